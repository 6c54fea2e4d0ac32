"""Compaction figures derived from the transcript, for /status, the admin API and metrics.

Derived rather than counted in memory: the transcript is the source of truth, so the
figures survive restarts and agree with what an inspector shows. Entries written
before strategies existed count as ``summary`` (that is what made them).

The figures of a transcript's first N entries and those of the entries after them
merge into the figures of the whole (``merge_stats``, ``fold_stats``), so a cache
brings its figures up to date from the entries appended since, never the whole file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from parley.core.transcript import ENTRY_COMPACTION, Entry

DEFAULT_STRATEGY = "summary"


@dataclass(frozen=True, slots=True)
class CompactionStats:
    count: int = 0
    by_strategy: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    by_trigger: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    with_fallbacks: int = 0  # entries made after at least one failed step
    last_tokens_before: int | None = None
    last_tokens_after: int | None = None
    tokens_saved: int = 0  # sum of max(0, before − after) over every compaction
    last_at: str | None = None  # the newest compaction entry's timestamp


def compaction_stats(entries: Iterable[Entry]) -> CompactionStats:
    """The figures over ``entries`` (pass every entry of a transcript, not only the
    live window, to count the whole session)."""
    by_strategy: dict[str, int] = {}
    by_trigger: dict[str, int] = {}
    count = fallbacks = saved = 0
    before = after = None
    last_at = None
    for entry in entries:
        if entry.type != ENTRY_COMPACTION:
            continue
        payload = entry.payload
        details = payload.get("details") or {}
        strategy = str(details.get("strategy") or DEFAULT_STRATEGY)
        trigger = str(payload.get("trigger") or "unknown")
        by_strategy[strategy] = by_strategy.get(strategy, 0) + 1
        by_trigger[trigger] = by_trigger.get(trigger, 0) + 1
        count += 1
        if details.get("fallbacks"):
            fallbacks += 1
        before = int(payload.get("tokens_before") or 0)
        after = int(payload.get("tokens_after") or 0)
        saved += max(0, before - after)
        last_at = entry.ts
    return CompactionStats(
        count=count,
        by_strategy=MappingProxyType(by_strategy),
        by_trigger=MappingProxyType(by_trigger),
        with_fallbacks=fallbacks,
        last_tokens_before=before,
        last_tokens_after=after,
        tokens_saved=saved,
        last_at=last_at,
    )


def merge_stats(earlier: CompactionStats, later: CompactionStats) -> CompactionStats:
    """The figures over two consecutive runs of entries, from the figures of each:
    ``compaction_stats(a + b) == merge_stats(compaction_stats(a), compaction_stats(b))``."""
    if later.count == 0:
        return earlier
    if earlier.count == 0:
        return later
    return CompactionStats(
        count=earlier.count + later.count,
        by_strategy=_summed(earlier.by_strategy, later.by_strategy),
        by_trigger=_summed(earlier.by_trigger, later.by_trigger),
        with_fallbacks=earlier.with_fallbacks + later.with_fallbacks,
        last_tokens_before=later.last_tokens_before,
        last_tokens_after=later.last_tokens_after,
        tokens_saved=earlier.tokens_saved + later.tokens_saved,
        last_at=later.last_at,
    )


def fold_stats(stats: CompactionStats, entries: Iterable[Entry]) -> CompactionStats:
    """``stats`` (the figures of the entries before) brought up to date with ``entries``."""
    return merge_stats(stats, compaction_stats(entries))


def _summed(a: Mapping[str, int], b: Mapping[str, int]) -> Mapping[str, int]:
    total = dict(a)
    for key, value in b.items():
        total[key] = total.get(key, 0) + value
    return MappingProxyType(total)


def utilisation(used: int, window: int) -> float:
    """The share of the window in use (0 for an unknown window). Not capped at 1: a
    value above it says by how much a request overflowed."""
    if window <= 0:
        return 0.0
    return max(0.0, used / window)
