"""What the admin API and the HTTP server need of the gateway, as a protocol.

The admin side reads sessions, transcripts and memory, and asks for compactions and
resets, which run in the session's lane; it never reaches into the gateway's
runtime. ``gateway.app.Gateway`` satisfies this protocol (the type checker proves it
where the server is built), and the admin package never imports the gateway class.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from parley.channels.base import Channel
from parley.core.context.compaction.compactor import CompactionOutcome
from parley.core.context.report import ContextReport
from parley.core.context.view import ContextView
from parley.core.memory.index import MemoryIndex
from parley.core.providers.base import Provider
from parley.core.transcript_store import SessionTranscript
from parley.gateway.admin.session_figures import SessionFiguresCache
from parley.gateway.config import ParleyConfig
from parley.gateway.storage.sessions import SessionRecord

if TYPE_CHECKING:
    from parley.gateway.storage.sessions import SessionRegistry
    from parley.gateway.storage.stores import StateStores


@dataclass(frozen=True, slots=True)
class ProviderHealth:
    """What the last provider call said (``/health``); ``ok`` is False only when it
    was unreachable. Written by the turn, read here."""

    ok: bool = True
    detail: str = "no call yet"
    at: datetime | None = None


class AdminGateway(Protocol):
    @property
    def config(self) -> ParleyConfig: ...

    @property
    def state(self) -> StateStores: ...

    @property
    def registry(self) -> SessionRegistry: ...

    @property
    def channels(self) -> Mapping[str, Channel]: ...

    @property
    def memory(self) -> MemoryIndex | None: ...

    def memory_of(self, agent: str | None) -> MemoryIndex | None:
        """An agent's memory index (None: the default agent's); raises KeyError for
        an agent there is not."""
        ...

    @property
    def figures(self) -> SessionFiguresCache: ...

    @property
    def provider(self) -> Provider: ...

    @property
    def provider_health(self) -> ProviderHealth: ...

    @property
    def ready(self) -> bool: ...

    def window_for(self, record: SessionRecord | None) -> int: ...

    async def cached_transcript(self, record: SessionRecord) -> SessionTranscript | None: ...

    async def context_report(
        self, record: SessionRecord | None, transcript: SessionTranscript | None, chat_type: str
    ) -> tuple[ContextReport, ContextView | None]: ...

    async def compact_session(
        self, record: SessionRecord, chat_type: str, focus: str
    ) -> CompactionOutcome: ...

    async def archive_session(self, record: SessionRecord, reason: str) -> None: ...

    async def run_in_lane(self, key: str, run: Callable[[], Awaitable[Any]]) -> Any: ...
