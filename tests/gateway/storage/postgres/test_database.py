"""The PostgreSQL pool and its migrations, against a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from parley.gateway.errors import SchemaTooNewError, StateError
from parley.gateway.storage.postgres.database import PgDatabase, redact_url
from parley.gateway.storage.postgres.schema_migrations import (
    MIGRATIONS,
    SCHEMA_VERSION,
    migrate,
    schema_version,
)


def _tables(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {r["tablename"] for r in rows}


async def test_open_migrates_and_reopening_applies_nothing(pg_url: str) -> None:
    async with PgDatabase(pg_url) as db:
        assert await db.run(schema_version) == SCHEMA_VERSION
        tables = await db.run(_tables)
        assert {"sessions", "pairing", "inbox", "transcripts", "parley_schema"} <= tables
    async with PgDatabase(pg_url) as db:
        assert await db.run(migrate) == []


async def test_replicas_starting_at_once_migrate_once(pg_url: str) -> None:
    dbs = [PgDatabase(pg_url, migrate_at_open=False) for _ in range(4)]
    for db in dbs:
        await db.open()
    try:
        applied = await asyncio.gather(*(db.run(migrate) for db in dbs))
        # The advisory lock serialises them: one applies every version, the rest none.
        assert sorted(applied, key=len) == [[], [], [], list(range(1, SCHEMA_VERSION + 1))]
        rows = await dbs[0].run(lambda c: c.execute("SELECT version FROM parley_schema").fetchall())
        assert [r["version"] for r in rows] == list(range(1, len(MIGRATIONS) + 1))
    finally:
        for db in dbs:
            await db.close()


async def test_a_newer_schema_is_refused(pg_url: str) -> None:
    async with PgDatabase(pg_url) as db:
        await db.run(lambda c: c.execute("INSERT INTO parley_schema (version) VALUES (%s)", (999,)))
    with pytest.raises(SchemaTooNewError, match="schema version 999"):
        await PgDatabase(pg_url).open()


async def test_a_failing_statement_rolls_back_its_transaction(pg_url: str) -> None:
    async with PgDatabase(pg_url) as db:

        def half_then_fail(conn: psycopg.Connection[Any]) -> None:
            conn.execute(
                "INSERT INTO pairing (channel, sender_id, account, code, status, created_at,"
                " expires_at) VALUES ('t', 'u', 'default', 'C1', 'pending', 'x', 'y')"
            )
            conn.execute("SELECT 1/0")

        with pytest.raises(psycopg.errors.DivisionByZero):
            await db.run(half_then_fail)
        count = await db.run(lambda c: c.execute("SELECT count(*) AS n FROM pairing").fetchone())
        assert count["n"] == 0


async def test_an_unreachable_server_is_a_clear_error(tmp_path: Any) -> None:
    url = f"postgresql://parley:secret@/parley?host={tmp_path}&connect_timeout=1"
    db = PgDatabase(url)
    db_open = db.open()
    with pytest.raises(StateError) as raised:
        await db_open
    assert "cannot connect to PostgreSQL at postgresql://parley@" in str(raised.value)
    assert "secret" not in str(raised.value)
    assert redact_url("postgresql://a:pw@h:5/d") == "postgresql://a@h/d"
