"""The state backends the backend-neutral tests run against: SQLite (a state.db in the
test's directory) and PostgreSQL (a fresh database of the test's own, `pg_url`).

A test takes the ``state`` fixture and gets the backend's registry, inbox and a pairing
store factory; it runs once per backend. Import the fixtures into the test module:

    from tests.gateway.state_backends import StateBackend, state, state_location
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.inbox import PgInbox
from parley.gateway.storage.postgres.pairing import PgPairingStore
from parley.gateway.storage.postgres.session_registry import PgSessionRegistry
from parley.gateway.storage.sessions import utcnow
from parley.gateway.storage.sqlite.database import Database
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from parley.gateway.storage.sqlite.pairing import SqlitePairingStore
from parley.gateway.storage.sqlite.session_registry import SqliteSessionRegistry

BACKENDS = ("sqlite", "postgres")

AnyRegistry = SqliteSessionRegistry | PgSessionRegistry
AnyInbox = SqliteInbox | PgInbox
AnyPairingStore = SqlitePairingStore | PgPairingStore


@dataclass(frozen=True)
class StateBackend:
    name: str
    where: Path | str  # the state.db path, or the PostgreSQL URL
    registry: AnyRegistry
    inbox: AnyInbox
    _pairing: Callable[[Callable[[], datetime]], AnyPairingStore]
    _execute: Callable[[str, Sequence[Any]], Any]

    def pairing(self, now: Callable[[], datetime] = utcnow) -> AnyPairingStore:
        return self._pairing(now)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """One statement written with SQLite's ``?`` placeholders, on either backend:
        for what the public API cannot do (backdating a row)."""
        await self._execute(sql, params)

    def reopen(self) -> AbstractAsyncContextManager[StateBackend]:
        """The same storage opened again, as a restarted gateway would."""
        return open_backend(self.name, self.where)


@asynccontextmanager
async def open_backend(name: str, where: Path | str) -> AsyncIterator[StateBackend]:
    if name == "sqlite":
        async with _sqlite(Path(where)) as backend:
            yield backend
    else:
        async with _postgres(str(where)) as backend:
            yield backend


@asynccontextmanager
async def _sqlite(path: Path) -> AsyncIterator[StateBackend]:
    async with Database(path) as db:

        async def execute(sql: str, params: Sequence[Any]) -> None:
            await db.run(lambda: db.conn.execute(sql, tuple(params)))

        yield StateBackend(
            "sqlite",
            path,
            SqliteSessionRegistry(db),
            SqliteInbox(db),
            lambda now: SqlitePairingStore(db, now=now),
            execute,
        )


@asynccontextmanager
async def _postgres(url: str) -> AsyncIterator[StateBackend]:
    async with PgDatabase(url) as db:

        def run(conn: Connection, sql: str, params: Sequence[Any]) -> None:
            conn.execute(sql.replace("?", "%s"), tuple(params))

        async def execute(sql: str, params: Sequence[Any]) -> None:
            await db.run(run, sql, params)

        yield StateBackend(
            "postgres",
            url,
            PgSessionRegistry(db),
            PgInbox(db),
            lambda now: PgPairingStore(db, now=now),
            execute,
        )


@pytest.fixture(params=BACKENDS)
def state_location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path | str]:
    # Only the postgres runs ask for pg_url, so SQLite-only runs never start the server.
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("pg_url")
    return "sqlite", tmp_path / "state.db"


@pytest.fixture
async def state(state_location: tuple[str, Path | str]) -> AsyncIterator[StateBackend]:
    async with open_backend(*state_location) as backend:
        yield backend
