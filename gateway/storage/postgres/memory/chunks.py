"""Chunk and file rows of a memory index: what ``replace_file`` writes and what
``parley migrate`` copies from memory.db, built and inserted the same way."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from parley.core.memory.rows import FileRow
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
