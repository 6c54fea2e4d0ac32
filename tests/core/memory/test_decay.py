from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.core.memory.decay import (
    DEFAULT_HALF_LIFE_DAYS,
    chunk_age_days,
    decay_multiplier,
    is_evergreen,
    memory_file_date,
)

NOW = datetime(2024, 4, 4, tzinfo=UTC)


def _days_before_now(days: float) -> float:
    return (NOW - timedelta(days=days)).timestamp()


# --- multiplier -----------------------------------------------------------------------------


def test_multiplier_is_exactly_half_at_the_half_life() -> None:
    assert DEFAULT_HALF_LIFE_DAYS == 30
    assert decay_multiplier(30) == 0.5
    # exp(-ln2 / h * h) misses 0.5 by an ulp for some h (5.5, 11, 21, ...); these must not.
    for half_life in (7, 5.5, 11, 21, 22):
        assert decay_multiplier(half_life, half_life_days=half_life) == 0.5
    assert decay_multiplier(60) == 0.25
    assert decay_multiplier(0) == 1.0


def test_multiplier_matches_the_exponential_form() -> None:
    for age in (0.5, 3.0, 45.0, 400.0):
        assert decay_multiplier(age) == pytest.approx(math.exp(-math.log(2) / 30 * age))


def test_future_and_unknown_ages_do_not_decay() -> None:
    assert decay_multiplier(-5) == 1.0
    assert decay_multiplier(math.nan) == 1.0


def test_a_non_positive_half_life_disables_decay() -> None:
    for half_life in (0.0, -30.0, math.nan, math.inf):
        assert decay_multiplier(90, half_life_days=half_life) == 1.0


@given(
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0, max_value=1e6),
    st.floats(min_value=0.01, max_value=1e4),
)
def test_older_never_scores_higher(a: float, b: float, half_life: float) -> None:
    younger, older = min(a, b), max(a, b)
    assert 0.0 <= decay_multiplier(older, half_life) <= decay_multiplier(younger, half_life) <= 1


# --- dates in memory file names -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("memory/2024-03-05.md", date(2024, 3, 5)),
        ("memory/2024-03-05-standup-notes.md", date(2024, 3, 5)),
        ("memory/2024/03/2024-03-05.md", date(2024, 3, 5)),
        ("./memory/2024-03-05.md", date(2024, 3, 5)),
        ("memory\\2024-03-05.md", date(2024, 3, 5)),
        ("memory/2024-03-05.MD", date(2024, 3, 5)),
        ("memory/2023-02-30.md", None),
        ("memory/2024-13-01.md", None),
        ("memory/2024-03-051.md", None),
        ("memory/2024-03-05.txt", None),
        ("memory/notes-2024-03-05.md", None),
        ("memory/cats.md", None),
        ("notes/2024-03-05.md", None),
        ("2024-03-05.md", None),
        ("MEMORY.md", None),
    ],
)
def test_memory_file_date(path: str, expected: date | None) -> None:
    assert memory_file_date(path) == expected


# --- evergreen files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("MEMORY.md", "memory", True),
        ("memory.md", "memory", True),
        ("./MEMORY.md", "memory", True),
        ("memory/people.md", "memory", True),
        ("memory/projects/parley.md", "memory", True),
        ("memory/2024-03-05.md", "memory", False),
        ("memory/2024-03-05-standup.md", "memory", False),
        ("docs/MEMORY.md", "memory", False),
        ("notes/ideas.md", "memory", False),
        ("sessions/abc.jsonl", "sessions", False),
        ("MEMORY.md", "sessions", False),
    ],
)
def test_is_evergreen(path: str, source: str, expected: bool) -> None:
    assert is_evergreen(path, source) is expected


# --- chunk age ------------------------------------------------------------------------------


def _age(
    path: str,
    source: str = "memory",
    chunk_ts: str | None = None,
    file_mtime: float | None = None,
    now: datetime = NOW,
) -> float | None:
    return chunk_age_days(
        path=path, source=source, chunk_ts=chunk_ts, file_mtime=file_mtime, now=now
    )


def test_evergreen_files_have_no_age() -> None:
    assert _age("MEMORY.md", file_mtime=_days_before_now(400)) is None
    assert _age("memory/people.md", file_mtime=_days_before_now(400)) is None


def test_dated_memory_files_age_from_the_name_not_the_mtime() -> None:
    assert _age("memory/2024-03-05.md", file_mtime=NOW.timestamp()) == 30.0
    assert decay_multiplier(_age("memory/2024-03-05.md") or 0.0) == 0.5


def test_future_dates_count_as_age_zero() -> None:
    assert _age("memory/2024-05-01.md") == 0.0
    assert _age("notes/x.md", file_mtime=_days_before_now(-3)) == 0.0
    assert _age("sessions/a.jsonl", "sessions", chunk_ts="2030-01-01T00:00:00Z") == 0.0


def test_other_files_age_from_their_mtime() -> None:
    assert _age("notes/ideas.md", file_mtime=_days_before_now(12.5)) == pytest.approx(12.5)
    assert _age("notes/ideas.md") is None
    assert _age("notes/ideas.md", file_mtime=math.nan) is None


def test_transcript_chunks_age_from_their_own_timestamp() -> None:
    old_file = _days_before_now(1)
    assert _age("sessions/a.jsonl", "sessions", "2024-03-03T12:00:00Z", old_file) == 31.5
    assert _age("sessions/a.jsonl", "sessions", "2024-04-03T00:00:00+02:00", old_file) == (
        pytest.approx(1 + 2 / 24)
    )
    # A naive timestamp is UTC.
    assert _age("sessions/a.jsonl", "sessions", "2024-04-02T00:00:00", old_file) == 2.0


def test_transcript_chunks_without_a_usable_timestamp_fall_back_to_the_mtime() -> None:
    mtime = _days_before_now(3)
    assert _age("sessions/a.jsonl", "sessions", None, mtime) == pytest.approx(3)
    assert _age("sessions/a.jsonl", "sessions", "yesterday", mtime) == pytest.approx(3)
    assert _age("sessions/a.jsonl", "sessions", "not a time") is None


def test_only_transcripts_use_chunk_timestamps() -> None:
    mtime = _days_before_now(5)
    assert _age("notes/x.md", "memory", "2024-04-03T00:00:00Z", mtime) == pytest.approx(5)


@pytest.fixture
def far_from_utc() -> Iterator[None]:
    """The process time zone set to UTC-5, so that a naive time read as local time shows."""
    previous = os.environ.get("TZ")
    os.environ["TZ"] = "EST+05"
    time.tzset()
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = previous
        time.tzset()


@pytest.mark.usefixtures("far_from_utc")
def test_naive_times_are_utc_whatever_the_local_zone() -> None:
    old_file = _days_before_now(1)
    assert _age("sessions/a.jsonl", "sessions", "2024-04-02T00:00:00", old_file) == 2.0
    assert _age("memory/2024-03-05.md", now=NOW.replace(tzinfo=None)) == 30.0


def test_a_naive_now_is_utc() -> None:
    naive_now = NOW.replace(tzinfo=None)
    assert _age("memory/2024-03-05.md", now=naive_now) == 30.0
