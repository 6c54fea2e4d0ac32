"""memory.db's chunk writes: a file's chunks replaced (whole, or from a line on), and the
vectors filled in after them.

A sync writes a file's chunks with their text and keyword rows at once, so they are
findable by keyword straight away; a chunk whose vector is still to be computed is
listed in ``chunks_pending`` (file layout 3) and the vector pass (``core.memory.index.
vectors``) embeds the pending chunks of every file in batches and adds their vectors
(``set_vectors``). A rebuild writes a kept source (its file removed by retention) as the
live index stored it (``carry_file``). Each method is one transaction, so a kill leaves
each file either old or new, its resume point (the file row) with it.

``MemoryStore`` (``core.memory.store``) inherits these methods; they use its connection.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from parley.core.errors import MemoryIndexError
from parley.core.memory.rows import FileRow, NewChunk, PendingChunk, StoredChunk, vector_blob

# SQLite's default limit on host parameters is 32766 in new builds, 999 in old ones.
IN_BATCH = 500


def in_batches(items: Sequence[Any], size: int = IN_BATCH) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class ChunkWrites:
    """The chunk-writing half of ``MemoryStore`` (one connection, one thread)."""

    _conn: Any

    @property
    def vector_dims(self) -> int | None:
        raise NotImplementedError

    def replace_file(
        self,
        file: FileRow,
        chunks: Sequence[NewChunk],
        vectors: np.ndarray | None,
    ) -> None:
        """Swap a file's chunks for ``chunks`` (with ``vectors`` row for row, or None:
        then, when ``file.vectors_pending``, the chunks wait for the vector pass)."""
        if vectors is not None and len(vectors) != len(chunks):
            raise MemoryIndexError("one vector per chunk is required")
        self._transaction(self._replace, file, chunks, vectors, None)

    def replace_tail(self, file: FileRow, from_line: int, chunks: Sequence[NewChunk]) -> None:
        """Replace a file's chunks that start at ``from_line`` or later by ``chunks``
        (a transcript resumed where its open chunk starts); the earlier ones stay."""
        self._transaction(self._replace, file, chunks, None, from_line)

    def _transaction(self, fn: Any, *args: Any) -> Any:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(*args)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return result

    def _replace(
        self,
        file: FileRow,
        chunks: Sequence[NewChunk],
        vectors: np.ndarray | None,
        from_line: int | None,
    ) -> None:
        now = time.time()
        conn = self._conn
        self._delete_chunks(file.path, from_line)
        pending = vectors is None and file.vectors_pending
        for index, chunk in enumerate(chunks):
            vector = None if vectors is None else vectors[index]
            self._insert_chunk(file, chunk, (now, now), vector, pending)
        count = len(chunks)
        if from_line is not None:
            count += conn.execute(
                "SELECT COUNT(*) FROM chunks WHERE path = ? AND start_line < ?",
                (file.path, from_line),
            ).fetchone()[0]
        self._upsert_file(file, count, now)

    def _insert_chunk(
        self,
        file: FileRow,
        chunk: NewChunk | StoredChunk,
        stamps: tuple[float, float],
        vector: np.ndarray | None,
        pending: bool,
    ) -> None:
        """One chunk of ``file`` with its keyword rows, and its vector or (``pending``)
        its place in the vector pass's queue. Every chunk takes its file's scope and
        source: a file is one audience's (a sync writes it whole, or resumes a
        transcript only under the same scope)."""
        conn = self._conn
        created, updated = stamps
        cursor = conn.execute(
            "INSERT INTO chunks(path, source, scope, start_line, end_line, hash, text,"
            " ts, entry_ids, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                file.path, file.source, file.scope, chunk.start_line, chunk.end_line,
                chunk.hash, chunk.text, chunk.ts, json.dumps(list(chunk.entry_ids)),
                created, updated,
            ),
        )  # fmt: skip
        chunk_id = cursor.lastrowid
        conn.execute("INSERT INTO chunks_fts(rowid, text) VALUES (?, ?)", (chunk_id, chunk.text))
        if chunk.cjk_text:
            conn.execute(
                "INSERT INTO chunks_cjk(rowid, text) VALUES (?, ?)", (chunk_id, chunk.cjk_text)
            )
        if vector is not None:
            conn.execute(
                "INSERT INTO chunks_vec(rowid, scope, embedding) VALUES (?, ?, ?)",
                (chunk_id, file.scope, vector_blob(vector)),
            )
        elif pending:
            conn.execute("INSERT INTO chunks_pending(id) VALUES (?)", (chunk_id,))

    def _upsert_file(self, file: FileRow, count: int, indexed_at: float) -> None:
        # Still waiting for vectors: this file's pending chunks, old or new.
        waiting = file.vectors_pending and self._has_pending(file.path)
        self._conn.execute(
            "INSERT INTO files(path, source, scope, hash, mtime, size, chunks,"
            " vectors_pending, indexed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(path) DO UPDATE SET source = excluded.source,"
            " scope = excluded.scope, hash = excluded.hash, mtime = excluded.mtime,"
            " size = excluded.size, chunks = excluded.chunks,"
            " vectors_pending = excluded.vectors_pending, indexed_at = excluded.indexed_at",
            (
                file.path, file.source, file.scope, file.hash, file.mtime, file.size,
                count, int(waiting), indexed_at,
            ),
        )  # fmt: skip

    def carry_file(self, file: FileRow, chunks: Sequence[StoredChunk]) -> None:
        """Write ``file`` and its chunks as another index stored them (a rebuild carrying
        a kept source over): their lines, times, CJK text, and vector where a chunk has
        one (the table must hold that width: ``ensure_vectors``); a chunk without one is
        pending when ``file.vectors_pending``. Whatever the file had is replaced, in one
        transaction: carrying twice (a resumed rebuild) leaves one copy."""
        dims = self.vector_dims
        if any(c.vector is not None and len(c.vector) != dims for c in chunks):
            raise MemoryIndexError(f"chunks_vec holds {dims}-dim vectors, not these: reindex")

        def write() -> None:
            self._delete_chunks(file.path, None)
            for chunk in chunks:
                stamps = (chunk.created_at, chunk.updated_at)
                self._insert_chunk(file, chunk, stamps, chunk.vector, file.vectors_pending)
            self._upsert_file(file, len(chunks), file.indexed_at)

        self._transaction(write)

    def _has_pending(self, path: str) -> bool:
        row = self._conn.execute(
            # CROSS JOIN: walk the few pending rows, not every chunk of a long transcript.
            "SELECT 1 FROM chunks_pending AS p CROSS JOIN chunks AS c ON c.id = p.id"
            " WHERE c.path = ? LIMIT 1",
            (path,),
        ).fetchone()
        return row is not None

    def delete_file(self, path: str) -> None:
        def delete() -> None:
            self._delete_chunks(path, None)
            self._conn.execute("DELETE FROM files WHERE path = ?", (path,))

        self._transaction(delete)

    def _delete_chunks(self, path: str, from_line: int | None) -> None:
        args: list[object]
        where, args = "path = ?", [path]
        if from_line is not None:
            where, args = "path = ? AND start_line >= ?", [path, from_line]
        ids = [r[0] for r in self._conn.execute(f"SELECT id FROM chunks WHERE {where}", args)]
        self.delete_chunk_rows(ids)

    def delete_chunk_rows(self, ids: Sequence[int]) -> int:
        """Delete chunks by id with their keyword, vector and pending rows; how many."""
        deleted = 0
        for batch in in_batches(ids):
            marks = ",".join("?" * len(batch))
            self._conn.execute(f"DELETE FROM chunks_fts WHERE rowid IN ({marks})", batch)
            self._conn.execute(f"DELETE FROM chunks_cjk WHERE rowid IN ({marks})", batch)
            self._conn.execute(f"DELETE FROM chunks_pending WHERE id IN ({marks})", batch)
            if self.vector_dims is not None:
                self._conn.execute(f"DELETE FROM chunks_vec WHERE rowid IN ({marks})", batch)
            cursor = self._conn.execute(f"DELETE FROM chunks WHERE id IN ({marks})", batch)
            deleted += cursor.rowcount
        return deleted

    # -- vectors after the text ----------------------------------------------------------

    def pending_vectors(self, limit: int) -> list[PendingChunk]:
        """Up to ``limit`` chunks waiting for their vector, of any file, oldest first."""
        rows = self._conn.execute(
            "SELECT c.id, c.path, c.scope, c.hash, c.text FROM chunks_pending AS p"
            " JOIN chunks AS c ON c.id = p.id ORDER BY p.id LIMIT ?",
            (int(limit),),
        ).fetchall()
        return [PendingChunk(int(i), str(p), str(s), str(h), str(t)) for i, p, s, h, t in rows]

    def set_vectors(self, items: Sequence[tuple[int, str, np.ndarray]]) -> int:
        """Add the vectors of pending chunks ((id, content hash, vector)); a chunk that was
        replaced meanwhile (its id gone, or reused by another text) is left alone. Each
        vector goes into its chunk's own scope. Files with nothing left pending are marked
        so. The number of vectors added."""

        def write() -> int:
            conn = self._conn
            written = 0
            paths: set[str] = set()
            for chunk_id, digest, vector in items:
                row = conn.execute(
                    "SELECT path, scope FROM chunks WHERE id = ? AND hash = ?", (chunk_id, digest)
                ).fetchone()
                if row is None:
                    continue
                conn.execute("DELETE FROM chunks_vec WHERE rowid = ?", (chunk_id,))
                conn.execute(
                    "INSERT INTO chunks_vec(rowid, scope, embedding) VALUES (?, ?, ?)",
                    (chunk_id, row[1], vector_blob(vector)),
                )
                conn.execute("DELETE FROM chunks_pending WHERE id = ?", (chunk_id,))
                paths.add(str(row[0]))
                written += 1
            for path in sorted(paths):
                if not self._has_pending(path):
                    conn.execute("UPDATE files SET vectors_pending = 0 WHERE path = ?", (path,))
            return written

        return int(self._transaction(write))

    def add_vectors(self, path: str, scope: str, items: Sequence[tuple[int, np.ndarray]]) -> None:
        """Fill in the vectors of a file indexed while the embedder was down."""

        def write() -> None:
            conn = self._conn
            for chunk_id, vector in items:
                conn.execute("DELETE FROM chunks_vec WHERE rowid = ?", (chunk_id,))
                conn.execute(
                    "INSERT INTO chunks_vec(rowid, scope, embedding) VALUES (?, ?, ?)",
                    (chunk_id, scope, vector_blob(vector)),
                )
                conn.execute("DELETE FROM chunks_pending WHERE id = ?", (chunk_id,))
            conn.execute("UPDATE files SET vectors_pending = 0 WHERE path = ?", (path,))

        self._transaction(write)
