"""Retention with several replicas on one real PostgreSQL: each replica has a home of its
own (two configs here), all share the database. One run at a time across them (the
database's run lock), the daily run of the others skips quietly, a day one replica did
is not planned again by the next, and `parley maintenance` says the database is busy.
The runs meet at events, never at sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from parley.core.messages import Message, TextBlock
from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.cli.main import main
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.errors import RetentionBusy
from parley.gateway.retention import run as run_module
from parley.gateway.retention.run import RunReport, read_last_run, run_daily, run_retention
from parley.gateway.retention.service import CATCH_UP_DELAY_SECONDS, RetentionService
from parley.gateway.retention.usage import disk_findings
from parley.gateway.storage.postgres.retention_runs import hold_run_lock
from parley.gateway.storage.sessions import SessionOrigin
from parley.gateway.storage.stores import StateStores
from tests.gateway.memory_helpers import restored_logging

# Three in the morning, the daily hour (run_hour_utc's default), and a run a minute later.
DAY = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
LOGGER = "parley.gateway.retention"


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    with restored_logging():
        yield


def _replica(tmp_path: Path, pg_url: str, name: str) -> LoadedConfig:
    """A replica's config: a home of its own, the shared database."""
    env = {
        "PARLEY_HOME": str(tmp_path / name),
        "PARLEY_MEMORY__ENABLED": "false",
        "PARLEY_STORAGE__BACKEND": "postgres",
        "PARLEY_STORAGE__URL": pg_url,
    }
    loaded = load_config(env=env)
    loaded.sessions_dir.mkdir(parents=True, exist_ok=True)
    return loaded


async def _old_archived_session(state: StateStores, name: str) -> str:
    """A session archived 120 days before DAY (past the 90-day window), with a transcript."""
    origin = SessionOrigin(
        f"agent:main:test:direct:{name}", "main", "test", "default", "direct", name
    )
    record = await state.registry.create(origin, now=DAY - timedelta(days=400))

    def write() -> None:
        with state.transcripts.create(record.session_id, origin.key) as transcript:
            transcript.append_message(Message("user", (TextBlock("hello"),)))

    await asyncio.to_thread(write)
    await state.registry.archive(record.session_id, "reset", now=DAY - timedelta(days=120))
    return record.session_id


async def _old_delivered_row(state: StateStores) -> int:
    """A delivered inbox row finished 40 days before DAY (past inbox_days, 30)."""
    from parley.channels.base import InboundMessage

    message = InboundMessage("test", "default", "direct", "x", "x", "X", "hi", "m1", DAY)
    item = (await state.inbox.record(message)).item
    await state.inbox.mark_delivered([item.id])
    stamp = (DAY - timedelta(days=40)).isoformat()
    assert state.pg is not None
    await state.pg.run(
        lambda conn: conn.execute(
            "UPDATE inbox SET updated_at = %s WHERE id = %s", (stamp, item.id)
        )
    )
    return item.id


@dataclass
class Gate:
    """Each run that gets past its locks says so (``entered``, ``inside``: its home) and
    waits in its plan until ``release``: whoever is inside holds the lock meanwhile. A
    second run getting inside sets ``release`` itself (the lock failed: both go on, and
    the test sees two runs rather than hanging)."""

    inside: list[str] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


def _gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    original = run_module.plan_run

    async def plan_run(loaded: LoadedConfig, state: Any, *, now: datetime) -> Any:
        gate.inside.append(loaded.home.name)
        gate.entered.set()
        if len(gate.inside) == 2:
            gate.release.set()
        await gate.release.wait()
        return await original(loaded, state, now=now)

    monkeypatch.setattr(run_module, "plan_run", plan_run)
    return gate


