"""One suite, both memory stores: SQLite (memory.db) and PostgreSQL (pgvector + full-text
search), held to the same behaviour through the methods the index and search call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from parley.core.errors import MemoryIndexError
from parley.core.memory.backend import SqliteBackend
from parley.core.memory.index import MemoryIndex
from parley.core.memory.query import build_cjk_query, build_fts_query, cjk_index_text
from parley.core.memory.rows import FileRow, IndexMeta, NewChunk, Tombstone
from parley.core.memory.store_protocol import MemoryStoreProtocol, StoreBackend
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from tests.core.memory.helpers import make_layout, quiet_settings
from tests.fakes.embedder import HashingEmbedder, resilient

T = TypeVar("T")
DIMS = 4
NOW = datetime(2026, 3, 1, tzinfo=UTC)
# PostgreSQL twice: the main test server, whose pgvector (built for AVX-512) dies with
# SIGILL on HNSW here, so it ranks exactly; and PostgreSQL 16 with a portable pgvector
# 0.6 (tests/fetch_pg16.py), which runs the HNSW index for real.
PG_SERVERS = {"postgres": ("pg_url", "exact"), "postgres-hnsw": ("pg16_url", "hnsw")}
BACKENDS = ["sqlite", *PG_SERVERS]


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Store methods block: run them off the event loop, as MemoryIndex does."""
    return await asyncio.to_thread(lambda: fn(*args, **kwargs))


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def chunk(text: str, line: int = 1) -> NewChunk:
    return NewChunk(line, line, text, f"h-{text}", cjk_text=cjk_index_text(text))


def file_row(path: str, *, scope: str = "agent", source: str = "memory", **kw: Any) -> FileRow:
    return FileRow(path, source, scope, f"hash-{path}", 1.0, 10, **kw)


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBackend]:
    if request.param == "sqlite":
        yield SqliteBackend(tmp_path / "memory.db")
        return
    url_fixture, vector_index = PG_SERVERS[request.param]
    async with PgDatabase(request.getfixturevalue(url_fixture)) as db:
        yield PgMemoryBackend(db, "agent-1", vector_index=vector_index)


@pytest.fixture
async def store(backend: StoreBackend) -> AsyncIterator[MemoryStoreProtocol]:
    opened = await call(backend.open_live, vector=True)
    yield opened
    await call(opened.close)


async def put(store: MemoryStoreProtocol, path: str, texts: list[str], **kw: Any) -> None:
    vectors = kw.pop("vectors", None)
    chunks = [chunk(t, i + 1) for i, t in enumerate(texts)]
    await call(store.replace_file, file_row(path, **kw), chunks, vectors)


async def keyword(
    store: MemoryStoreProtocol, query: str, scopes: list[str] | None = None, *, cjk: bool = False
) -> list[str]:
    """Texts of the keyword hits, best first."""
    match = build_cjk_query(query) if cjk else build_fts_query(query, mode="or")
    assert match
    table = "chunks_cjk" if cjk else "chunks_fts"
    hits = await call(store.keyword_hits, table, match, scopes or ["agent"], 10)
    rows = await call(store.chunks_by_id, [i for i, _ in hits])
    return [rows[i].text for i, _ in hits]


async def test_meta_round_trips(store: MemoryStoreProtocol) -> None:
    assert await call(store.meta) is None
    meta = IndexMeta("fake", "m", "", 4, {"file_tokens": 400}, "cl100k_base")
    await call(store.set_meta, meta)
    assert await call(store.meta) == meta


async def test_replace_file_swaps_every_chunk_and_delete_removes_them(
    store: MemoryStoreProtocol,
) -> None:
    await put(store, "memory/a.md", ["the walrus sings", "a second line"])
    first = await call(store.chunk_texts, "memory/a.md")
    assert [t for _, _, t in first] == ["the walrus sings", "a second line"]
    await put(store, "memory/a.md", ["the heron dances"])
    second = await call(store.chunk_texts, "memory/a.md")
    assert [t for _, _, t in second] == ["the heron dances"]
    assert await keyword(store, "walrus") == []
    assert await keyword(store, "heron") == ["the heron dances"]
    files = await call(store.files)
    assert files["memory/a.md"].chunks == 1
    await call(store.touch_file, "memory/a.md", 5.0, 99)
    assert (await call(store.files))["memory/a.md"].mtime == 5.0
    await call(store.delete_file, "memory/a.md")
    assert await call(store.files) == {}
    assert await call(store.chunks_by_id, [i for i, _, _ in second]) == {}
    assert await keyword(store, "heron") == []


