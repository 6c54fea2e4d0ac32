"""One turn at a time per session across every replica: PostgreSQL advisory locks.

A replica holds the locks of the sessions it is running on one dedicated connection
(session-level advisory locks, keyed by a 64-bit hash of the session key). Taking one
is ``pg_try_advisory_lock``; when another replica holds it, the waiter sleeps until
that replica's release NOTIFYs the key, or ``poll_seconds`` pass. A replica that dies
loses its connection and PostgreSQL drops its locks; no NOTIFY comes then, so the
waiters find out by polling. Within a replica the lanes already run one turn per
session, so these locks only ever contend with other replicas.

A lock has no lease: nothing expires it while its connection lives, however starved
the replica is (PostgreSQL keeps an idle connection; the kernel answers keepalives).
The connection itself can still go (a network cut, a server restart, an operator's
``idle_session_timeout``, which the lock connection turns off for itself), and with
it every lock, in the middle of a turn. ``still_held`` says whether a lock is still
this replica's: the lane asks it before each reply goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import psycopg
from psycopg.rows import TupleRow

from parley.gateway.errors import StateError
from parley.gateway.tasks import cancel_and_wait

log = logging.getLogger("parley.gateway.pg")

CHANNEL = "parley_session_unlocked"
DEFAULT_POLL_SECONDS = 1.0


class SessionLocks:
    """The replica's session locks; explicit open/close."""

    def __init__(self, url: str, *, poll_seconds: float = DEFAULT_POLL_SECONDS) -> None:
        self._url = url
        self._poll = poll_seconds
        self._conn: psycopg.AsyncConnection[TupleRow] | None = None
        self._listener: psycopg.AsyncConnection[TupleRow] | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._released: dict[str, asyncio.Event] = {}
        self._statement = asyncio.Lock()  # one statement at a time on the lock connection
        self.held: set[str] = set()
        # The lock connection's backend pid: this replica's identity while it lives
        # (the inbox's ``claimed_by``); PostgreSQL forgets it when the replica dies.
        self.pid: int | None = None

    async def open(self) -> None:
        try:
            self._conn = await lock_connection(self._url)
            self._listener = await lock_connection(self._url)
            await self._listener.execute(f"LISTEN {CHANNEL}")
            row = await (await self._conn.execute("SELECT pg_backend_pid()")).fetchone()
            self.pid = int(row[0]) if row else None
        except psycopg.Error as exc:
            await self.close()
            raise StateError(f"cannot open the session lock connection: {exc}") from exc
        self._listen_task = asyncio.create_task(self._listen(), name="session-lock-listener")

    async def close(self) -> None:
        task, self._listen_task = self._listen_task, None
        await cancel_and_wait(task)
        for conn in (self._conn, self._listener):
            if conn is not None:
                await conn.close()  # drops every lock still held
        self._conn = self._listener = None
        self.held.clear()

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block, waiting for other replicas first."""
        await self.acquire(key)
        try:
            yield
        finally:
            await self.release(key)

    async def acquire(self, key: str) -> None:
        waited = False
        while not await self._try(key):
            if not waited:
                log.debug("session %s is running on another replica; waiting", key)
                waited = True
            event = self._released.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll):
                    await event.wait()
            event.clear()
        self._released.pop(key, None)  # one event per waited-on key, not per key ever seen
        self.held.add(key)

    async def release(self, key: str) -> None:
        self.held.discard(key)
        try:
            async with self._statement:
                conn = self._connection()
                await conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, key))
        except psycopg.Error as exc:
            # The connection is gone, and with it the lock: nothing left to release.
            log.error("releasing the session lock of %s failed: %s", key, exc)

    async def still_held(self, key: str) -> bool:
        """Is ``key``'s lock still this replica's? Taken on the lock connection and
        released only by ``release``, it is as long as that connection lives: one
        round trip tells. False once the connection broke (every lock went with it;
        the next ``acquire`` reconnects)."""
        if key not in self.held:
            return False  # released, or a reconnect since dropped it
        async with self._statement:
            conn = self._conn
            if conn is None:
                return False
            try:
                await conn.execute("SELECT 1")
            except psycopg.Error as exc:
                log.error("the session lock connection is gone (%s): its locks with it", exc)
                self.held.clear()
                return False
        return key in self.held

    async def _try(self, key: str) -> bool:
        async with self._statement:
            if self._conn is None and self._listener is not None:
                # A reconnect failed before (the server was down): try again now,
                # rather than fail every session's runs until a restart.
                await self._reconnect(StateError("the lock connection was lost"))
            for attempt in (1, 2):
                try:
                    cursor = await self._connection().execute(
                        "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)
                    )
                    row = await cursor.fetchone()
                    return bool(row and row[0])
                except psycopg.Error as exc:
                    if attempt == 2:
                        raise StateError(f"the session lock connection failed: {exc}") from exc
                    # The connection broke (a server restart, a network cut): its locks
                    # went with it. Reconnect once; this replica gets a new pid, so the
                    # inbox items it had claimed become orphans that a live replica
                    # (maybe this one) takes over.
                    await self._reconnect(exc)
        raise AssertionError("unreachable")

    async def _reconnect(self, cause: Exception) -> None:
        log.error("the session lock connection failed (%s); reconnecting", cause)
        self.held.clear()
        old, self._conn = self._conn, None
        if old is not None:
            with contextlib.suppress(psycopg.Error):
                await old.close()
        try:
            self._conn = await lock_connection(self._url)
            row = await (await self._conn.execute("SELECT pg_backend_pid()")).fetchone()
        except psycopg.Error as exc:
            raise StateError(f"cannot reopen the session lock connection: {exc}") from exc
        self.pid = int(row[0]) if row else None

    def _connection(self) -> psycopg.AsyncConnection[TupleRow]:
        if self._conn is None:
            raise StateError("session locks are not open")
        return self._conn

    async def _listen(self) -> None:
        assert self._listener is not None
        try:
            async for note in self._listener.notifies():
                event = self._released.get(note.payload)
                if event is not None:
                    event.set()
        except psycopg.Error as exc:
            # Waiters fall back to polling; nothing is lost but promptness.
            log.warning("session lock notifications stopped: %s", exc)


async def lock_connection(url: str) -> psycopg.AsyncConnection[TupleRow]:
    """A lock (or notification) connection: autocommit, and exempt from a server's
    ``idle_session_timeout`` (it idles between a turn's lock and its release, and its
    end would drop the locks mid-turn). Retention's run lock uses one too
    (``retention_runs``)."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    # Before PostgreSQL 14 there is no such timeout to turn off.
    with contextlib.suppress(psycopg.errors.UndefinedObject):
        await conn.execute("SET idle_session_timeout = 0")
    return conn
