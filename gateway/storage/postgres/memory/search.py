"""``PgMemoryStore``'s search primitives: keyword hits (BM25 over tsvectors, see
``keyword``), vector hits (HNSW or exact, see ``vectors``), and the rows they name."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from parley.core.memory.rows import ChunkRow
from parley.gateway.storage.postgres.database import Connection
from parley.gateway.storage.postgres.memory.base import StoreBase
from parley.gateway.storage.postgres.memory.keyword import (
    BM25_B,
    BM25_K1,
    CJK_TABLE,
    FTS_TABLE,
    KEYWORD_COLUMNS,
    KEYWORD_CONFIGS,
    KEYWORD_SQL,
    fold,
    match_terms,
    tsquery_term,
)
from parley.gateway.storage.postgres.memory.vectors import (
    MAX_EF_SEARCH,
    MIN_EF_SEARCH,
    rank_exactly,
    vector_text,
)


class SearchMethods(StoreBase):
    """What one hybrid search reads (``core.memory.store_protocol.SearchStore``)."""

    def keyword_hits(
        self, table: str, match: str, scopes: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        """(chunk id, negated BM25) best first, as FTS5's ``bm25()`` ranks them."""
        if table not in KEYWORD_CONFIGS:
            raise ValueError(f"not a keyword table: {table}")
        terms = [
            tsquery_term(fold(term) if table == FTS_TABLE else term, prefix)
            for term, prefix in match_terms(match)
        ]
        if not terms or not scopes or limit <= 0:
            return []
        column, length = KEYWORD_COLUMNS[table]
        indexed = "c.cjk_len > 0" if table == CJK_TABLE else "true"
        sql = KEYWORD_SQL.format(column=column, length=length, indexed=indexed)
        params = {
            "cfg": KEYWORD_CONFIGS[table],
            "terms": terms,
            "any": " | ".join(terms),
            "scopes": list(scopes),
            "limit": int(limit),
            "k1": BM25_K1,
            "b": BM25_B,
        }

        def read(conn: Connection) -> list[dict[str, Any]]:
            params["ix"] = self._index(conn).id
            return conn.execute(sql, params).fetchall()

        return [(int(r["id"]), float(r["rank"])) for r in self._call(read)]

    def vector_hits(
        self, query: np.ndarray, scopes: Sequence[str], k: int
    ) -> list[tuple[int, float]]:
        """The ``k`` (chunk id, cosine distance) nearest first, within ``scopes``."""
        if not self.info.vector_available or k <= 0 or not scopes:
            return []
        width = len(query)

        if self.vector_index == "exact":
            return self._exact_hits(query, scopes, int(k))

        iterative = self.info.iterative_scan

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            if ix.dims != width:
                return []
            ef = min(MAX_EF_SEARCH, max(MIN_EF_SEARCH, 2 * int(k)))
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
            if iterative:
                # The scope filter applies after the graph walk: keep walking until k pass.
                conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
            # The width is a literal, not a parameter: the planner must see that the
            # query implies the partial index's ``dims = n`` even in a generic plan.
            return conn.execute(
                f"SELECT id, embedding::vector({width}) <=> %s::vector({width}) AS distance"
                f" FROM memory_chunks WHERE index_id = %s AND dims = {width}"
                " AND scope = ANY(%s) ORDER BY distance LIMIT %s",
                (vector_text(query), ix.id, list(scopes), int(k)),
            ).fetchall()

        rows = self._call(read)
        if len(rows) < k and not iterative:
            # pgvector before 0.8 stops after ef_search candidates, of which the scope
            # filter may keep fewer than k. Short means the scope holds few of the
            # nearest, so ranking that scope exactly is the complete and cheap answer.
            return self._exact_hits(query, scopes, int(k))
        return [(int(r["id"]), float(r["distance"])) for r in rows]

    def _exact_hits(
        self, query: np.ndarray, scopes: Sequence[str], k: int
    ) -> list[tuple[int, float]]:
        width = len(query)

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            if ix.dims != width:
                return []
            with conn.cursor(binary=True) as cur:  # real[] in binary: no float parsing
                return cur.execute(
                    "SELECT id, embedding::real[] AS v FROM memory_chunks WHERE index_id = %s"
                    " AND dims = %s AND scope = ANY(%s)",
                    (ix.id, width, list(scopes)),
                ).fetchall()

        rows = self._call(read)
        return rank_exactly([int(r["id"]) for r in rows], [r["v"] for r in rows], query, k)

    def vectors_for(self, ids: Sequence[int]) -> dict[int, np.ndarray]:
        if not self.info.vector_available or not ids:
            return {}
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT id, embedding::real[] AS v FROM memory_chunks"
                " WHERE id = ANY(%s) AND embedding IS NOT NULL",
                (list(dict.fromkeys(int(i) for i in ids)),),
            ).fetchall()
        )
        return {int(r["id"]): np.asarray(r["v"], dtype=np.float32) for r in rows}

    def chunks_by_id(self, ids: Sequence[int]) -> dict[int, ChunkRow]:
        if not ids:
            return {}
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT id, path, source, scope, start_line, end_line, hash, text, ts,"
                " entry_ids, updated_at FROM memory_chunks WHERE id = ANY(%s)",
                ([int(i) for i in ids],),
            ).fetchall()
        )
        return {
            int(r["id"]): ChunkRow(
                int(r["id"]),
                r["path"],
                r["source"],
                r["scope"],
                int(r["start_line"]),
                int(r["end_line"]),
                r["hash"],
                r["text"],
                r["ts"],
                tuple(json.loads(r["entry_ids"] or "[]")),
                float(r["updated_at"]),
            )
            for r in rows
        }
