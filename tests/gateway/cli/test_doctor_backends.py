"""`parley doctor` on either storage backend: the state, transcript, memory and pairing
checks read what the configured backend holds (files and state.db, or the shared
PostgreSQL, which a check never migrates)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from parley.core.messages import Message
from parley.core.transcript_store import FileTranscriptStore, TranscriptStore
from parley.gateway.cli.doctor_checks import Finding, _check_transcripts, run_doctor
from parley.gateway.config import LoadedConfig
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.stores import StateStores
from tests.fakes.embedder import HashingEmbedder, resilient
from tests.gateway.memory_helpers import memory_config

SID_A = "a" * 32
SID_B = "b" * 32
KEY = "agent:main:test:direct:alice"
STORAGE_CHECKS = ("state", "state.db", "transcripts", "memory", "pairing")


@pytest.fixture(autouse=True)
def small_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 dimensions and exact vectors: this machine's pgvector cannot do more.
    monkeypatch.setattr(
        "parley.gateway.memory.build_embedder",
        lambda settings: resilient(HashingEmbedder(dimensions=8)),
    )


def pg_config(home: Path, url: str) -> LoadedConfig:
    return memory_config(
        home,
        PARLEY_STORAGE__BACKEND="postgres",
        PARLEY_STORAGE__URL=url,
        PARLEY_STORAGE__VECTOR_INDEX="exact",
    )


def storage_findings(findings: list[Finding]) -> dict[str, list[Finding]]:
    """The storage checks' findings by check (the provider and http ones are not ours)."""
    out: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.check in STORAGE_CHECKS:
            out.setdefault(finding.check, []).append(finding)
    return out


def _severities(by_check: dict[str, list[Finding]]) -> dict[str, list[str]]:
    return {check: [f.severity for f in found] for check, found in by_check.items()}


async def _seed(loaded: LoadedConfig) -> None:
    """Two transcripts through the backend's store (its open migrates PostgreSQL)."""

    def write(store: TranscriptStore) -> None:
        for sid in (SID_A, SID_B):
            with store.create(sid, KEY, {"memory_scope": "person:test:alice"}) as t:
                t.append_message(Message.user("the shed key is under the mat"))
                t.append_message(Message.assistant("Noted."))

    async with StateStores(loaded) as state:
        await asyncio.to_thread(write, state.transcripts)


async def test_postgres_an_empty_database_is_a_first_run(tmp_path: Path, pg_url: str) -> None:
    loaded = pg_config(tmp_path, pg_url)
    found = storage_findings(await run_doctor(loaded))
    assert _severities(found) == {
        "state": ["ok"],
        "transcripts": ["ok"],
        "memory": ["ok"],
        "pairing": ["ok"],
    }
    assert "no tables yet" in found["state"][0].detail
    assert "parley db migrate" in found["state"][0].detail
    assert found["transcripts"][0].detail == "not checked: no tables yet"
    # A check changes nothing: the database is still empty.
    async with PgDatabase(pg_url, migrate_at_open=False) as db:
        tables = await db.run(_tables)
    assert tables == []


async def test_postgres_checks_what_the_database_holds(tmp_path: Path, pg_url: str) -> None:
    loaded = pg_config(tmp_path, pg_url)
    await _seed(loaded)

    found = storage_findings(await run_doctor(loaded))

    assert _severities(found) == {
        "state": ["ok"],
        "transcripts": ["ok"],
        "memory": ["ok"],
        "pairing": ["ok"],
    }
    assert "schema version" in found["state"][0].detail
    assert found["transcripts"][0].detail == "2 load cleanly"
    assert "hybrid search ready" in found["memory"][0].detail
    assert found["pairing"][0].detail == "no one waiting"
    assert not (tmp_path / "state.db").exists()


async def test_postgres_broken_and_repairable_transcripts(tmp_path: Path, pg_url: str) -> None:
    loaded = pg_config(tmp_path, pg_url)
    await _seed(loaded)
    async with PgDatabase(pg_url) as db:
        await db.run(_corrupt, SID_A, SID_B)

    found = storage_findings(await run_doctor(loaded))

    transcripts = {f.severity: f.detail for f in found["transcripts"]}
    assert set(transcripts) == {"error", "warning"}
    assert transcripts["error"].startswith("fail to load: ") and SID_A in transcripts["error"]
    assert transcripts["warning"].startswith("need repair on next load: ")
    assert SID_B in transcripts["warning"] and SID_A not in transcripts["warning"]


async def test_postgres_a_newer_schema_and_an_unreachable_server(
    tmp_path: Path, pg_url: str
) -> None:
    loaded = pg_config(tmp_path, pg_url)
    await _seed(loaded)
    async with PgDatabase(pg_url) as db:
        await db.run(lambda conn: conn.execute("INSERT INTO parley_schema (version) VALUES (999)"))
    found = storage_findings(await run_doctor(loaded))
    assert found["state"][0].severity == "error" and "upgrade" in found["state"][0].detail
    assert {f.severity for f in found["transcripts"]} == {"warning"}

    down = pg_config(tmp_path, "postgresql://nobody@127.0.0.1:1/parley?connect_timeout=2")
    found = storage_findings(await run_doctor(down))
    assert found["state"][0].severity == "error"
    assert "cannot connect" in found["state"][0].detail
    assert _severities(found)["transcripts"] == ["warning"]


def test_sqlite_transcripts_are_checked_through_the_file_store(tmp_path: Path) -> None:
    store = FileTranscriptStore(tmp_path / "sessions")
    assert _check_transcripts(store) == [Finding("transcripts", "ok", "none yet")]
    store.sessions_dir.mkdir()
    with store.create(SID_A, KEY) as t:
        t.append_message(Message.user("hello"))
    assert _check_transcripts(store) == [Finding("transcripts", "ok", "1 load cleanly")]
    (store.sessions_dir / f"{SID_B}.jsonl").write_text("not json\n", encoding="utf-8")
    (broken,) = _check_transcripts(store)
    assert broken.severity == "error" and f"{SID_B}.jsonl" in broken.detail


def _tables(conn: Connection) -> list[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    ).fetchall()
    return [row["tablename"] for row in rows]


def _corrupt(conn: Connection, broken: str, repairable: str) -> None:
    conn.execute("UPDATE transcripts SET header = '{not json' WHERE session_id = %s", (broken,))
    conn.execute(
        "UPDATE transcript_lines SET line = '{not json' WHERE session_id = %s AND seq = 2",
        (repairable,),
    )
