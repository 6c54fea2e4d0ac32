"""A session's context figures for /status, the admin API and metrics.

Compaction counts (by strategy and trigger) and the last compaction's tokens come from
the session's whole transcript (``core.context.compaction.stats``): the transcript is the
source of truth, so the figures survive restarts and agree with the inspector.

Reading a whole transcript costs what its length does, and the figures are refreshed
after every turn, so each session's figures are cached with the number of entry lines
they cover and brought up to date by folding in only the lines appended since
(``fold_stats``): a turn reads its own few entries, a compaction it wrote among them.
Entry lines are only ever appended to a session's transcript (a torn tail was never
counted; a repair only completes or drops it), so the figures of its first N lines
stay right for any object that reads the same transcript: a reopened one, or the
admin API's read-only copy, folds from the cached count too. Only a transcript that
is not the one cached (another header) or holds fewer lines than the cache covers
(a read-only copy opened earlier) is read whole.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from parley.core.context.compaction.stats import (
    CompactionStats,
    compaction_stats,
    fold_stats,
    utilisation,
)
from parley.core.transcript_store import SessionTranscript
from parley.gateway.admin.metrics import SessionFigures

# Sessions whose figures stay cached (each a few small dicts).
CACHED_SESSIONS = 2048


@dataclass(frozen=True, slots=True)
class _Cached:
    identity: tuple[str, str]  # the transcript's header (session id, created)
    count: int  # the entry lines the figures cover
    stats: CompactionStats


class SessionFiguresCache:
    def __init__(self, max_sessions: int = CACHED_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._cache: OrderedDict[str, _Cached] = OrderedDict()

    async def stats(self, session_id: str, transcript: SessionTranscript) -> CompactionStats:
        """The session's compaction figures, as of the transcript's entries now."""
        cached = self._cache.get(session_id)
        # After a turn the new entries are the ones it appended, in memory: no thread
        # hop, no read (one of each per turn, and the hop's GIL hand-offs, under load).
        fresh = _fold_appended(transcript, cached)
        if fresh is None:
            # On a thread, entry_count included: a file's first count reads its prefix.
            fresh = await asyncio.to_thread(_read, transcript, cached)
        self._store(session_id, fresh)
        return fresh.stats

    def peek(self, session_id: str) -> CompactionStats | None:
        """The cached figures, without reading anything (None: not seen yet)."""
        cached = self._cache.get(session_id)
        return cached.stats if cached is not None else None

    def forget(self, session_id: str) -> None:
        self._cache.pop(session_id, None)

    def _store(self, session_id: str, fresh: _Cached) -> None:
        # Another read of the session may have cached newer figures while this one ran
        # on its thread (a turn and the admin API): keep whichever covers more.
        current = self._cache.get(session_id)
        if current is None or current.identity != fresh.identity or current.count <= fresh.count:
            self._cache[session_id] = fresh
        self._cache.move_to_end(session_id)
        while len(self._cache) > self.max_sessions:
            self._cache.popitem(last=False)


def _identity(transcript: SessionTranscript) -> tuple[str, str]:
    header = transcript.header
    return (header.id, header.created)


def _fold_appended(transcript: SessionTranscript, cached: _Cached | None) -> _Cached | None:
    """``cached`` brought up to date from the entries ``transcript`` appended since, when
    it still has them in memory (``appended_since``); None when they must be read."""
    if cached is None or cached.identity != _identity(transcript):
        return None
    appended = transcript.appended_since(cached.count)
    if appended is None:
        return None
    count, new = appended
    return cached if not new else _Cached(cached.identity, count, fold_stats(cached.stats, new))


def _read(transcript: SessionTranscript, cached: _Cached | None) -> _Cached:
    """The figures of ``transcript`` now: ``cached`` brought up to date when it covers
    a prefix of this transcript, else read from its first entry."""
    identity = _identity(transcript)
    count = transcript.entry_count
    if cached is not None and cached.identity == identity and cached.count <= count:
        if cached.count == count:
            return cached
        # Bounded by ``count``: the figures cover exactly the lines they claim to.
        since = cached.count
        new = (entry for _, entry in transcript.numbered_entries(since, count - since))
        return _Cached(identity, count, fold_stats(cached.stats, new))
    return _Cached(identity, count, compaction_stats(transcript.entries(0, count)))


def figures(stats: CompactionStats, used: int, window: int) -> SessionFigures:
    return SessionFigures(
        utilisation=round(utilisation(used, window), 4),
        compactions_by_strategy=dict(stats.by_strategy),
        compactions_by_trigger=dict(stats.by_trigger),
        last_tokens_before=stats.last_tokens_before,
        last_tokens_after=stats.last_tokens_after,
    )
