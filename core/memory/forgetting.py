"""Forgetting: which chunks of derived memory the policies evict, and why.

Only derived memory is ever forgotten: transcript chunks (``sessions``) and task
records (``tasks``). The files people write (MEMORY.md, memory/*.md, extra paths, the
agent's own daily notes among them) are theirs: no policy touches them.

Policies, per scope (``ForgettingSettings`` with ``scopes`` overrides), in this order:

1. age: a chunk older than ``max_age_days`` (by its own timestamp, else its file's
   mtime; evergreen files never age);
2. importance: a chunk whose text scores below ``min_importance``
   (``core.importance.text_importance`` of its most important line, ``chunk_importance``);
3. capacity: past ``max_chunks_per_scope`` chunks in a scope, the least important go
   first, the oldest first among equals (``core.importance``'s drop order).

An eviction deletes the chunk and leaves a tombstone (path, chunk hash), so the next
sync does not index it again. This module only plans; ``MemoryIndex.forget`` applies.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any, Literal

from parley.core.importance import DEFAULT, NOTHING, text_importance
from parley.core.memory.decay import is_evergreen, iso_timestamp
from parley.core.memory.memory_config import ForgettingSettings
from parley.core.memory.rows import ForgettableChunk, Tombstone
from parley.core.memory.sources import SESSIONS_SOURCE, TASKS_SOURCE

Policy = Literal["age", "importance", "capacity"]
POLICIES: tuple[Policy, ...] = ("age", "importance", "capacity")
# The sources whose chunks may be evicted; everything else is the user's.
FORGETTABLE_SOURCES: tuple[str, ...] = (SESSIONS_SOURCE, TASKS_SOURCE)
# The store state key holding when the policies last ran (ISO 8601).
LAST_RUN_KEY = "forgetting.last_run"
SECONDS_PER_DAY = 86_400.0
# A transcript chunk line's "[2026-03-01 12:00] Alice: " prefix (time, then a speaker
# of a few words): without it "ok thanks" is chatter; with it, plain text.
_LINE_PREFIX = re.compile(r"^\s*(?:\[[^\]\n]{1,40}\]\s*)?(?:[^\s:][^:\n]{0,39}:\s+)?")


@dataclass(frozen=True, slots=True)
class ScopePolicy:
    """The limits that apply to one scope (None: that policy is off)."""

    max_age_days: float | None
    min_importance: float | None
    max_chunks: int | None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.max_age_days, self.min_importance, self.max_chunks))


def policy_for(settings: ForgettingSettings, scope: str) -> ScopePolicy:
    """The section's limits, with the most specific matching override's keys on top
    (an exact scope beats a pattern, a longer pattern a shorter one)."""
    policy = ScopePolicy(
        settings.max_age_days, settings.min_importance, settings.max_chunks_per_scope
    )
    matches = [p for p in settings.scopes if fnmatchcase(scope, p)]
    if not matches:
        return policy
    override = settings.scopes[max(matches, key=lambda p: (p == scope, len(p)))]
    # Only keys written in the override count: None there turns a policy off.
    given = override.model_fields_set
    return ScopePolicy(
        override.max_age_days if "max_age_days" in given else policy.max_age_days,
        override.min_importance if "min_importance" in given else policy.min_importance,
        override.max_chunks_per_scope if "max_chunks_per_scope" in given else policy.max_chunks,
    )


def chunk_importance(text: str) -> float:
    """A chunk's importance: its most important line's, each line scored without its
    time and speaker prefix (a label must not lift "ok thanks" out of chatter, nor hide
    an error: a line's own score counts when it says more than plain text)."""
    best = NOTHING
    for line in text.splitlines():
        if not line.strip():
            continue
        score = text_importance(_LINE_PREFIX.sub("", line, count=1))
        raw = text_importance(line)
        best = max(best, score, raw if raw > DEFAULT else NOTHING)
    return best


def chunk_moment(chunk: ForgettableChunk) -> float:
    """When a chunk was said or done (seconds since the epoch): its own timestamp, else
    its file's mtime."""
    moment = iso_timestamp(chunk.ts)
    return chunk.file_mtime if moment is None else moment


@dataclass(frozen=True, slots=True)
class Eviction:
    chunk: ForgettableChunk
    policy: Policy
    reason: str

    def tombstone(self, evicted_at: float) -> Tombstone:
        return Tombstone.of(self.chunk, f"{self.policy}: {self.reason}", evicted_at)


def plan_forgetting(
    chunks: Iterable[ForgettableChunk], settings: ForgettingSettings, now: datetime
) -> list[Eviction]:
    """What the policies evict from ``chunks`` (empty when forgetting is off)."""
    if not settings.enabled:
        return []
    by_scope: dict[str, list[ForgettableChunk]] = defaultdict(list)
    for chunk in chunks:
        # Belt and braces: the store lists derived sources only, and a user's file
        # must not be lost to a caller that passes more.
        if chunk.source in FORGETTABLE_SOURCES and not is_evergreen(chunk.path, chunk.source):
            by_scope[chunk.scope].append(chunk)
    evictions: list[Eviction] = []
    for scope in sorted(by_scope):
        policy = policy_for(settings, scope)
        if policy.active:
            evictions += _plan_scope(by_scope[scope], policy, now.timestamp())
    return evictions


def _plan_scope(
    chunks: Sequence[ForgettableChunk], policy: ScopePolicy, now: float
) -> list[Eviction]:
    out: list[Eviction] = []
    kept: list[tuple[float, float, ForgettableChunk]] = []  # (importance, moment, chunk)
    # Scoring reads every line: skip it where no policy asks (most runs, most scopes).
    scoring = policy.min_importance is not None or (
        policy.max_chunks is not None and len(chunks) > policy.max_chunks
    )
    for chunk in chunks:
        moment = chunk_moment(chunk)
        age_days = max(0.0, (now - moment) / SECONDS_PER_DAY)
        if policy.max_age_days is not None and age_days > policy.max_age_days:
            out.append(Eviction(chunk, "age", f"{age_days:.0f} days old > {policy.max_age_days:g}"))
            continue
        score = chunk_importance(chunk.text) if scoring else 0.0
        if policy.min_importance is not None and score < policy.min_importance:
            out.append(
                Eviction(chunk, "importance", f"importance {score:.2f} < {policy.min_importance:g}")
            )
            continue
        kept.append((score, moment, chunk))
    if policy.max_chunks is not None and len(kept) > policy.max_chunks:
        excess = len(kept) - policy.max_chunks
        kept.sort(key=lambda item: (item[0], item[1], item[2].id))
        out += [
            Eviction(
                chunk,
                "capacity",
                f"scope over {policy.max_chunks} chunks (importance {score:.2f})",
            )
            for score, _, chunk in kept[:excess]
        ]
    return out


@dataclass(slots=True)
class ForgettingReport:
    dry_run: bool
    ran_at: datetime
    evictions: list[Eviction] = field(default_factory=list)
    evicted: int = 0  # chunks actually deleted (0 on a dry run)

    def counts(self) -> dict[tuple[str, str], int]:
        """Evictions per (policy, scope)."""
        return dict(sorted(Counter((e.policy, e.chunk.scope) for e in self.evictions).items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "ran_at": self.ran_at.isoformat(),
            "evicted": self.evicted,
            "by_policy": [
                {"policy": p, "scope": s, "chunks": n} for (p, s), n in self.counts().items()
            ],
            "evictions": [
                {
                    "policy": e.policy,
                    "scope": e.chunk.scope,
                    "path": e.chunk.path,
                    "lines": [e.chunk.start_line, e.chunk.end_line],
                    "reason": e.reason,
                }
                for e in self.evictions
            ],
        }


def _cite(path: str, start: int, end: int) -> str:
    return f"{path}#L{start}" if start == end else f"{path}#L{start}-L{end}"


def format_forgetting_report(report: ForgettingReport) -> str:
    verb = "would evict" if report.dry_run else "evicted"
    if not report.evictions:
        return "Nothing to forget."
    lines = [f"{verb} {len(report.evictions)} chunk(s):"]
    for (policy, scope), count in report.counts().items():
        lines.append(f"  {policy:<10} {scope}: {count}")
    for eviction in report.evictions:
        chunk = eviction.chunk
        lines.append(
            f"  - [{eviction.policy}] {chunk.scope} "
            f"{_cite(chunk.path, chunk.start_line, chunk.end_line)}: {eviction.reason}"
        )
    return "\n".join(lines)


def format_tombstones(tombstones: Sequence[Tombstone]) -> str:
    """``parley memory pruned``: newest first, one eviction per line."""
    if not tombstones:
        return "Nothing has been forgotten."
    lines = []
    for t in tombstones:
        when = datetime.fromtimestamp(t.evicted_at, UTC).strftime("%Y-%m-%d %H:%M")
        lines.append(
            f"{when}  {t.scope}  {_cite(t.path, t.start_line, t.end_line)}  {t.reason}\n"
            f"    {t.preview}"
        )
    return "\n".join(lines)
