"""The open transcripts of one gateway: a bounded cache, one open per session.

The lane that runs a session's turns opens (or creates) its transcript here and keeps
it open between turns; readers outside the lane (``/context``, the admin API) use
``cached`` and open read-only copies of their own when it has none. With several
replicas another process may have appended since this one cached a transcript:
``current`` reopens it then.

Past ``max_open``, the least recently used transcript lets go of its file but, when its
store supports it (the file store: ``suspend``/``resume``), stays warm in memory up to
``warm_bytes`` of live windows: with more active chats than open files, a turn then
picks its session up without parsing the live window again, a cost that grew with
every turn of the session (bench/load.py: CPU per message doubled from the 1st to the
16th message of each of 1,000 chats with 256 files open).

``prefetch`` opens (or resumes) the transcript a session's lane used last while the lane
waits for a run slot (``LaneManager``), so the run finds it open instead of reading it
inside its slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

from parley.core.errors import TranscriptError
from parley.core.transcript_store import SessionTranscript, TranscriptStore
from parley.gateway.storage.sessions import SessionRecord

log = logging.getLogger("parley.gateway")

# A warm window is evicted least recently used first only once it has been warm this
# long; before that, the newest goes (see ``_keep_warm``).
WARM_MIN_SECONDS = 600.0

# Creates a session's transcript when its registry row exists but the file never did.
CreateTranscript = Callable[[SessionRecord], Awaitable[SessionTranscript]]

# How many session keys ``prefetch`` remembers the last session of, at least (and four
# times ``max_open``): a key not remembered is simply not prefetched.
MIN_REMEMBERED_KEYS = 4096


class TranscriptCache:
    def __init__(
        self, store: TranscriptStore, *, max_open: int, shared: bool, warm_bytes: int = 0
    ) -> None:
        self.store = store
        self.max_open = max_open
        self.warm_bytes = warm_bytes
        self.shared = shared  # several replicas append to the same transcripts
        self.create_missing: CreateTranscript | None = None  # set by the session stage
        # Whether a session key's lane has a run in flight (set by the gateway): its
        # transcript is not let go of while it does, whatever the LRU order says.
        self.in_use: Callable[[str], bool] | None = None
        self._open: OrderedDict[str, SessionTranscript] = OrderedDict()
        self._opening: dict[str, asyncio.Future[SessionTranscript]] = {}
        # Suspended transcripts (no file held), least recently used first, and the
        # bytes of live window they keep.
        self._warm: OrderedDict[str, WarmTranscript] = OrderedDict()
        self._warm_since: dict[str, float] = {}  # when each was suspended (monotonic)
        self._warm_total = 0
        # The active session each key's lane used last, least recently first, and back:
        # what ``prefetch`` opens for a key.
        self._session_of_key: OrderedDict[str, str] = OrderedDict()
        self._key_of_session: dict[str, str] = {}
        self._remembered = max(MIN_REMEMBERED_KEYS, 4 * max_open)
        self._prefetching: set[asyncio.Future[SessionTranscript]] = set()

    def __len__(self) -> int:
        return len(self._open)

    async def get(self, record: SessionRecord) -> SessionTranscript:
        """The session's transcript, opened (or created when it never was) on first use."""
        session_id = record.session_id
        if record.status == "active":  # a stored reply's archived session is no turn's
            self._remember(record.key, session_id)
        while True:
            cached = self._open.get(session_id)
            if cached is not None:
                self._open.move_to_end(session_id)
                return cached
            # One open per session at a time: a prefetch racing the run's own open
            # would otherwise make a second object on the same transcript, with its own
            # idea of where the file ends (and two writers).
            opening = self._opening.get(session_id)
            if opening is None:
                return await asyncio.shield(self._begin_open(session_id, record))
            if opening not in self._prefetching:
                return await asyncio.shield(opening)
            try:
                return await asyncio.shield(opening)
            except Exception:
                # The prefetch's own failure (it never creates a transcript, and an
                # error is for the run to meet itself): look again, and open it here.
                continue

    async def prefetch(self, session_key: str) -> None:
        """Open (or resume) the transcript of the session the key's lane used last, for
        a run that waits for its slot. Nothing with several replicas (a run opens what
        another may have appended to itself), for a key not seen, or one open already;
        never creates a transcript. Raises TranscriptError when it cannot be opened."""
        session_id = self._session_of_key.get(session_key)
        if self.shared or session_id is None:
            return
        if session_id in self._open:
            self._open.move_to_end(session_id)  # wanted soon: not the next to go
            return
        if session_id in self._opening:
            return
        opening = self._begin_open(session_id, None)
        self._prefetching.add(opening)
        await asyncio.shield(opening)

    def _begin_open(
        self, session_id: str, record: SessionRecord | None
    ) -> asyncio.Future[SessionTranscript]:
        opening = asyncio.ensure_future(self._open_one(session_id, record))
        self._opening[session_id] = opening

        def opened(_: asyncio.Future[SessionTranscript]) -> None:
            if self._opening.get(session_id) is opening:
                del self._opening[session_id]
            self._prefetching.discard(opening)

        opening.add_done_callback(opened)
        return opening

    def _remember(self, session_key: str, session_id: str) -> None:
        previous = self._session_of_key.get(session_key)
        if previous == session_id:
            self._session_of_key.move_to_end(session_key)
            return
        if previous is not None:
            self._key_of_session.pop(previous, None)
        self._session_of_key[session_key] = session_id
        self._session_of_key.move_to_end(session_key)
        self._key_of_session[session_id] = session_key
        while len(self._session_of_key) > self._remembered:
            _, dropped = self._session_of_key.popitem(last=False)
            self._key_of_session.pop(dropped, None)

    async def _open_one(self, session_id: str, record: SessionRecord | None) -> SessionTranscript:
        """Open (or resume) a transcript; ``record`` given: create it when its registry
        row exists but the file never did. Run as the task in ``_opening``."""
        this = asyncio.current_task()
        warm = self._take_warm(session_id)
        if warm is not None:
            if await asyncio.to_thread(warm.resume):
                return self._keep_opened(this, session_id, warm)
            warm.close()  # changed on disk meanwhile: read it afresh
        try:
            transcript = await asyncio.to_thread(self._open_counted, session_id)
        except TranscriptError:
            if (
                record is None
                or self.create_missing is None
                or await asyncio.to_thread(self.store.exists, session_id)
            ):
                raise
            # The row exists but the transcript never did (a kill between the two).
            transcript = await self.create_missing(record)
        report = transcript.load_report
        if not report.clean:
            log.warning("transcript %s repaired on load: %s", session_id, report)
        return self._keep_opened(this, session_id, transcript)

    def _keep_opened(
        self, this: asyncio.Task[object] | None, session_id: str, transcript: SessionTranscript
    ) -> SessionTranscript:
        """Keep what an open got, unless the session was let go of while it opened
        (``forget``: archived; ``close_all``: the gateway stops): a prefetch finishing
        after its session's reset must not bring the archived one back, nor hold a file
        after the cache closed its own."""
        if self._opening.get(session_id) is not this:
            transcript.close()
            raise TranscriptError(f"transcript {session_id} was let go of while it opened")
        self.keep(session_id, transcript)
        return transcript

    def _open_counted(self, session_id: str) -> SessionTranscript:
        """Open a transcript and count its entry lines, on a worker thread: a reopened
        file's first count reads the lines before its live window (cached after), and
        every turn reads ``entry_count`` on the event loop."""
        transcript = self.store.open(session_id)
        try:
            _ = transcript.entry_count
        except BaseException:
            transcript.close()
            raise
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
        # A run holds its transcript from its start to its reply's delivery record, and
        # one let go of meanwhile refuses its appends (closed): with more sessions
        # starting during a long run than ``max_open``, the run failed. Those in use go
        # to the back of the line instead; with all in use, more stay open for a while.
        passes = len(self._open)
        while len(self._open) > self.max_open and passes > 0:
            passes -= 1
            evicted_id, evicted = self._open.popitem(last=False)
            if self._running(evicted):
                self._open[evicted_id] = evicted
                continue
            self._keep_warm(evicted_id, evicted)

    def _running(self, transcript: SessionTranscript) -> bool:
        return self.in_use is not None and self.in_use(transcript.header.key)

    def forget(self, session_id: str) -> None:
        key = self._key_of_session.pop(session_id, None)
        if key is not None:  # archived or gone: nothing to prefetch for its key
            self._session_of_key.pop(key, None)
        self._opening.pop(session_id, None)  # an open under way closes what it gets
        transcript = self._open.pop(session_id, None)
        if transcript is not None:
            transcript.close()
        warm = self._take_warm(session_id)
        if warm is not None:
            warm.close()

    def close_all(self) -> None:
        self._opening.clear()  # an open under way closes what it gets
        for transcript in self._open.values():
            transcript.close()
        self._open.clear()
        for warm in self._warm.values():
            warm.close()
        self._warm.clear()
        self._warm_since.clear()
        self._warm_total = 0

    def _keep_warm(self, session_id: str, transcript: SessionTranscript) -> None:
        """Suspend an evicted transcript and keep it warm, within ``warm_bytes``; one
        that cannot be suspended (or would not fit) is closed."""
        # A duck check: isinstance against the protocol tests every member, per eviction.
        if not hasattr(transcript, "suspend"):
            transcript.close()
            return
        transcript = cast(WarmTranscript, transcript)
        size = transcript.live_bytes
        if size > self.warm_bytes:
            transcript.close()
            return
        try:
            transcript.suspend()  # a blocking close(2), as ``close`` here always was
        except OSError as exc:
            log.debug("transcript %s not kept warm: %s", session_id, exc)
            transcript.close()
            return
        self._warm[session_id] = transcript
        self._warm_since[session_id] = time.monotonic()
        self._warm_total += size
        while self._warm_total > self.warm_bytes:
            # The least recently used goes only once it has been warm a while: with more
            # chats taking turns than the budget holds (1,000 chats writing in rounds),
            # it is always the next one asked for, and every turn missed (bench/load.py:
            # CPU per message doubled the round the windows outgrew the budget). The
            # newest goes instead then, so the share that fits keeps resuming.
            oldest = next(iter(self._warm))
            if time.monotonic() - self._warm_since[oldest] >= WARM_MIN_SECONDS:
                victim = oldest
            else:
                victim = next(reversed(self._warm))
            dropped = self._take_warm(victim)
            assert dropped is not None
            dropped.close()

    def _take_warm(self, session_id: str) -> WarmTranscript | None:
        warm = self._warm.pop(session_id, None)
        if warm is not None:
            self._warm_since.pop(session_id, None)
            self._warm_total -= warm.live_bytes
        return warm


class WarmTranscript(SessionTranscript, Protocol):
    """A transcript that can let go of its file and take it up again (the file store)."""

    @property
    def live_bytes(self) -> int: ...

    def suspend(self) -> None: ...

    def resume(self) -> bool: ...
