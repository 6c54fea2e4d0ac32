"""`parley doctor --fix` moves memory from before audiences out of the agent-wide places:
flush blocks of `workspace/memory/*.md` to the private notes of the person or group
their session key names (headings without the key), the workspace's task logs to the
private task folder. Plain `parley doctor` only counts; the gateway's start warns."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.notes import NoteStore
from parley.core.memory.rows import SearchHit
from parley.core.memory.tasks import TaskRecord, scope_file_name
from parley.gateway.app import Gateway
from parley.gateway.audiences import PersonLinks, viewer_for
from parley.gateway.cli.doctor_checks import Finding, run_doctor
from parley.gateway.config import LoadedConfig
from parley.gateway.home_upgrade.audiences import log_legacy_memory, survey_audiences
from parley.gateway.home_upgrade.state import BACKUPS_DIR
from parley.gateway.memory import LEGACY_SHARED_TASKS_DIR, build_memory_index, notes_dir, tasks_dir
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import memory_config, use_hashing_embedder

ALICE_KEY = "agent:main:test:direct:alice"
BOB_KEY = "agent:main:test:direct:bob"
GROUP_KEY = "agent:main:test:group:g1"
ALICE_NOTE = "- Alice's ferret is called Pumpernickel and her locker code is 7491."
BOB_NOTE = "- Bob practises the bassoon every Thursday evening."
GROUP_NOTE = "- The group plans a picnic at the lake on Saturday."
LOOSE_NOTE = "- Someone mentioned the marmalade recipe from grandmother."
NO_KEY_NOTE = "- A note whose heading names no session: quince jelly."
OPERATOR = "# March the first\n\nThe spare keys hang in the blue cupboard by the door.\n"
CHECK = "memory audiences"


def legacy_block(time: str, key: str | None, text: str) -> str:
    """What core/flush.py wrote before audiences (13db957), key and all."""
    heading = f"## {time} — saved before compaction" + (f" ({key})" if key else "")
    return f"\n{heading}\n\n{text}\n"


@pytest.fixture
def loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LoadedConfig:
    use_hashing_embedder(monkeypatch)
    config = memory_config(tmp_path)
    memory = config.workspace / "memory"
    memory.mkdir(parents=True)
    (memory / "2026-03-01.md").write_text(
        OPERATOR
        + legacy_block("12:00", ALICE_KEY, ALICE_NOTE)
        + legacy_block("12:30", BOB_KEY, BOB_NOTE)
        + legacy_block("13:00", f"{GROUP_KEY}:thread:t1", GROUP_NOTE)
        + legacy_block("14:00", "not a session key", LOOSE_NOTE)
        + legacy_block("15:00", None, NO_KEY_NOTE),
        encoding="utf-8",
    )
    # A file of flushes only: nothing is left of it afterwards.
    (memory / "2026-03-02.md").write_text(
        legacy_block("09:15", f"{ALICE_KEY}:thread:7", "- Alice starts her new job in May."),
        encoding="utf-8",
    )
    # Task records of the PostgreSQL layout, readable by read_file until moved.
    legacy = config.workspace / LEGACY_SHARED_TASKS_DIR / "host-8080"
    legacy.mkdir(parents=True)
    record = TaskRecord(
        "rotate the backup keys", {"shell": 2}, "ok", (), datetime(2026, 3, 1, tzinfo=UTC), 3.0,
        scope="dm:test:direct:alice",
    )  # fmt: skip
    (legacy / scope_file_name(record.scope)).write_text(
        json.dumps(record.to_dict()) + "\n", encoding="utf-8"
    )
    return config


async def doctor(loaded: LoadedConfig, monkeypatch: pytest.MonkeyPatch, *, fix: bool = False):
    import parley.gateway.cli.doctor_checks as module

    async def no_probe(*args: object) -> Finding:
        return Finding("provider", "ok", "not probed")

    async def no_channels(*args: object) -> list[Finding]:
        return []

    monkeypatch.setattr(module, "_check_provider", no_probe)
    monkeypatch.setattr(module, "_check_channels", no_channels)
    return [f for f in await run_doctor(loaded, fix=fix) if f.check == CHECK]


async def search_as(loaded: LoadedConfig, viewer: Viewer, query: str) -> list[SearchHit]:
    index = build_memory_index(loaded)
    await index.open()
    try:
        await index.sync()
        scopes = await index.visible_scopes(viewer)
        return (await index.search(query, scopes=list(scopes), min_score=0.0)).hits
    finally:
        await index.close()


def person(loaded: LoadedConfig, person_id: str) -> Viewer:
    session = loaded.config.session
    return viewer_for(Audience.person(person_id), session, PersonLinks(session))


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def found(hits: list[SearchHit], text: str) -> bool:
    return any(text in hit.snippet for hit in hits)


async def test_doctor_reports_then_fix_moves_each_block_to_its_audience(
    loaded: LoadedConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = person(loaded, "test:alice"), person(loaded, "test:bob")
    # Before: the leak. Bob's search finds Alice's flush, agent-wide.
    assert found(await search_as(loaded, bob, "Pumpernickel ferret locker"), "Pumpernickel")

    before = files(loaded.home)
    reported = await doctor(loaded, monkeypatch)
    assert files(loaded.home) == before  # doctor without --fix writes nothing
    assert [f.severity for f in reported] == ["warning", "warning"]
    pending, stranded = (f.detail for f in reported)
    assert "4 flush block(s) in 2 file(s)" in pending
    assert "person test:alice: 2" in pending and "conversation test:g1: 1" in pending
    assert "1 task log(s)" in pending and "parley doctor --fix" in pending
    assert "2 flush block(s) cannot be attributed" in stranded
    assert "memory/2026-03-01.md line" in stranded and "'not a session key'" in stranded

    fixed = await doctor(loaded, monkeypatch, fix=True)
    assert [f.severity for f in fixed] == ["ok", "warning"], fixed
    done, stranded_after = (f.detail for f in fixed)
    assert "moved 4 flush block(s) to private notes" in done
    assert "removed emptied memory/2026-03-02.md" in done
    assert "moved 1 task log(s)" in done and "index: synced" in done
    (backup,) = (loaded.home / BACKUPS_DIR).iterdir()
    assert str(backup) in done
    assert (backup / "workspace/memory/2026-03-02.md").is_file()  # the backup came first
    assert stranded_after == stranded.replace("line 16", "line 4").replace("line 20", "line 8")

    # The operator's text and the unattributable blocks stay, nothing else.
    left = (loaded.workspace / "memory" / "2026-03-01.md").read_text(encoding="utf-8")
    assert left.startswith(OPERATOR)
    assert LOOSE_NOTE in left and NO_KEY_NOTE in left
    for note in (ALICE_NOTE, BOB_NOTE, GROUP_NOTE):
        assert note not in left
    assert not (loaded.workspace / "memory" / "2026-03-02.md").exists()

    # Each block in its audience's notes of the same day, the heading without the key.
    notes = NoteStore(notes_dir(loaded))
    day = {
        audience: (notes.folder(Audience.person(audience)) / "2026-03-01.md")
        for audience in ("test:alice", "test:bob")
    }
    alice_day = day["test:alice"].read_text(encoding="utf-8")
    assert alice_day == f"\n## 12:00 — saved before compaction\n\n{ALICE_NOTE}\n"
    assert "agent:main" not in alice_day
    alice_next = notes.folder(Audience.person("test:alice")) / "2026-03-02.md"
    assert "09:15 — saved before compaction\n\n- Alice starts her new job" in (
        alice_next.read_text(encoding="utf-8")
    )
    assert BOB_NOTE in day["test:bob"].read_text(encoding="utf-8")
    group = notes.folder(Audience.conversation("test:g1")) / "2026-03-01.md"
    assert group.read_text(encoding="utf-8") == (
        f"\n## 13:00 — saved before compaction\n\n{GROUP_NOTE}\n"
    )

    # The task log moved out of the workspace, same layout, the folder gone, and its
    # record filed under its person (Alice's own searches and /memory stats find it).
    assert "filed 1 task record(s) under their audience" in done
    assert not (loaded.workspace / ".parley").exists()
    moved = tasks_dir(loaded) / "host-8080" / scope_file_name("person:test:alice")
    assert "rotate the backup keys" in moved.read_text(encoding="utf-8")
    assert moved.stat().st_mode & 0o777 == 0o600
    assert not (tasks_dir(loaded) / "host-8080" / scope_file_name("dm:test:direct:alice")).exists()

    # Afterwards: Bob no longer finds Alice's notes; Alice does; each finds their own.
    bob_hits = await search_as(loaded, bob, "Pumpernickel ferret locker")
    assert not found(bob_hits, "Pumpernickel")
    alice_hits = await search_as(loaded, alice, "Pumpernickel ferret locker")
    assert found(alice_hits, "Pumpernickel")
    assert all(h.path.startswith("notes/") for h in alice_hits if "Pumpernickel" in h.snippet)
    assert found(await search_as(loaded, bob, "bassoon Thursday"), "bassoon")
    assert not found(await search_as(loaded, alice, "bassoon Thursday"), "bassoon")

    # A second --fix finds nothing to move: no backup, no change.
    before = files(loaded.home)
    again = await doctor(loaded, monkeypatch, fix=True)
    assert [f.severity for f in again] == ["warning"]  # only the stranded blocks, again
    assert files(loaded.home) == before
    assert len(list((loaded.home / BACKUPS_DIR).iterdir())) == 1


async def test_a_rerun_after_a_kill_does_not_duplicate_a_note(
    loaded: LoadedConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the notes were appended, before the workspace file was rewritten."""
    notes = NoteStore(notes_dir(loaded))
    when = datetime(2026, 3, 1, 12, 0)
    notes.append_flush(Audience.person("test:alice"), when, ALICE_NOTE)
    await doctor(loaded, monkeypatch, fix=True)
    text = (notes.folder(Audience.person("test:alice")) / "2026-03-01.md").read_text("utf-8")
    assert text.count(ALICE_NOTE) == 1