async def test_keyword_hits_rank_like_bm25(store: MemoryStoreProtocol) -> None:
    await put(
        store,
        "memory/k.md",
        [
            "Caroline went to the support group on Monday",
            "Caroline painted a sunrise over the lake",
            "Caroline talked with Melanie",
            "Melanie researched adoption agencies",
            "The café downtown serves naïve espresso",
        ],
    )
    # "group" is rare, "caroline" is everywhere: the rare word decides (IDF).
    hits = await keyword(store, "When did Caroline go to the support group?")
    assert hits[0] == "Caroline went to the support group on Monday"
    assert set(hits) == {
        "Caroline went to the support group on Monday",
        "Caroline painted a sunrise over the lake",
        "Caroline talked with Melanie",
    }
    ranks = await call(
        store.keyword_hits,
        "chunks_fts",
        build_fts_query("caroline group", mode="or"),
        ["agent"],
        10,
    )
    assert all(r < 0 for _, r in ranks)  # bm25() ranks: negative, best (lowest) first
    assert [r for _, r in ranks] == sorted(r for _, r in ranks)
    # Stemming both sides, and diacritics folded.
    assert await keyword(store, "research agency") == ["Melanie researched adoption agencies"]
    assert await keyword(store, "cafe naive") == ["The café downtown serves naïve espresso"]
    # A prefix term (the relaxed query search.py falls back to).
    ids = await call(store.keyword_hits, "chunks_fts", '"sunri"*', ["agent"], 10)
    rows = await call(store.chunks_by_id, [i for i, _ in ids])
    assert [r.text for r in rows.values()] == ["Caroline painted a sunrise over the lake"]
    # FTS5 operators in the input are plain text.
    assert await keyword(store, 'NEAR(" caroline) -group*') != []


async def test_cjk_text_is_found_through_its_bigrams(store: MemoryStoreProtocol) -> None:
    await put(
        store, "memory/zh.md", ["我养了一只猫，它叫小白", "今天的会议讨论了预算", "no cjk here"]
    )
    assert await keyword(store, "我的猫叫什么名字", cjk=True) == ["我养了一只猫，它叫小白"]
    assert await keyword(store, "会议预算", cjk=True) == ["今天的会议讨论了预算"]
    assert await keyword(store, "天气", cjk=True) == []


async def test_scopes_filter_every_search(store: MemoryStoreProtocol) -> None:
    await call(store.ensure_vectors, DIMS)
    await put(store, "memory/a.md", ["otter facts"], vectors=np.stack([unit(1, 0, 0, 0)]))
    await put(
        store,
        "sessions/p.jsonl",
        ["otter secrets"],
        scope="person:peer",
        source="sessions",
        vectors=np.stack([unit(1, 0.1, 0, 0)]),
    )
    assert await call(store.scopes) == ["agent", "person:peer"]
    assert await keyword(store, "otter", ["agent"]) == ["otter facts"]
    assert set(await keyword(store, "otter", ["agent", "person:peer"])) == {
        "otter facts",
        "otter secrets",
    }
    near = await call(store.vector_hits, unit(1, 0.1, 0, 0), ["agent"], 5)
    assert len(near) == 1
    near = await call(store.vector_hits, unit(1, 0.1, 0, 0), ["person:peer", "agent"], 5)
    assert len(near) == 2
    assert await call(store.vector_hits, unit(1, 0, 0, 0), ["conversation:x"], 5) == []


async def test_vector_hits_are_cosine_distances_nearest_first(store: MemoryStoreProtocol) -> None:
    assert store.vector_dims is None
    await call(store.ensure_vectors, DIMS)
    assert store.vector_dims == DIMS
    await call(store.ensure_vectors, DIMS)  # idempotent
    vectors = np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0), unit(1, 1, 0, 0)])
    await put(store, "memory/v.md", ["east", "north", "north-east"], vectors=vectors)
    ids = {t: i for i, _, t in await call(store.chunk_texts, "memory/v.md")}
    hits = await call(store.vector_hits, unit(1, 0.2, 0, 0), ["agent"], 2)
    assert [i for i, _ in hits] == [ids["east"], ids["north-east"]]
    query = unit(1, 0.2, 0, 0)
    assert hits[0][1] == pytest.approx(1 - float(np.dot(query, vectors[0])), abs=1e-5)
    stored = await call(store.vectors_for, [ids["north"]])
    assert np.allclose(stored[ids["north"]], vectors[1], atol=1e-6)
    with pytest.raises(MemoryIndexError):
        await call(store.ensure_vectors, DIMS + 1)


