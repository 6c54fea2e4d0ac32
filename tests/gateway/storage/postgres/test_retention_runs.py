"""The shared database's retention run lock on a real PostgreSQL (retention_runs.py):
held only while its connection lives, so a replica killed mid-run (its process gone) or
cut off (its connection ended by the server) leaves it free for the next run; a run
whose connection broke says so when it ends."""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import psycopg
import pytest

from parley.gateway.errors import RetentionBusy
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.retention_runs import hold_run_lock

# A replica's run holding the lock: prints its lock connection's backend pid, then waits
# to be killed.
REPLICA = """
import asyncio, sys
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.retention_runs import hold_run_lock

async def main() -> None:
    async with hold_run_lock(PgDatabase(sys.argv[1])) as pid:
        print(pid, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def _is_free(db: PgDatabase) -> bool:
    try:
        async with hold_run_lock(db):
            return True
    except RetentionBusy:
        return False


async def _backend_gone(pg_url: str, pid: int, *, within: float = 30.0) -> None:
    """Wait until the server has ended backend ``pid`` (it notices a dead client's
    closed socket on its own, a moment after the kill)."""
    deadline = time.monotonic() + within
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        while True:
            query = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
            cursor = await admin.execute(query, (pid,))
            row = await cursor.fetchone()
            if row is not None and row[0] == 0:
                return
            assert time.monotonic() < deadline, f"backend {pid} still there after {within} s"
            await asyncio.sleep(0.05)


async def test_a_killed_replica_leaves_the_lock_free(pg_url: str) -> None:
    db = PgDatabase(pg_url)  # the lock needs only its URL: the pool is never opened
    replica = await asyncio.create_subprocess_exec(
        sys.executable, "-c", REPLICA, pg_url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert replica.stdout is not None
        line = await replica.stdout.readline()
        pid = int(line)  # the replica holds the lock now
        assert not await _is_free(db)
    finally:
        replica.kill()  # SIGKILL: no finally, no unlock, no goodbye to the server
        await replica.wait()
    await _backend_gone(pg_url, pid)
    assert await _is_free(db)


async def test_a_run_cut_off_from_the_server_loses_the_lock_and_says_so(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    db = PgDatabase(pg_url)
    with caplog.at_level(logging.WARNING, logger="parley.gateway.retention"):
        async with hold_run_lock(db):
            pass
        assert caplog.records == []  # an ordinary run says nothing
        async with hold_run_lock(db) as pid:
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
                # With a timeout, it returns once the backend is gone (PostgreSQL 14+).
                await admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            assert await _is_free(db)  # another replica's run could start now
    [record] = caplog.records
    assert "run lock was lost during the run" in record.getMessage()


async def test_the_lock_is_the_schemas(pg_url: str) -> None:
    """Two deployments in two schemas of one database work on different rows: neither's
    run waits for the other's. One schema's runs still exclude each other."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute("CREATE SCHEMA other")
    separator = "&" if "?" in pg_url else "?"
    other = PgDatabase(f"{pg_url}{separator}options=-csearch_path%3Dother")
    db = PgDatabase(pg_url)
    async with hold_run_lock(db):
        assert not await _is_free(db)
        assert await _is_free(other)
