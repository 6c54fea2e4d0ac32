"""Which sessions are compacting right now, and a way to wait until one is not.

While a compaction runs, the session's transcript is about to gain a compaction
entry and its view is about to change: the runner awaits ``idle`` before running
tools so a tool never acts on a view that is being folded. The gateway's lanes
already queue the session's next messages, so waiting drops nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Hold:
    depth: int = 0  # nested holds (an overflow compaction inside /compact's turn)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class CompactionGate:
    def __init__(self) -> None:
        self._holds: dict[str, _Hold] = {}

    def compacting(self, key: str) -> bool:
        return key in self._holds

    async def idle(self, key: str) -> None:
        """Return at once when ``key`` is not compacting, else when it stops."""
        hold = self._holds.get(key)
        if hold is not None:
            await hold.done.wait()

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Mark ``key`` as compacting for the block; cleared however the block ends."""
        hold = self._holds.setdefault(key, _Hold())
        hold.depth += 1
        try:
            yield
        finally:
            hold.depth -= 1
            if hold.depth == 0:
                del self._holds[key]
                hold.done.set()
