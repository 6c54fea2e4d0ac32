"""Session locks across replicas, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from parley.gateway.storage.postgres.session_locks import SessionLocks

LIMIT = 10.0


@pytest.fixture
async def replicas(pg_url: str) -> AsyncIterator[tuple[SessionLocks, SessionLocks]]:
    # A long poll: a release must wake the waiter by NOTIFY, not by the timer.
    a, b = SessionLocks(pg_url, poll_seconds=60), SessionLocks(pg_url, poll_seconds=60)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_one_replica_at_a_time_per_session(
    replicas: tuple[SessionLocks, SessionLocks],
) -> None:
    a, b = replicas
    order: list[str] = []
    await a.acquire("agent:main:telegram:direct:1")
    waiting = asyncio.create_task(b.acquire("agent:main:telegram:direct:1"))
    # Another session is not held up meanwhile.
    async with asyncio.timeout(LIMIT), b.hold("agent:main:telegram:direct:2"):
        order.append("other session ran")
    assert not waiting.done()
    order.append("a done")
    await a.release("agent:main:telegram:direct:1")
    async with asyncio.timeout(LIMIT):
        await waiting
    order.append("b got it")
    assert order == ["other session ran", "a done", "b got it"]
    assert b.held == {"agent:main:telegram:direct:1"} and a.held == set()


async def test_a_dead_replica_releases_its_sessions(pg_url: str) -> None:
    a = SessionLocks(pg_url)
    b = SessionLocks(pg_url, poll_seconds=0.05)  # no NOTIFY comes from the dead
    await a.open()
    await b.open()
    try:
        await a.acquire("k")
        waiting = asyncio.create_task(b.acquire("k"))
        # Kill a's lock connection from outside, as a crashed replica's would end.
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks"
                " WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()"
            )
        async with asyncio.timeout(LIMIT):
            await waiting
        assert b.held == {"k"}
    finally:
        await a.close()
        await b.close()
