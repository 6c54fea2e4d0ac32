"""``PgMemoryStore``: ``MemoryStore`` (``core.memory.store``) on PostgreSQL.

This module opens an index and holds its meta and vector width; the other methods
come from one class per job (``files``, ``search``, ``forgetting``, ``status``), all on
``base.StoreBase``. The package's ``__init__`` describes the tables.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from parley.core.errors import MemoryIndexError
from parley.core.memory.rows import IndexMeta
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.memory.base import LIVE
from parley.gateway.storage.postgres.memory.files import FileMethods
from parley.gateway.storage.postgres.memory.forgetting import ForgettingMethods
from parley.gateway.storage.postgres.memory.info import PgStoreInfo, version_tuple
from parley.gateway.storage.postgres.memory.search import SearchMethods
from parley.gateway.storage.postgres.memory.status import StatusMethods
from parley.gateway.storage.postgres.memory.vectors import (
    HNSW_MAX_DIMS,
    HNSW_SINCE,
    VECTOR_INDEX_LOCK,
    VectorIndex,
    hnsw_index_sql,
)


class PgMemoryStore(FileMethods, SearchMethods, ForgettingMethods, StatusMethods):
    """``MemoryStore`` on PostgreSQL. Methods are synchronous: call on a worker thread.

    Holds no connection: each method borrows one from the pool for one transaction
    (``StoreBase``), so a writer and a reader (or several replicas) may use the same
    index at once.
    """

    @classmethod
    def open(
        cls,
        db: PgDatabase,
        name: str,
        role: str = LIVE,
        *,
        vector: bool = True,
        vector_index: VectorIndex = "hnsw",
    ) -> PgMemoryStore:
        def create(conn: Connection) -> dict[str, Any]:
            conn.execute(
                "INSERT INTO memory_indexes (name, role, created_at) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                (name, role, time.time()),
            )
            row = conn.execute(
                "SELECT current_setting('server_version') AS server,"
                " (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS vector"
            ).fetchone()
            assert row is not None
            return row

        try:
            versions = db.call(create)
        except psycopg.Error as exc:
            raise MemoryIndexError(f"cannot open memory index {name!r}: {exc}") from exc
        info = PgStoreInfo(
            vector_available=vector and versions["vector"] is not None,
            vector_error=None if vector else "vector search is turned off (keyword-only)",
            server_version=str(versions["server"]),
            vector_version=versions["vector"],
        )
        if vector and versions["vector"] is None:
            info = PgStoreInfo(False, "pgvector is not installed", info.server_version, None)
        elif (
            info.vector_available
            and vector_index == "hnsw"
            and version_tuple(info.vector_version) < HNSW_SINCE
        ):
            raise MemoryIndexError(
                f"pgvector {info.vector_version} has no HNSW index (0.5 or newer has);"
                ' upgrade it, or set [storage] vector_index = "exact"'
            )
        return cls(db, name, role, info, vector_index)

    def close(self) -> None:
        return None  # the pool belongs to the PgDatabase

    def checkpoint(self) -> None:
        return None  # every method commits its own transaction

    # -- meta -------------------------------------------------------------------------

    def meta(self) -> IndexMeta | None:
        def read(conn: Connection) -> str | None:
            row = conn.execute(
                "SELECT meta FROM memory_indexes WHERE name = %s AND role = %s",
                (self.name, self.role),
            ).fetchone()
            return None if row is None else row["meta"]

        raw = self._call(read)
        return IndexMeta.from_json(raw) if raw else None

    def set_meta(self, meta: IndexMeta) -> None:
        def write(conn: Connection) -> None:
            ix = self._index(conn)
            conn.execute(
                "UPDATE memory_indexes SET meta = %s WHERE id = %s", (meta.to_json(), ix.id)
            )

        self._call(write)

    # -- vectors ----------------------------------------------------------------------

    @property
    def vector_dims(self) -> int | None:
        """The index's vector width, None before the first vectors (or keyword-only)."""
        if not self.info.vector_available:
            return None
        return self._call(lambda conn: self._index(conn).dims)

    def ensure_vectors(self, dims: int) -> None:
        if not self.info.vector_available:
            raise MemoryIndexError(f"vector search unavailable: {self.info.vector_error}")
        width = int(dims)

        def ensure(conn: Connection) -> None:
            # Serialised per width: two replicas creating one index would collide in
            # the catalogue even with IF NOT EXISTS.
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (VECTOR_INDEX_LOCK, width))
            row = conn.execute(
                "SELECT id, dims FROM memory_indexes WHERE name = %s AND role = %s FOR UPDATE",
                (self.name, self.role),
            ).fetchone()
            if row is None:
                raise MemoryIndexError(f"memory index {self.name!r} does not exist")
            if row["dims"] is not None and row["dims"] != width:
                raise MemoryIndexError(
                    f"memory index holds {row['dims']}-dim vectors, not {width}: reindex"
                )
            if row["dims"] is None:
                conn.execute(
                    "UPDATE memory_indexes SET dims = %s WHERE id = %s", (width, row["id"])
                )
            if self.vector_index == "hnsw" and width <= HNSW_MAX_DIMS:
                conn.execute(hnsw_index_sql(width))

        self._call(ensure)
