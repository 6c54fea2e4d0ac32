"""``PgMemoryBackend``: one agent's live and shadow memory indexes in a shared
PostgreSQL (the ``StoreBackend`` of ``core.memory.store_protocol``; SQLite's is
``core.memory.backend.SqliteBackend``)."""

from __future__ import annotations

from parley.core.errors import MemoryIndexError
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.memory.base import LIVE, RETIRED, SHADOW
from parley.gateway.storage.postgres.memory.store import PgMemoryStore
from parley.gateway.storage.postgres.memory.vectors import VECTOR_INDEX_LOCK, VectorIndex


class PgMemoryBackend:
    """One agent's memory index in a shared PostgreSQL (``name``: the agent id)."""

    def __init__(self, db: PgDatabase, name: str, *, vector_index: VectorIndex = "hnsw") -> None:
        self.db = db
        self.name = name
        self.vector_index: VectorIndex = vector_index

    @property
    def where(self) -> str:
        return f"{self.db.where} (memory index {self.name!r})"

    def open_live(self, *, vector: bool) -> PgMemoryStore:
        return PgMemoryStore.open(
            self.db, self.name, LIVE, vector=vector, vector_index=self.vector_index
        )

    def open_shadow(self, *, vector: bool) -> PgMemoryStore:
        return PgMemoryStore.open(
            self.db, self.name, SHADOW, vector=vector, vector_index=self.vector_index
        )

    def discard_shadow(self) -> None:
        self.db.call(delete_role, self.name, SHADOW)

    def promote_shadow(self) -> None:
        """The shadow becomes live in one transaction; the old rows go afterwards."""

        def flip(conn: Connection) -> None:
            lock_name(conn, self.name)
            conn.execute(
                "UPDATE memory_indexes SET role = %s WHERE name = %s AND role = %s",
                (RETIRED, self.name, LIVE),
            )
            row = conn.execute(
                "UPDATE memory_indexes SET role = %s WHERE name = %s AND role = %s RETURNING id",
                (LIVE, self.name, SHADOW),
            ).fetchone()
            if row is None:
                raise MemoryIndexError(f"memory index {self.name!r} has no rebuild to swap in")

        self.db.call(flip)
        # A separate transaction: readers already see the new index, and a kill here
        # leaves only a retired index, removed by the next promotion (or drop).
        self.db.call(delete_role, self.name, RETIRED)

    def drop(self) -> None:
        """Remove every row of this index (live, shadow and retired), tombstones too."""

        def delete(conn: Connection) -> None:
            conn.execute("DELETE FROM memory_indexes WHERE name = %s", (self.name,))
            conn.execute("DELETE FROM memory_forgotten WHERE name = %s", (self.name,))
            conn.execute("DELETE FROM memory_state WHERE name = %s", (self.name,))

        self.db.call(delete)


def lock_name(conn: Connection, name: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (VECTOR_INDEX_LOCK, name))


def delete_role(conn: Connection, name: str, role: str) -> None:
    conn.execute("DELETE FROM memory_indexes WHERE name = %s AND role = %s", (name, role))
