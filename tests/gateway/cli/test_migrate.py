"""``parley migrate --from sqlite --to postgres``: a real SQLite state (built with the real
stores) copied into a real PostgreSQL, then compared row for row and byte for byte; run
again, interrupted, dry-run, and pointed the wrong way."""

from __future__ import annotations

import argparse
import asyncio
import io
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from parley.channels.base import InboundMessage
from parley.core.memory.index import MemoryIndex
from parley.core.memory.rows import Tombstone
from parley.core.memory.store import MemoryStore
from parley.core.messages import Message, Usage
from parley.core.transcript_store import FileTranscriptStore, write_jsonl
from parley.gateway.audiences import scope_resolver
from parley.gateway.cli.migrate import add_migrate_commands, migrate_command
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.errors import StateError
from parley.gateway.memory import memory_db_path
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.inbox import PgInbox
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from parley.gateway.storage.postgres.schema_migrations import schema_version
from parley.gateway.storage.postgres.transcripts import PgTranscriptStore
from parley.gateway.storage.sessions import SessionOrigin
from parley.gateway.storage.sqlite.database import Database
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from parley.gateway.storage.sqlite.pairing import SqlitePairingStore
from parley.gateway.storage.sqlite.session_registry import SqliteSessionRegistry
from tests.fakes.embedder import HashingEmbedder, resilient

T = TypeVar("T")
DIMS = 8  # this machine's pgvector dies on distances of 16 dims or more
STATE_TABLES = {"sessions": "session_id", "pairing": "channel, sender_id", "inbox": "id"}
QUERIES = ("espresso machine", "Lisbon trip in May", "dentist appointment", "deploy key rotation")


async def call(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


def config(home: Path) -> LoadedConfig:
    return load_config(
        env={
            "PARLEY_HOME": str(home),
            "PARLEY_MEMORY__SYNC__WATCH": "false",
            "PARLEY_MEMORY__SYNC__ON_START": "false",
            # Searches compare stored rows: no sync may change them first.
            "PARLEY_MEMORY__SYNC__ON_SEARCH": "false",
        }
    )


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="parley")
    add_migrate_commands(
        parser.add_subparsers(dest="command"), argparse.ArgumentParser(add_help=False)
    )
    return parser.parse_args(["migrate", *argv])