async def test_vectors_filled_in_later(store: MemoryStoreProtocol) -> None:
    await put(store, "memory/p.md", ["late vector"], vectors_pending=True)
    counts = await call(store.counts)
    assert (counts.pending_vector_files, counts.vectors) == (1, 0)
    await call(store.ensure_vectors, DIMS)
    [(chunk_id, _, _)] = await call(store.chunk_texts, "memory/p.md")
    await call(store.add_vectors, "memory/p.md", "agent", [(chunk_id, unit(0, 0, 1, 0))])
    counts = await call(store.counts)
    assert (counts.pending_vector_files, counts.vectors) == (0, 1)
    hits = await call(store.vector_hits, unit(0, 0, 1, 0), ["agent"], 3)
    assert hits == [(chunk_id, pytest.approx(0.0, abs=1e-6))]


async def test_replace_tail_keeps_the_chunks_before_its_line(store: MemoryStoreProtocol) -> None:
    row = file_row("sessions/t.jsonl", source="sessions", scope="person:a")
    chunks = [chunk("alpha", 2), chunk("bravo", 4), chunk("charlie open", 6)]
    await call(store.replace_file, row, chunks, None)
    tail = [chunk("charlie closed", 6), chunk("delta", 8)]
    await call(store.replace_tail, replace(row, hash="resume-2"), 6, tail)
    texts = [t for _, _, t in await call(store.chunk_texts, "sessions/t.jsonl")]
    assert texts == ["alpha", "bravo", "charlie closed", "delta"]
    file = (await call(store.files))["sessions/t.jsonl"]
    assert (file.chunks, file.hash) == (4, "resume-2")
    assert await keyword(store, "charlie", ["person:a"]) == ["charlie closed"]
    assert await keyword(store, "open", ["person:a"]) == []
    assert await call(store.integrity_check) == []


async def test_pending_chunks_get_their_vectors_across_files_in_their_own_scope(
    store: MemoryStoreProtocol,
) -> None:
    """The vector pass's read and write: pending chunks of every file, oldest first; each
    vector lands in its chunk's scope (a canary: Alice's never answers Bob's search); a
    chunk replaced meanwhile (same id reused, other text) is left pending."""
    await call(store.ensure_vectors, DIMS)
    alice = file_row("sessions/a.jsonl", source="sessions", scope="person:alice")
    bob = file_row("sessions/b.jsonl", source="sessions", scope="person:bob")
    pending = {"vectors_pending": True}
    await call(store.replace_file, replace(alice, **pending), [chunk("CANARY-alice", 2)], None)
    await call(store.replace_file, replace(bob, **pending), [chunk("bob", 2), chunk("b2", 3)], None)
    rows = await call(store.pending_vectors, 10)
    assert [(r.text, r.scope) for r in rows] == [
        ("CANARY-alice", "person:alice"), ("bob", "person:bob"), ("b2", "person:bob"),
    ]  # fmt: skip
    assert [r.text for r in await call(store.pending_vectors, 2)] == ["CANARY-alice", "bob"]
    # b2 is replaced before its vector arrives: its stale vector must not be written.
    await call(store.replace_tail, replace(bob, **pending), 3, [chunk("b3", 3)])
    canary = unit(0, 0, 0, 1)
    items = [
        (r.id, r.hash, canary if r.scope == "person:alice" else unit(1, 0, 0, 0)) for r in rows
    ]
    assert await call(store.set_vectors, items) == 2
    assert [r.text for r in await call(store.pending_vectors, 10)] == ["b3"]
    files = await call(store.files)
    assert not files["sessions/a.jsonl"].vectors_pending
    assert files["sessions/b.jsonl"].vectors_pending
    hits = await call(store.vector_hits, canary, ["person:bob", "agent"], 10)
    texts = (await call(store.chunks_by_id, [i for i, _ in hits])).values()
    assert "CANARY-alice" not in [c.text for c in texts]
    alice_hits = await call(store.vector_hits, canary, ["person:alice"], 10)
    assert [i for i, _ in alice_hits] == [rows[0].id]
    [b3] = await call(store.pending_vectors, 10)
    assert await call(store.set_vectors, [(b3.id, b3.hash, unit(0, 1, 0, 0))]) == 1
    assert not (await call(store.files))["sessions/b.jsonl"].vectors_pending
    assert (await call(store.counts)).vectors == 3
    assert await call(store.integrity_check) == []