async def test_two_replicas_at_once_one_does_the_work(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _replica(tmp_path, pg_url, "a"), _replica(tmp_path, pg_url, "b")
    async with StateStores(a) as state_a, StateStores(b) as state_b:
        old = await _old_archived_session(state_a, "old")
        row = await _old_delivered_row(state_a)
        gate = _gate(monkeypatch)

        async def attempt(loaded: LoadedConfig, state: StateStores) -> RunReport | RetentionBusy:
            try:
                return await run_retention(loaded, state, now=DAY)
            except RetentionBusy as exc:
                gate.release.set()  # the other run may go on now that this one has tried
                return exc

        # Both start together; each home's own lock is free, so only the database's
        # lock can keep them apart.
        results = await asyncio.gather(attempt(a, state_a), attempt(b, state_b))

        reports = [r for r in results if isinstance(r, RunReport)]
        busy = [r for r in results if isinstance(r, RetentionBusy)]
        assert len(gate.inside) == 1 and len(reports) == 1 and len(busy) == 1, results
        assert busy[0].shared and "shared database" in str(busy[0])
        # The one run removed everything, and is the only one to say so.
        report = reports[0]
        assert [t.session_id for t in report.plan.transcripts] == [old]
        assert report.plan.inbox.rows == 1 and not report.errors
        assert not await asyncio.to_thread(state_a.transcripts.exists, old)
        assert await state_a.inbox.get(row) is None
        winner = a if gate.inside == ["a"] else b
        loser = b if winner is a else a
        assert read_last_run(winner) is not None and read_last_run(loser) is None


async def test_parley_maintenance_says_the_database_is_busy(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _replica(tmp_path, pg_url, "a"), _replica(tmp_path, pg_url, "b")
    async with StateStores(a) as state_a:
        old = await _old_archived_session(state_a, "old")
        assert state_a.pg is not None
        # Replica a's run holds the database's lock; the CLI runs on replica b's home.
        monkeypatch.setenv("PARLEY_HOME", str(b.home))
        monkeypatch.setenv("PARLEY_MEMORY__ENABLED", "false")
        monkeypatch.setenv("PARLEY_STORAGE__BACKEND", "postgres")
        monkeypatch.setenv("PARLEY_STORAGE__URL", pg_url)
        async with hold_run_lock(state_a.pg):
            code, out, err = await asyncio.to_thread(_cli, ["maintenance"])
            assert code == EXIT_PROBLEM and out == ""
            assert "another retention run is under way on the shared database" in err
            assert state_a.pg.where in err
            dry = await asyncio.to_thread(_cli, ["maintenance", "--dry-run"])
            assert dry[0] == EXIT_PROBLEM  # a plan beside a run would be stale at once
        assert await asyncio.to_thread(state_a.transcripts.exists, old)
        # Free again: the same command does the work.
        code, out, err = await asyncio.to_thread(_cli, ["maintenance"])
        assert code == EXIT_OK and old in out, err
        assert not await asyncio.to_thread(state_a.transcripts.exists, old)


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def test_a_cancelled_run_lets_go_of_the_lock(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway stopped mid-run (the service's task cancelled) closes its lock
    connection: another replica's run goes at once."""
    a, b = _replica(tmp_path, pg_url, "a"), _replica(tmp_path, pg_url, "b")
    async with StateStores(a) as state_a, StateStores(b) as state_b:
        old = await _old_archived_session(state_a, "old")
        gate = _gate(monkeypatch)
        running = asyncio.create_task(run_retention(a, state_a, now=DAY))
        await gate.entered.wait()
        with pytest.raises(RetentionBusy):
            await run_retention(b, state_b, now=DAY)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert await asyncio.to_thread(state_a.transcripts.exists, old)  # stopped before
        gate.release.set()  # plans no longer wait
        report = await run_retention(b, state_b, now=DAY)
        assert [t.session_id for t in report.plan.transcripts] == [old]


def _service(loaded: LoadedConfig, state: StateStores, now: list[datetime]) -> RetentionService:
    return RetentionService(loaded, state, clock=lambda: now[0], memory=lambda: None)


async def test_the_daily_run_skips_quietly_while_another_replica_runs(
    tmp_path: Path, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = _replica(tmp_path, pg_url, "a"), _replica(tmp_path, pg_url, "b")
    async with StateStores(a) as state_a, StateStores(b) as state_b:
        old = await _old_archived_session(state_a, "old")
        service = _service(b, state_b, [DAY])
        assert state_a.pg is not None
        with caplog.at_level(logging.INFO, logger=LOGGER):
            async with hold_run_lock(state_a.pg):  # replica a's daily run, under way
                assert await service.run_once() is None
        assert service.failures == 0 and service.last_report is None
        skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == 1 and skipped[0].levelno == logging.INFO
        assert "shared database" in skipped[0].getMessage() and not skipped[0].exc_info
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert await asyncio.to_thread(state_b.transcripts.exists, old)
        # Tried again next time: the lock is free, and no run is recorded for the day.
        report = await service.run_once()
        assert report is not None and [t.session_id for t in report.plan.transcripts] == [old]


async def test_a_day_one_replica_did_is_not_planned_again(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = _replica(tmp_path, pg_url, "a"), _replica(tmp_path, pg_url, "b")
    plans: list[str] = []
    original = run_module.plan_run

    async def counted(loaded: LoadedConfig, state: Any, *, now: datetime) -> Any:
        plans.append(loaded.home.name)
        return await original(loaded, state, now=now)

    monkeypatch.setattr(run_module, "plan_run", counted)
    async with StateStores(a) as state_a, StateStores(b) as state_b:
        old = await _old_archived_session(state_a, "old")
        a_now, b_now = [DAY + timedelta(seconds=5)], [DAY + timedelta(minutes=1)]
        report = await _service(a, state_a, a_now).run_once()
        assert report is not None and [t.session_id for t in report.plan.transcripts] == [old]
        # Replica b's timer fires after a's run ended (its clock a minute on): no plan.
        service_b = _service(b, state_b, b_now)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert await service_b.run_once() is None
        assert plans == ["a"] and service_b.failures == 0
        assert "skipped, the shared database records a run at 2026-06-01 03:00:05" in caplog.text
        # The doctor on b's home shows a's run, though b never ran one.
        assert read_last_run(b) is None
        found = {f.check: f for f in await disk_findings(b, state_b.pg)}
        assert (
            "last run: 2026-06-01 03:00 UTC, removed 1 transcript(s)" in found["retention"].detail
        )
        # A new day is a new run, whichever replica's timer fires first.
        fresh = await _old_archived_session(state_a, "fresh")
        b_now[0] = DAY + timedelta(days=1)
        again = await service_b.run_once()
        assert plans == ["a", "b"] and again is not None
        assert [t.session_id for t in again.plan.transcripts] == [fresh]
        # `parley maintenance` (run_retention) runs whatever the record says.
        plans.clear()
        await run_retention(a, state_a, now=DAY + timedelta(days=1, minutes=2))
        assert plans == ["a"]


async def test_a_replica_started_after_another_ran_does_not_catch_up(
    tmp_path: Path, pg_url: str
) -> None:
    """The catch-up run (a start long after the last run) goes by the shared record: a
    replica with a fresh home, started after another replica's run, waits for the hour."""
    a, b = _replica(tmp_path, pg_url, "a"), _replica(tmp_path, pg_url, "b")
    async with StateStores(a) as state_a, StateStores(b) as state_b:
        await run_retention(a, state_a, now=DAY)
        waits = await _first_wait(b, state_b, DAY + timedelta(hours=9))
        assert waits == [15 * 3600.0]  # tomorrow's 03:00, not CATCH_UP_DELAY_SECONDS
        # With no run recorded anywhere in the last day, it does catch up.
        waits = await _first_wait(b, state_b, DAY + timedelta(days=1, hours=9))
        assert waits == [CATCH_UP_DELAY_SECONDS]


async def _first_wait(loaded: LoadedConfig, state: StateStores, now: datetime) -> list[float]:
    slept: list[float] = []
    parked = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        parked.set()
        await asyncio.Event().wait()

    service = RetentionService(loaded, state, clock=lambda: now, memory=lambda: None, sleep=sleep)
    service.start()
    await parked.wait()
    await service.stop()
    return slept


async def test_on_sqlite_every_daily_run_runs(tmp_path: Path) -> None:
    """No shared database, no skipping: two daily runs on one day both run (as always)."""
    loaded = load_config(env={"PARLEY_HOME": str(tmp_path), "PARLEY_MEMORY__ENABLED": "false"})
    async with StateStores(loaded) as state:
        first = await run_daily(loaded, state, now=DAY, unless_ran_since=DAY)
        later = DAY + timedelta(minutes=1)
        second = await run_daily(loaded, state, now=later, unless_ran_since=DAY)
        assert first is not None and second is not None
        assert read_last_run(loaded) == second.to_record()
