"""A session's context figures for /status, the admin API and metrics.

Compaction counts (by strategy and trigger) and the last compaction's tokens come from
the session's whole transcript (``core.context.compaction.stats``): the transcript is the
source of truth, so the figures survive restarts and agree with the inspector. Reading
a whole transcript is not free, so each session's figures are cached and re-read only
when a compaction was written since (or the cache never saw the session).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from parley.core.context.compaction.stats import CompactionStats, compaction_stats, utilisation
from parley.core.transcript_store import SessionTranscript
from parley.gateway.admin.metrics import SessionFigures

# Sessions whose figures stay cached (each a few small dicts).
CACHED_SESSIONS = 2048


class SessionFiguresCache:
    def __init__(self, max_sessions: int = CACHED_SESSIONS) -> None:
        self.max_sessions = max_sessions
        # session id → (the transcript object read, entry count then, its figures)
        self._cache: OrderedDict[str, tuple[int, int, CompactionStats]] = OrderedDict()

    async def stats(
        self, session_id: str, transcript: SessionTranscript, *, changed: bool = False
    ) -> CompactionStats:
        """The session's compaction figures; ``changed``: a compaction was just written."""
        cached = self._cache.get(session_id)
        fresh = (
            cached is not None
            and not changed
            and cached[0] == id(transcript)
            and cached[1] <= transcript.entry_count
        )
        if fresh:
            assert cached is not None
            self._cache.move_to_end(session_id)
            return cached[2]
        count = transcript.entry_count
        stats = await asyncio.to_thread(lambda: compaction_stats(transcript.entries()))
        self._cache[session_id] = (id(transcript), count, stats)
        self._cache.move_to_end(session_id)
        while len(self._cache) > self.max_sessions:
            self._cache.popitem(last=False)
        return stats

    def peek(self, session_id: str) -> CompactionStats | None:
        """The cached figures, without reading anything (None: not seen yet)."""
        cached = self._cache.get(session_id)
        return cached[2] if cached is not None else None

    def forget(self, session_id: str) -> None:
        self._cache.pop(session_id, None)


def figures(stats: CompactionStats, used: int, window: int) -> SessionFigures:
    return SessionFigures(
        utilisation=round(utilisation(used, window), 4),
        compactions_by_strategy=dict(stats.by_strategy),
        compactions_by_trigger=dict(stats.by_trigger),
        last_tokens_before=stats.last_tokens_before,
        last_tokens_after=stats.last_tokens_after,
    )
