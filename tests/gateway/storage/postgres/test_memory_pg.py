"""PostgreSQL specifics of the memory store: the per-width HNSW index the planner uses,
a rebuild nobody reads until it is promoted, and the LoCoMo bench on this backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from parley.core.memory.embedders import EmbedderSettings
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.query import build_fts_query, cjk_index_text
from parley.core.memory.rows import FileRow, NewChunk
from parley.gateway.cli.locomo import run_locomo
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from parley.gateway.storage.postgres.memory.store import PgMemoryStore
from tests.gateway.cli.test_locomo import locomo_data

T = TypeVar("T")
DIMS = 4


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.to_thread(lambda: fn(*args, **kwargs))


def row(path: str) -> FileRow:
    return FileRow(path, "memory", "agent", f"hash-{path}", 1.0, 10)


def chunks(*texts: str) -> list[NewChunk]:
    return [NewChunk(i, i, t, f"h-{t}", cjk_text=cjk_index_text(t)) for i, t in enumerate(texts)]


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[PgDatabase]:
    async with PgDatabase(pg_url) as opened:
        yield opened


async def test_each_width_gets_an_hnsw_index_the_planner_uses(db: PgDatabase) -> None:
    store = await call(PgMemoryBackend(db, "agent-1").open_live, vector=True)
    await call(store.ensure_vectors, DIMS)

    def inspect(conn: Connection) -> tuple[str, list[str]]:
        definition = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (f"memory_chunks_hnsw_{DIMS}",)
        ).fetchone()
        assert definition is not None
        # Only planned, never run: this machine's pgvector build dies with SIGILL when
        # an HNSW graph is walked or grown past one node (see memory/vectors.py).
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = conn.execute(
            f"EXPLAIN SELECT id, embedding::vector({DIMS}) <=> %s::vector({DIMS}) AS distance"
            f" FROM memory_chunks WHERE index_id = 1 AND dims = {DIMS}"
            " AND scope = ANY(%s) ORDER BY distance LIMIT 8",
            ("[1,0,0,0]", ["agent"]),
        ).fetchall()
        return definition["indexdef"], [r["QUERY PLAN"] for r in plan]

    definition, plan = await call(db.call, inspect)
    assert "USING hnsw" in definition and "vector_cosine_ops" in definition
    assert f"WHERE (dims = {DIMS})" in definition
    assert any(f"Index Scan using memory_chunks_hnsw_{DIMS}" in line for line in plan), plan
    assert await call(store.integrity_check) == []
    # A second width (a rebuild for another model) gets its own index.
    shadow = await call(PgMemoryBackend(db, "agent-1").open_shadow, vector=True)
    await call(shadow.ensure_vectors, 8)
    found = await call(
        db.call,
        lambda conn: conn.execute(
            "SELECT count(*) AS n FROM pg_indexes WHERE indexname LIKE 'memory_chunks_hnsw_%'"
        ).fetchone(),
    )
    assert found == {"n": 2}


async def keyword_texts(store: PgMemoryStore, query: str) -> list[str]:
    match = build_fts_query(query, mode="or")
    hits = await call(store.keyword_hits, "chunks_fts", match, ["agent"], 10)
    rows = await call(store.chunks_by_id, [i for i, _ in hits])
    return sorted(rows[i].text for i, _ in hits)


async def test_a_rebuild_is_invisible_until_promoted(db: PgDatabase) -> None:
    backend = PgMemoryBackend(db, "agent-1", vector_index="exact")
    live = await call(backend.open_live, vector=True)
    await call(live.replace_file, row("MEMORY.md"), chunks("the old otter"), None)
    # Another replica's reader: a store of its own, opened before the rebuild.
    reader = await call(PgMemoryBackend(db, "agent-1").open_live, vector=True)

    shadow = await call(backend.open_shadow, vector=True)
    await call(shadow.replace_file, row("MEMORY.md"), chunks("the new otter"), None)
    await call(shadow.replace_file, row("memory/b.md"), chunks("a second otter"), None)
    assert await keyword_texts(reader, "otter") == ["the old otter"]
    assert (await call(reader.counts)).files == 1

    await call(backend.promote_shadow)
    # The same reader object, not reopened: its next statement reads the new index.
    assert await keyword_texts(reader, "otter") == ["a second otter", "the new otter"]
    assert (await call(reader.counts)).files == 2
    roles = await call(
        db.call,
        lambda conn: conn.execute("SELECT role FROM memory_indexes ORDER BY id").fetchall(),
    )
    assert roles == [{"role": "live"}]  # the old index's rows are gone
    assert await call(reader.integrity_check) == []


async def test_a_stale_shadow_is_discarded(db: PgDatabase) -> None:
    backend = PgMemoryBackend(db, "agent-1", vector_index="exact")
    shadow = await call(backend.open_shadow, vector=True)
    await call(shadow.replace_file, row("MEMORY.md"), chunks("half built"), None)
    await call(backend.discard_shadow)
    fresh = await call(backend.open_shadow, vector=True)
    assert await call(fresh.files) == {}


async def test_locomo_bench_on_postgres_matches_sqlite(tmp_path: Path, pg_url: str) -> None:
    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps(locomo_data()), encoding="utf-8")
    settings = MemorySettings(embedder=EmbedderSettings(provider="none"))
    on_sqlite = await run_locomo(data, tmp_path / "a.jsonl", settings=settings, work_dir=tmp_path)
    on_postgres = await run_locomo(
        data,
        tmp_path / "b.jsonl",
        settings=settings,
        work_dir=tmp_path,
        backend="postgres",
        database_url=pg_url,
    )
    assert on_postgres["backend"] == "postgres"
    assert on_postgres["chunks"] == on_sqlite["chunks"] > 0
    assert on_postgres["recall"] == on_sqlite["recall"]
    # The bench removes its index from a database it was pointed at.
    async with PgDatabase(pg_url) as db:
        left = await db.run(
            lambda conn: conn.execute("SELECT count(*) AS n FROM memory_indexes").fetchone()
        )
    assert left == {"n": 0}