async def test_a_keyword_only_file_has_nothing_pending(store: MemoryStoreProtocol) -> None:
    await put(store, "memory/k.md", ["keyword only"])
    assert await call(store.pending_vectors, 10) == []
    assert not (await call(store.files))["memory/k.md"].vectors_pending


async def test_embedding_cache_by_hash_width_and_age(store: MemoryStoreProtocol) -> None:
    key = ("fake", "m", "")
    await call(store.cache_vectors, *key, [("h1", unit(1, 0, 0, 0))], max_entries=2)
    await call(store.cache_vectors, *key, [("h2", unit(0, 1, 0, 0))], max_entries=2)
    found = await call(store.cached_vectors, *key, ["h1", "h2", "h9"])
    assert set(found) == {"h1", "h2"}
    assert np.allclose(found["h2"], unit(0, 1, 0, 0))
    assert await call(store.cached_vectors, *key, ["h1"], 8) == {}  # another width
    assert await call(store.cached_vectors, "other", "m", "", ["h1"]) == {}
    await call(store.cache_vectors, *key, [("h3", unit(0, 0, 1, 0))], max_entries=2)
    assert set(await call(store.cached_vectors, *key, ["h1", "h2", "h3"])) == {"h2", "h3"}
    assert (await call(store.counts)).cache_entries == 2


async def test_counts_by_source_and_integrity(store: MemoryStoreProtocol) -> None:
    await call(store.ensure_vectors, DIMS)
    await put(store, "memory/a.md", ["one", "two"], vectors=np.stack([unit(1, 0, 0, 0)] * 2))
    await put(store, "sessions/s.jsonl", ["three"], source="sessions", scope="person:x")
    counts = await call(store.counts)
    assert (counts.files, counts.chunks, counts.vectors) == (2, 3, 2)
    assert [(s.source, s.files, s.chunks) for s in counts.by_source] == [
        ("memory", 1, 2),
        ("sessions", 1, 1),
    ]
    assert await call(store.integrity_check) == []
    assert await call(store.fts_available)


async def test_a_second_store_sees_committed_writes(backend: StoreBackend) -> None:
    writer = await call(backend.open_live, vector=True)
    reader = await call(backend.open_live, vector=True)
    await put(writer, "memory/a.md", ["shared heron"])
    assert await keyword(reader, "heron") == ["shared heron"]
    await call(writer.close)
    await call(reader.close)


# -- end to end through MemoryIndex --------------------------------------------------------

MEMORY_FILES = {
    "MEMORY.md": "# Facts\n\nThe user's dog is called Biscuit and loves the beach.\n",
    "memory/2026-02-01.md": "Planned a trip to Lisbon in May with Ana.\nBooked the hotel.\n",
    "memory/2026-02-10.md": "Started learning the cello; lessons on Thursdays.\n",
    "memory/zh.md": "我养了一只猫，名字叫小白。\n周末去杭州看西湖。\n",
}
QUERIES = {
    "what is the dog called": "MEMORY.md",
    "when is the Lisbon trip": "memory/2026-02-01.md",
    "cello lessons": "memory/2026-02-10.md",
    "我的猫叫什么名字": "memory/zh.md",
}


async def _search_all(root: Path, backend: StoreBackend | None) -> dict[str, list[str]]:
    layout = make_layout(root)
    for relative, text in MEMORY_FILES.items():
        layout.write(relative, text)
    # A fixed time: the chunk's text holds it, and so its (hashed) embedding and rank.
    layout.transcript(
        "s1", [("user", "My sister Ana lives in Porto"), ("assistant", "Nice!")], ts=NOW
    )
    index = MemoryIndex(
        quiet_settings(),
        db_path=layout.db,
        workspace=layout.workspace,
        sessions_dir=layout.sessions,
        embedder=resilient(HashingEmbedder()),
        now=lambda: NOW,
        backend=backend,
    )
    await index.start()
    try:
        report = await index.sync(reason="test")
        assert not report.errors
        results: dict[str, list[str]] = {}
        for query in QUERIES:
            result = await index.search(query, scopes=["agent", "unscoped"])
            assert result.mode == "hybrid"
            results[query] = [f"{h.path}#{h.start_line}" for h in result.hits[:3]]
        return results
    finally:
        await index.close()


