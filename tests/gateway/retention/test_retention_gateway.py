"""Retention in the running gateway, end to end: real state.db, transcript files,
checkpoints, media files, memory.db (the deterministic embedder) and the gateway's
fake clock. An archived session past the window loses its transcript and checkpoints;
the active sessions keep theirs; the removed transcript's chunks stay searchable or
go, as configured; listings and the admin API say "removed by retention"."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from parley.core.memory.sources import AGENT_SCOPE
from parley.gateway.admin.schemas import TranscriptQuery
from parley.gateway.admin.service import AdminService
from parley.gateway.app import Gateway
from parley.gateway.errors import ApiError
from parley.gateway.retention.run import read_last_run
from parley.gateway.storage.sessions import REMOVED_SETTING, SessionRecord
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import Clock, memory_config, say, use_hashing_embedder

ALICE_KEY = "agent:main:test:direct:alice"
BOB_KEY = "agent:main:test:direct:bob"
ALICE_SCOPE = "person:test:alice"
FACT = "Remember this: my ferret is named Pumpernickel and hates thunderstorms."
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

Stack = tuple[Gateway, RecordingChannel, Clock]


async def _stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Gateway:
    use_hashing_embedder(monkeypatch)
    clock = Clock(START)
    config = memory_config(tmp_path, **env)
    return Gateway(config, channels=[RecordingChannel()], provider=ScriptedProvider(), clock=clock)


@pytest.fixture
async def keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    gateway = await _stack(tmp_path, monkeypatch)
    async with gateway:
        yield gateway, gateway.channels["test"], gateway.clock  # type: ignore[misc]


async def _archive_alice(gateway: Gateway, channel: RecordingChannel) -> SessionRecord:
    await say(gateway, channel, FACT, sender="alice")
    old = await gateway.registry.get_active(ALICE_KEY)
    assert old is not None
    await say(gateway, channel, "/new", sender="alice")
    await say(gateway, channel, "hello again", sender="alice")
    await say(gateway, channel, "hi, I am Bob", sender="bob")
    assert gateway.memory is not None
    await gateway.memory.sync()
    return old


def _checkpoint(home: Path, session_id: str) -> Path:
    folder = home / "sessions" / "checkpoints" / session_id
    folder.mkdir(parents=True)
    (folder / "20260301T120000Z-manual.jsonl").write_bytes(b"{}\n" * 100)
    return folder


async def _search(gateway: Gateway, query: str) -> list[str]:
    assert gateway.memory is not None
    result = await gateway.memory.search(query, scopes=(AGENT_SCOPE, ALICE_SCOPE))
    return [hit.path for hit in result.hits]


async def test_an_old_archived_session_goes_and_its_memory_stays(keep: Stack) -> None:
    gateway, channel, clock = keep
    home = gateway.loaded.home
    old = await _archive_alice(gateway, channel)
    old_file = home / "sessions" / f"{old.session_id}.jsonl"
    folder = _checkpoint(home, old.session_id)
    active = [await gateway.registry.get_active(k) for k in (ALICE_KEY, BOB_KEY)]
    assert all(r is not None for r in active)
    active_files = [home / "sessions" / f"{r.session_id}.jsonl" for r in active if r]
    assert old_file.exists() and all(f.exists() for f in active_files)
    assert f"sessions/{old.session_id}.jsonl" in await _search(gateway, "Pumpernickel ferret")

    clock.now = START + timedelta(days=89)  # inside the 90-day window: nothing goes
    report = await gateway.retention.run_once()
    assert report is not None and report.plan.transcripts == []
    assert old_file.exists()

    clock.now = START + timedelta(days=91)
    report = await gateway.retention.run_once()
    assert report is not None
    assert [t.session_id for t in report.plan.transcripts] == [old.session_id]
    assert not old_file.exists() and not folder.exists()
    assert all(f.exists() for f in active_files)  # the active sessions are untouched
    record = await gateway.registry.get(old.session_id)
    assert record is not None and record.settings[REMOVED_SETTING] == clock.now.isoformat()
    # Kept: a sync after the file went still finds what it said.
    await gateway.memory.sync()  # type: ignore[union-attr]
    assert f"sessions/{old.session_id}.jsonl" in await _search(gateway, "Pumpernickel ferret")
    last = read_last_run(gateway.loaded)
    assert last is not None and last["transcripts"] == 1 and last["checkpoint_files"] == 1
    # The output and the record hold ids and figures, never the words.
    assert "Pumpernickel" not in "\n".join(report.lines()) + str(last)

    # The admin side copes: the session still lists, its transcript says why it is gone.
    service = AdminService(gateway)
    detail = await service.session(old.session_id)
    assert detail.settings[REMOVED_SETTING]
    with pytest.raises(ApiError) as caught:
        await service.transcript(old.session_id, TranscriptQuery())
    assert caught.value.status == 410 and "removed by retention" in str(caught.value)

    # A second run finds nothing more: it is idempotent.
    again = await gateway.retention.run_once()
    assert again is not None and again.plan.transcripts == []


async def test_drop_removes_the_chunks_with_the_transcript(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = await _stack(tmp_path, monkeypatch, PARLEY_RETENTION__ARCHIVED_MEMORY="drop")
    async with gateway:
        channel = gateway.channels["test"]
        assert isinstance(channel, RecordingChannel)
        old = await _archive_alice(gateway, channel)
        path = f"sessions/{old.session_id}.jsonl"
        assert path in await _search(gateway, "Pumpernickel ferret")
        gateway.clock.now = START + timedelta(days=91)  # type: ignore[attr-defined]
        report = await gateway.retention.run_once()
        assert report is not None and len(report.plan.transcripts) == 1
        assert path not in await _search(gateway, "Pumpernickel ferret")
        await gateway.memory.sync()  # type: ignore[union-attr]
        assert path not in await _search(gateway, "Pumpernickel ferret")


async def test_old_media_goes_and_new_media_stays(keep: Stack) -> None:
    gateway, _, clock = keep
    media = gateway.loaded.home / "media" / "telegram" / "2026"
    media.mkdir(parents=True)
    old, new = media / "a.jpg", media / "b.jpg"
    old.write_bytes(b"x" * 1000)
    new.write_bytes(b"y" * 500)
    clock.now = START + timedelta(days=100)
    stamp = (clock.now - timedelta(days=91)).timestamp()
    os.utime(old, (stamp, stamp))
    fresh = (clock.now - timedelta(days=89)).timestamp()
    os.utime(new, (fresh, fresh))
    # A symlink is neither followed nor removed: what it points at is not parley's.
    outside = gateway.loaded.home.parent / f"{gateway.loaded.home.name}-not-parleys.jpg"
    outside.write_bytes(b"z" * 10)
    os.utime(outside, (stamp, stamp))
    (media / "link.jpg").symlink_to(outside)
    report = await gateway.retention.run_once()
    assert report is not None
    assert [m.path for m in report.plan.media] == [old]
    assert not old.exists() and new.exists()
    assert outside.exists() and (media / "link.jpg").is_symlink()


async def test_a_failed_run_is_logged_and_the_gateway_goes_on(
    keep: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, channel, _ = keep

    async def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr("parley.gateway.retention.service.run_daily", broken)
    with caplog.at_level(logging.ERROR, logger="parley.gateway.retention"):
        assert await gateway.retention.run_once() is None
    assert gateway.retention.failures == 1
    assert "retention run failed" in caplog.text and "disk on fire" in caplog.text
    assert gateway.ready
    assert (await say(gateway, channel, "still there?")).startswith("echo:")


@pytest.mark.parametrize("archived_memory", ["keep", "drop"])
async def test_on_postgres_the_rows_go_and_memory_follows_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str, archived_memory: str
) -> None:
    """The transcript's rows leave the shared database; its chunks (in the database
    too) stay or go as configured, through the index's own API."""
    from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder
    from tests.fakes.embedder import HashingEmbedder, resilient

    def build(settings: EmbedderSettings) -> ResilientEmbedder:
        return resilient(HashingEmbedder(dimensions=8))  # this pgvector: under 16 dims

    monkeypatch.setattr("parley.gateway.memory.build_embedder", build)
    clock = Clock(START)
    config = memory_config(
        tmp_path,
        PARLEY_STORAGE__BACKEND="postgres",
        PARLEY_STORAGE__URL=pg_url,
        PARLEY_STORAGE__VECTOR_INDEX="exact",
        PARLEY_RETENTION__ARCHIVED_MEMORY=archived_memory,
    )
    gateway = Gateway(
        config, channels=[RecordingChannel()], provider=ScriptedProvider(), clock=clock
    )
    async with gateway:
        channel = gateway.channels["test"]
        assert isinstance(channel, RecordingChannel)
        old = await _archive_alice(gateway, channel)
        path = f"sessions/{old.session_id}.jsonl"
        assert path in await _search(gateway, "Pumpernickel ferret")
        store = gateway.state.transcripts
        clock.now = START + timedelta(days=91)
        report = await gateway.retention.run_once()
        assert report is not None and [t.session_id for t in report.plan.transcripts] == [
            old.session_id
        ]
        assert report.plan.transcripts[0].bytes > 0 and not report.plan.transcripts[0].on_disk
        assert not await asyncio.to_thread(store.exists, old.session_id)
        active = await gateway.registry.get_active(ALICE_KEY)
        assert active is not None and await asyncio.to_thread(store.exists, active.session_id)
        assert gateway.memory is not None
        await gateway.memory.sync()
        found = path in await _search(gateway, "Pumpernickel ferret")
        assert found is (archived_memory == "keep")


