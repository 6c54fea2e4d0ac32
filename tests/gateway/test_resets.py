"""Reset policy: config validation, precedence, each mode, DST days, triggers."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time, timedelta
from importlib import resources
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from parley.gateway.runtime import resets
from parley.gateway.runtime.resets import (
    StaleReason,
    daily_boundary,
    is_stale,
    next_daily_boundary,
    resolve_reset_policy,
    resolve_timezone,
    should_reset,
)
from parley.gateway.session_config import ResetConfig, SessionConfig

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
KOLKATA = ZoneInfo("Asia/Kolkata")
ZONES = [BERLIN, NEW_YORK, LORD_HOWE, KOLKATA, ZoneInfo("UTC")]
DAILY_4 = ResetConfig()
TICK = timedelta(microseconds=1)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def local(tz: ZoneInfo, *parts: int, fold: int = 0) -> datetime:
    return datetime(*parts, tzinfo=tz, fold=fold)


# --- config ------------------------------------------------------------------------


def test_reset_defaults_follow_upstream() -> None:
    assert (DAILY_4.mode, DAILY_4.at_hour, DAILY_4.idle_minutes) == ("daily", 4, 0)
    assert SessionConfig().reset_triggers == ["/new", "/reset"]


@pytest.mark.parametrize("mode", ["idle", "both"])
def test_idle_modes_need_minutes(mode: str) -> None:
    with pytest.raises(ValidationError, match="idle_minutes > 0"):
        ResetConfig(mode=mode)
    assert ResetConfig(mode=mode, idle_minutes=30).idle_minutes == 30


@pytest.mark.parametrize(
    "fields",
    [
        {"at_hour": 24},
        {"at_hour": -1},
        {"idle_minutes": -5},
        {"mode": "weekly"},
        {"atHour": 3},
        {"idle_minutes": 10**12},
    ],
)
def test_reset_config_rejects(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ResetConfig(**fields)  # type: ignore[arg-type]


def test_reset_config_is_frozen() -> None:
    with pytest.raises(ValidationError):
        DAILY_4.at_hour = 5  # type: ignore[misc]


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../../etc/passwd", "", "Europe"])
def test_unknown_time_zone_is_refused(zone: str) -> None:
    with pytest.raises(ValidationError, match="time zone"):
        SessionConfig(timezone=zone)


def test_known_time_zone_and_clean_triggers() -> None:
    config = SessionConfig(timezone="Australia/Lord_Howe", reset_triggers=[" /New "])
    assert config.timezone == "Australia/Lord_Howe"
    assert config.reset_triggers == ["/New"]
    with pytest.raises(ValidationError, match="empty trigger"):
        SessionConfig(reset_triggers=["/new", " "])


def test_reset_by_channel_names_are_lowercased_and_unique() -> None:
    config = SessionConfig(reset_by_channel={"Discord": {"mode": "off"}})
    assert list(config.reset_by_channel) == ["discord"]
    with pytest.raises(ValidationError, match="twice"):
        SessionConfig(reset_by_channel={"discord": {"mode": "off"}, "DISCORD": {"mode": "off"}})


def test_reset_by_type_only_knows_chat_types() -> None:
    with pytest.raises(ValidationError):
        SessionConfig(reset_by_type={"dm": {"mode": "off"}})  # type: ignore[dict-item]


# --- precedence --------------------------------------------------------------------

PRECEDENCE = SessionConfig(
    reset=ResetConfig(at_hour=6),
    reset_by_type={
        "group": ResetConfig(mode="idle", idle_minutes=120),
        "thread": ResetConfig(mode="off"),
    },
    reset_by_channel={"discord": ResetConfig(mode="off"), "web": ResetConfig(at_hour=1)},
)


@pytest.mark.parametrize(
    ("channel", "chat_type", "expected"),
    [
        ("telegram", "direct", ResetConfig(at_hour=6)),
        ("telegram", "group", ResetConfig(mode="idle", idle_minutes=120)),
        ("telegram", "thread", ResetConfig(mode="off")),
        ("discord", "group", ResetConfig(mode="off")),
        ("Discord", "direct", ResetConfig(mode="off")),
        # The channel entry replaces everything, also the type entry for threads.
        ("web", "thread", ResetConfig(at_hour=1)),
        ("web", "group", ResetConfig(at_hour=1)),
    ],
)
def test_policy_precedence(channel: str, chat_type: str, expected: ResetConfig) -> None:
    assert resolve_reset_policy(PRECEDENCE, channel, chat_type) == expected  # type: ignore[arg-type]


def test_default_policy_when_nothing_specific() -> None:
    assert resolve_reset_policy(SessionConfig(), "telegram", "group") == ResetConfig()


# --- modes -------------------------------------------------------------------------


def test_daily_resets_at_the_hour_and_not_before() -> None:
    updated = local(BERLIN, 2026, 6, 10, 3, 59)
    boundary = local(BERLIN, 2026, 6, 10, 4)
    assert is_stale(updated, boundary - TICK, DAILY_4, BERLIN) is None
    assert is_stale(updated, boundary, DAILY_4, BERLIN) == StaleReason("daily", boundary)
    # Active exactly at the boundary belongs to the new day.
    assert is_stale(boundary, boundary + timedelta(hours=23), DAILY_4, BERLIN) is None


def test_daily_session_lives_until_the_next_boundary() -> None:
    updated = local(BERLIN, 2026, 6, 9, 5)
    assert is_stale(updated, local(BERLIN, 2026, 6, 10, 3, 59), DAILY_4, BERLIN) is None
    stale = is_stale(updated, local(BERLIN, 2026, 6, 12, 9), DAILY_4, BERLIN)
    # Stale since the first boundary it missed, not the latest.
    assert stale == StaleReason("daily", local(BERLIN, 2026, 6, 10, 4).astimezone(UTC))


def test_daily_uses_the_zone_not_utc() -> None:
    # 04:00 in Kolkata is 22:30 UTC the day before.
    updated = utc(2026, 6, 9, 22, 29)
    assert is_stale(updated, utc(2026, 6, 9, 22, 30), DAILY_4, KOLKATA) is not None
    assert is_stale(updated, utc(2026, 6, 10, 3, 59), DAILY_4, ZoneInfo("UTC")) is None


def test_idle_edges_are_exact() -> None:
    policy = ResetConfig(mode="idle", idle_minutes=30)
    updated = utc(2026, 6, 10, 12)
    deadline = updated + timedelta(minutes=30)
    assert is_stale(updated, deadline, policy, BERLIN) is None
    assert is_stale(updated, deadline + TICK, policy, BERLIN) == StaleReason("idle", deadline)
    # Idle alone ignores the daily hour.
    assert is_stale(updated, utc(2026, 6, 10, 12, 29), policy, BERLIN) is None


def test_idle_counts_elapsed_time_across_fall_back() -> None:
    # 02:50 CEST, then clocks go back at 03:00 CEST: 20 real minutes later is 02:10 CET.
    updated = local(BERLIN, 2026, 10, 25, 2, 50)
    policy = ResetConfig(mode="idle", idle_minutes=20)
    deadline = utc(2026, 10, 25, 1, 10)
    assert is_stale(updated, deadline, policy, BERLIN) is None
    assert is_stale(updated, deadline + TICK, policy, BERLIN) == StaleReason("idle", deadline)


@pytest.mark.parametrize(
    ("updated", "idle", "now", "expected"),
    [
        # idle first, before the daily hour is reached
        ((3, 0), 10, (3, 20), ("idle", (3, 10))),
        # both expired; the daily boundary came first
        ((3, 55), 60, (5, 30), ("daily", (4, 0))),
        # both expired; idle came first
        ((2, 0), 30, (5, 0), ("idle", (2, 30))),
        # a tie goes to daily
        ((3, 30), 30, (4, 1), ("daily", (4, 0))),
        ((4, 0), 30, (4, 30), None),
    ],
)
def test_both_reports_whichever_expired_first(
    updated: tuple[int, int],
    idle: int,
    now: tuple[int, int],
    expected: tuple[str, tuple[int, int]] | None,
) -> None:
    policy = ResetConfig(mode="both", idle_minutes=idle)
    result = is_stale(
        local(BERLIN, 2026, 6, 10, *updated), local(BERLIN, 2026, 6, 10, *now), policy, BERLIN
    )
    if expected is None:
        assert result is None
    else:
        reason, at = expected
        assert result == StaleReason(reason, local(BERLIN, 2026, 6, 10, *at))  # type: ignore[arg-type]


def test_off_never_resets() -> None:
    off = ResetConfig(mode="off")
    assert is_stale(utc(2020, 1, 1), utc(2026, 1, 1), off, BERLIN) is None


def test_a_future_update_is_not_stale() -> None:
    # Clock skew between hosts must not reset a session that was just written.
    assert is_stale(utc(2026, 6, 10, 5), utc(2026, 6, 10, 4, 30), DAILY_4, ZoneInfo("UTC")) is None


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        is_stale(datetime(2026, 1, 1), utc(2026, 1, 2), DAILY_4, BERLIN)
    with pytest.raises(ValueError, match="timezone-aware"):
        daily_boundary(datetime(2026, 1, 1), 4, BERLIN)


def test_automated_events_never_reset() -> None:
    updated, now = utc(2026, 1, 1), utc(2026, 1, 5)
    assert should_reset(updated, now, DAILY_4, BERLIN, automated=True) is None
    assert should_reset(updated, now, DAILY_4, BERLIN, automated=False) is not None


# --- DST days ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "day", "at_hour", "expected_utc"),
    [
        # 02:00 does not exist: the boundary is the end of the gap, 03:00 CEST.
        (BERLIN, date(2026, 3, 29), 2, utc(2026, 3, 29, 1)),
        # 02:00 happens twice: the first, 02:00 CEST.
        (BERLIN, date(2026, 10, 25), 2, utc(2026, 10, 25, 0)),
        (NEW_YORK, date(2026, 3, 8), 2, utc(2026, 3, 8, 7)),
        (NEW_YORK, date(2026, 11, 1), 1, utc(2026, 11, 1, 5)),
        # Lord Howe moves by 30 minutes: 02:00 is in the gap, which ends at 02:30 +11.
        (LORD_HOWE, date(2026, 10, 4), 2, utc(2026, 10, 3, 15, 30)),
        # ... and repeats 01:30-02:00 in April: 01:00 happens once.
        (LORD_HOWE, date(2026, 4, 5), 1, utc(2026, 4, 4, 14)),
        (KOLKATA, date(2026, 3, 29), 4, utc(2026, 3, 28, 22, 30)),
        # Samoa skipped 2011-12-30 entirely: that day's boundary is the jump itself.
        (ZoneInfo("Pacific/Apia"), date(2011, 12, 30), 4, utc(2011, 12, 30, 10)),
    ],
)
def test_boundary_on_transition_days(
    tz: ZoneInfo, day: date, at_hour: int, expected_utc: datetime
) -> None:
    assert daily_boundary(expected_utc, at_hour, tz) == expected_utc
    assert daily_boundary(expected_utc - TICK, at_hour, tz) < expected_utc
    assert next_daily_boundary(expected_utc - TICK, at_hour, tz) == expected_utc
    updated = expected_utc - timedelta(seconds=1)
    assert is_stale(updated, expected_utc - TICK, ResetConfig(at_hour=at_hour), tz) is None
    assert is_stale(updated, expected_utc, ResetConfig(at_hour=at_hour), tz) == StaleReason(
        "daily", expected_utc
    )
    assert expected_utc.astimezone(tz).date() in (day, day + timedelta(days=1))


def test_no_second_reset_in_the_repeated_hour() -> None:
    policy = ResetConfig(at_hour=2)
    # Active at 02:30 CEST; an hour later it is 02:30 CET, the second 02:00 has passed.
    updated = local(BERLIN, 2026, 10, 25, 2, 30)
    later = local(BERLIN, 2026, 10, 25, 2, 30, fold=1)
    assert later - updated == timedelta(0)  # same wall time: Python compares naively here
    assert later.astimezone(UTC) - updated.astimezone(UTC) == timedelta(hours=1)
    assert is_stale(updated, later, policy, BERLIN) is None


def test_fall_back_across_midnight() -> None:
    # Until 2010 Goose Bay fell back at 00:01 ADT to 23:01 AST of the day before:
    # 00:00 on Oct 29 happened at 03:00 UTC, then the wall clock read Oct 28 again.
    goose_bay = ZoneInfo("America/Goose_Bay")
    policy = ResetConfig(at_hour=0)
    first_midnight = utc(2006, 10, 29, 3)
    now = utc(2006, 10, 29, 3, 30)
    assert now.astimezone(goose_bay).date() == date(2006, 10, 28)
    assert daily_boundary(now, 0, goose_bay) == first_midnight
    assert is_stale(first_midnight - TICK, now, policy, goose_bay) == StaleReason(
        "daily", first_midnight
    )
    # The second 00:00 (04:00 UTC) is not another reset.
    assert is_stale(now, utc(2006, 10, 29, 4, 30), policy, goose_bay) is None


# --- property tests ----------------------------------------------------------------

GRID = timedelta(minutes=15)


def _transitions(tz: ZoneInfo) -> list[datetime]:
    found = []
    step = timedelta(hours=1)
    instant = utc(2024, 1, 1)
    previous = instant.astimezone(tz).utcoffset()
    while instant < utc(2028, 1, 1):
        instant += step
        offset = instant.astimezone(tz).utcoffset()
        if offset != previous:
            found.append(instant)
            previous = offset
    return found


TRANSITIONS = {tz.key: _transitions(tz) for tz in ZONES}


def _wall(instant: datetime, tz: ZoneInfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def oracle_boundary(now: datetime, at_hour: int, tz: ZoneInfo) -> datetime:
    """The latest instant <= now at which the wall clock first reached at_hour:00 of
    some date, found by walking a 15-minute UTC grid (every offset and transition in
    ZONES is a multiple of 15 minutes, so the true instant lies on the grid)."""
    end = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    instant = end - timedelta(hours=32)
    first_crossing: dict[date, datetime] = {}
    while instant <= end:
        before, after = _wall(instant - GRID, tz), _wall(instant, tz)
        for day in {before.date(), after.date()}:
            mark = datetime.combine(day, time(at_hour))
            if before < mark <= after:
                first_crossing.setdefault(day, instant)
        instant += GRID
    return max(first_crossing.values())


@st.composite
def zoned_instants(draw: st.DrawFn) -> tuple[ZoneInfo, datetime]:
    tz = draw(st.sampled_from(ZONES))
    transitions = TRANSITIONS[tz.key]
    if transitions and draw(st.booleans()):
        anchor = draw(st.sampled_from(transitions))
        offset = draw(st.integers(-30 * 3600 * 10**6, 30 * 3600 * 10**6))
        return tz, anchor + timedelta(microseconds=offset)
    moment = draw(st.datetimes(datetime(2000, 1, 1), datetime(2035, 1, 1)))
    return tz, moment.replace(tzinfo=UTC)


def test_the_property_zones_do_have_transitions() -> None:
    # Guards the strategy: without transitions the DST branch would test nothing.
    assert len(TRANSITIONS["Europe/Berlin"]) == 8
    assert len(TRANSITIONS["Australia/Lord_Howe"]) == 8
    assert TRANSITIONS["Asia/Kolkata"] == TRANSITIONS["UTC"] == []


@settings(max_examples=250, deadline=None)
@given(zoned=zoned_instants(), at_hour=st.integers(0, 23))
def test_daily_boundary_properties(zoned: tuple[ZoneInfo, datetime], at_hour: int) -> None:
    tz, now = zoned
    boundary = daily_boundary(now, at_hour, tz)
    assert boundary <= now
    assert now - boundary <= timedelta(hours=25)
    assert boundary == oracle_boundary(now, at_hour, tz)
    # The boundary is its own most recent boundary, and the one before it is earlier.
    assert daily_boundary(boundary, at_hour, tz) == boundary
    assert next_daily_boundary(boundary - TICK, at_hour, tz) == boundary
    following = next_daily_boundary(boundary, at_hour, tz)
    assert boundary < following and following > now
    assert timedelta(hours=22) <= following - boundary <= timedelta(hours=26)
    # A session updated just before the boundary is fresh until it and stale from it.
    policy = ResetConfig(at_hour=at_hour)
    just_before = boundary - TICK
    assert is_stale(just_before, just_before, policy, tz) is None
    assert is_stale(just_before, boundary, policy, tz) == StaleReason("daily", boundary)
    assert is_stale(boundary, now, policy, tz) is None


@settings(max_examples=200, deadline=None)
@given(
    updated=st.datetimes(
        datetime(2000, 1, 1), datetime(2035, 1, 1), timezones=st.sampled_from(ZONES)
    ),
    idle_minutes=st.integers(1, 60 * 24 * 30),
    extra=st.integers(-(10**9), 10**9),
)
def test_idle_is_stale_exactly_when_elapsed_time_exceeds_the_window(
    updated: datetime, idle_minutes: int, extra: int
) -> None:
    policy = ResetConfig(mode="idle", idle_minutes=idle_minutes)
    deadline = updated.astimezone(UTC) + timedelta(minutes=idle_minutes)
    assert is_stale(updated, deadline, policy, BERLIN) is None
    assert is_stale(updated, deadline + TICK, policy, BERLIN) == StaleReason("idle", deadline)
    now = deadline + timedelta(microseconds=extra)
    result = is_stale(updated, now, policy, BERLIN)
    assert (result is not None) == (extra > 0)


# --- time zone resolution ----------------------------------------------------------


def test_resolve_timezone_prefers_the_configured_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    assert resolve_timezone("Europe/Berlin").key == "Europe/Berlin"
    assert resolve_timezone(None).key == "Asia/Kolkata"
    monkeypatch.setenv("TZ", ":America/New_York")
    assert resolve_timezone(None).key == "America/New_York"


def test_resolve_timezone_reads_the_host_zone_file(monkeypatch: pytest.MonkeyPatch) -> None:
    zone_file = resources.files("tzdata.zoneinfo").joinpath("Australia", "Lord_Howe")
    with resources.as_file(zone_file) as path:
        monkeypatch.setenv("TZ", "CET-1CEST")  # a POSIX rule, not a zone name
        monkeypatch.setattr(resets, "_LOCALTIME_PATH", str(path))
        zone = resolve_timezone(None)
        monkeypatch.setenv("TZ", str(path))
        from_env_path = resolve_timezone(None)
    summer = utc(2026, 1, 1)
    assert zone.utcoffset(summer) == from_env_path.utcoffset(summer) == timedelta(hours=11)


def test_resolve_timezone_falls_back_to_utc_loudly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("TZ", raising=False)
    monkeypatch.setattr(resets, "_LOCALTIME_PATH", "/nonexistent/parley/localtime")
    # Attach directly: the "parley" logger tree may not propagate to the root.
    logger = logging.getLogger("parley.gateway.resets")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            assert resolve_timezone(None).key == "UTC"
    finally:
        logger.removeHandler(caplog.handler)
    assert "session.timezone" in caplog.text
