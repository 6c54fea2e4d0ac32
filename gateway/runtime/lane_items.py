"""What a session's lane carries: inbound messages (``LaneItem``) and work that must
run in order with them (``LaneTask``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from parley.channels.base import InboundMessage
from parley.gateway.routing import SessionRoute
from parley.gateway.storage.inbox import InboxItem


@dataclass(frozen=True, slots=True)
class LaneItem:
    inbox_id: int
    message: InboundMessage
    route: SessionRoute
    reset_text: str | None = None  # set for /new and /reset: the text after the trigger
    recovered: InboxItem | None = None
    compact_focus: str | None = None  # set for /compact: its focus text ("" for none)


@dataclass(slots=True)
class LaneTask:
    """Work that must not overlap the session's turns (an admin compaction or reset):
    it runs in the session's lane, in order with its messages."""

    run: Callable[[], Awaitable[Any]]
    done: asyncio.Future[Any] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    async def execute(self) -> None:
        try:
            result = await self.run()
        except Exception as exc:  # handed to the waiter, who reports it
            if not self.done.done():
                self.done.set_exception(exc)
            return
        if not self.done.done():
            self.done.set_result(result)
