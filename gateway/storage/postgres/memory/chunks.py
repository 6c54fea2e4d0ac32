"""Chunk and file rows of a memory index: what ``replace_file`` writes, and what ``parley
migrate`` copies from memory.db and a rebuild carries over (``write_stored_file``), built
and inserted the same way."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from parley.core.memory.rows import FileRow, StoredChunk
from parley.gateway.storage.postgres.database import Connection
from parley.gateway.storage.postgres.memory.keyword import fold
from parley.gateway.storage.postgres.memory.vectors import vector_text


class ChunkLike(Protocol):
    """What a chunk row is built from: ``NewChunk`` (indexing) or ``StoredChunk``
    (``parley migrate``)."""

    # Read-only (properties): the chunk classes are frozen dataclasses.
    @property
    def start_line(self) -> int: ...
    @property
    def end_line(self) -> int: ...
    @property
    def hash(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def ts(self) -> str | None: ...
    @property
    def entry_ids(self) -> tuple[str, ...]: ...
    @property
    def cjk_text(self) -> str: ...


def chunk_params(
    index_id: int, file: FileRow, chunk: ChunkLike, vector: np.ndarray | None, stamp: float
) -> dict[str, Any]:
    """``INSERT_CHUNK``'s parameters for one chunk of ``file`` (``stamp``: created and
    updated time)."""
    return {
        "ix": index_id,
        "path": file.path,
        "source": file.source,
        "scope": file.scope,
        "start": chunk.start_line,
        "end": chunk.end_line,
        "hash": chunk.hash,
        "text": chunk.text,
        "ts": chunk.ts,
        "entry_ids": json.dumps(list(chunk.entry_ids)),
        "now": stamp,
        "fts": fold(chunk.text),
        "cjk": chunk.cjk_text or None,
        "emb": None if vector is None else vector_text(vector),
        "dims": None if vector is None else len(vector),
    }


def insert_chunks(conn: Connection, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Insert chunk rows (``chunk_params``); their new ids, in order."""
    if not rows:
        return []
    ids: list[int] = []
    with conn.cursor() as cur:
        cur.executemany(INSERT_CHUNK + " RETURNING id", rows, returning=True)
        while True:
            row = cur.fetchone()
            assert row is not None
            ids.append(int(row["id"]))
            if not cur.nextset():
                break
    return ids


def write_stored_file(
    conn: Connection, index_id: int, file: FileRow, chunks: Sequence[StoredChunk]
) -> None:
    """``file`` and its chunks as another index stored them (times, vectors and all),
    replacing whatever the index has of it: ``parley migrate`` copying memory.db, and a
    rebuild carrying a kept source over. The file row is written as given (its chunk
    count and ``vectors_pending`` included). Call inside the caller's transaction."""
    # The store's own per-file lock: a replica syncing the same file waits for us.
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (index_id, file.path))
    conn.execute(
        "DELETE FROM memory_chunks WHERE index_id = %s AND path = %s", (index_id, file.path)
    )
    # The insert stamps both times with created_at...
    rows = [chunk_params(index_id, file, c, c.vector, c.created_at) for c in chunks]
    ids = insert_chunks(conn, rows)
    later = [  # ...so put back the update times that differ
        (chunk.updated_at, chunk_id)
        for chunk, chunk_id in zip(chunks, ids, strict=True)
        if chunk.updated_at != chunk.created_at
    ]
    if later:
        with conn.cursor() as cur:
            cur.executemany("UPDATE memory_chunks SET updated_at = %s WHERE id = %s", later)
    upsert_file_row(conn, index_id, file, file.chunks, file.indexed_at)


def upsert_file_row(
    conn: Connection, index_id: int, file: FileRow, chunks: int, indexed_at: float
) -> None:
    conn.execute(
        "INSERT INTO memory_files (index_id, path, source, scope, hash, mtime, size,"
        " chunks, vectors_pending, indexed_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (index_id, path) DO UPDATE SET source = excluded.source,"
        " scope = excluded.scope, hash = excluded.hash, mtime = excluded.mtime,"
        " size = excluded.size, chunks = excluded.chunks,"
        " vectors_pending = excluded.vectors_pending, indexed_at = excluded.indexed_at",
        (
            index_id,
            file.path,
            file.source,
            file.scope,
            file.hash,
            file.mtime,
            file.size,
            chunks,
            file.vectors_pending,
            indexed_at,
        ),
    )


# Both tsvectors are computed once, in the statement; their token counts are BM25's
# document lengths. ``chunk_params`` builds its parameters.
INSERT_CHUNK = """
INSERT INTO memory_chunks (index_id, path, source, scope, start_line, end_line, hash, text,
    ts, entry_ids, created_at, updated_at, tsv, doc_len, cjk_tsv, cjk_len, embedding, dims)
SELECT %(ix)s, %(path)s, %(source)s, %(scope)s, %(start)s, %(end)s, %(hash)s, %(text)s,
    %(ts)s, %(entry_ids)s, %(now)s, %(now)s, v.tsv, parley_ts_tokens(v.tsv), k.tsv,
    coalesce(parley_ts_tokens(k.tsv), 0), %(emb)s::vector, %(dims)s
FROM (SELECT to_tsvector('parley_english', %(fts)s::text) AS tsv) AS v,
     (SELECT to_tsvector('simple', %(cjk)s::text) AS tsv) AS k
"""
