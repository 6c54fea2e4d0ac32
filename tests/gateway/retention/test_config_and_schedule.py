"""The ``[retention]`` section (sizes, validation, environment overrides) and the daily
schedule of the gateway's run (a fake clock and a fake sleep: no waiting)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from parley.gateway.config import effective_config_toml, load_config
from parley.gateway.errors import ConfigFileError
from parley.gateway.retention.run import RunReport, run_lock
from parley.gateway.retention.service import CATCH_UP_DELAY_SECONDS, RetentionService, next_run
from parley.gateway.retention_config import RetentionConfig, format_bytes, parse_size

# The state of a SQLite gateway as far as the service itself goes (the runs are faked).
SQLITE_STATE = SimpleNamespace(pg=None)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("20GiB", 20 * 1024**3),
        ("500 MB", 500 * 1000**2),
        ("1.5G", 1_500_000_000),
        ("64mib", 64 * 1024**2),
        (4096, 4096),
        ("4096", 4096),
    ],
)
def test_sizes_parse(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["20 parsecs", "-1GB", "GiB", True, -5, 1.5])
def test_a_bad_size_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_defaults_are_sensible_and_documented() -> None:
    r = RetentionConfig()
    assert (r.archived_transcripts_days, r.inbox_days, r.media_days) == (90, 30, 90)
    assert r.archived_memory == "keep" and r.cap_bytes is None and r.enabled
    assert "disk cap off" in r.describe()
    example = Path(__file__).parents[3] / "config" / "parley.example.toml"
    text = example.read_text(encoding="utf-8")
    assert "[retention]" in text
    for name in RetentionConfig.model_fields:
        assert f"{name} =" in text, f"{name} is not documented in parley.example.toml"


def test_environment_overrides_and_show() -> None:
    loaded = load_config(
        env={
            "PARLEY_RETENTION__DISK_CAP": "20GiB",
            "PARLEY_RETENTION__ARCHIVED_MEMORY": "drop",
            "PARLEY_RETENTION__MEDIA_DAYS": "0",
        }
    )
    r = loaded.config.retention
    assert r.cap_bytes == 20 * 1024**3 and r.archived_memory == "drop" and r.media_days == 0
    assert "media forever" in r.describe() and "20.0 GiB" in r.describe()
    assert "disk_cap = 21474836480" in effective_config_toml(loaded.config)
    assert load_config(env={"PARLEY_RETENTION__DISK_CAP": "off"}).config.retention.cap_bytes is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PARLEY_RETENTION__DISK_CAP": "lots"}, "retention.disk_cap"),
        ({"PARLEY_RETENTION__DISK_CAP": "100KB"}, "under 1 MiB"),
        ({"PARLEY_RETENTION__ARCHIVED_MEMORY": "forget"}, "retention.archived_memory"),
        ({"PARLEY_RETENTION__MEDIA_DAYS": "-1"}, "retention.media_days"),
        (
            {
                "PARLEY_RETENTION__LOW_WATER_PERCENT": "95",
                "PARLEY_RETENTION__HIGH_WATER_PERCENT": "90",
            },
            "must not be above",
        ),
        ({"PARLEY_RETENTION__KEEP": "1"}, "retention.keep"),
    ],
)
def test_bad_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigFileError, match=message):
        load_config(env=env)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (12, 2048, 3 * 1024**2, 5 * 1024**4)] == [
        "12 B",
        "2.0 KiB",
        "3.0 MiB",
        "5120.0 GiB",
    ]


def test_next_run_is_the_next_hour_strictly_after_now() -> None:
    at = datetime(2026, 3, 1, 2, 59, tzinfo=UTC)
    assert next_run(at, 3) == datetime(2026, 3, 1, 3, 0, tzinfo=UTC)
    assert next_run(at.replace(hour=3, minute=0), 3) == datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
    assert next_run(at.replace(hour=20), 3) == datetime(2026, 3, 2, 3, 0, tzinfo=UTC)


async def test_the_service_runs_daily_and_a_failure_waits_for_the_next_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_config(env={"PARLEY_HOME": str(tmp_path)})
    now = [datetime(2026, 3, 1, 12, 0, tzinfo=UTC)]
    slept: list[float] = []
    runs: list[datetime] = []
    done = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += timedelta(seconds=seconds)
        if len(slept) == 4:
            done.set()
            await asyncio.Event().wait()  # parked until stopped

    async def run(*args: object, now: datetime, **kwargs: object) -> RunReport:
        runs.append(now)
        if len(runs) == 1:
            raise OSError("the disk is full")
        raise RuntimeError("stop here")  # only its timing matters

    monkeypatch.setattr("parley.gateway.retention.service.run_daily", run)
    # A run an hour ago: the next one waits for the scheduled hour.
    (tmp_path / "retention.json").write_text(
        json.dumps({"finished_at": (now[0] - timedelta(hours=1)).isoformat()})
    )
    service = RetentionService(
        loaded,
        SQLITE_STATE,
        clock=lambda: now[0],
        memory=lambda: None,
        sleep=sleep,  # type: ignore[arg-type]
    )
    service.start()
    await done.wait()
    await service.stop()
    day = timedelta(days=1)
    first = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
    assert runs == [first, first + day, first + 2 * day]
    assert slept[0] == 15 * 3600 and slept[1:] == [86400.0] * 3
    assert service.failures == 3


@pytest.mark.parametrize("last", [None, {"finished_at": "2026-02-27T03:00:00+00:00"}, {}])
async def test_a_gateway_started_long_after_the_last_run_runs_soon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, last: dict[str, str] | None
) -> None:
    loaded = load_config(env={"PARLEY_HOME": str(tmp_path)})
    if last is not None:
        (tmp_path / "retention.json").write_text(json.dumps(last))
    slept: list[float] = []
    parked = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        parked.set()
        await asyncio.Event().wait()

    service = RetentionService(
        loaded,
        SQLITE_STATE,  # type: ignore[arg-type]
        clock=lambda: datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        memory=lambda: None,
        sleep=sleep,
    )
    service.start()
    await parked.wait()
    await service.stop()
    assert slept == [CATCH_UP_DELAY_SECONDS]


def test_the_service_does_not_start_when_disabled(tmp_path: Path) -> None:
    loaded = load_config(env={"PARLEY_HOME": str(tmp_path), "PARLEY_RETENTION__ENABLED": "false"})
    service = RetentionService(
        loaded, SQLITE_STATE, clock=lambda: datetime.now(UTC), memory=lambda: None
    )  # type: ignore[arg-type]
    service.start()
    assert service._task is None


async def test_the_daily_run_skips_quietly_while_an_operator_runs_maintenance(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loaded = load_config(env={"PARLEY_HOME": str(tmp_path)})
    service = RetentionService(
        loaded,
        SQLITE_STATE,  # type: ignore[arg-type]
        clock=lambda: datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        memory=lambda: None,
    )
    async with run_lock(loaded):  # `parley maintenance` on this home, under way
        with caplog.at_level("INFO", logger="parley"):
            assert await service.run_once() is None
    assert service.failures == 0 and service.last_report is None
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert any("skipped" in r.getMessage() for r in caplog.records)
