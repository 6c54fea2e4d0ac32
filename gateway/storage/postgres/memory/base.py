"""What every part of ``PgMemoryStore`` stands on: the index's roles, the row a
statement resolves first, and one pooled transaction per call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from parley.core.errors import MemoryIndexError
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.memory.info import PgStoreInfo
from parley.gateway.storage.postgres.memory.vectors import VectorIndex

T = TypeVar("T")
LIVE = "live"
SHADOW = "shadow"
RETIRED = "retired"


@dataclass(frozen=True, slots=True)
class IndexRow:
    """An index's ``memory_indexes`` row, resolved by (name, role) in each transaction."""

    id: int
    dims: int | None


class StoreBase:
    """The state and helpers the store's method groups share (``PgMemoryStore``)."""

    def __init__(
        self,
        db: PgDatabase,
        name: str,
        role: str,
        info: PgStoreInfo,
        vector_index: VectorIndex = "hnsw",
    ) -> None:
        self.db = db
        self.name = name
        self.role = role
        self.info = info
        self.vector_index: VectorIndex = vector_index

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return self.db.call(fn, *args)

    def _index(self, conn: Connection, *, lock: bool = False) -> IndexRow:
        row = conn.execute(
            "SELECT id, dims FROM memory_indexes WHERE name = %s AND role = %s"
            + (" FOR SHARE" if lock else ""),
            (self.name, self.role),
        ).fetchone()
        if row is None:
            raise MemoryIndexError(f"memory index {self.name!r} ({self.role}) does not exist")
        return IndexRow(int(row["id"]), row["dims"])

    def _lock_path(self, conn: Connection, ix: IndexRow, path: str) -> None:
        # Two replicas syncing one file at once would each delete nothing the other
        # had not committed yet and both insert: one at a time per file.
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (ix.id, path))
