"""Every PostgreSQL schema version migrates to the current one with its data intact.

For each earlier version N: a fresh database gets migrations 1..N only (as a parley of
that version left it), rows that version could hold are written (through today's
stores where they only touch tables that existed at N, by SQL where today's code
would write newer columns), then ``migrate`` runs and today's code reads everything
back and uses what the later versions added.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from parley.channels.base import InboundMessage
from parley.core.memory.query import build_fts_query
from parley.core.memory.rows import FileRow, NewChunk, Tombstone
from parley.core.messages import Message
from parley.gateway.storage.inbox import message_to_json
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.inbox import PgInbox
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from parley.gateway.storage.postgres.pairing import PgPairingStore
from parley.gateway.storage.postgres.retention_runs import last_run, record_run
from parley.gateway.storage.postgres.schema_migrations import (
    MIGRATIONS,
    SCHEMA_VERSION,
    migrate,
    schema_version,
)
from parley.gateway.storage.postgres.session_registry import PgSessionRegistry
from parley.gateway.storage.postgres.transcripts import PgTranscriptStore
from parley.gateway.storage.sessions import SessionOrigin

ORIGIN = SessionOrigin("agent:main:test:direct:alice", "main", "test", "default", "direct", "alice")
# The versions that introduced each part (see gateway/pg/migrations.py).
TRANSCRIPTS_SINCE = 2
MEMORY_SINCE = 3


def message(mid: str, text: str) -> InboundMessage:
    return InboundMessage(
        "test", "default", "direct", "alice", "alice", "Alice", text, mid,
        datetime(2026, 1, 1, tzinfo=UTC),
    )  # fmt: skip


def migrate_to(conn: Connection, version: int) -> None:
    """What a parley of schema ``version`` left: migrations 1..version, recorded."""
    conn.execute(
        "CREATE TABLE parley_schema (version INTEGER PRIMARY KEY,"
        " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    )
    for target in range(1, version + 1):
        conn.execute(MIGRATIONS[target - 1])
        conn.execute("INSERT INTO parley_schema (version) VALUES (%s)", (target,))


def old_inbox_row(conn: Connection, inbound: InboundMessage) -> None:
    """Version 1's inbox columns only (session_key and claimed_by came with 4)."""
    now = datetime(2026, 1, 1, tzinfo=UTC).isoformat()
    conn.execute(
        "INSERT INTO inbox (channel, account, platform_message_id, received_at, updated_at,"
        " payload, status) VALUES (%s, %s, %s, %s, %s, %s, 'received')",
        (inbound.channel, inbound.account, inbound.message_id, now, now, message_to_json(inbound)),
    )


def memory_file() -> tuple[FileRow, list[NewChunk]]:
    text = "The spare key hangs behind the blue door."
    return FileRow("MEMORY.md", "memory", "agent", "h-file", 1.0, 10), [
        NewChunk(1, 1, text, "h-chunk")
    ]


async def call(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
async def test_an_earlier_schema_migrates_with_its_data(pg_url: str, version: int) -> None:
    async with PgDatabase(pg_url, migrate_at_open=False) as db:
        await db.run(migrate_to, version)
        assert await db.run(schema_version) == version

        # -- what a parley of that version wrote ---------------------------------------
        record = await PgSessionRegistry(db).create(ORIGIN, settings={"model": "m1"})
        check = await PgPairingStore(db).check("test", "default", "bob", "Bob")
        await db.run(old_inbox_row, message("m-1", "written before the upgrade"))
        store = PgTranscriptStore(db)
        if version >= TRANSCRIPTS_SINCE:

            def write() -> None:
                with store.create(record.session_id, ORIGIN.key, {}) as transcript:
                    transcript.append_message(Message.user("hello from the old schema"))

            await call(write)
        backend = PgMemoryBackend(db, "main", vector_index="exact")
        if version >= MEMORY_SINCE:
            live = await asyncio.to_thread(lambda: backend.open_live(vector=False))
            await call(live.replace_file, *memory_file(), None)

        # -- the upgrade ---------------------------------------------------------------
        assert await db.run(migrate) == list(range(version + 1, SCHEMA_VERSION + 1))
        assert await db.run(schema_version) == SCHEMA_VERSION

        # -- today's code reads it all and uses what came later --------------------------
        again = await PgSessionRegistry(db).get(record.session_id)
        assert again is not None and again.settings == {"model": "m1"}
        requests = await PgPairingStore(db).list()
        assert check.request is not None
        assert [r.code for r in requests] == [check.request.code]
        inbox = PgInbox(db)
        [old] = await inbox.open_items()
        assert old.message.text == "written before the upgrade"
        new = await inbox.record(message("m-2", "after"), session_key=ORIGIN.key)  # v4
        assert new.is_new and [i.id for i in await inbox.open_for_session(ORIGIN.key)] == [
            new.item.id
        ]
        if version < TRANSCRIPTS_SINCE:
            await call(lambda: store.create(record.session_id, ORIGIN.key, {}).close())

        def read() -> list[str]:
            with store.open(record.session_id) as transcript:
                transcript.append_message(Message.user("after the upgrade"))
                return [e.message.text for e in transcript.entries()]

        texts = await call(read)
        assert texts[-1] == "after the upgrade"
        if version >= TRANSCRIPTS_SINCE:
            assert texts == ["hello from the old schema", "after the upgrade"]
        live = await asyncio.to_thread(lambda: backend.open_live(vector=False))
        if version < MEMORY_SINCE:
            await call(live.replace_file, *memory_file(), None)
        hits = await call(
            live.keyword_hits, "chunks_fts", build_fts_query("spare key", mode="or"), ["agent"], 5
        )
        assert len(hits) == 1
        evicted = Tombstone("sessions/x.jsonl", "h", "agent", "sessions", 1, 2, "age", 1.0, "p")
        await call(live.add_tombstones, [evicted])  # forgetting's tables (v5)
        assert await call(live.tombstones) == [evicted]
        # Retention's record of the last run (v7).
        assert await db.run(last_run) is None
        await db.run(record_run, {"finished_at": "2026-01-02T03:00:00+00:00", "transcripts": 1})
        assert await db.run(last_run) == {
            "finished_at": "2026-01-02T03:00:00+00:00",
            "transcripts": 1,
        }
