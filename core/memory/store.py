"""memory.db's rows: one connection to one agent's SQLite memory index, and nothing else.

``MemoryStore`` replaces a file's chunks (with their keyword, CJK and vector rows), keeps
the embedding cache, answers the search primitives (BM25 over FTS5, KNN over
sqlite-vec), exports rows for ``parley migrate``, applies forgetting's evictions and
counts what is there. The tables and their upgrades are ``core.memory.store_schema``'s;
the row types are ``core.memory.rows``'s, shared with the PostgreSQL store, and
``core.memory.store_protocol`` says what the index and search need of either store.

Every method is synchronous and meant for one thread (``MemoryIndex`` gives its writer
and its reader thread a connection each); a file's chunks change in one transaction,
so a kill leaves each file either old or new.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from parley.core.errors import MemoryIndexError
from parley.core.memory.driver import DriverChoice, DriverInfo, open_connection
from parley.core.memory.rows import (
    CacheEntry,
    ChunkRow,
    FileRow,
    ForgettableChunk,
    IndexMeta,
    SourceCount,
    StoreCounts,
    StoredChunk,
    Tombstone,
    blob_vector,
    vector_blob,
)
from parley.core.memory.store_chunks import IN_BATCH, ChunkWrites, in_batches
from parley.core.memory.store_schema import STORE_VERSION as STORE_VERSION
from parley.core.memory.store_schema import create_tables

# STORE_VERSION is re-exported (``as``): the home upgrade (gateway/home_upgrade/state.py)
# reads it from this module with getattr, so it must stay here. The row types come from
# core.memory.rows.
META_KEY = "index"
_IN_BATCH = IN_BATCH
_chunked = in_batches


class MemoryStore(ChunkWrites):
    """One connection to one memory.db. Not thread-safe: give each thread its own.
    Writing chunks and their late vectors: ``ChunkWrites`` (``core.memory.store_chunks``)."""

    def __init__(self, conn: Any, info: DriverInfo, path: Path) -> None:
        self._conn = conn
        self.info = info
        self.path = path
        self._errors: tuple[type[BaseException], ...] = (info.module.Error,)
        self._vec_dims = self._existing_vec_dims()

    @classmethod
    def open(cls, path: Path, *, driver: DriverChoice = "auto", vector: bool = True) -> MemoryStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn, info = open_connection(path, choice=driver, vector=vector)
        except Exception as exc:
            raise MemoryIndexError(f"cannot open the memory index {path}: {exc}") from exc
        try:
            create_tables(conn)
        except info.module.Error as exc:
            conn.close()
            raise MemoryIndexError(f"memory index {path} is unusable: {exc}") from exc
        return cls(conn, info, path)

    def close(self) -> None:
        self._conn.close()

    def checkpoint(self) -> None:
        """Move the WAL into the main file (before the file is renamed into place)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- meta -------------------------------------------------------------------------

    def meta(self) -> IndexMeta | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
        return IndexMeta.from_json(row[0]) if row else None

    def set_meta(self, meta: IndexMeta) -> None:
        self._conn.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (META_KEY, meta.to_json()),
        )

    # -- vectors table ------------------------------------------------------------------

    @property
    def vector_dims(self) -> int | None:
        """The width of ``chunks_vec``, or None when it does not exist (yet), or when this
        connection cannot load sqlite-vec (then the table, if an earlier driver made it,
        cannot even be read; the index is rebuilt keyword-only)."""
        if not self.info.vector_available:
            return None
        if self._vec_dims is None:  # another connection may have created it since
            self._vec_dims = self._existing_vec_dims()
        return self._vec_dims

    def _existing_vec_dims(self) -> int | None:
        row = self._conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'chunks_vec'"
        ).fetchone()
        if not row:
            return None
        marker = "float["
        sql = str(row[0])
        start = sql.find(marker)
        return int(sql[start + len(marker) : sql.index("]", start)]) if start >= 0 else None

    def ensure_vectors(self, dims: int) -> None:
        if not self.info.vector_available:
            raise MemoryIndexError(f"vector search unavailable: {self.info.vector_error}")
        current = self.vector_dims  # another connection may have created it already
        if current is None:
            # IF NOT EXISTS: another connection may create it between the check and here.
            self._conn.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_vec USING vec0("
                f"scope TEXT PARTITION KEY, embedding float[{int(dims)}] distance_metric=cosine)"
            )
            current = self._vec_dims = self._existing_vec_dims()
        if current != dims:
            raise MemoryIndexError(f"chunks_vec holds {current}-dim vectors, not {dims}: reindex")

    # -- files --------------------------------------------------------------------------

    def files(self) -> dict[str, FileRow]:
        rows = self._conn.execute(
            "SELECT path, source, scope, hash, mtime, size, chunks, vectors_pending, indexed_at"
            " FROM files"
        ).fetchall()
        return {
            path: FileRow(path, source, scope, digest, mtime, size, chunks, bool(pending), indexed)
            for path, source, scope, digest, mtime, size, chunks, pending, indexed in rows
        }

    def touch_file(self, path: str, mtime: float, size: int) -> None:
        """The content is unchanged (same hash): remember the new stat only."""
        self._conn.execute(
            "UPDATE files SET mtime = ?, size = ? WHERE path = ?", (mtime, size, path)
        )

    # -- embedding cache ----------------------------------------------------------------

    def cached_vectors(
        self,
        provider: str,
        model: str,
        provider_key: str,
        hashes: Sequence[str],
        dims: int = 0,
    ) -> dict[str, np.ndarray]:
        """Cached vectors by content hash; ``dims`` > 0 keeps only vectors of that width."""
        found: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(hashes))
        for batch in _chunked(unique):
            marks = ",".join("?" * len(batch))
            rows = self._conn.execute(
                "SELECT hash, embedding FROM embedding_cache WHERE provider = ? AND model = ?"
                f" AND provider_key = ? AND hash IN ({marks})",
                (provider, model, provider_key, *batch),
            )
            found.update(
                (h, vector)
                for h, blob in rows
                if (vector := blob_vector(blob)).size == dims or dims <= 0
            )
        return found

    def cache_vectors(
        self,
        provider: str,
        model: str,
        provider_key: str,
        items: Sequence[tuple[str, np.ndarray]],
        *,
        max_entries: int,
    ) -> None:
        if not items or max_entries <= 0:
            return
        now = time.time()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT INTO embedding_cache(provider, model, provider_key, hash, embedding,"
                " dims, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO UPDATE SET embedding = excluded.embedding,"
                " dims = excluded.dims, updated_at = excluded.updated_at",
                [(provider, model, provider_key, h, vector_blob(v), len(v), now) for h, v in items],
            )
            excess = conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0]
            excess -= max_entries
            if excess > 0:  # least recently written first
                conn.execute(
                    "DELETE FROM embedding_cache WHERE rowid IN (SELECT rowid FROM"
                    " embedding_cache ORDER BY updated_at LIMIT ?)",
                    (excess,),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # -- search primitives --------------------------------------------------------------

    def keyword_hits(
        self, table: str, match: str, scopes: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        """(chunk id, bm25 rank) best first; ``table`` is chunks_fts or chunks_cjk."""
        if table not in ("chunks_fts", "chunks_cjk"):
            raise ValueError(f"not a keyword table: {table}")
        marks = ",".join("?" * len(scopes))
        # CROSS JOIN pins the full-text table as the outer loop: with a plain JOIN the
        # planner walked the scope index and re-ran the MATCH once per chunk (3.9 s p50 at
        # 100,000 chunks; bench/memory_scale.py).
        rows = self._conn.execute(
            f"SELECT f.rowid, bm25({table}) AS rank FROM {table} AS f"
            f" CROSS JOIN chunks AS c ON c.id = f.rowid"
            f" WHERE {table} MATCH ? AND c.scope IN ({marks}) ORDER BY rank LIMIT ?",
            (match, *scopes, limit),
        ).fetchall()
        return [(int(i), float(r)) for i, r in rows]

    def vector_hits(
        self, query: np.ndarray, scopes: Sequence[str], k: int
    ) -> list[tuple[int, float]]:
        """The ``k`` (chunk id, cosine distance) nearest first, within ``scopes``."""
        if self.vector_dims is None or k <= 0:
            return []
        marks = ",".join("?" * len(scopes))
        # sqlite-vec runs the KNN once per partition value of the IN list: up to k rows
        # for each scope, whose union holds the k nearest overall.
        rows = self._conn.execute(
            "SELECT rowid, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ?"
            f" AND scope IN ({marks}) ORDER BY distance",
            (vector_blob(query), int(k), *scopes),
        ).fetchall()
        return [(int(i), float(d)) for i, d in rows[:k]]

    def vectors_for(self, ids: Sequence[int]) -> dict[int, np.ndarray]:
        if self.vector_dims is None or not ids:
            return {}
        found: dict[int, np.ndarray] = {}
        # One point lookup per id: vec0 answers ``rowid IN (...)`` with a full scan.
        for chunk_id in dict.fromkeys(ids):
            row = self._conn.execute(
                "SELECT embedding FROM chunks_vec WHERE rowid = ?", (chunk_id,)
            ).fetchone()
            if row is not None:
                found[int(chunk_id)] = blob_vector(row[0])
        return found

    def chunks_by_id(self, ids: Sequence[int]) -> dict[int, ChunkRow]:
        found: dict[int, ChunkRow] = {}
        for batch in _chunked(list(ids)):
            marks = ",".join("?" * len(batch))
            rows = self._conn.execute(
                "SELECT id, path, source, scope, start_line, end_line, hash, text, ts,"
                f" entry_ids, updated_at FROM chunks WHERE id IN ({marks})",
                batch,
            )
            for chunk_id, path, source, scope, start, end, digest, text, ts, entries, at in rows:
                found[int(chunk_id)] = ChunkRow(
                    chunk_id, path, source, scope, start, end, digest, text, ts,
                    tuple(json.loads(entries or "[]")), float(at),
                )  # fmt: skip
        return found

    def chunk_texts(self, path: str) -> list[tuple[int, str, str]]:
        """(id, hash, text) of a file's chunks, in order (for filling in vectors later)."""
        rows = self._conn.execute(
            "SELECT id, hash, text FROM chunks WHERE path = ? ORDER BY id", (path,)
        )
        return [(int(i), str(h), str(t)) for i, h, t in rows]

    # -- export (read-only) -------------------------------------------------------------

    def stored_chunks(self, path: str, *, vectors: bool = True) -> list[StoredChunk]:
        """A file's chunks in id order, with their CJK text and vectors (``vectors=False``:
        without, for a copy that embeds them anew). Raises MemoryIndexError when vectors
        are asked for and the file has some this connection cannot read (no sqlite-vec):
        a copy without them would silently lose the vector side."""
        if vectors and self.vector_dims is None and self._existing_vec_dims() is not None:
            raise MemoryIndexError(
                f"{self.path} holds vectors, but they cannot be read here: {self.info.vector_error}"
            )
        rows = self._conn.execute(
            "SELECT id, start_line, end_line, hash, text, ts, entry_ids, created_at,"
            " updated_at FROM chunks WHERE path = ? ORDER BY id",
            (path,),
        ).fetchall()
        ids = [int(r[0]) for r in rows]
        cjk: dict[int, str] = {}
        for batch in _chunked(ids):
            marks = ",".join("?" * len(batch))
            cjk.update(
                (int(i), str(t))
                for i, t in self._conn.execute(
                    f"SELECT rowid, text FROM chunks_cjk WHERE rowid IN ({marks})", batch
                )
            )
        found = self.vectors_for(ids) if vectors else {}
        return [
            StoredChunk(
                id=int(r[0]),
                start_line=int(r[1]),
                end_line=int(r[2]),
                hash=str(r[3]),
                text=str(r[4]),
                ts=r[5],
                entry_ids=tuple(json.loads(r[6] or "[]")),
                created_at=float(r[7]),
                updated_at=float(r[8]),
                cjk_text=cjk.get(int(r[0]), ""),
                vector=found.get(int(r[0])),
            )
            for r in rows
        ]

    def cache_entries(self, batch: int = _IN_BATCH) -> Iterator[list[CacheEntry]]:
        """The embedding cache's rows, ``batch`` at a time (a large cache never sits in
        memory whole)."""
        cursor = self._conn.execute(
            "SELECT provider, model, provider_key, hash, embedding, dims, updated_at"
            " FROM embedding_cache ORDER BY provider, model, provider_key, hash"
        )
        while rows := cursor.fetchmany(batch):
            yield [
                CacheEntry(str(p), str(m), str(k), str(h), bytes(e), int(d), float(u))
                for p, m, k, h, e, d, u in rows
            ]

    # -- forgetting ---------------------------------------------------------------------

    def state(self, key: str) -> str | None:
        """A value the index keeps beside its rows (e.g. when it last forgot)."""
        if key == META_KEY:
            raise ValueError(f"{key!r} is the index meta")
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def states(self, prefix: str) -> dict[str, str]:
        """Every state value whose key starts with ``prefix`` (e.g. the kept sources)."""
        rows = self._conn.execute(
            "SELECT key, value FROM meta WHERE substr(key, 1, ?) = ? AND key != ?",
            (len(prefix), prefix, META_KEY),
        )
        return {str(k): str(v) for k, v in rows}

    def set_state(self, key: str, value: str) -> None:
        if key == META_KEY:
            raise ValueError(f"{key!r} is the index meta")
        self._conn.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def forgettable_chunks(self, sources: Sequence[str]) -> list[ForgettableChunk]:
        """The chunks of ``sources``, with their file's mtime, oldest id first."""
        if not sources:
            return []
        marks = ",".join("?" * len(sources))
        rows = self._conn.execute(
            "SELECT c.id, c.path, c.source, c.scope, c.start_line, c.end_line, c.hash,"
            " c.text, c.ts, f.mtime FROM chunks AS c JOIN files AS f ON f.path = c.path"
            f" WHERE c.source IN ({marks}) ORDER BY c.id",
            tuple(sources),
        ).fetchall()
        return [
            ForgettableChunk(
                chunk_id, path, source, scope, start, end, digest, text, ts, float(mtime)
            )
            for chunk_id, path, source, scope, start, end, digest, text, ts, mtime in rows
        ]

    def evict_chunks(self, evictions: Sequence[tuple[int, Tombstone]]) -> int:
        """Delete chunks by id and record their tombstones, in one transaction; the
        number of chunks deleted (a chunk replaced meanwhile is not deleted, but its
        tombstone still keeps its (path, hash) out)."""
        if not evictions:
            return 0
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            deleted = self.delete_chunk_rows([chunk_id for chunk_id, _ in evictions])
            self._insert_tombstones([t for _, t in evictions])
            # files.chunks counts what is indexed now.
            conn.executemany(
                "UPDATE files SET chunks = (SELECT COUNT(*) FROM chunks WHERE path = ?)"
                " WHERE path = ?",
                [(path, path) for path in sorted({t.path for _, t in evictions})],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return deleted

    def add_tombstones(self, tombstones: Sequence[Tombstone]) -> None:
        """Record tombstones (kept ones win): a rebuild carries the live index's over."""
        if not tombstones:
            return
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._insert_tombstones(tombstones)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _insert_tombstones(self, tombstones: Sequence[Tombstone]) -> None:
        self._conn.executemany(
            "INSERT INTO forgotten(path, hash, scope, source, start_line, end_line, reason,"
            " evicted_at, preview) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(path, hash) DO NOTHING",
            [
                (t.path, t.hash, t.scope, t.source, t.start_line, t.end_line, t.reason,
                 t.evicted_at, t.preview)
                for t in tombstones
            ],
        )  # fmt: skip

    def forgotten_hashes(self, path: str) -> set[str]:
        """The hashes of a file's evicted chunks (a sync leaves them out)."""
        rows = self._conn.execute("SELECT hash FROM forgotten WHERE path = ?", (path,))
        return {str(r[0]) for r in rows}

    def tombstones(self, limit: int | None = None) -> list[Tombstone]:
        """Evictions, newest first (all of them when ``limit`` is None)."""
        rows = self._conn.execute(
            "SELECT path, hash, scope, source, start_line, end_line, reason, evicted_at,"
            " preview FROM forgotten ORDER BY evicted_at DESC, path, start_line LIMIT ?",
            (-1 if limit is None else int(limit),),
        ).fetchall()
        return [
            Tombstone(path, digest, scope, source, start, end, reason, float(at), str(preview))
            for path, digest, scope, source, start, end, reason, at, preview in rows
        ]

    # -- status -------------------------------------------------------------------------

    def scopes(self) -> list[str]:
        return [
            str(r[0]) for r in self._conn.execute("SELECT DISTINCT scope FROM files ORDER BY 1")
        ]

    def counts(self) -> StoreCounts:
        conn = self._conn
        counts = StoreCounts()
        by_source: dict[str, SourceCount] = {}
        for source, files, pending in conn.execute(
            "SELECT source, COUNT(*), SUM(vectors_pending) FROM files GROUP BY source"
        ):
            by_source[source] = SourceCount(source, files=int(files))
            counts.files += int(files)
            counts.pending_vector_files += int(pending or 0)
        for source, chunks in conn.execute("SELECT source, COUNT(*) FROM chunks GROUP BY source"):
            by_source.setdefault(source, SourceCount(source)).chunks = int(chunks)
            counts.chunks += int(chunks)
        counts.by_source = [by_source[k] for k in sorted(by_source)]
        if self.vector_dims is not None:
            counts.vectors = int(conn.execute("SELECT COUNT(*) FROM chunks_vec").fetchone()[0])
        counts.cache_entries = int(
            conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0]
        )
        counts.forgotten = int(conn.execute("SELECT COUNT(*) FROM forgotten").fetchone()[0])
        return counts

    def integrity_check(self) -> list[str]:
        """Problems found (empty when healthy): SQLite's own check, FTS5's check of both
        keyword tables, and chunks missing from the keyword index."""
        conn = self._conn
        problems = [str(r[0]) for r in conn.execute("PRAGMA integrity_check").fetchall()]
        problems = [p for p in problems if p != "ok"]
        for table in ("chunks_fts", "chunks_cjk"):
            try:
                # FTS5's own check: raises SQLITE_CORRUPT_VTAB when index and rows disagree.
                conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
            except self._errors as exc:
                # The check is an INSERT: a read-only or full disk refuses to run it,
                # which says nothing about the index. Only corruption is a finding.
                if any(word in str(exc).lower() for word in ("malformed", "corrupt")):
                    problems.append(f"{table}: {exc}")
        missing = conn.execute(
            "SELECT COUNT(*) FROM chunks WHERE id NOT IN (SELECT rowid FROM chunks_fts)"
        ).fetchone()[0]
        if missing:
            problems.append(f"{missing} chunk(s) missing from the keyword index")
        if self.vector_dims is not None:
            orphans = conn.execute(
                "SELECT COUNT(*) FROM chunks_vec WHERE rowid NOT IN (SELECT id FROM chunks)"
            ).fetchone()[0]
            if orphans:
                problems.append(f"{orphans} vector(s) without a chunk")
        return problems

    def fts_available(self) -> bool:
        try:
            self._conn.execute("SELECT rowid FROM chunks_fts LIMIT 0").fetchall()
            return True
        except self._errors:
            return False
