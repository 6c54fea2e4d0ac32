"""``PgMemoryStore``'s status: scopes, counts, the integrity check and whether
full-text search works."""

from __future__ import annotations

from typing import Any

import psycopg

from parley.core.memory.rows import SourceCount, StoreCounts
from parley.gateway.storage.postgres.database import Connection
from parley.gateway.storage.postgres.memory.base import StoreBase
from parley.gateway.storage.postgres.memory.vectors import HNSW_MAX_DIMS, hnsw_index_name


class StatusMethods(StoreBase):
    """What ``parley memory status`` and the doctor read of one index."""

    def scopes(self) -> list[str]:
        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT DISTINCT scope FROM memory_files WHERE index_id = %s ORDER BY 1", (ix.id,)
            ).fetchall()

        return [str(r["scope"]) for r in self._call(read)]

    def counts(self) -> StoreCounts:
        def read(conn: Connection) -> StoreCounts:
            ix = self._index(conn)
            counts = StoreCounts()
            by_source: dict[str, SourceCount] = {}
            for r in conn.execute(
                "SELECT source, count(*) AS files, count(*) FILTER (WHERE vectors_pending)"
                " AS pending FROM memory_files WHERE index_id = %s GROUP BY source",
                (ix.id,),
            ):
                by_source[r["source"]] = SourceCount(r["source"], files=int(r["files"]))
                counts.files += int(r["files"])
                counts.pending_vector_files += int(r["pending"])
            for r in conn.execute(
                "SELECT source, count(*) AS chunks, count(embedding) AS vectors"
                " FROM memory_chunks WHERE index_id = %s GROUP BY source",
                (ix.id,),
            ):
                by_source.setdefault(r["source"], SourceCount(r["source"])).chunks = int(
                    r["chunks"]
                )
                counts.chunks += int(r["chunks"])
                counts.vectors += int(r["vectors"])
            counts.by_source = [by_source[k] for k in sorted(by_source)]
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_embedding_cache WHERE index_id = %s", (ix.id,)
            ).fetchone()
            counts.cache_entries = int(row["n"] if row else 0)
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_forgotten WHERE name = %s", (self.name,)
            ).fetchone()
            counts.forgotten = int(row["n"] if row else 0)
            return counts

        return self._call(read)

    def integrity_check(self) -> list[str]:
        """Problems found (empty when healthy): files whose chunk count disagrees with
        their rows, chunks without a file, vectors of the wrong width, and a missing
        vector index."""

        def check(conn: Connection) -> list[str]:
            ix = self._index(conn)
            problems: list[str] = []
            for r in conn.execute(
                "SELECT f.path, f.chunks, count(c.id) AS found FROM memory_files f"
                " LEFT JOIN memory_chunks c ON c.index_id = f.index_id AND c.path = f.path"
                " WHERE f.index_id = %s GROUP BY f.path, f.chunks"
                " HAVING count(c.id) <> f.chunks ORDER BY f.path",
                (ix.id,),
            ):
                problems.append(f"{r['path']}: {r['chunks']} chunk(s) recorded, {r['found']} found")
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_chunks c WHERE c.index_id = %s AND NOT EXISTS"
                " (SELECT 1 FROM memory_files f WHERE f.index_id = c.index_id"
                " AND f.path = c.path)",
                (ix.id,),
            ).fetchone()
            if row and row["n"]:
                problems.append(f"{row['n']} chunk(s) without a file")
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_chunks WHERE index_id = %s"
                " AND embedding IS NOT NULL AND (dims IS DISTINCT FROM %s"
                " OR vector_dims(embedding) <> dims)",
                (ix.id, ix.dims),
            ).fetchone()
            if row and row["n"]:
                problems.append(f"{row['n']} vector(s) of another width than the index's")
            if self.vector_index == "hnsw" and ix.dims is not None and ix.dims <= HNSW_MAX_DIMS:
                name = hnsw_index_name(ix.dims)
                found = conn.execute("SELECT to_regclass(%s) AS r", (name,)).fetchone()
                if not found or found["r"] is None:
                    problems.append(f"vector index {name} is missing")
            return problems

        return self._call(check)

    def fts_available(self) -> bool:
        try:
            self._call(
                lambda conn: conn.execute(
                    "SELECT to_tsvector('parley_english', 'x') @@ to_tsquery('parley_english', 'x')"
                ).fetchone()
            )
            return True
        except psycopg.Error:
            return False
