"""A psycopg connection pool whose statements run on worker threads.

``run(fn, *args)`` calls ``fn(conn, *args)`` on one of the pool's threads with a
pooled connection inside a transaction: committed when ``fn`` returns, rolled back
when it raises. ``call`` does the same synchronously, for code that already runs on a
worker thread (transcript appends). The schema is migrated at ``open``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from parley.gateway.errors import StateError
from parley.gateway.storage.postgres.schema_migrations import migrate

log = logging.getLogger("parley.gateway.pg")

T = TypeVar("T")
Connection = psycopg.Connection[dict[str, Any]]
OPEN_TIMEOUT_SECONDS = 30.0
# How long a statement waits for a free connection before it fails (not hangs).
CHECKOUT_TIMEOUT_SECONDS = 30.0


def redact_url(url: str) -> str:
    """``url`` without its password, for logs and errors."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database URL>"
    host = info.get("host") or "localhost"
    return f"postgresql://{info.get('user') or ''}@{host}/{info.get('dbname') or ''}"


class PgDatabase:
    """The replica's connections to the shared PostgreSQL; explicit open/close."""

    def __init__(self, url: str, *, pool_size: int = 10, migrate_at_open: bool = True) -> None:
        self.url = url
        self.where = redact_url(url)
        self._pool_size = pool_size
        self._migrate_at_open = migrate_at_open
        self._pool: ConnectionPool[Connection] | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def __aenter__(self) -> PgDatabase:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._pool is not None:
            return
        self._executor = ThreadPoolExecutor(
            max_workers=self._pool_size, thread_name_prefix="parley-pg"
        )
        pool: ConnectionPool[Connection] = ConnectionPool(
            self.url,
            min_size=1,
            max_size=self._pool_size,
            kwargs={"row_factory": dict_row},
            timeout=CHECKOUT_TIMEOUT_SECONDS,
            open=False,
            name="parley",
        )
        try:
            # One plain connection first: the pool would retry a refused or misspelt
            # server until its timeout, where this fails at once with the reason.
            await self._in_thread(self._probe)
            await self._in_thread(pool.open, True, OPEN_TIMEOUT_SECONDS)
        except (PoolTimeout, psycopg.Error) as exc:
            await self._in_thread(pool.close)
            self._shutdown_executor()
            raise StateError(f"cannot connect to PostgreSQL at {self.where}: {exc}") from exc
        self._pool = pool
        if self._migrate_at_open:
            try:
                await self.run(migrate)
            except BaseException:
                await self.close()
                raise

    def _probe(self) -> None:
        psycopg.connect(self.url, connect_timeout=int(OPEN_TIMEOUT_SECONDS)).close()

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await self._in_thread(pool.close)
        self._shutdown_executor()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` in a transaction on a worker thread."""
        return await self._in_thread(self.call, fn, *args)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` in a transaction, on the calling (worker) thread."""
        pool = self._pool
        if pool is None:
            raise StateError(f"PostgreSQL at {self.where} is not open")
        with pool.connection() as conn:
            return fn(conn, *args)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        executor = self._executor
        if executor is None:
            raise StateError(f"PostgreSQL at {self.where} is not open")
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    def _shutdown_executor(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
