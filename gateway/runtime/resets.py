"""When a session goes stale (the manual reset triggers: ``gateway.runtime.commands``).

Rules the gateway follows around these functions:

- Freshness is checked for messages from people only. Automated events (heartbeats,
  cron and exec events: ``InboundMessage.automated``) never reset a session, not even
  a stale one; ``should_reset`` encodes that. Their text is never matched against
  the reset triggers either.
- A model or delivery error never resets a session; only staleness and triggers do.

Daily boundaries are wall-clock times in the configured zone, computed with zoneinfo:

- An ``at_hour`` that does not exist that day (it falls in a spring-forward gap, e.g.
  02:00 in Europe/Berlin on the last Sunday of March) resets at the first instant
  after the gap, i.e. the transition itself (03:00 CEST in that example).
- An ``at_hour`` that happens twice (fall-back) resets at its first occurrence.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from parley.gateway.session_config import ResetConfig, ResetType, SessionConfig

logger = logging.getLogger("parley.gateway.resets")

DEFAULT_TIMEZONE = "UTC"
_LOCALTIME_PATH = "/etc/localtime"
# Enough days to step over any real transition, a skipped calendar day included
# (Pacific/Apia skipped 2011-12-30).
_MAX_DAY_STEPS = 6
_ONE_SECOND = timedelta(seconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

StaleKind = Literal["daily", "idle"]


@dataclass(frozen=True, slots=True)
class StaleReason:
    """Why a session is stale, and the instant (UTC) it became so."""

    reason: StaleKind
    expired_at: datetime


def resolve_reset_policy(config: SessionConfig, channel: str, chat_type: ResetType) -> ResetConfig:
    """The policy for a session: channel entry, else chat-type entry, else the default."""
    by_channel = config.reset_by_channel.get(channel.lower())
    if by_channel is not None:
        return by_channel
    return config.reset_by_type.get(chat_type, config.reset)


def resolve_timezone(name: str | None) -> ZoneInfo:
    """The configured zone, else the host's (``$TZ``, then /etc/localtime), else UTC.

    Reads zone files: call it once at startup, not per message on the event loop.
    """
    if name:
        return ZoneInfo(name)
    env = os.environ.get("TZ", "").removeprefix(":")
    if env:
        zone = _zone_from_env(env)
        if zone is not None:
            return zone
    try:
        with open(_LOCALTIME_PATH, "rb") as handle:
            return ZoneInfo.from_file(handle, key="localtime")
    except (OSError, ValueError):
        logger.warning(
            "cannot tell the host's time zone; daily resets use UTC (set session.timezone)"
        )
        return ZoneInfo(DEFAULT_TIMEZONE)


def _zone_from_env(value: str) -> ZoneInfo | None:
    try:
        if os.path.isabs(value):
            with open(value, "rb") as handle:
                return ZoneInfo.from_file(handle, key=value)
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, OSError, ValueError):
        # A POSIX rule string such as "CET-1CEST"; fall back to the system zone file.
        return None


def _require_aware(**values: datetime) -> None:
    for name, value in values.items():
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{name} must be timezone-aware, got {value!r}")


def _seconds(instant: datetime) -> int:
    return (instant - _EPOCH) // _ONE_SECOND


def _boundary_on(day: date, at_hour: int, tz: ZoneInfo) -> datetime:
    """The instant (UTC) of ``at_hour:00`` on ``day`` in ``tz``, by the module's DST rules."""
    wall = datetime(day.year, day.month, day.day, at_hour, tzinfo=tz)  # fold=0: first
    instant = wall.astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) == wall.replace(tzinfo=None):
        return instant
    # In a gap, fold=0 maps with the offset before the transition and fold=1 with the
    # one after; the transition lies between the two readings. Zone files keep
    # transitions in whole seconds, so a search over seconds finds it exactly.
    other = wall.replace(fold=1).astimezone(UTC)
    early, late = min(instant, other), max(instant, other)
    after_offset = late.astimezone(tz).utcoffset()
    lo, hi = _seconds(early), _seconds(late)  # offset(lo) differs, offset(hi) matches
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (_EPOCH + timedelta(seconds=mid)).astimezone(tz).utcoffset() == after_offset:
            hi = mid
        else:
            lo = mid
    return _EPOCH + timedelta(seconds=hi)


def daily_boundary(now: datetime, at_hour: int, tz: ZoneInfo) -> datetime:
    """The most recent daily reset instant (UTC) not after ``now``."""
    _require_aware(now=now)
    # Start a day ahead: after a fall-back across midnight, today's wall date can lag.
    day = now.astimezone(tz).date() + timedelta(days=1)
    for _ in range(_MAX_DAY_STEPS):
        boundary = _boundary_on(day, at_hour, tz)
        if boundary <= now:
            return boundary
        day -= timedelta(days=1)
    raise AssertionError(f"no daily boundary found before {now.isoformat()} in {tz}")


def next_daily_boundary(after: datetime, at_hour: int, tz: ZoneInfo) -> datetime:
    """The first daily reset instant (UTC) strictly after ``after``."""
    _require_aware(after=after)
    day = after.astimezone(tz).date() - timedelta(days=2)
    for _ in range(_MAX_DAY_STEPS):
        boundary = _boundary_on(day, at_hour, tz)
        if boundary > after:
            return boundary
        day += timedelta(days=1)
    raise AssertionError(f"no daily boundary found after {after.isoformat()} in {tz}")


def is_stale(
    updated_at: datetime, now: datetime, policy: ResetConfig, tz: ZoneInfo
) -> StaleReason | None:
    """Whether a session last active at ``updated_at`` must start afresh at ``now``.

    daily: stale when ``updated_at`` is before the most recent boundary not after
    ``now``. idle: stale when ``now > updated_at + idle_minutes``. both: whichever
    expired first (daily on a tie). off: never.
    """
    _require_aware(updated_at=updated_at, now=now)
    if policy.mode == "off":
        return None
    found: list[StaleReason] = []
    if policy.mode in ("daily", "both"):
        boundary = daily_boundary(now, policy.at_hour, tz)
        if updated_at < boundary:
            expired = next_daily_boundary(updated_at, policy.at_hour, tz)
            found.append(StaleReason("daily", expired))
    # idle_minutes 0 means "never" (validation keeps it out of idle/both anyway).
    if policy.mode in ("idle", "both") and policy.idle_minutes > 0:
        # Elapsed time, so add in UTC: adding to a zoned datetime adds wall time.
        deadline = updated_at.astimezone(UTC) + timedelta(minutes=policy.idle_minutes)
        if now > deadline:
            found.append(StaleReason("idle", deadline))
    return min(found, key=lambda reason: reason.expired_at) if found else None


def should_reset(
    updated_at: datetime,
    now: datetime,
    policy: ResetConfig,
    tz: ZoneInfo,
    *,
    automated: bool,
) -> StaleReason | None:
    """``is_stale`` for a message from a person; automated events never reset."""
    if automated:
        return None
    return is_stale(updated_at, now, policy, tz)
