"""`parley doctor --fix`: state written by earlier parleys (tests/gateway/fixtures/state)
is backed up byte for byte, migrated, and then opens with today's code."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from parley.core.memory import rows as memory_rows
from parley.core.memory import store as memory_store
from parley.core.memory.sources import AGENT_SCOPE
from parley.core.transcript_store import FileTranscriptStore
from parley.gateway.cli.doctor_checks import Finding, run_doctor
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.home_upgrade.state import BACKUPS_DIR, StateMigrationError, migrate, survey
from parley.gateway.memory import build_memory_index, memory_db_path
from parley.gateway.storage.sqlite.database import SCHEMA_VERSION, Database
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from parley.gateway.storage.sqlite.pairing import SqlitePairingStore
from parley.gateway.storage.sqlite.session_registry import SqliteSessionRegistry

FIXTURES = Path(__file__).parent.parent / "fixtures" / "state"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
KEYS = {"agent:main:telegram:default:direct:alice", "agent:main:discord:group:9001"}


def config(home: Path) -> LoadedConfig:
    return load_config(
        env={
            "PARLEY_HOME": str(home),
            # Keyword-only, as the fixtures were built: no model to load.
            "PARLEY_MEMORY__EMBEDDER__PROVIDER": "none",
            "PARLEY_MEMORY__SYNC__WATCH": "false",
            "PARLEY_MEMORY__SYNC__ON_START": "false",
        }
    )


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (but backups) by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and BACKUPS_DIR not in p.relative_to(root).parts
    }


@pytest.fixture(params=NAMES)
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    target = tmp_path / "home"
    shutil.copytree(FIXTURES / request.param, target)
    return target


def test_every_fixture_is_out_of_date(home: Path) -> None:
    # A fixture that is already current would test nothing.
    assert survey(config(home)).steps


async def test_fixture_migrates_and_opens_with_todays_code(home: Path) -> None:
    loaded = config(home)
    original = snapshot(home)
    had_pairing = _has_table(loaded.state_db, "pairing")
    had_memory = memory_db_path(loaded).exists()

    report = await migrate(loaded)

    assert report.backup is not None and report.backup.parent == home / BACKUPS_DIR
    assert snapshot(report.backup) == original
    assert report.done
    assert not survey(loaded).steps

    async with Database(loaded.state_db) as db:
        version = await db.run(lambda: db.conn.execute("PRAGMA user_version").fetchone()[0])
        assert version == SCHEMA_VERSION
        sessions = await SqliteSessionRegistry(db).list(limit=10)
        assert {s.key for s in sessions.sessions} == KEYS
        assert await SqliteInbox(db).counts() == {"received": 2}
        if had_pairing:
            pending = await SqlitePairingStore(db).list("pending")
            assert [(r.channel, r.sender_id) for r in pending] == [("telegram", "bob")]

    store = FileTranscriptStore(loaded.sessions_dir)
    infos = store.list_transcripts()
    assert len(infos) == 2
    for info in infos:
        with store.open(info.session_id, read_only=True) as transcript:
            assert transcript.load_report.clean
            roles = [e.message.role for e in transcript.entries() if e.type == "message"]
            assert roles == ["user", "assistant"]

    if had_memory:
        await _assert_memory_current(loaded)


async def _assert_memory_current(loaded: LoadedConfig) -> None:
    path = memory_db_path(loaded)
    with sqlite3.connect(path) as conn:
        layout = conn.execute("PRAGMA user_version").fetchone()[0]
        meta = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'index'").fetchone()[0])
    assert layout == getattr(memory_store, "STORE_VERSION", 1) or (
        layout == 0 and not hasattr(memory_store, "STORE_VERSION")
    )
    assert meta["schema"] == memory_rows.SCHEMA_VERSION
    index = build_memory_index(loaded)
    await index.open()
    try:
        result = await index.search("BLUEHERON", scopes=(AGENT_SCOPE,))
    finally:
        await index.close()
    assert any("BLUEHERON" in hit.snippet for hit in result.hits)


async def test_a_second_fix_does_nothing(home: Path) -> None:
    loaded = config(home)
    await migrate(loaded)
    migrated = snapshot(home)
    backups = sorted((home / BACKUPS_DIR).iterdir())

    again = await migrate(loaded)

    assert again.backup is None and again.done == ()
    assert snapshot(home) == migrated
    assert sorted((home / BACKUPS_DIR).iterdir()) == backups
    fix = [f for f in await _doctor(loaded, fix=True) if f.check == "fix"]
    assert fix == [Finding("fix", "ok", "nothing to migrate: the state is current")]


async def test_doctor_without_fix_reports_and_changes_nothing(home: Path) -> None:
    loaded = config(home)
    before = _all_files(home)

    findings = await _doctor(loaded)

    assert _all_files(home) == before  # no new file (not even a -wal or -shm) either
    migration = [f for f in findings if f.check == "migration"]
    assert [f.severity for f in migration] == ["warning"]
    assert "parley doctor --fix" in migration[0].detail
    skipped = {f.check for f in findings if f.detail == "not checked: see migration"}
    assert "state.db" in skipped and "pairing" in skipped


async def test_doctor_fix_migrates_and_reports_the_backup(home: Path) -> None:
    findings = await _doctor(config(home), fix=True)

    fix = next(f for f in findings if f.check == "fix")
    assert fix.severity == "ok" and str(home / BACKUPS_DIR) in fix.detail
    assert [f.severity for f in findings if f.check in ("migration", "state.db")] == ["ok"] * 2


@pytest.mark.parametrize("what", ["state.db", "memory.db"])
async def test_a_newer_schema_is_refused(tmp_path: Path, what: str) -> None:
    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "state1-memory1-f1b1eb4", home)
    loaded = config(home)
    if what == "state.db":
        _set_user_version(loaded.state_db, SCHEMA_VERSION + 1)
    else:
        newer = getattr(memory_store, "STORE_VERSION", 1) + 1
        _set_user_version(memory_db_path(loaded), newer)
    before = snapshot(home)

    with pytest.raises(StateMigrationError, match=rf"{what}: .* newer than this parley's"):
        await migrate(loaded)

    assert snapshot(home) == before
    assert not (home / BACKUPS_DIR).exists()
    findings = await _doctor(loaded)
    assert any(f.check == "migration" and f.severity == "error" for f in findings)


async def test_a_failed_backup_touches_nothing(home: Path) -> None:
    loaded = config(home)
    (home / BACKUPS_DIR).write_text("not a directory")  # the destination is unusable
    before = snapshot(home)

    with pytest.raises(StateMigrationError, match="nothing was migrated"):
        await migrate(loaded)

    assert snapshot(home) == before
    assert survey(loaded).steps  # still to do


async def test_a_backup_failing_midway_leaves_no_partial_copy(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = config(home)
    before = snapshot(home)
    calls = 0

    def failing_fsync(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr("parley.gateway.home_upgrade.state.os.fsync", failing_fsync)

    with pytest.raises(StateMigrationError, match="Input/output error"):
        await migrate(loaded)

    assert snapshot(home) == before
    assert list((home / BACKUPS_DIR).iterdir()) == []


async def test_a_kill_after_the_backup_is_finished_by_the_next_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "state1-memory1-f1b1eb4", home)
    loaded = config(home)
    original = snapshot(home)

    async def killed(*args: object, **kwargs: object) -> None:
        raise asyncio.CancelledError  # the process dies before memory.db is upgraded

    monkeypatch.setattr("parley.gateway.home_upgrade.state._open_memory", killed)
    with pytest.raises(asyncio.CancelledError):
        await migrate(loaded)
    monkeypatch.undo()

    (first,) = (home / BACKUPS_DIR).iterdir()
    assert snapshot(first) == original
    assert [s.kind for s in survey(loaded).steps] == ["memory-store", "memory-schema"]
    report = await migrate(loaded)
    assert report.done and not survey(loaded).steps


async def _doctor(loaded: LoadedConfig, *, fix: bool = False) -> list[Finding]:
    """The doctor's findings, the provider and channel probes (network) left out."""
    import parley.gateway.cli.doctor_checks as doctor

    async def no_probe(*args: object) -> Finding:
        return Finding("provider", "ok", "not probed")

    async def no_channels(*args: object) -> list[Finding]:
        return []

    saved = doctor._check_provider, doctor._check_channels
    doctor._check_provider, doctor._check_channels = no_probe, no_channels
    try:
        return await run_doctor(loaded, fix=fix)
    finally:
        doctor._check_provider, doctor._check_channels = saved


def _all_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _has_table(path: Path, name: str) -> bool:
    with sqlite3.connect(f"{path.as_uri()}?immutable=1", uri=True) as conn:
        return bool(conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone())


def _set_user_version(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA user_version = {version}")
    finally:
        conn.close()
