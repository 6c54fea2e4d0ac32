"""Temporal decay of memory search scores: newer memories outrank stale ones.

A score is multiplied by ``0.5 ** (age / half_life)`` (OpenClaw's ``exp(-ln2 / half_life *
age)``, written so the half-life gives exactly 0.5). The age of a chunk comes from, in order:

* nothing, for evergreen files: ``MEMORY.md`` / ``memory.md`` at the workspace root and undated
  files under ``memory/`` hold curated knowledge that stays true however old the file is;
* a transcript chunk's own timestamp (source ``"sessions"``): a long session file spans weeks,
  and its mtime says only when it last grew;
* the date in a ``memory/YYYY-MM-DD*.md`` name (UTC midnight): the day the note is about, which
  survives copies and edits that reset the mtime;
* the file's mtime, for everything else (extra paths, transcripts without a timestamp).

Paths are workspace-relative with ``/`` separators (``\\`` and a leading ``./`` are accepted).
Future dates count as age 0: a clock skew must not boost a memory above 1.0. No I/O here; the
caller passes the mtime.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime

DEFAULT_HALF_LIFE_DAYS = 30.0
SECONDS_PER_DAY = 86_400.0

SESSIONS_SOURCE = "sessions"

# memory/2024-03-05.md, memory/2024-03-05-standup.md, memory/2024/03/2024-03-05.md; not
# memory/2024-03-051.md (the date must end there).
_DATED_MEMORY_RE = re.compile(
    r"(?:^|/)memory/(?:[^/]+/)*(\d{4})-(\d{2})-(\d{2})(?:[^/\d][^/]*)?(?i:\.md)\Z"
)
_ROOT_MEMORY_FILES = frozenset({"MEMORY.md", "memory.md"})


def decay_multiplier(age_days: float, half_life_days: float = DEFAULT_HALF_LIFE_DAYS) -> float:
    """The factor in (0, 1] for a memory ``age_days`` old; 1.0 when the half-life is <= 0."""
    if not (half_life_days > 0 and math.isfinite(half_life_days)) or not age_days > 0:
        return 1.0  # also for a NaN age: unknown is not old
    return 0.5 ** (age_days / half_life_days)


def _normalise(path: str) -> str:
    path = path.replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return path


def memory_file_date(path: str) -> date | None:
    """The date in a ``memory/YYYY-MM-DD*.md`` path, or None (also for 2023-02-30)."""
    match = _DATED_MEMORY_RE.search(_normalise(path))
    if match is None:
        return None
    try:
        return date(*(int(part) for part in match.groups()))
    except ValueError:
        return None


def is_evergreen(path: str, source: str) -> bool:
    """True for a memory file that never decays (see the module docstring)."""
    if source == SESSIONS_SOURCE:
        return False
    path = _normalise(path)
    if path in _ROOT_MEMORY_FILES:
        return True
    return path.startswith("memory/") and memory_file_date(path) is None


def iso_timestamp(value: str | None) -> float | None:
    """Seconds since the epoch of an ISO 8601 timestamp (naive means UTC), or None."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def chunk_age_days(
    *,
    path: str,
    source: str,
    chunk_ts: str | None,
    file_mtime: float | None,
    now: datetime,
) -> float | None:
    """The age in days of a chunk, >= 0; None when it must not decay (or nothing dates it).

    ``chunk_ts`` is the ISO timestamp of a transcript chunk, ``file_mtime`` the file's mtime in
    seconds since the epoch, ``now`` the current time (naive means UTC).
    """
    if is_evergreen(path, source):
        return None
    moment = iso_timestamp(chunk_ts) if source == SESSIONS_SOURCE else None
    if moment is None and (day := memory_file_date(path)) is not None:
        moment = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
    if moment is None and file_mtime is not None and math.isfinite(file_mtime):
        moment = file_mtime
    if moment is None:
        return None
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return max(0.0, (now.timestamp() - moment) / SECONDS_PER_DAY)
