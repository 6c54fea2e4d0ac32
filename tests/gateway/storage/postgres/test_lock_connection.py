"""The session-lock connection going away under a replica (a network cut, a server
restart, an operator's idle timeout): what the replica knows of its locks then, and
that it takes them again once the server is back (session_locks.py)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from parley.gateway.errors import StateError
from parley.gateway.storage.postgres.session_locks import SessionLocks


async def terminate(pg_url: str, pid: int | None) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_a_lock_is_still_held_only_while_its_connection_lives(pg_url: str) -> None:
    locks = SessionLocks(pg_url)
    await locks.open()
    try:
        assert not await locks.still_held("k")  # never taken
        await locks.acquire("k")
        assert await locks.still_held("k")
        await terminate(pg_url, locks.pid)
        assert not await locks.still_held("k")  # PostgreSQL dropped it with the connection
        assert locks.held == set()
        await locks.acquire("k")  # a new connection, the lock taken again
        assert await locks.still_held("k")
        await locks.release("k")
        assert not await locks.still_held("k")
    finally:
        await locks.close()


async def test_the_lock_connection_ignores_a_server_idle_session_timeout(pg_url: str) -> None:
    # A server (or role) with idle_session_timeout would end the lock connection while
    # a turn runs, and with it the lock; the lock connection turns it off for itself.
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
        database = (await (await admin.execute("SELECT current_database()")).fetchone() or [""])[0]
        await admin.execute(f"ALTER DATABASE \"{database}\" SET idle_session_timeout = '2s'")
    locks = SessionLocks(pg_url)
    await locks.open()
    try:
        # (The listener connection is opened the same way; it is busy in its NOTIFY
        # loop, so it is not asked here.)
        assert locks._conn is not None
        row = await (await locks._conn.execute("SHOW idle_session_timeout")).fetchone()
        assert row is not None and row[0] == "0"
    finally:
        await locks.close()


async def test_locks_come_back_after_a_failed_reconnect(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = SessionLocks(pg_url)
    await locks.open()
    try:
        await locks.acquire("k")
        await locks.release("k")
        await terminate(pg_url, locks.pid)
        connect = psycopg.AsyncConnection.connect

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise psycopg.OperationalError("connection refused")

        # The server is still down when the replica first notices.
        monkeypatch.setattr(psycopg.AsyncConnection, "connect", refused)
        with pytest.raises(StateError):
            await locks.acquire("k")
        # Back: the next run reconnects (before, every acquire from then on failed
        # with "session locks are not open" until the replica was restarted).
        monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect)
        await locks.acquire("k")
        assert await locks.still_held("k")
    finally:
        await locks.close()