async def test_a_home_without_legacy_memory_is_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = memory_config(tmp_path)
    assert [(f.severity, f.detail) for f in await doctor(loaded, monkeypatch, fix=True)] == [
        ("ok", "no agent-wide flush notes or workspace task logs to migrate")
    ]
    assert not (tmp_path / BACKUPS_DIR).exists()


async def test_the_gateway_warns_at_start(
    loaded: LoadedConfig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="parley")
    channel = RecordingChannel()
    async with Gateway(loaded, channels=[channel], provider=ScriptedProvider()):
        pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    pending = [w for w in warnings if "memory from before audiences" in w]
    assert len(pending) == 1 and "parley doctor --fix" in pending[0]
    assert "4 flush block(s)" in pending[0] and "1 task log(s)" in pending[0]
    assert any("cannot be attributed" in w for w in warnings)
    assert not any("transcript_scope" in w for w in warnings)


def test_transcript_scope_agent_is_named_as_no_longer_honoured(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="parley")
    loaded = memory_config(tmp_path, PARLEY_MEMORY__TRANSCRIPT_SCOPE="agent")
    assert not survey_audiences(loaded).pending
    log_legacy_memory(loaded)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert 'transcript_scope = "agent" is no longer honoured' in warning
    assert 'dm_scope = "main"' in warning