async def run_migrate(
    loaded: LoadedConfig, url: str, *extra: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    args = parse(
        "--from", "sqlite", "--to", "postgres", "--url", url, "--vector-index", "exact", *extra
    )
    code = await migrate_command(loaded, args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def memory_index(loaded: LoadedConfig, backend: Any = None) -> MemoryIndex:
    settings = loaded.config.memory
    return MemoryIndex(
        settings,
        db_path=memory_db_path(loaded),
        workspace=loaded.workspace,
        sessions_dir=loaded.sessions_dir,
        embedder=resilient(HashingEmbedder(dimensions=DIMS)),
        scope_for=scope_resolver(),
        backend=backend,
    )


@dataclass
class Built:
    loaded: LoadedConfig
    session_ids: list[str]
    compacted: str  # a session whose transcript has compactions


def message(n: int, text: str) -> InboundMessage:
    return InboundMessage(
        channel="telegram",
        account="default",
        chat_type="direct",
        chat_id="42",
        sender_id="42",
        sender_name="Ann",
        text=text,
        message_id=f"m{n}",
        timestamp=datetime(2025, 5, 1, 12, n, tzinfo=UTC),
    )


async def build_state(home: Path) -> Built:
    loaded = config(home)
    sessions = FileTranscriptStore(loaded.sessions_dir)
    async with Database(loaded.state_db) as db:
        registry = SqliteSessionRegistry(db)
        ids = []
        for n, peer in enumerate(("42", "43", "44")):
            origin = SessionOrigin(
                key=f"agent:main:telegram:direct:{peer}",
                agent_id="main",
                channel="telegram",
                account="default",
                chat_type="direct",
                peer=peer,
                display_name=f"Person {peer} — ünïcode",
            )
            record = await registry.create(origin, settings={"think": n}, model="m-1")
            ids.append(record.session_id)
        await registry.record_turn(
            ids[0],
            usage=Usage(10, 20, 3, 4),
            context_tokens=77,
            entry_count=5,
            last_entry_id="e5",
            model="m-2",
            compactions=1,
        )
        await registry.record_delivery(
            ids[0],
            {"chat_id": "42"},
            "timeout",
            entry_count=6,
            last_entry_id="e6",
            message_ids=["9"],
        )
        await registry.update_settings(ids[1], {"verbose": True})
        await registry.archive(ids[2], "daily")
        # The key of the archived session gets a new active one.
        fresh = await registry.create(
            SessionOrigin(
                "agent:main:telegram:direct:44", "main", "telegram", "default", "direct", "44"
            )
        )
        ids.append(fresh.session_id)

        inbox = SqliteInbox(db)
        items = [(await inbox.record(message(n, f"hello {n}"))).item.id for n in range(5)]
        await inbox.mark_replied([items[0], items[1]], ids[0], ["hi", "there"])
        await inbox.mark_delivered([items[0]])
        await inbox.note_undelivered([items[1]], "network down")
        await inbox.mark_failed([items[2]], "storage: disk full")
        await inbox.mark_rejected([items[3]], "busy")

        pairing = SqlitePairingStore(db)
        first = await pairing.check("telegram", "default", "100", "Bob")
        await pairing.check("telegram", "default", "101", None)
        await pairing.check("discord", "default", "102", "Cy")
        assert first.request is not None
        await pairing.approve(first.request.code)

    def transcripts() -> None:
        loaded.sessions_dir.mkdir(parents=True, exist_ok=True)
        for n, sid in enumerate(ids):
            with sessions.create(sid, f"agent:main:telegram:direct:{n}", {"n": n}) as t:
                kept = None
                for turn in range(6 + n):
                    entry = t.append_message(
                        Message.user(f"turn {turn} about the espresso machine ☕")
                    )
                    t.append_message(Message.assistant(f"noted {turn}"), usage=Usage(1, 2))
                    if turn == 2:
                        kept = entry
                if n == 0:
                    assert kept is not None
                    t.append_compaction(
                        "summary: espresso",
                        first_kept_entry_id=kept.id,
                        tokens_before=900,
                        tokens_after=300,
                        trigger="threshold",
                        details={"ledger": ["x"]},
                    )
                    t.append_custom("note", {"k": "v"})
                    last = t.append_message(Message.user("after the compaction"))
                    t.append_compaction(
                        "second",
                        first_kept_entry_id=last.id,
                        tokens_before=5,
                        tokens_after=2,
                        trigger="manual",
                    )
                    t.append_compaction(
                        "third",
                        first_kept_entry_id=None,
                        tokens_before=2,
                        tokens_after=1,
                        trigger="manual",
                    )
                    t.append_message(Message.assistant("fresh start"))

    await call(transcripts)
    workspace = loaded.workspace
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text(
        "# Facts\n\nAnn loves her espresso machine.\n\nThe deploy key rotation is monthly.\n"
    )
    (workspace / "memory" / "2025-05-01.md").write_text(
        "Planning a Lisbon trip in May.\n\nDentist appointment on Friday at 9.\n"
    )
    index = memory_index(loaded)
    await index.open()
    try:
        report = await index.sync()
        assert not report.errors, report.errors
    finally:
        await index.close()
    return Built(loaded, ids, ids[0])


@pytest.fixture
async def built(tmp_path: Path) -> Built:
    return await build_state(tmp_path / "home")


@pytest.fixture
async def pg(pg_url: str) -> AsyncIterator[PgDatabase]:
    db = PgDatabase(pg_url, migrate_at_open=False)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


def sqlite_rows(path: Path, table: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY {STATE_TABLES[table]}").fetchall()
        return [dict(r) for r in rows]
    finally:
        conn.close()


def pg_rows(db: PgDatabase, table: str) -> list[dict[str, Any]]:
    return db.call(
        lambda c: c.execute(f"SELECT * FROM {table} ORDER BY {STATE_TABLES[table]}").fetchall()
    )


def execute(db: PgDatabase, sql: str, params: tuple[Any, ...] = ()) -> None:
    def run(conn: Connection) -> None:
        conn.execute(sql, params)

    db.call(run)


def transcript_bytes_pg(db: PgDatabase, sid: str) -> bytes:
    out = io.BytesIO()
    with PgTranscriptStore(db).open(sid, read_only=True) as t:
        write_jsonl(t, out)
    return out.getvalue()


def assert_transcripts_equal(loaded: LoadedConfig, db: PgDatabase) -> None:
    files = FileTranscriptStore(loaded.sessions_dir)
    pgs = PgTranscriptStore(db)
    infos = files.list_transcripts()
    assert [i.session_id for i in infos] == [i.session_id for i in pgs.list_transcripts()]
    for info in infos:
        sid = info.session_id
        assert transcript_bytes_pg(db, sid) == files.path(sid).read_bytes()
        with files.open(sid, read_only=True) as f, pgs.open(sid, read_only=True) as p:
            assert p.entry_count == f.entry_count
            assert p.cycle_bytes == f.cycle_bytes
            assert [e.id for e in p.live_entries()] == [e.id for e in f.live_entries()]
            assert list(p.numbered_entries()) == list(f.numbered_entries())
            assert p.load_report.missing_first_kept_id is None


def assert_state_equal(loaded: LoadedConfig, db: PgDatabase) -> None:
    for table in STATE_TABLES:
        source = sqlite_rows(loaded.state_db, table)
        assert source, table
        target = pg_rows(db, table)
        # Columns only PostgreSQL has (the inbox's replica claims) are left NULL.
        extra = {name for row in target for name in row} - set(source[0])
        assert [{k: v for k, v in row.items() if k not in extra} for row in target] == source
        assert all(row[name] is None for row in target for name in extra), table


def memory_snapshot(store: Any) -> dict[str, Any]:
    files = store.files()
    chunks = {}
    for path in files:
        rows = store.chunk_texts(path)
        by_id = store.chunks_by_id([i for i, _, _ in rows])
        vectors = store.vectors_for([i for i, _, _ in rows])
        chunks[path] = [
            (
                by_id[i].start_line,
                by_id[i].end_line,
                by_id[i].hash,
                by_id[i].text,
                by_id[i].ts,
                by_id[i].entry_ids,
                by_id[i].updated_at,
                vectors[i].tolist() if i in vectors else None,
            )
            for i, _, _ in rows
        ]
    return {"files": files, "chunks": chunks, "meta": store.meta(), "dims": store.vector_dims}


async def assert_memory_equal(loaded: LoadedConfig, db: PgDatabase) -> None:
    def read() -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
        source = MemoryStore.open(memory_db_path(loaded))
        target = PgMemoryBackend(db, loaded.config.agent.id, vector_index="exact").open_live(
            vector=True
        )
        try:
            hashes = [e.hash for batch in source.cache_entries() for e in batch]
            key = ("fake", "hash-v1", "")
            return (
                memory_snapshot(source),
                memory_snapshot(target),
                source.cached_vectors(*key, hashes),
                target.cached_vectors(*key, hashes),
            )
        finally:
            source.close()

    source, target, source_cache, target_cache = await call(read)
    assert source["files"] and source["dims"] == DIMS
    assert target == source
    assert source_cache and source_cache.keys() == target_cache.keys()
    for h, vector in source_cache.items():
        assert np.array_equal(vector, target_cache[h])

    sqlite_index = memory_index(loaded)
    pg_index = memory_index(
        loaded, PgMemoryBackend(db, loaded.config.agent.id, vector_index="exact")
    )
    await sqlite_index.open()
    await pg_index.open()
    try:
        for query in QUERIES:
            want = await sqlite_index.search(query, scopes=["agent"])
            got = await pg_index.search(query, scopes=["agent"])
            assert want.hits, query
            assert got.mode == want.mode == "hybrid"
            assert [h.citation for h in got.hits] == [h.citation for h in want.hits], query
            assert [h.snippet for h in got.hits] == [h.snippet for h in want.hits]
            assert [h.score for h in got.hits] == pytest.approx([h.score for h in want.hits])
    finally:
        await sqlite_index.close()
        await pg_index.close()


def counts_table(out: str) -> dict[str, tuple[int, int, str]]:
    found = {}
    for line in out.splitlines():
        parts = line.rsplit(None, 3)
        if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
            found[parts[0].strip()] = (int(parts[1]), int(parts[2]), parts[3])
    return found


# -- the tests -------------------------------------------------------------------------------


async def test_everything_is_copied_field_by_field_and_byte_for_byte(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = built.loaded
    code, out, err = await run_migrate(loaded, pg_url, capsys=capsys)
    assert code == 0, out + err
    table = counts_table(out)
    assert table["sessions"] == (4, 4, "ok")
    assert table["inbox"] == (5, 5, "ok")
    assert table["pairing"] == (3, 3, "ok")
    assert table["transcripts"] == (4, 4, "ok")
    assert table["memory vectors"][2] == "ok" and table["memory vectors"][0] > 0
    assert all(status == "ok" for _, _, status in table.values())

    await call(assert_state_equal, loaded, pg)
    await call(assert_transcripts_equal, loaded, pg)
    # The compactions' kept entries point at the lines they name.
    kept = await call(
        pg.call,
        lambda c: c.execute(
            "SELECT l.seq, l.kept_seq FROM transcript_lines l WHERE session_id = %s"
            " AND kind = 'compaction' ORDER BY seq",
            (built.compacted,),
        ).fetchall(),
    )
    assert [r["kept_seq"] is not None for r in kept] == [True, True, False]
    await assert_memory_equal(loaded, pg)

    # A message recorded in PostgreSQL now gets an id past the migrated ones.
    result = await PgInbox(pg).record(message(30, "new"))
    assert (
        result.is_new
        and result.item.id
        == max(r["id"] for r in pg_rows(pg, "inbox") if r["id"] != result.item.id) + 1
    )


async def test_forgotten_chunks_stay_forgotten_after_the_move(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = built.loaded
    evicted = Tombstone(
        "sessions/old.jsonl", "h-evicted", "agent", "sessions", 3, 9, "age", 1.0e9, "old words"
    )

    def forget() -> None:
        source = MemoryStore.open(memory_db_path(loaded))
        try:
            source.add_tombstones([evicted])
        finally:
            source.close()

    await call(forget)
    code, out, err = await run_migrate(loaded, pg_url, capsys=capsys)
    assert code == 0, out + err
    assert "1 eviction(s) carried over" in out
    backend = PgMemoryBackend(pg, loaded.config.agent.id, vector_index="exact")
    target = await asyncio.to_thread(lambda: backend.open_live(vector=True))
    assert await call(target.tombstones) == [evicted]
    # A second run adds no second copy.
    code, out, err = await run_migrate(loaded, pg_url, capsys=capsys)
    assert code == 0, out + err
    assert await call(target.tombstones) == [evicted]


async def test_a_second_run_copies_nothing_and_changes_nothing(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = built.loaded
    first = await run_migrate(loaded, pg_url, capsys=capsys)
    assert first[0] == 0
    before = {t: await call(pg_rows, pg, t) for t in STATE_TABLES}
    lines_before = await call(
        pg.call, lambda c: c.execute("SELECT count(*) AS n FROM transcript_lines").fetchone()
    )
    code, out, _ = await run_migrate(loaded, pg_url, capsys=capsys)
    assert code == 0
    assert counts_table(out) == counts_table(first[1])
    assert "sessions: 0 copied" in out and "inbox: 0 copied" in out
    assert "transcripts: 0 line(s) copied" in out and "memory: 0 file(s) copied" in out
    assert {t: await call(pg_rows, pg, t) for t in STATE_TABLES} == before
    assert lines_before == await call(
        pg.call, lambda c: c.execute("SELECT count(*) AS n FROM transcript_lines").fetchone()
    )
    await call(assert_transcripts_equal, loaded, pg)


async def test_an_interrupted_copy_is_completed_by_the_next_run(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = built.loaded
    assert (await run_migrate(loaded, pg_url, capsys=capsys))[0] == 0
    sid = built.compacted
    # What a kill leaves: some transactions committed, the rest not. A transcript's tail
    # (rows and count move together), one never begun, rows of each table, a memory file.
    execute(pg, "DELETE FROM transcript_lines WHERE session_id = %s AND seq > 5", (sid,))
    execute(pg, "UPDATE transcripts SET line_count = 5 WHERE session_id = %s", (sid,))
    execute(pg, "DELETE FROM transcripts WHERE session_id = %s", (built.session_ids[1],))
    execute(pg, "DELETE FROM sessions WHERE session_id = %s", (built.session_ids[2],))
    execute(pg, "DELETE FROM inbox WHERE id IN (SELECT max(id) FROM inbox)")
    execute(pg, "DELETE FROM pairing WHERE channel = 'discord'")
    execute(pg, "DELETE FROM memory_chunks WHERE path = 'MEMORY.md'")
    execute(
        pg,
        "DELETE FROM memory_embedding_cache WHERE ctid IN"
        " (SELECT ctid FROM memory_embedding_cache LIMIT 2)",
    )

    code, out, _ = await run_migrate(loaded, pg_url, capsys=capsys)
    assert code == 0, out
    assert "sessions: 1 copied" in out and "inbox: 1 copied" in out and "pairing: 1 copied" in out
    assert "memory: 1 file(s) copied, 2 cache entr(ies) added" in out
    await call(assert_state_equal, loaded, pg)
    await call(assert_transcripts_equal, loaded, pg)
    await assert_memory_equal(loaded, pg)


async def test_a_hole_in_a_transcript_is_reported_not_papered_over(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (await run_migrate(built.loaded, pg_url, capsys=capsys))[0] == 0
    execute(
        pg, "DELETE FROM transcript_lines WHERE session_id = %s AND seq = 4", (built.compacted,)
    )
    code, out, err = await run_migrate(built.loaded, pg_url, capsys=capsys)
    assert code == 1
    assert counts_table(out)["transcripts"][2] == "MISMATCH"
    assert f"transcript {built.compacted}:" in out and "re-run" in err


async def test_a_changed_target_transcript_is_not_resumed(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (await run_migrate(built.loaded, pg_url, capsys=capsys))[0] == 0
    sid = built.compacted
    execute(pg, "DELETE FROM transcript_lines WHERE session_id = %s AND seq > 5", (sid,))
    execute(pg, "UPDATE transcripts SET line_count = 5 WHERE session_id = %s", (sid,))
    execute(pg, "UPDATE transcript_lines SET line = '{}' WHERE session_id = %s AND seq = 5", (sid,))
    code, out, _ = await run_migrate(built.loaded, pg_url, capsys=capsys)
    assert code == 1
    assert "line 5 differs in the target" in out


async def test_a_dry_run_changes_nothing(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = built.loaded
    files = {p: p.read_bytes() for p in loaded.home.rglob("*") if p.is_file()}
    code, out, _ = await run_migrate(loaded, pg_url, "--dry-run", capsys=capsys)
    assert code == 0
    assert "would migrate v0" in out
    table = counts_table(out)
    assert table["sessions"] == (4, 0, "4") and table["inbox"] == (5, 0, "5")
    assert table["memory files"][1] == 0 and table["memory files"][2] == str(
        table["memory files"][0]
    )
    assert await pg.run(schema_version) == 0  # not even the schema
    assert {p: p.read_bytes() for p in loaded.home.rglob("*") if p.is_file()} == files

    # After a partial copy, it says what is left.
    assert (await run_migrate(loaded, pg_url, capsys=capsys))[0] == 0
    execute(pg, "DELETE FROM sessions WHERE session_id = %s", (built.session_ids[0],))
    before = await call(pg_rows, pg, "sessions")
    code, out, _ = await run_migrate(loaded, pg_url, "--dry-run", capsys=capsys)
    assert code == 0
    assert counts_table(out)["sessions"] == (4, 3, "1")
    assert counts_table(out)["inbox"] == (5, 5, "0")
    assert await call(pg_rows, pg, "sessions") == before


async def test_only_sqlite_to_postgres(
    built: Built, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse("--from", "postgres", "--to", "sqlite", "--url", pg_url)
    assert await migrate_command(built.loaded, args) == 2
    assert "only --from sqlite --to postgres" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--from", "mysql", "--to", "postgres")
    capsys.readouterr()


async def test_a_target_is_required(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    assert await migrate_command(built.loaded, parse("--from", "sqlite", "--to", "postgres")) == 2
    assert "--url" in capsys.readouterr().err


async def test_the_url_defaults_to_the_configured_one(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = load_config(
        env={
            "PARLEY_HOME": str(built.loaded.home),
            "PARLEY_DATABASE_URL": pg_url,
        }
    )
    args = parse("--from", "sqlite", "--to", "postgres", "--vector-index", "exact")
    assert await migrate_command(loaded, args) == 0
    assert len(await call(pg_rows, pg, "sessions")) == 4


async def test_no_state_db_is_a_clear_error(tmp_path: Path, pg_url: str) -> None:
    loaded = config(tmp_path / "empty")
    with pytest.raises(StateError, match=r"nothing to migrate: .*state\.db does not exist"):
        await migrate_command(
            loaded, parse("--from", "sqlite", "--to", "postgres", "--url", pg_url)
        )


async def test_an_unreachable_target_never_shows_its_password(
    built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "postgresql://ann:s3cret-pw@127.0.0.1:1/parley?connect_timeout=2"
    with pytest.raises(StateError) as caught:
        await migrate_command(
            built.loaded, parse("--from", "sqlite", "--to", "postgres", "--url", url)
        )
    message = str(caught.value)
    assert "cannot connect to PostgreSQL at postgresql://ann@127.0.0.1/parley" in message
    assert "s3cret-pw" not in message
    assert "s3cret-pw" not in "".join(capsys.readouterr())


async def test_corrupt_and_torn_lines_keep_their_slots(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = built.loaded
    sid = built.session_ids[1]
    path = FileTranscriptStore(loaded.sessions_dir).path(sid)
    with path.open("ab") as f:
        f.write(b'{"not an entry": true}\n')
    with FileTranscriptStore(loaded.sessions_dir).open(sid) as t:
        t.append_message(Message.user("after the corrupt line"))
    complete = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"id": "torn')  # a write cut short: not copied, as an export leaves it out
    code, out, _ = await run_migrate(loaded, pg_url, capsys=capsys)
    assert code == 0, out
    assert await call(transcript_bytes_pg, pg, sid) == complete
    kinds = await call(
        pg.call,
        lambda c: c.execute(
            "SELECT kind FROM transcript_lines WHERE session_id = %s ORDER BY seq DESC LIMIT 2",
            (sid,),
        ).fetchall(),
    )
    assert [r["kind"] for r in kinds] == ["message", "corrupt"]


async def test_a_row_postgresql_refuses_is_reported_and_the_rest_is_copied(
    built: Built, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = built.loaded
    conn = sqlite3.connect(loaded.state_db)
    with conn:
        conn.execute(
            "UPDATE pairing SET sender_name = ? WHERE channel = 'discord'", ("nul\x00name",)
        )
    conn.close()
    code, out, _ = await run_migrate(loaded, pg_url, capsys=capsys)
    assert code == 1
    assert "problem: pairing:" in out and "NUL" in out
    assert counts_table(out)["pairing"][2] == "MISMATCH"
    assert counts_table(out)["sessions"] == (4, 4, "ok")
    assert counts_table(out)["memory chunks"][2] == "ok"
    await call(assert_transcripts_equal, loaded, pg)


async def test_a_database_holding_another_bots_sessions_is_refused_before_any_copy(
    built: Built, tmp_path: Path, pg_url: str, pg: PgDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    other = await build_state(tmp_path / "other-bot")
    assert (await run_migrate(other.loaded, pg_url, capsys=capsys))[0] == 0
    before = {t: await call(pg_rows, pg, t) for t in STATE_TABLES}
    with pytest.raises(StateError, match=r"already holds \d+ session\(s\) that are not in"):
        await run_migrate(built.loaded, pg_url, capsys=capsys)
    assert {t: await call(pg_rows, pg, t) for t in STATE_TABLES} == before