async def test_erasing_a_person_takes_the_chunks_retention_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept chunks have no file left for a sync to miss: `parley people erase` still
    removes them (one person's words never outlive their erasure)."""
    from parley.gateway.memory import build_memory_index
    from parley.gateway.people import erase_person

    gateway = await _stack(tmp_path, monkeypatch)
    async with gateway:
        channel = gateway.channels["test"]
        assert isinstance(channel, RecordingChannel)
        old = await _archive_alice(gateway, channel)
        gateway.clock.now = START + timedelta(days=91)  # type: ignore[attr-defined]
        assert await gateway.retention.run_once() is not None
        await gateway.memory.sync()  # type: ignore[union-attr]
        path = f"sessions/{old.session_id}.jsonl"
        assert path in await _search(gateway, "Pumpernickel ferret")
    report = await erase_person(gateway.loaded, "test:alice")
    assert report.errors == [], report.errors
    assert path in report.index_files

    index = build_memory_index(gateway.loaded)

    def indexed() -> set[str]:
        store = index.backend.open_live(vector=False)
        try:
            return set(store.files())
        finally:
            store.close()

    try:
        left = await asyncio.to_thread(indexed)
    finally:
        await index.close()
    assert path not in left and not any("alice" in p for p in left)


async def test_parley_maintenance_beside_a_running_gateway(
    keep: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's run (its own state.db connection and memory index) while the gateway
    runs on the same home: the archived transcript goes, its chunks stay (the mark the
    CLI wrote is what the gateway's next sync reads), the gateway answers on, and its
    own run afterwards finds nothing left."""
    import argparse

    from parley.gateway.cli.maintenance import maintenance_command

    gateway, channel, clock = keep
    old = await _archive_alice(gateway, channel)
    home = gateway.loaded.home
    backdated = (START - timedelta(days=100)).isoformat()
    db = gateway.state.sqlite
    assert db is not None
    await db.run(
        lambda: db.conn.execute(
            "UPDATE sessions SET archived_at = ? WHERE session_id = ?", (backdated, old.session_id)
        )
    )
    code = await maintenance_command(gateway.loaded, argparse.Namespace(dry_run=False))
    out = capsys.readouterr().out
    assert code == 0, out
    assert old.session_id in out and "kept searchable" in out and "Pumpernickel" not in out
    assert not (home / "sessions" / f"{old.session_id}.jsonl").exists()
    assert (await say(gateway, channel, "are you there?", sender="alice")).startswith("echo:")
    assert gateway.memory is not None
    await gateway.memory.sync()
    assert f"sessions/{old.session_id}.jsonl" in await _search(gateway, "Pumpernickel ferret")
    clock.now = START + timedelta(days=1)
    report = await gateway.retention.run_once()
    assert report is not None and report.plan.transcripts == [] and report.errors == []


async def test_a_cap_archived_data_cannot_meet_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await _stack(tmp_path, monkeypatch, PARLEY_RETENTION__DISK_CAP="1MiB")
    async with gateway:
        # Two MiB nothing may remove (the workspace is the operator's).
        (gateway.loaded.workspace / "big.bin").write_bytes(b"w" * (2 << 20))
        with caplog.at_level(logging.WARNING, logger="parley.gateway.retention"):
            report = await gateway.retention.run_once()
        assert report is not None and report.plan.cap_unmet
        assert "still above the disk cap" in caplog.text
        assert (gateway.loaded.workspace / "big.bin").exists()
        last = read_last_run(gateway.loaded)
        assert last is not None and last["cap_unmet"] is True