@pytest.mark.parametrize("server", list(PG_SERVERS))
async def test_same_top_results_through_memory_index(
    tmp_path: Path, server: str, request: pytest.FixtureRequest
) -> None:
    on_sqlite = await _search_all(tmp_path / "sqlite", None)
    url_fixture, vector_index = PG_SERVERS[server]
    async with PgDatabase(request.getfixturevalue(url_fixture)) as db:
        on_postgres = await _search_all(
            tmp_path / "pg", PgMemoryBackend(db, "agent-1", vector_index=vector_index)
        )
    for query, path in QUERIES.items():
        assert on_sqlite[query][0].startswith(path + "#"), (query, on_sqlite[query])
    assert on_postgres == on_sqlite


# -- forgetting: evictions, tombstones, state ---------------------------------------------


async def test_evicted_chunks_are_gone_and_leave_tombstones(store: MemoryStoreProtocol) -> None:
    await put(store, "MEMORY.md", ["the user's own walrus note"])
    await put(
        store,
        "sessions/s1.jsonl",
        ["walrus small talk", "walrus decision", "heron plans"],
        source="sessions",
        scope="person:alice",
    )
    listed = await call(store.forgettable_chunks, ["sessions", "tasks"])
    # The user's file is not even offered to the policies.
    assert [c.text for c in listed] == ["walrus small talk", "walrus decision", "heron plans"]
    assert {(c.path, c.scope, c.source, c.file_mtime) for c in listed} == {
        ("sessions/s1.jsonl", "person:alice", "sessions", 1.0)
    }
    small_talk, decision, _ = listed
    evicted = [
        (small_talk.id, Tombstone.of(small_talk, "importance: low", 100.0)),
        (decision.id, Tombstone.of(decision, "age: old", 200.0)),
    ]
    assert await call(store.evict_chunks, evicted) == 2
    assert await keyword(store, "walrus", ["agent", "person:alice"]) == [
        "the user's own walrus note"
    ]
    assert await keyword(store, "heron", ["person:alice"]) == ["heron plans"]
    assert (await call(store.files))["sessions/s1.jsonl"].chunks == 1
    assert await call(store.forgotten_hashes, "sessions/s1.jsonl") == {
        "h-walrus small talk",
        "h-walrus decision",
    }
    assert await call(store.forgotten_hashes, "MEMORY.md") == set()
    newest_first = await call(store.tombstones)
    assert [(t.reason, t.preview, t.start_line) for t in newest_first] == [
        ("age: old", "walrus decision", 2),
        ("importance: low", "walrus small talk", 1),
    ]
    assert await call(store.tombstones, 1) == newest_first[:1]
    # Carrying tombstones over (a rebuild) keeps the first record of each chunk.
    await call(store.add_tombstones, [Tombstone.of(decision, "capacity: again", 300.0)])
    assert await call(store.tombstones) == newest_first


async def test_state_round_trips(store: MemoryStoreProtocol) -> None:
    assert await call(store.state, "forgetting.last_run") is None
    await call(store.set_state, "forgetting.last_run", "2026-03-01T00:00:00+00:00")
    await call(store.set_state, "forgetting.last_run", "2026-03-02T00:00:00+00:00")
    assert await call(store.state, "forgetting.last_run") == "2026-03-02T00:00:00+00:00"


async def test_an_evicted_chunk_takes_its_vector_with_it(store: MemoryStoreProtocol) -> None:
    await call(store.ensure_vectors, DIMS)
    vectors = np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0)])
    await put(
        store,
        "sessions/s.jsonl",
        ["east", "north"],
        vectors=vectors,
        source="sessions",
        scope="person:x",
    )
    east, north = await call(store.forgettable_chunks, ["sessions"])
    await call(store.evict_chunks, [(east.id, Tombstone.of(east, "age: old", 1.0))])
    hits = await call(store.vector_hits, unit(1, 0, 0, 0), ["person:x"], 5)
    assert [chunk_id for chunk_id, _ in hits] == [north.id]
    assert (await call(store.counts)).vectors == 1
    assert await call(store.integrity_check) == []


# -- kept sources: read as stored, carried into a rebuild's shadow --------------------------


