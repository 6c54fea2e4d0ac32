"""Long-term memory of a gateway whose storage is PostgreSQL: the index's rows in the
shared database (one index per agent id) and its ``sessions`` source read from the
transcript table, with no file anywhere.

This machine's pgvector build dies (SIGILL) computing any distance of 16 or more
dimensions and on any HNSW insert, so every index here is ``vector_index = "exact"``
(vectors ranked in the client) over the hashing embedder's 8 dimensions, and one test
checks that no HNSW index was ever made."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder
from parley.core.memory.sources import AGENT_SCOPE, StoreTranscriptSource
from parley.core.memory.tasks import TaskRecord
from parley.core.messages import Message
from parley.gateway.app import Gateway
from parley.gateway.cli.main import build_parser
from parley.gateway.cli.memory import memory_command
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import ConfigFileError, StateError
from parley.gateway.memory import build_memory_index
from parley.gateway.runtime.commands.texts import format_memory_status
from parley.gateway.storage.postgres.database import Connection
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from parley.gateway.storage.stores import StateStores
from tests.fakes.embedder import HashingEmbedder, resilient
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import Clock, memory_config

SID = "0123456789abcdef0123456789abcdef"
ALICE_KEY = "agent:main:test:direct:alice"
ALICE_SCOPE = "person:test:alice"
FACT = "Remember this: my locker combination is 7491 and my ferret is named Pumpernickel."
DIMS = 8  # well under the 16 at which this machine's pgvector crashes


@pytest.fixture(autouse=True)
def small_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(settings: EmbedderSettings) -> ResilientEmbedder:
        return resilient(HashingEmbedder(dimensions=DIMS))

    monkeypatch.setattr("parley.gateway.memory.build_embedder", build)


@pytest.fixture
def loaded(tmp_path: Path, pg_url: str) -> LoadedConfig:
    return memory_config(
        tmp_path,
        PARLEY_STORAGE__BACKEND="postgres",
        PARLEY_STORAGE__URL=pg_url,
        PARLEY_STORAGE__VECTOR_INDEX="exact",
    )


@pytest.fixture
async def state(loaded: LoadedConfig) -> AsyncIterator[StateStores]:
    async with StateStores(loaded) as stores:
        yield stores


def _write(state: StateStores, session_id: str, *texts: str) -> None:
    store = state.transcripts
    if store.exists(session_id):
        transcript = store.open(session_id)
    else:
        transcript = store.create(session_id, ALICE_KEY, {"memory_scope": ALICE_SCOPE})
    with transcript:
        for text in texts:
            transcript.append_message(Message.user(text))


def _hnsw_indexes(conn: Connection) -> list[str]:
    rows = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE indexdef ILIKE '%%hnsw%%'"
    ).fetchall()
    return [row["indexname"] for row in rows]


def test_vector_index_is_a_storage_setting(tmp_path: Path) -> None:
    assert memory_config(tmp_path).config.storage.vector_index == "hnsw"
    exact = memory_config(tmp_path, PARLEY_STORAGE__VECTOR_INDEX="exact")
    assert exact.config.storage.vector_index == "exact"
    with pytest.raises(ConfigFileError, match="vector_index"):
        memory_config(tmp_path, PARLEY_STORAGE__VECTOR_INDEX="ivfflat")


async def test_the_index_reads_the_transcript_table_on_the_shared_pool(
    loaded: LoadedConfig, state: StateStores
) -> None:
    assert state.pg is not None
    await asyncio.to_thread(_write, state, SID, FACT)
    index = build_memory_index(loaded, db=state.pg)
    assert isinstance(index.backend, PgMemoryBackend)
    assert (index.backend.name, index.backend.vector_index) == ("main", "exact")
    assert isinstance(index.transcripts, StoreTranscriptSource)
    await index.open()
    try:
        report = await index.sync()
        assert report.errors == [] and report.files_indexed >= 1
        result = await index.search("ferret Pumpernickel", scopes=[AGENT_SCOPE, ALICE_SCOPE])
        assert result.mode == "hybrid" and result.fallback is None
        assert result.hits and result.hits[0].path == f"sessions/{SID}.jsonl"
        assert result.hits[0].scope == ALICE_SCOPE
        # Not the memory.db under $PARLEY_HOME: nothing of it exists.
        assert not index.db_path.exists()
        assert not loaded.sessions_dir.exists() or not list(loaded.sessions_dir.iterdir())

        again = await index.sync()
        assert again.files_indexed == 0  # the table's line count did not move

        await asyncio.to_thread(_write, state, SID, "The ferret sleeps in the laundry basket.")
        assert f"sessions/{SID}.jsonl" in (await index.status()).dirty_files
        grown = await index.sync()
        assert grown.files_indexed == 1
        found = await index.search("laundry basket", scopes=[ALICE_SCOPE])
        assert any("laundry basket" in hit.snippet for hit in found.hits)
        status = await index.status()
        assert "PostgreSQL" in format_memory_status(status)
        assert status.counts.vectors > 0
    finally:
        await index.close()
    # The pool is the gateway's: closing the index leaves it open.
    await state.ping()
    assert await state.pg.run(_hnsw_indexes) == []


async def test_without_a_pool_the_index_opens_and_closes_its_own(
    loaded: LoadedConfig, state: StateStores
) -> None:
    await asyncio.to_thread(_write, state, SID, FACT)
    index = build_memory_index(loaded)
    backend = index.backend
    assert isinstance(backend, PgMemoryBackend) and backend.db is not state.pg
    await index.open()
    try:
        await index.sync()
        result = await index.search("locker combination", scopes=[ALICE_SCOPE])
        assert result.hits and result.hits[0].path == f"sessions/{SID}.jsonl"
    finally:
        await index.close()
    with pytest.raises(StateError, match="not open"):
        await backend.db.run(_hnsw_indexes)


async def test_a_turn_through_the_gateway_is_indexed_and_found(loaded: LoadedConfig) -> None:
    channel = RecordingChannel()
    provider = ScriptedProvider()
    clock = Clock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    async with Gateway(loaded, channels=[channel], provider=provider, clock=clock) as gateway:
        await gateway.handle_inbound(channel.inbound(FACT, sender="alice"))
        await channel.wait_sent(1)
        await gateway.wait_idle()
        record = await gateway.registry.get_active(ALICE_KEY)
        assert record is not None
        memory = gateway.memory
        assert memory is not None and isinstance(memory.backend, PgMemoryBackend)

        result = await memory.search("ferret Pumpernickel", scopes=[AGENT_SCOPE, ALICE_SCOPE])

        paths = [hit.path for hit in result.hits]
        assert f"sessions/{record.session_id}.jsonl" in paths
        assert result.mode == "hybrid"
        # Another person's search does not see Alice's conversation.
        other = await memory.search("ferret Pumpernickel", scopes=["person:test:bob"])
        assert other.hits == []
        assert await gateway.state.pg.run(_hnsw_indexes) == []  # type: ignore[union-attr]
        assert not list(loaded.sessions_dir.glob("*.jsonl"))


async def test_the_memory_command_indexes_and_searches_postgres(
    loaded: LoadedConfig,
    state: StateStores,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`parley memory index|search|status` with the storage of the config: the CLI's
    index opens a pool of its own."""
    await asyncio.to_thread(_write, state, SID, FACT)
    assert loaded.config.storage.backend == "postgres"
    for action in (("index",), ("search", "locker combination", "--all-scopes"), ("status",)):
        args = build_parser().parse_args(["memory", *action])
        assert await memory_command(loaded, args) == 0, action
    out = capsys.readouterr().out
    assert "1 indexed" in out
    assert f"sessions/{SID}.jsonl" in out
    assert "memory index 'main'" in out and "PostgreSQL" in out


