"""A retention run on a real home, once per state backend (state.db and transcript files,
or a real PostgreSQL holding the registry, inbox and transcripts): by age, by the disk
cap (oldest archived first, never an active session), the run lock, and the CLI
(`parley maintenance [--dry-run]`, `parley sessions`, `parley doctor`)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from parley.core.messages import Message, TextBlock
from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.cli.main import main
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.errors import RetentionBusy
from parley.gateway.retention.run import plan_run, run_lock, run_retention
from parley.gateway.storage.sessions import REMOVED_SETTING, SessionOrigin
from parley.gateway.storage.stores import StateStores
from tests.gateway.memory_helpers import restored_logging

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SECRET = "the words of a person nobody else may read"


@pytest.fixture(autouse=True)
def keep_logging() -> AsyncIterator[None]:  # type: ignore[misc]
    with restored_logging():
        yield


@pytest.fixture(params=["sqlite", "postgres"])
def env(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    values = {"PARLEY_HOME": str(tmp_path / "home"), "PARLEY_MEMORY__ENABLED": "false"}
    if request.param == "postgres":
        values["PARLEY_STORAGE__BACKEND"] = "postgres"
        values["PARLEY_STORAGE__URL"] = request.getfixturevalue("pg_url")
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def _loaded(env: dict[str, str], **more: str) -> LoadedConfig:
    loaded = load_config(env={**env, **more})
    loaded.sessions_dir.mkdir(parents=True, exist_ok=True)
    return loaded


async def _session(
    state: StateStores, name: str, *, archived_days: int | None, size: int = 1
) -> str:
    origin = SessionOrigin(
        f"agent:main:test:direct:{name}", "main", "test", "default", "direct", name
    )
    record = await state.registry.create(origin, now=NOW - timedelta(days=400))

    def write() -> None:
        with state.transcripts.create(record.session_id, origin.key) as transcript:
            for _ in range(size):
                transcript.append_message(Message("user", (TextBlock(SECRET + " " * 2000),)))

    await asyncio.to_thread(write)
    if archived_days is not None:
        await state.registry.archive(
            record.session_id, "reset", now=NOW - timedelta(days=archived_days)
        )
    return record.session_id


def _checkpoint(loaded: LoadedConfig, session_id: str) -> Path:
    folder = loaded.sessions_dir / "checkpoints" / session_id
    folder.mkdir(parents=True)
    (folder / "20260101T000000Z-threshold.jsonl").write_bytes(b"x" * 3000)
    return folder


async def test_by_age_on_either_backend(env: dict[str, str]) -> None:
    loaded = _loaded(env)
    async with StateStores(loaded) as state:
        old = await _session(state, "old", archived_days=120)
        young = await _session(state, "young", archived_days=30)
        active = await _session(state, "active", archived_days=None)
        folder = _checkpoint(loaded, old)

        dry = await run_retention(loaded, state, now=NOW, dry_run=True)
        assert [t.session_id for t in dry.plan.transcripts] == [old]
        assert dry.plan.transcripts[0].bytes > 2000
        assert await asyncio.to_thread(state.transcripts.exists, old)  # dry: nothing goes

        report = await run_retention(loaded, state, now=NOW)
        assert [t.session_id for t in report.plan.transcripts] == [old]
        exists = state.transcripts.exists
        assert not await asyncio.to_thread(exists, old) and not folder.exists()
        assert await asyncio.to_thread(exists, young) and await asyncio.to_thread(exists, active)
        record = await state.registry.get(old)
        assert record is not None and record.settings[REMOVED_SETTING] == NOW.isoformat()
        again = await plan_run(loaded, state, now=NOW + timedelta(days=1))
        assert again.transcripts == []

    # The CLI lists it, shows why its transcript is gone, and says so on export.
    out = await asyncio.to_thread(_cli, ["sessions", "show", old])
    assert out[0] == EXIT_OK and "removed by retention on 2026-06-01" in out[1]
    listing = await asyncio.to_thread(_cli, ["sessions", "list"])
    assert "removed by retention" in listing[1]
    exported = await asyncio.to_thread(_cli, ["sessions", "export", old])
    assert exported[0] == EXIT_PROBLEM and "removed by retention" in exported[2]


async def test_the_disk_cap_removes_the_oldest_archived_first(env: dict[str, str]) -> None:
    loaded = _loaded(
        env,
        PARLEY_RETENTION__ARCHIVED_TRANSCRIPTS_DAYS="0",
        PARLEY_RETENTION__MEDIA_DAYS="0",
    )
    async with StateStores(loaded) as state:
        oldest = await _session(state, "a", archived_days=50, size=200)
        middle = await _session(state, "b", archived_days=40, size=200)
        newest = await _session(state, "c", archived_days=10, size=200)
        active = await _session(state, "d", archived_days=None, size=600)  # ~1.3 MB
        media = loaded.home / "media" / "m.bin"
        media.parent.mkdir()
        media.write_bytes(b"m" * 200_000)
        stamp = (NOW - timedelta(days=45)).timestamp()
        os.utime(media, (stamp, stamp))
        plan = await plan_run(loaded, state, now=NOW)
        assert plan.transcripts == [] and plan.media == []  # no cap, no age: keep all
        sizes = await plan_run(
            _loaded(env, PARLEY_RETENTION__ARCHIVED_TRANSCRIPTS_DAYS="1"), state, now=NOW
        )
        oldest_bytes = sizes.transcripts[0].bytes
    # Measured with state.db closed, as the run below measures it with its own open.
    home = _home_bytes(loaded)
    if "PARLEY_STORAGE__BACKEND" in env:
        # The cap counts the home: PostgreSQL's transcripts are not in it, only media is.
        assert home < oldest_bytes
        capped = _loaded(env, PARLEY_RETENTION__DISK_CAP="1MiB", PARLEY_RETENTION__MEDIA_DAYS="0")
        media.write_bytes(b"m" * 2_000_000)
        async with StateStores(capped) as state:
            report = await run_retention(capped, state, now=NOW)
            assert report.plan.transcripts == [] and [m.path for m in report.plan.media] == [media]
            assert not report.plan.cap_unmet and not media.exists()
        return

    # A cap the home is over by more than the oldest transcript: the oldest archived data
    # goes (the transcript archived 50 days ago, then the media file from 45 days ago),
    # and no more once under the low-water mark (the one from 40 days ago stays).
    cap = home - oldest_bytes - 100_000
    capped = _loaded(
        env,
        PARLEY_RETENTION__ARCHIVED_TRANSCRIPTS_DAYS="0",
        PARLEY_RETENTION__MEDIA_DAYS="0",
        PARLEY_RETENTION__DISK_CAP=str(cap),
        PARLEY_RETENTION__LOW_WATER_PERCENT="100",
    )
    async with StateStores(capped) as state:
        report = await run_retention(capped, state, now=NOW)
        assert [t.session_id for t in report.plan.transcripts] == [oldest]
        assert all(t.reason == "cap" for t in report.plan.transcripts)
        assert [m.path for m in report.plan.media] == [media]
        assert not report.plan.cap_unmet
        exists = state.transcripts.exists
        for kept in (middle, newest, active):
            assert await asyncio.to_thread(exists, kept)
        assert not await asyncio.to_thread(exists, oldest) and not media.exists()

    # A cap that only active data could meet: everything archived goes, the active
    # session stays, and the run says the cap is unmet.
    tiny = _loaded(env, PARLEY_RETENTION__DISK_CAP="1MiB", PARLEY_RETENTION__MEDIA_DAYS="0")
    async with StateStores(tiny) as state:
        # A delivered row 10 days old: inside inbox_days (30), past the dedupe window (7).
        row = await _delivered_row(state, "m1", days=10)
        fresh = await _delivered_row(state, "m2", days=2)
        report = await run_retention(tiny, state, now=NOW)
        assert report.plan.inbox_for_cap and report.plan.inbox.rows == 1
        assert await state.inbox.get(row) is None and await state.inbox.get(fresh) is not None
        assert "down to the dedupe window" in "\n".join(report.lines())
        assert [t.session_id for t in report.plan.transcripts] == [middle, newest]
        assert report.plan.cap_unmet
        assert "cannot bring the home under the cap" in "\n".join(report.lines())
        assert await asyncio.to_thread(state.transcripts.exists, active)


async def _delivered_row(state: StateStores, mid: str, *, days: int) -> int:
    from parley.channels.base import InboundMessage

    message = InboundMessage("test", "default", "direct", "x", "x", "X", "hi", mid, NOW)
    item = (await state.inbox.record(message)).item
    await state.inbox.mark_delivered([item.id])
    stamp = (NOW - timedelta(days=days)).isoformat()
    db = state.sqlite
    assert db is not None
    await db.run(
        lambda: db.conn.execute("UPDATE inbox SET updated_at = ? WHERE id = ?", (stamp, item.id))
    )
    return item.id


def _home_bytes(loaded: LoadedConfig) -> int:
    return sum(p.stat().st_size for p in loaded.home.rglob("*") if p.is_file())


async def test_one_run_at_a_time(env: dict[str, str]) -> None:
    loaded = _loaded(env)
    async with StateStores(loaded) as state, run_lock(loaded):
        with pytest.raises(RetentionBusy):
            await run_retention(loaded, state, now=NOW)


async def test_parley_maintenance_prints_counts_and_bytes_never_words(
    env: dict[str, str],
) -> None:
    loaded = _loaded(env)
    async with StateStores(loaded) as state:
        old = await _session(state, "old", archived_days=120)
        await _session(state, "active", archived_days=None)
    code, out, _ = await asyncio.to_thread(_cli, ["maintenance", "--dry-run"])
    assert code == EXIT_OK
    assert "retention (dry run)" in out and "WOULD REMOVE" in out
    assert old in out and SECRET not in out
    line = next(x for x in out.splitlines() if x.startswith("archived transcripts"))
    assert line.split()[2] == "1"
    async with StateStores(loaded) as state:
        assert await asyncio.to_thread(state.transcripts.exists, old)
    code, out, _ = await asyncio.to_thread(_cli, ["maintenance"])
    assert code == EXIT_OK and "REMOVED" in out and SECRET not in out
    async with StateStores(loaded) as state:
        assert not await asyncio.to_thread(state.transcripts.exists, old)


def _cli(argv: list[str]) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def test_doctor_shows_disk_use_per_kind_and_the_last_run(env: dict[str, str]) -> None:
    from parley.gateway.cli.doctor_checks import run_doctor

    loaded = _loaded(env, PARLEY_RETENTION__DISK_CAP="1MiB")
    async with StateStores(loaded) as state:
        await _session(state, "old", archived_days=120)
        young = await _session(state, "young", archived_days=10, size=300)
        await _session(state, "active", archived_days=None, size=600)
        _checkpoint(loaded, young)
    found = {f.check: f for f in await run_doctor(loaded)}
    disk, retention = found["disk"], found["retention"]
    assert "last run: never" in retention.detail and "disk cap 1.0 MiB" in retention.detail
    if "PARLEY_STORAGE__BACKEND" in env:
        assert "in PostgreSQL: " in disk.detail and "transcript_lines " in disk.detail
    else:
        assert "active transcripts 1.3 MiB (1 file)" in disk.detail
        assert "archived transcripts 650.5 KiB (2 files)" in disk.detail
        assert "checkpoints 2.9 KiB" in disk.detail and "state db " in disk.detail
        assert retention.severity == "warning" and "over the cap" in retention.detail
    async with StateStores(loaded) as state:
        await run_retention(loaded, state, now=NOW)
    found = {f.check: f for f in await run_doctor(loaded)}
    # By age, the one archived 120 days ago; on SQLite the cap takes the other too.
    removed = 1 if "PARLEY_STORAGE__BACKEND" in env else 2
    assert f"removed {removed} transcript(s)" in found["retention"].detail
    if "PARLEY_STORAGE__BACKEND" not in env:
        # The active session alone is over the cap: the doctor says so.
        assert "could not meet the cap" in found["retention"].detail
        assert "archived transcripts 0 B (0 files)" in found["disk"].detail


async def test_no_transcript_goes_when_its_chunks_cannot_be_kept(env: dict[str, str]) -> None:
    """Memory on, chunks to be kept, and no index to tell: removing the transcript would
    lose its chunks at the next sync, so it stays (and the run says why)."""
    loaded = _loaded(env, PARLEY_MEMORY__ENABLED="true")
    async with StateStores(loaded) as state:
        old = await _session(state, "old", archived_days=120)
        report = await run_retention(loaded, state, now=NOW, memory=None)
        assert report.plan.transcripts == [] and report.errors
        assert "could not be opened" in report.errors[0]
        assert await asyncio.to_thread(state.transcripts.exists, old)


async def test_a_transcript_that_cannot_go_is_reported_and_the_rest_go(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from parley.gateway.retention import run as run_module

    loaded = _loaded(env)
    async with StateStores(loaded) as state:
        stuck = await _session(state, "stuck", archived_days=200)
        goes = await _session(state, "goes", archived_days=150)
        original = run_module._remove_files

        def remove(loaded: LoadedConfig, store: object, session_id: str) -> None:
            if session_id == stuck:
                raise PermissionError("read-only file system")
            original(loaded, store, session_id)  # type: ignore[arg-type]

        monkeypatch.setattr(run_module, "_remove_files", remove)
        report = await run_retention(loaded, state, now=NOW)
        assert [t.session_id for t in report.plan.transcripts] == [goes]
        assert report.errors == [f"session {stuck}: read-only file system"]
        assert await asyncio.to_thread(state.transcripts.exists, stuck)
        record = await state.registry.get(stuck)
        assert record is not None and REMOVED_SETTING not in record.settings
        # The next run tries it again.
        monkeypatch.setattr(run_module, "_remove_files", original)
        again = await run_retention(loaded, state, now=NOW)
        assert [t.session_id for t in again.plan.transcripts] == [stuck] and not again.errors
