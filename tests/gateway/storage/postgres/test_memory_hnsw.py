"""The HNSW path executed for real, on PostgreSQL 16 with pgvector 0.6 (tests/fetch_pg16.py).

The main test server's pgvector dies with SIGILL on these machines the moment a graph
is grown or walked, so there HNSW is only planned. Here the graph is built, walked by
the store's own query, and held to the exact ranking; pgvector 0.6 also has no
``hnsw.iterative_scan``, so a scope that the walk comes up short on is ranked exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from parley.core.memory.rows import FileRow, NewChunk
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from parley.gateway.storage.postgres.memory.info import PgStoreInfo, version_tuple
from parley.gateway.storage.postgres.memory.store import PgMemoryStore

T = TypeVar("T")
DIMS = 32
BIG_SCOPE = "agent"
SMALL_SCOPE = "peer:telegram:42"


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.to_thread(lambda: fn(*args, **kwargs))


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    matrix = rng.standard_normal((n, DIMS)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


async def fill(store: PgMemoryStore, scope: str, vectors: np.ndarray, files: int) -> None:
    """``vectors`` spread over ``files`` files of ``scope``, one chunk per vector."""
    for f, part in enumerate(np.array_split(vectors, files)):
        path = f"{scope}/{f}.md"
        chunks = [NewChunk(i, i, f"{path} chunk {i}", f"h-{path}-{i}") for i in range(len(part))]
        file = FileRow(path, "memory", scope, f"hash-{path}", 1.0, 10)
        await call(store.replace_file, file, chunks, part)


@pytest.fixture
async def db(pg16_url: str) -> AsyncIterator[PgDatabase]:
    async with PgDatabase(pg16_url) as opened:
        yield opened


@pytest.fixture
async def walking_db(pg16_url: str) -> AsyncIterator[PgDatabase]:
    """A pool whose sessions never sort: every nearest-neighbour query walks the graph,
    even where the planner would rather rank a selective scope by its btree."""
    async with PgDatabase(f"{pg16_url}&options=-c%20enable_sort%3Doff") as opened:
        yield opened


async def two_stores(db: PgDatabase) -> tuple[PgMemoryStore, PgMemoryStore]:
    """The same live index twice: searched through HNSW, and exactly."""
    rng = np.random.default_rng(7)
    hnsw = await call(PgMemoryBackend(db, "agent-1", vector_index="hnsw").open_live, vector=True)
    await call(hnsw.ensure_vectors, DIMS)
    await fill(hnsw, BIG_SCOPE, unit_rows(rng, 600), files=12)
    await fill(hnsw, SMALL_SCOPE, unit_rows(rng, 15), files=1)
    exact = await call(PgMemoryBackend(db, "agent-1", vector_index="exact").open_live, vector=True)
    return hnsw, exact


@pytest.fixture
async def stores(db: PgDatabase) -> tuple[PgMemoryStore, PgMemoryStore]:
    return await two_stores(db)


async def test_the_server_is_an_older_pgvector_without_iterative_scan(
    stores: tuple[PgMemoryStore, PgMemoryStore],
) -> None:
    hnsw, _ = stores
    assert version_tuple(hnsw.info.vector_version) < (0, 8)
    assert not hnsw.info.iterative_scan


async def test_the_graph_is_walked_by_the_stores_query(
    stores: tuple[PgMemoryStore, PgMemoryStore], db: PgDatabase
) -> None:
    query = unit_rows(np.random.default_rng(1), 1)[0]

    def analyse(conn: Connection) -> list[str]:
        conn.execute("SET LOCAL enable_seqscan = off")
        rows = conn.execute(
            f"EXPLAIN (ANALYZE, COSTS OFF) SELECT id FROM memory_chunks"
            f" WHERE dims = {DIMS} AND scope = ANY(%s)"
            f" ORDER BY embedding::vector({DIMS}) <=> %s::vector({DIMS}) LIMIT 10",
            ([BIG_SCOPE], str(query.tolist())),
        ).fetchall()
        return [next(iter(r.values())) for r in rows]

    plan = await call(db.call, analyse)
    scan = [line for line in plan if f"Index Scan using memory_chunks_hnsw_{DIMS}" in line]
    assert scan and "rows=10" in scan[0], plan  # executed, and it returned the 10


async def test_hnsw_ranks_as_the_exact_search_does(
    stores: tuple[PgMemoryStore, PgMemoryStore],
) -> None:
    hnsw, exact = stores
    overlap = []
    for query in unit_rows(np.random.default_rng(2), 20):
        approximate = await call(hnsw.vector_hits, query, [BIG_SCOPE], 10)
        truth = await call(exact.vector_hits, query, [BIG_SCOPE], 10)
        assert len(approximate) == 10
        # Distances come from the same vectors either way.
        for chunk_id, distance in approximate:
            assert distance == pytest.approx(dict(truth).get(chunk_id, distance), abs=1e-5)
        overlap.append(len({i for i, _ in approximate} & {i for i, _ in truth}) / 10)
    assert np.mean(overlap) >= 0.95, overlap


async def test_a_small_scope_fills_k(stores: tuple[PgMemoryStore, PgMemoryStore]) -> None:
    """Whichever plan the server picks for a selective scope, the answer is complete."""
    hnsw, exact = stores
    for query in unit_rows(np.random.default_rng(3), 5):
        hits = await call(hnsw.vector_hits, query, [SMALL_SCOPE], 10)
        truth = await call(exact.vector_hits, query, [SMALL_SCOPE], 10)
        assert [i for i, _ in hits] == [i for i, _ in truth]


async def test_a_walk_that_comes_up_short_is_ranked_exactly(walking_db: PgDatabase) -> None:
    """15 of 615 vectors are the peer's: a 100-candidate walk keeps about 2 of them, and
    pgvector 0.6 cannot walk on. The store notices and ranks the scope exactly."""
    hnsw, exact = await two_stores(walking_db)
    query = unit_rows(np.random.default_rng(3), 1)[0]

    def walk(conn: Connection) -> list[dict[str, Any]]:
        return conn.execute(
            f"SELECT id FROM memory_chunks WHERE dims = {DIMS} AND scope = ANY(%s)"
            f" ORDER BY embedding::vector({DIMS}) <=> %s::vector({DIMS}) LIMIT 10",
            ([SMALL_SCOPE], str(query.tolist())),
        ).fetchall()

    assert len(await call(walking_db.call, walk)) < 10  # the bare walk is short
    hits = await call(hnsw.vector_hits, query, [SMALL_SCOPE], 10)
    assert hits == await call(exact.vector_hits, query, [SMALL_SCOPE], 10)
    assert len(hits) == 10


async def test_hnsw_survives_a_rebuild_promotion(db: PgDatabase) -> None:
    backend = PgMemoryBackend(db, "agent-1", vector_index="hnsw")
    shadow = await call(backend.open_shadow, vector=True)
    await call(shadow.ensure_vectors, DIMS)
    vectors = unit_rows(np.random.default_rng(4), 40)
    await fill(shadow, BIG_SCOPE, vectors, files=2)
    await call(backend.promote_shadow)
    live = await call(backend.open_live, vector=True)
    hits = await call(live.vector_hits, vectors[5], [BIG_SCOPE], 3)
    rows = await call(live.chunks_by_id, [hits[0][0]])
    assert hits[0][1] == pytest.approx(0.0, abs=1e-5)
    assert rows[hits[0][0]].text == f"{BIG_SCOPE}/0.md chunk 5"


@pytest.mark.parametrize(
    ("version", "iterative"),
    [("0.8.2", True), ("0.10.0", True), ("0.7.4", False), ("0.6.2", False), (None, False)],
)
def test_iterative_scan_follows_the_pgvector_version(version: str | None, iterative: bool) -> None:
    assert PgStoreInfo(True, None, "16.2", version).iterative_scan is iterative