async def test_replicas_share_task_records_through_the_workspace(
    tmp_path: Path, pg_url: str, state: StateStores
) -> None:
    """Two replicas (two HTTP ports, one workspace volume, one database): each appends
    to its own folder, and each one's index and stats hold both records; neither's
    sync drops the other's rows."""

    def replica(port: int) -> LoadedConfig:
        return memory_config(
            tmp_path,
            PARLEY_STORAGE__BACKEND="postgres",
            PARLEY_STORAGE__URL=pg_url,
            PARLEY_STORAGE__VECTOR_INDEX="exact",
            PARLEY_HTTP__PORT=str(port),
        )

    first = build_memory_index(replica(8801), db=state.pg)
    second = build_memory_index(replica(8802), db=state.pg)
    assert first.task_log.directory == second.task_log.directory
    assert first.task_log.writer != second.task_log.writer
    started = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    await first.open()
    await second.open()
    try:
        await first.record_task(
            TaskRecord("rotate the backup keys", {"shell": 2}, "ok", (), started, 3.0)
        )
        await second.record_task(
            TaskRecord(
                "deploy the staging cluster", {"shell": 1}, "error", ("exit 2",), started, 9.0
            )
        )
        for index in (first, second, first):  # each sync sees every replica's files
            await index.sync()
        for index in (first, second):
            stats = await index.task_stats()
            assert (stats.total, stats.by_outcome["ok"], stats.by_outcome["error"]) == (2, 1, 1)
            for request in ("rotate the backup keys", "deploy the staging cluster"):
                result = await index.search(request, scopes=[AGENT_SCOPE])
                assert result.hits and result.hits[0].path.startswith("tasks/"), request
        folders = sorted(p.parent.name for p in first.task_log.files())
        assert folders == sorted([first.task_log.writer, second.task_log.writer])
    finally:
        await first.close()
        await second.close()