async def test_states_are_listed_by_prefix(store: MemoryStoreProtocol) -> None:
    await call(store.set_meta, IndexMeta("fake", "m", "", 4, {}, "cl100k_base"))
    await call(store.set_state, "kept_source:sessions/a.jsonl", "1")
    await call(store.set_state, "kept_source:sessions/b.jsonl", "1")
    await call(store.set_state, "forgetting.last_run", "2026-03-01T00:00:00+00:00")
    assert await call(store.states, "kept_source:") == {
        "kept_source:sessions/a.jsonl": "1",
        "kept_source:sessions/b.jsonl": "1",
    }
    assert await call(store.states, "kept_source%") == {}  # a prefix, not a pattern
    assert "index" not in await call(store.states, "")  # the meta is not a state


async def test_a_file_carried_as_stored_keeps_its_rows_scope_and_vectors(
    backend: StoreBackend,
) -> None:
    live = await call(backend.open_live, vector=True)
    shadow = await call(backend.open_shadow, vector=True)
    try:
        await call(live.ensure_vectors, DIMS)
        path = "sessions/s.jsonl"
        vectors = np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0)])
        await put(live, path, ["walrus east", "小白 north"], vectors=vectors, source="sessions",
                  scope="person:alice")  # fmt: skip
        file = (await call(live.files))[path]
        stored = await call(live.stored_chunks, path)
        assert [c.text for c in stored] == ["walrus east", "小白 north"]
        # A chunk updated after it was made (as ``parley migrate`` copies them): both kept.
        stored[1] = replace(stored[1], updated_at=stored[1].created_at + 5.0)
        assert stored[1].cjk_text == cjk_index_text("小白 north")
        await call(shadow.ensure_vectors, DIMS)
        await call(shadow.carry_file, file, stored)
        await call(shadow.carry_file, file, stored)  # a resumed rebuild: still one copy

        copied = await call(shadow.stored_chunks, path)
        assert (await call(shadow.files))[path] == file  # times, hash and scope as they were
        strip = [replace(c, id=0, vector=None) for c in stored]
        assert [replace(c, id=0, vector=None) for c in copied] == strip
        for old, new in zip(stored, copied, strict=True):
            assert old.vector is not None and new.vector is not None
            assert np.allclose(old.vector, new.vector)
        assert await keyword(shadow, "walrus", ["person:alice"]) == ["walrus east"]
        assert await keyword(shadow, "小白", ["person:alice"], cjk=True) == ["小白 north"]
        assert await keyword(shadow, "walrus", ["agent", "person:bob"]) == []
        east = await call(shadow.vector_hits, unit(1, 0, 0, 0), ["person:alice"], 1)
        assert [copied[0].id] == [i for i, _ in east]
        assert await call(shadow.vector_hits, unit(1, 0, 0, 0), ["person:bob"], 1) == []
        assert await call(shadow.pending_vectors, 10) == []
        assert await call(shadow.integrity_check) == []
    finally:
        await call(live.close)
        await call(shadow.close)


async def test_a_file_carried_without_vectors_waits_for_the_vector_pass(
    backend: StoreBackend,
) -> None:
    live = await call(backend.open_live, vector=True)
    shadow = await call(backend.open_shadow, vector=True)
    try:
        await call(live.ensure_vectors, DIMS)
        path = "sessions/s.jsonl"
        await put(live, path, ["walrus east"], vectors=np.stack([unit(1, 0, 0, 0)]),
                  source="sessions", scope="person:alice")  # fmt: skip
        file = replace((await call(live.files))[path], vectors_pending=True)
        stored = await call(live.stored_chunks, path, vectors=False)
        assert [c.vector for c in stored] == [None]
        await call(shadow.carry_file, file, stored)

        (pending,) = await call(shadow.pending_vectors, 10)
        assert (pending.path, pending.scope, pending.text) == (path, "person:alice", "walrus east")
        assert (await call(shadow.files))[path].vectors_pending
        await call(shadow.ensure_vectors, DIMS)
        await call(shadow.set_vectors, [(pending.id, pending.hash, unit(0, 0, 1, 0))])
        assert not (await call(shadow.files))[path].vectors_pending
        hits = await call(shadow.vector_hits, unit(0, 0, 1, 0), ["person:alice"], 1)
        assert [i for i, _ in hits] == [pending.id]
    finally:
        await call(live.close)
        await call(shadow.close)
