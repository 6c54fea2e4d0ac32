"""The state stores of the configured backend (registry, inbox, pairing, transcripts),
opened and closed together.

``[storage] backend = "sqlite"`` (the default): state.db under $PARLEY_HOME.
``"postgres"``: the shared database at ``[storage] url`` (the ``postgres`` extra).
Both give the same registry, inbox, pairing and transcript-store APIs, so nothing
above this module knows which one runs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from parley.core.transcript_store import FileTranscriptStore, TranscriptStore
from parley.gateway.config import LoadedConfig
from parley.gateway.storage.inbox import Inbox, ReplicaInbox
from parley.gateway.storage.pairing import PairingStore
from parley.gateway.storage.sessions import SessionRegistry, utcnow
from parley.gateway.storage.sqlite.database import Database
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from parley.gateway.storage.sqlite.pairing import SqlitePairingStore
from parley.gateway.storage.sqlite.session_registry import SqliteSessionRegistry

if TYPE_CHECKING:
    from parley.gateway.storage.postgres.database import PgDatabase
    from parley.gateway.storage.postgres.session_locks import SessionLocks


class StateStores:
    """Registry, inbox and pairing on one backend; explicit open/close."""

    def __init__(self, loaded: LoadedConfig, *, now: Callable[[], datetime] = utcnow) -> None:
        storage = loaded.config.storage
        self.backend = storage.backend
        self.sqlite: Database | None = None
        self.pg: PgDatabase | None = None
        self.registry: SessionRegistry
        self.inbox: Inbox
        self.pairing: PairingStore
        self.transcripts: TranscriptStore
        # PostgreSQL: the same inbox, with what several replicas need; None for SQLite.
        self.replica_inbox: ReplicaInbox | None = None
        # PostgreSQL: the replica's session locks (opened with the stores); None for
        # SQLite, where one process owns the state and its lanes are lock enough.
        self.locks: SessionLocks | None = None
        if storage.backend == "postgres":
            from parley.gateway.storage.postgres.database import PgDatabase
            from parley.gateway.storage.postgres.inbox import PgInbox
            from parley.gateway.storage.postgres.pairing import PgPairingStore
            from parley.gateway.storage.postgres.session_locks import SessionLocks
            from parley.gateway.storage.postgres.session_registry import PgSessionRegistry
            from parley.gateway.storage.postgres.transcripts import PgTranscriptStore

            assert storage.url is not None  # the config refuses postgres without one
            self.pg = PgDatabase(storage.url.get_secret_value(), pool_size=storage.pool_size)
            self.registry = PgSessionRegistry(self.pg)
            self.pairing = PgPairingStore(self.pg, now=now)
            self.transcripts = PgTranscriptStore(self.pg)
            self.locks = SessionLocks(storage.url.get_secret_value())
            inbox = PgInbox(self.pg)
            inbox.locks = self.locks
            self.inbox = self.replica_inbox = inbox
            self.where = f"postgres {self.pg.where}"
        else:
            self.sqlite = Database(loaded.state_db, fsync=storage.fsync)
            self.registry = SqliteSessionRegistry(self.sqlite)
            self.inbox = SqliteInbox(self.sqlite)
            self.pairing = SqlitePairingStore(self.sqlite, now=now)
            self.transcripts = FileTranscriptStore(loaded.sessions_dir, fsync=storage.fsync)
            self.where = str(loaded.state_db)

    async def __aenter__(self) -> StateStores:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self.pg is not None:
            await self.pg.open()  # migrates first: the locks need no schema, the inbox does
            if self.locks is not None:
                try:
                    await self.locks.open()
                except BaseException:
                    await self.pg.close()
                    raise
        elif self.sqlite is not None:
            await self.sqlite.open()

    async def close(self) -> None:
        if self.locks is not None:
            await self.locks.close()  # releases what is held: other replicas take over
        if self.pg is not None:
            await self.pg.close()
        elif self.sqlite is not None:
            await self.sqlite.close()

    async def ping(self) -> None:
        """One trivial statement: raises when the state database cannot answer."""
        if self.pg is not None:
            await self.pg.run(_select_one)
        elif self.sqlite is not None:
            db = self.sqlite
            await db.run(lambda: db.conn.execute("SELECT 1").fetchone())


def _select_one(conn: Any) -> None:
    conn.execute("SELECT 1").fetchone()
