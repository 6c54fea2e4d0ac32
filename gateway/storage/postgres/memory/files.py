"""``PgMemoryStore``'s files and chunks: listing, replacing and deleting a file's
chunks, the embedding cache, vectors filled in after the embedder was down, and a
file's chunks read and written as stored (a rebuild carrying a kept source over)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from parley.core.errors import MemoryIndexError
from parley.core.memory.query import cjk_index_text
from parley.core.memory.rows import (
    FileRow,
    NewChunk,
    PendingChunk,
    StoredChunk,
    blob_vector,
    vector_blob,
)
from parley.gateway.storage.postgres.database import Connection
from parley.gateway.storage.postgres.memory.base import StoreBase
from parley.gateway.storage.postgres.memory.chunks import (
    chunk_params,
    insert_chunks,
    upsert_file_row,
    write_stored_file,
)
from parley.gateway.storage.postgres.memory.vectors import vector_text


class FileMethods(StoreBase):
    """Files, chunks and the embedding cache of one index."""

    def files(self) -> dict[str, FileRow]:
        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT path, source, scope, hash, mtime, size, chunks, vectors_pending,"
                " indexed_at FROM memory_files WHERE index_id = %s",
                (ix.id,),
            ).fetchall()

        return {
            r["path"]: FileRow(
                r["path"],
                r["source"],
                r["scope"],
                r["hash"],
                float(r["mtime"]),
                int(r["size"]),
                int(r["chunks"]),
                bool(r["vectors_pending"]),
                float(r["indexed_at"]),
            )
            for r in self._call(read)
        }

    def touch_file(self, path: str, mtime: float, size: int) -> None:
        def write(conn: Connection) -> None:
            ix = self._index(conn)
            conn.execute(
                "UPDATE memory_files SET mtime = %s, size = %s WHERE index_id = %s AND path = %s",
                (mtime, size, ix.id, path),
            )

        self._call(write)

    def replace_file(
        self, file: FileRow, chunks: Sequence[NewChunk], vectors: np.ndarray | None
    ) -> None:
        """Swap a file's chunks for ``chunks`` (with ``vectors`` row for row, or None:
        then, when ``file.vectors_pending``, the chunks wait for the vector pass)."""
        if vectors is not None and len(vectors) != len(chunks):
            raise MemoryIndexError("one vector per chunk is required")
        self._call(self._replace, file, chunks, vectors, None)

    def replace_tail(self, file: FileRow, from_line: int, chunks: Sequence[NewChunk]) -> None:
        """Replace a file's chunks that start at ``from_line`` or later by ``chunks``
        (a transcript resumed where its open chunk starts); the earlier ones stay."""
        self._call(self._replace, file, chunks, None, from_line)

    def _replace(
        self,
        conn: Connection,
        file: FileRow,
        chunks: Sequence[NewChunk],
        vectors: np.ndarray | None,
        from_line: int | None,
    ) -> None:
        now = time.time()
        ix = self._index(conn, lock=True)
        self._lock_path(conn, ix, file.path)
        if from_line is None:
            conn.execute(
                "DELETE FROM memory_chunks WHERE index_id = %s AND path = %s", (ix.id, file.path)
            )
        else:
            conn.execute(
                "DELETE FROM memory_chunks WHERE index_id = %s AND path = %s AND start_line >= %s",
                (ix.id, file.path, from_line),
            )
        rows = [
            chunk_params(ix.id, file, c, None if vectors is None else vectors[i], now)
            for i, c in enumerate(chunks)
        ]
        insert_chunks(conn, rows)
        count = len(chunks)
        if from_line is not None:
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_chunks WHERE index_id = %s AND path = %s"
                " AND start_line < %s",
                (ix.id, file.path, from_line),
            ).fetchone()
            count += int(row["n"] if row else 0)
        # A chunk without a vector is pending (when the file wants vectors at all).
        waiting = file.vectors_pending and self._has_pending(conn, ix.id, file.path)
        upsert_file_row(conn, ix.id, replace(file, vectors_pending=waiting), count, now)

    @staticmethod
    def _has_pending(conn: Connection, index_id: int, path: str) -> bool:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM memory_chunks WHERE index_id = %s AND path = %s"
            " AND embedding IS NULL) AS e",
            (index_id, path),
        ).fetchone()
        return bool(row and row["e"])

    def delete_file(self, path: str) -> None:
        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            self._lock_path(conn, ix, path)
            conn.execute(
                "DELETE FROM memory_chunks WHERE index_id = %s AND path = %s", (ix.id, path)
            )
            conn.execute(
                "DELETE FROM memory_files WHERE index_id = %s AND path = %s", (ix.id, path)
            )

        self._call(write)

    # -- embedding cache --------------------------------------------------------------

    def cached_vectors(
        self,
        provider: str,
        model: str,
        provider_key: str,
        hashes: Sequence[str],
        dims: int = 0,
    ) -> dict[str, np.ndarray]:
        """Cached vectors by content hash; ``dims`` > 0 keeps only vectors of that width."""
        unique = list(dict.fromkeys(hashes))
        if not unique:
            return {}

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT hash, embedding FROM memory_embedding_cache WHERE index_id = %s"
                " AND provider = %s AND model = %s AND provider_key = %s AND hash = ANY(%s)",
                (ix.id, provider, model, provider_key, unique),
            ).fetchall()

        found: dict[str, np.ndarray] = {}
        for row in self._call(read):
            vector = blob_vector(bytes(row["embedding"]))
            if dims <= 0 or vector.size == dims:
                found[row["hash"]] = vector
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

        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO memory_embedding_cache (index_id, provider, model,"
                    " provider_key, hash, embedding, dims, updated_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (index_id, provider, model, provider_key, hash) DO UPDATE"
                    " SET embedding = excluded.embedding, dims = excluded.dims,"
                    " updated_at = excluded.updated_at",
                    [
                        (ix.id, provider, model, provider_key, h, vector_blob(v), len(v), now)
                        for h, v in items
                    ],
                )
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_embedding_cache WHERE index_id = %s", (ix.id,)
            ).fetchone()
            excess = int(row["n"] if row else 0) - max_entries
            if excess > 0:  # least recently written first
                conn.execute(
                    "DELETE FROM memory_embedding_cache WHERE ctid IN (SELECT ctid FROM"
                    " memory_embedding_cache WHERE index_id = %s ORDER BY updated_at LIMIT %s)",
                    (ix.id, excess),
                )

        self._call(write)

    def chunk_texts(self, path: str) -> list[tuple[int, str, str]]:
        """(id, hash, text) of a file's chunks, in order (for filling in vectors later)."""

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT id, hash, text FROM memory_chunks WHERE index_id = %s AND path = %s"
                " ORDER BY id",
                (ix.id, path),
            ).fetchall()

        return [(int(r["id"]), r["hash"], r["text"]) for r in self._call(read)]

    def stored_chunks(self, path: str, *, vectors: bool = True) -> list[StoredChunk]:
        """A file's chunks in id order, as stored (``vectors=False``: without their
        vectors, for a copy that embeds them anew). The CJK text is not kept beside its
        tsvector: it is derived from the text again, as indexing derived it."""
        with_vectors = vectors and self.info.vector_available
        column = ", embedding::real[] AS v" if with_vectors else ""

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            with conn.cursor(binary=True) as cur:  # real[] in binary: no float parsing
                return cur.execute(
                    "SELECT id, start_line, end_line, hash, text, ts, entry_ids, created_at,"
                    f" updated_at{column} FROM memory_chunks WHERE index_id = %s AND path = %s"
                    " ORDER BY id",
                    (ix.id, path),
                ).fetchall()

        return [
            StoredChunk(
                id=int(r["id"]),
                start_line=int(r["start_line"]),
                end_line=int(r["end_line"]),
                hash=r["hash"],
                text=r["text"],
                ts=r["ts"],
                entry_ids=tuple(json.loads(r["entry_ids"] or "[]")),
                created_at=float(r["created_at"]),
                updated_at=float(r["updated_at"]),
                cjk_text=cjk_index_text(r["text"]),
                vector=None
                if not with_vectors or r["v"] is None
                else np.asarray(r["v"], dtype=np.float32),
            )
            for r in self._call(read)
        ]

    def carry_file(self, file: FileRow, chunks: Sequence[StoredChunk]) -> None:
        """Write ``file`` and its chunks as another index stored them (a rebuild carrying
        a kept source over): lines, times, vectors where a chunk has one (of the index's
        width: ``ensure_vectors``); a chunk without one is pending when
        ``file.vectors_pending``. Replaces whatever the file had, in one transaction:
        carrying twice (a resumed rebuild) leaves one copy."""

        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            if any(c.vector is not None and len(c.vector) != ix.dims for c in chunks):
                raise MemoryIndexError(f"memory index holds {ix.dims}-dim vectors: reindex")
            pending = file.vectors_pending and any(c.vector is None for c in chunks)
            row = replace(file, chunks=len(chunks), vectors_pending=pending)
            write_stored_file(conn, ix.id, row, chunks)

        self._call(write)

    def add_vectors(self, path: str, scope: str, items: Sequence[tuple[int, np.ndarray]]) -> None:
        """Fill in the vectors of a file indexed while the embedder was down."""

        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            self._lock_path(conn, ix, path)
            with conn.cursor() as cur:
                cur.executemany(
                    "UPDATE memory_chunks SET embedding = %s::vector, dims = %s"
                    " WHERE id = %s AND index_id = %s",
                    [(vector_text(v), len(v), int(i), ix.id) for i, v in items],
                )
            conn.execute(
                "UPDATE memory_files SET vectors_pending = false WHERE index_id = %s AND path = %s",
                (ix.id, path),
            )

        self._call(write)

    def pending_vectors(self, limit: int) -> list[PendingChunk]:
        """Up to ``limit`` chunks waiting for their vector, of any file, oldest first:
        those without one in files marked ``vectors_pending``."""

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT c.id, c.path, c.scope, c.hash, c.text FROM memory_files AS f"
                " JOIN memory_chunks AS c ON c.index_id = f.index_id AND c.path = f.path"
                " WHERE f.index_id = %s AND f.vectors_pending AND c.embedding IS NULL"
                " ORDER BY c.id LIMIT %s",
                (ix.id, int(limit)),
            ).fetchall()

        return [
            PendingChunk(int(r["id"]), r["path"], r["scope"], r["hash"], r["text"])
            for r in self._call(read)
        ]

    def set_vectors(self, items: Sequence[tuple[int, str, np.ndarray]]) -> int:
        """Add the vectors of pending chunks ((id, content hash, vector)); a chunk that was
        replaced meanwhile is left alone. Files with nothing left pending are marked so.
        The number of vectors added."""
        if not items:
            return 0

        def write(conn: Connection) -> int:
            ix = self._index(conn, lock=True)
            ids = [int(i) for i, _, _ in items]
            found = conn.execute(
                "SELECT id, path FROM memory_chunks WHERE index_id = %s AND id = ANY(%s)",
                (ix.id, ids),
            ).fetchall()
            paths = sorted({str(r["path"]) for r in found})
            for path in paths:  # sorted: two writers take the locks in the same order
                self._lock_path(conn, ix, path)
            written = 0
            for chunk_id, digest, vector in items:
                written += conn.execute(
                    "UPDATE memory_chunks SET embedding = %s::vector, dims = %s"
                    " WHERE id = %s AND index_id = %s AND hash = %s",
                    (vector_text(vector), len(vector), int(chunk_id), ix.id, digest),
                ).rowcount
            for path in paths:
                if not self._has_pending(conn, ix.id, path):
                    conn.execute(
                        "UPDATE memory_files SET vectors_pending = false"
                        " WHERE index_id = %s AND path = %s",
                        (ix.id, path),
                    )
            return written

        return int(self._call(write))
