"""The open transcripts of one gateway: a bounded cache, one open per session.

The lane that runs a session's turns opens (or creates) its transcript here and keeps
it open between turns; readers outside the lane (``/context``, the admin API) use
``cached`` and open read-only copies of their own when it has none. With several
replicas another process may have appended since this one cached a transcript:
``current`` reopens it then.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from parley.core.errors import TranscriptError
from parley.core.transcript_store import SessionTranscript, TranscriptStore
from parley.gateway.storage.sessions import SessionRecord

log = logging.getLogger("parley.gateway")

# Creates a session's transcript when its registry row exists but the file never did.
CreateTranscript = Callable[[SessionRecord], Awaitable[SessionTranscript]]


class TranscriptCache:
    def __init__(self, store: TranscriptStore, *, max_open: int, shared: bool) -> None:
        self.store = store
        self.max_open = max_open
        self.shared = shared  # several replicas append to the same transcripts
        self.create_missing: CreateTranscript | None = None  # set by the session stage
        self._open: OrderedDict[str, SessionTranscript] = OrderedDict()
        self._opening: dict[str, asyncio.Future[SessionTranscript]] = {}

    def __len__(self) -> int:
        return len(self._open)

    async def get(self, record: SessionRecord) -> SessionTranscript:
        """The session's transcript, opened (or created when it never was) on first use."""
        cached = self._open.get(record.session_id)
        if cached is not None:
            self._open.move_to_end(record.session_id)
            return cached
        # One open per session at a time: a reader outside the lane (/context, the admin
        # API) racing the lane's first open would otherwise make a second object on the
        # same transcript, with its own idea of where the file ends.
        opening = self._opening.get(record.session_id)
        if opening is None:
            opening = asyncio.ensure_future(self._open_one(record))
            self._opening[record.session_id] = opening
            opening.add_done_callback(lambda _: self._opening.pop(record.session_id, None))
        return await asyncio.shield(opening)

    async def _open_one(self, record: SessionRecord) -> SessionTranscript:
        try:
            transcript = await asyncio.to_thread(self.store.open, record.session_id)
        except TranscriptError:
            if self.create_missing is None or await asyncio.to_thread(
                self.store.exists, record.session_id
            ):
                raise
            # The row exists but the transcript never did (a kill between the two).
            transcript = await self.create_missing(record)
        report = transcript.load_report
        if not report.clean:
            log.warning("transcript %s repaired on load: %s", record.session_id, report)
        self.keep(record.session_id, transcript)
        return transcript

    async def current(self, record: SessionRecord) -> SessionTranscript:
        """``get``, reopened first when another replica appended to it (in the
        session's lane)."""
        if self.shared and await self.cached(record) is None:
            self.forget(record.session_id)  # stale (or not open): reopen
        return await self.get(record)

    async def cached(self, record: SessionRecord) -> SessionTranscript | None:
        """The lane's open transcript when it has one that is current, else None; never
        opens or creates one. For readers outside the lane (/context, the admin API):
        opening the lane's way from there races the lane creating the file (a reader
        would find it empty) or puts a second writer on it; they open read-only copies."""
        cached = self._open.get(record.session_id)
        if cached is None:
            return None
        is_current = getattr(cached, "is_current", None)  # PostgreSQL, several replicas
        if is_current is not None and not await asyncio.to_thread(is_current):
            return None
        return cached

    def keep(self, session_id: str, transcript: SessionTranscript) -> None:
        self._open[session_id] = transcript
        self._open.move_to_end(session_id)
        while len(self._open) > self.max_open:
            _, evicted = self._open.popitem(last=False)
            evicted.close()

    def forget(self, session_id: str) -> None:
        transcript = self._open.pop(session_id, None)
        if transcript is not None:
            transcript.close()

    def close_all(self) -> None:
        for transcript in self._open.values():
            transcript.close()
        self._open.clear()