async def test_a_task_log_already_in_the_private_folder_is_merged_older_first(
    loaded: LoadedConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = scope_file_name("dm:test:direct:alice")
    target = tasks_dir(loaded) / "host-8080" / name
    target.parent.mkdir(parents=True)
    target.write_text('{"newer": true}\n', encoding="utf-8")
    legacy = (loaded.workspace / LEGACY_SHARED_TASKS_DIR / "host-8080" / name).read_text("utf-8")
    await doctor(loaded, monkeypatch, fix=True)
    # Merged older first, then the record filed under its person; the line that is not
    # a record stays where it was.
    assert target.read_text(encoding="utf-8") == '{"newer": true}\n'
    alice = target.parent / scope_file_name("person:test:alice")
    [moved] = [json.loads(line) for line in alice.read_text(encoding="utf-8").splitlines()]
    assert moved == {**json.loads(legacy), "scope": "person:test:alice"}
    assert not (loaded.workspace / ".parley").exists()


def test_the_backup_keeps_files_outside_the_home_apart(tmp_path: Path) -> None:
    from parley.gateway.home_upgrade.state import backup

    home = tmp_path / "home"
    home.mkdir()
    outside = [tmp_path / "a" / "2026-03-01.md", tmp_path / "b" / "2026-03-01.md"]
    for n, path in enumerate(outside):
        path.parent.mkdir()
        path.write_text(f"copy {n}", encoding="utf-8")
    target = backup(home, tuple(outside))
    for n, path in enumerate(outside):
        copy = target / "external" / path.relative_to("/")
        assert copy.read_text(encoding="utf-8") == f"copy {n}"


def test_a_block_of_a_key_made_while_linked_is_the_linked_persons(tmp_path: Path) -> None:
    from parley.gateway.home_upgrade.audiences import blocks_in

    text = legacy_block("10:00", "agent:main:telegram:direct:alice", ALICE_NOTE)
    lines = text.splitlines(keepends=True)
    (linked,) = blocks_in(lines, tmp_path / "x.md", "memory/x.md", frozenset({"alice"}))
    assert linked.audience == Audience.person("alice")
    (raw,) = blocks_in(lines, tmp_path / "x.md", "memory/x.md")
    assert raw.audience == Audience.person("telegram:alice")
