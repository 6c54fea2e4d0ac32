"""memory.db tables: a real SQLite file, the real sqlite-vec, FTS5 over plain and CJK text."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import parley.core.memory.store as store_module
from parley.core.errors import MemoryIndexError
from parley.core.memory.query import cjk_index_text
from parley.core.memory.rows import FileRow, IndexMeta, NewChunk, SourceCount
from parley.core.memory.store import MemoryStore

DIMS = 4


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def chunk(text: str, line: int = 1) -> NewChunk:
    return NewChunk(line, line, text, f"h-{text}", cjk_text=cjk_index_text(text))


def file_row(path: str, *, scope: str = "agent", source: str = "memory", **kw: object) -> FileRow:
    return FileRow(path, source, scope, f"hash-{path}", 1.0, 10, **kw)  # type: ignore[arg-type]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sub" / "memory.db"


@pytest.fixture
def store(db: Path) -> Iterator[MemoryStore]:
    opened = MemoryStore.open(db)
    yield opened
    opened.close()


@pytest.fixture
def second(db: Path, store: MemoryStore) -> Iterator[MemoryStore]:
    """Another connection to the same file, opened while the first one is open."""
    opened = MemoryStore.open(db)
    yield opened
    opened.close()


def table_ids(store: MemoryStore, table: str) -> set[int]:
    conn = store._conn  # the test reads the raw tables
    if table == "chunks":
        return {r[0] for r in conn.execute("SELECT id FROM chunks")}
    return {r[0] for r in conn.execute(f"SELECT rowid FROM {table}")}


def tables(store: MemoryStore) -> set[str]:
    return {r[0] for r in store._conn.execute("SELECT name FROM sqlite_master")}


def test_open_creates_the_schema(store: MemoryStore, db: Path) -> None:
    assert db.exists()
    assert {"meta", "files", "chunks", "chunks_fts", "chunks_cjk", "embedding_cache"} <= tables(
        store
    )
    assert "chunks_vec" not in tables(store)  # created once the width is known
    assert store.vector_dims is None
    assert store.fts_available()
    assert store.info.vector_available
    assert store.meta() is None


def test_reopening_keeps_the_rows(db: Path) -> None:
    first = MemoryStore.open(db)
    first.ensure_vectors(DIMS)
    first.replace_file(file_row("a.md"), [chunk("alpha")], np.stack([unit(1, 0, 0, 0)]))
    first.close()

    again = MemoryStore.open(db)
    try:
        assert again.vector_dims == DIMS
        assert set(again.files()) == {"a.md"}
        assert again.counts().vectors == 1
    finally:
        again.close()


def test_meta_round_trip(store: MemoryStore) -> None:
    meta = IndexMeta("e5", "m", "", 384, {"file_tokens": 400}, "cl100k_base")
    store.set_meta(meta)
    assert store.meta() == meta
    changed = IndexMeta("e5", "m", "", 384, {"file_tokens": 200}, "cl100k_base")
    store.set_meta(changed)
    assert store.meta() == changed


@pytest.mark.parametrize("raw", ["not json", "{}", '{"embedder": "e5"}', "[]"])
def test_unreadable_meta_reads_as_none(raw: str) -> None:
    assert IndexMeta.from_json(raw) is None


def test_replace_file_writes_every_table(store: MemoryStore) -> None:
    store.ensure_vectors(DIMS)
    chunks = [chunk("the cat sat", 1), chunk("我的猫叫小白", 2)]
    store.replace_file(file_row("a.md"), chunks, np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0)]))

    ids = table_ids(store, "chunks")
    assert len(ids) == 2
    assert table_ids(store, "chunks_fts") == ids
    assert table_ids(store, "chunks_vec") == ids
    assert len(table_ids(store, "chunks_cjk")) == 1  # only the chunk with CJK text
    rows = store.chunks_by_id(sorted(ids))
    assert [r.text for r in rows.values()] == ["the cat sat", "我的猫叫小白"]
    assert store.files()["a.md"].chunks == 2
    assert store.chunk_texts("a.md")[0][2] == "the cat sat"


def test_replace_file_is_atomic(store: MemoryStore) -> None:
    store.ensure_vectors(DIMS)
    store.replace_file(
        file_row("a.md"), [chunk("old one"), chunk("old two")], np.stack([unit(1, 0, 0, 0)] * 2)
    )
    before = {t: table_ids(store, t) for t in ("chunks", "chunks_fts", "chunks_vec")}
    bad_vectors = np.array([[1, 0, 0, 0], [1, 0, 0]], dtype=object)  # the second is 3-wide
    new = FileRow("a.md", "memory", "agent", "new-hash", 2.0, 20)

    with pytest.raises(store.info.module.Error):
        store.replace_file(new, [chunk("new one"), chunk("new two")], bad_vectors)

    assert {t: table_ids(store, t) for t in before} == before
    assert store.files()["a.md"].hash == "hash-a.md"
    texts = sorted(r.text for r in store.chunks_by_id(sorted(before["chunks"])).values())
    assert texts == ["old one", "old two"]
    assert store.keyword_hits("chunks_fts", '"new"', ["agent"], 10) == []
    # The connection is usable afterwards (the transaction was rolled back, not left open).
    store.replace_file(new, [chunk("new one")], np.stack([unit(0, 0, 1, 0)]))
    assert [r.text for r in store.chunks_by_id(sorted(table_ids(store, "chunks"))).values()] == [
        "new one"
    ]


def test_replace_file_wants_one_vector_per_chunk(store: MemoryStore) -> None:
    store.ensure_vectors(DIMS)
    with pytest.raises(MemoryIndexError, match="one vector per chunk"):
        store.replace_file(file_row("a.md"), [chunk("a"), chunk("b")], np.stack([unit(1, 0, 0, 0)]))
    assert store.files() == {}


def test_delete_file_removes_it_from_every_table(store: MemoryStore) -> None:
    store.ensure_vectors(DIMS)
    store.replace_file(
        file_row("a.md"),
        [chunk("cat food"), chunk("猫粮很贵")],
        np.stack([unit(1, 0, 0, 0), unit(0, 1, 0, 0)]),
    )
    store.replace_file(file_row("b.md"), [chunk("dog food")], np.stack([unit(0, 0, 1, 0)]))
    kept = table_ids(store, "chunks") - {r[0] for r in store.chunk_texts("a.md")}

    store.delete_file("a.md")

    assert set(store.files()) == {"b.md"}
    assert table_ids(store, "chunks") == kept
    assert table_ids(store, "chunks_fts") == kept
    assert table_ids(store, "chunks_vec") == kept
    assert table_ids(store, "chunks_cjk") == set()
    assert [i for i, _ in store.keyword_hits("chunks_fts", '"food"', ["agent"], 10)] == list(kept)
    assert store.keyword_hits("chunks_cjk", '"猫粮"', ["agent"], 10) == []


def test_embedding_cache_is_keyed_and_bounded(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = types.SimpleNamespace(time=lambda: 0.0)
    monkeypatch.setattr(store_module, "time", clock)
    key = ("fake", "m1", "")
    for second_, name in enumerate(["oldest", "middle", "newer"], start=1):
        clock.time = lambda s=second_: float(s)
        store.cache_vectors(*key, [(name, unit(1, 0, 0, second_))], max_entries=3)
    assert store.counts().cache_entries == 3

    clock.time = lambda: 10.0
    store.cache_vectors(*key, [("newest", unit(0, 1, 0, 0))], max_entries=3)

    found = store.cached_vectors(*key, ["oldest", "middle", "newer", "newest"])
    assert set(found) == {"middle", "newer", "newest"}
    np.testing.assert_allclose(found["newest"], unit(0, 1, 0, 0))
    assert store.counts().cache_entries == 3
    # Another model (or endpoint) never reads these vectors.
    assert store.cached_vectors("fake", "m2", "", ["newest"]) == {}
    assert store.cached_vectors("fake", "m1", "other-endpoint", ["newest"]) == {}


def test_a_zero_cache_stores_nothing(store: MemoryStore) -> None:
    store.cache_vectors("fake", "m", "", [("h", unit(1, 0, 0, 0))], max_entries=0)
    assert store.counts().cache_entries == 0


def test_rewriting_a_cached_vector_refreshes_it(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = types.SimpleNamespace(time=lambda: 1.0)
    monkeypatch.setattr(store_module, "time", clock)
    store.cache_vectors("fake", "m", "", [("a", unit(1, 0, 0, 0))], max_entries=2)
    clock.time = lambda: 2.0
    store.cache_vectors("fake", "m", "", [("b", unit(0, 1, 0, 0))], max_entries=2)
    clock.time = lambda: 3.0
    store.cache_vectors("fake", "m", "", [("a", unit(0, 0, 1, 0))], max_entries=2)
    clock.time = lambda: 4.0
    store.cache_vectors("fake", "m", "", [("c", unit(0, 0, 0, 1))], max_entries=2)

    found = store.cached_vectors("fake", "m", "", ["a", "b", "c"])
    assert set(found) == {"a", "c"}
    np.testing.assert_allclose(found["a"], unit(0, 0, 1, 0))


def test_vector_hits_never_cross_scopes(store: MemoryStore) -> None:
    store.ensure_vectors(DIMS)
    query = unit(1, 0, 0, 0)
    store.replace_file(file_row("MEMORY.md"), [chunk("agent fact")], np.stack([unit(1, 1, 1, 1)]))
    store.replace_file(
        file_row("sessions/a.jsonl", scope="peer:alice", source="sessions"),
        [chunk("alice said")],
        np.stack([unit(1, 1, 0, 0)]),
    )
    # Bob's chunk is exactly the query: the nearest of all, and still never returned.
    store.replace_file(
        file_row("sessions/b.jsonl", scope="peer:bob", source="sessions"),
        [chunk("bob said"), chunk("bob again")],
        np.stack([query, unit(1, 0.1, 0, 0)]),
    )
    scopes_of = {
        r.id: r.scope for r in store.chunks_by_id(sorted(table_ids(store, "chunks"))).values()
    }

    for k in (1, 2, 3, 10):
        hits = store.vector_hits(query, ["agent", "peer:alice"], k)
        assert len(hits) == min(k, 2)
        assert {scopes_of[i] for i, _ in hits} <= {"agent", "peer:alice"}
        distances = [d for _, d in hits]
        assert distances == sorted(distances)
    bob = store.vector_hits(query, ["peer:bob"], 10)
    assert [scopes_of[i] for i, _ in bob] == ["peer:bob", "peer:bob"]
    assert bob[0][1] == pytest.approx(0.0, abs=1e-6)


def test_keyword_hits_respect_scopes(store: MemoryStore) -> None:
    store.replace_file(file_row("MEMORY.md"), [chunk("shared secret word")], None)
    store.replace_file(
        file_row("sessions/b.jsonl", scope="peer:bob", source="sessions"),
        [chunk("secret word secret word")],
        None,
    )
    hits = store.keyword_hits("chunks_fts", '"secret"', ["agent", "peer:alice"], 10)
    rows = store.chunks_by_id([i for i, _ in hits])
    assert [r.scope for r in rows.values()] == ["agent"]
    with pytest.raises(ValueError, match="not a keyword table"):
        store.keyword_hits("chunks; DROP TABLE chunks", '"x"', ["agent"], 10)


def test_counts_by_source(store: MemoryStore) -> None:
    store.ensure_vectors(DIMS)
    store.replace_file(
        file_row("MEMORY.md"), [chunk("a"), chunk("b")], np.stack([unit(1, 0, 0, 0)] * 2)
    )
    store.replace_file(file_row("memory/x.md"), [chunk("c")], None)
    store.replace_file(
        file_row("sessions/s.jsonl", source="sessions", scope="peer:alice", vectors_pending=True),
        [chunk("d"), chunk("e"), chunk("f")],
        None,
    )
    store.cache_vectors("fake", "m", "", [("h", unit(1, 0, 0, 0))], max_entries=10)

    counts = store.counts()

    assert counts.files == 3
    assert counts.chunks == 6
    assert counts.vectors == 2
    assert counts.pending_vector_files == 1
    assert counts.cache_entries == 1
    assert counts.by_source == [SourceCount("memory", 2, 3), SourceCount("sessions", 1, 3)]


def test_add_vectors_fills_in_a_pending_file(store: MemoryStore) -> None:
    store.replace_file(file_row("a.md", vectors_pending=True), [chunk("one"), chunk("two")], None)
    assert store.files()["a.md"].vectors_pending
    store.ensure_vectors(DIMS)
    ids = [i for i, _, _ in store.chunk_texts("a.md")]

    store.add_vectors("a.md", "agent", [(ids[0], unit(1, 0, 0, 0)), (ids[1], unit(0, 1, 0, 0))])

    assert not store.files()["a.md"].vectors_pending
    assert set(store.vectors_for(ids)) == set(ids)
    np.testing.assert_allclose(store.vectors_for([ids[1]])[ids[1]], unit(0, 1, 0, 0))


def test_touch_file_keeps_the_chunks(store: MemoryStore) -> None:
    store.replace_file(file_row("a.md"), [chunk("one")], None)
    store.touch_file("a.md", 99.0, 123)
    row = store.files()["a.md"]
    assert (row.mtime, row.size, row.chunks) == (99.0, 123, 1)


def test_a_second_connection_sees_chunks_vec_made_by_the_first(
    store: MemoryStore, second: MemoryStore
) -> None:
    assert second.vector_dims is None
    store.ensure_vectors(DIMS)
    store.replace_file(file_row("a.md"), [chunk("alpha")], np.stack([unit(1, 0, 0, 0)]))

    assert second.vector_dims == DIMS
    assert second.counts().vectors == 1
    assert [i for i, _ in second.vector_hits(unit(1, 0, 0, 0), ["agent"], 5)] == list(
        table_ids(store, "chunks")
    )
    second.ensure_vectors(DIMS)  # already there: no "table already exists"
    with pytest.raises(MemoryIndexError, match="reindex"):
        second.ensure_vectors(DIMS + 1)
    # A delete through the second connection takes the vectors with it.
    second.delete_file("a.md")
    assert table_ids(store, "chunks_vec") == set()
    assert store.counts().vectors == 0


def test_ensure_vectors_refuses_another_width(store: MemoryStore) -> None:
    store.ensure_vectors(DIMS)
    store.ensure_vectors(DIMS)
    with pytest.raises(MemoryIndexError, match="4-dim vectors, not 8"):
        store.ensure_vectors(8)


def test_fts_only_store_refuses_vectors_and_says_why(tmp_path: Path) -> None:
    fts_only = MemoryStore.open(tmp_path / "fts.db", driver="sqlite3")
    try:
        assert not fts_only.info.vector_available
        assert fts_only.fts_available()
        with pytest.raises(MemoryIndexError, match="cannot load extensions"):
            fts_only.ensure_vectors(DIMS)
        fts_only.replace_file(file_row("a.md"), [chunk("keyword only")], None)
        assert fts_only.vector_hits(unit(1, 0, 0, 0), ["agent"], 5) == []
        assert len(fts_only.keyword_hits("chunks_fts", '"keyword"', ["agent"], 5)) == 1
        assert fts_only.counts().vectors == 0
    finally:
        fts_only.close()


def test_an_unopenable_file_is_a_memory_index_error(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(MemoryIndexError, match="memory index"):
        MemoryStore.open(tmp_path / "dir.db")


def test_a_file_that_is_not_sqlite_is_a_memory_index_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(MemoryIndexError):
        MemoryStore.open(junk)


def test_a_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    """A memory.db written before forgetting existed (no tombstone table, user_version
    0) gains the table at open and keeps its rows: no rebuild."""
    path = tmp_path / "memory.db"
    store = MemoryStore.open(path, vector=False)
    store.replace_file(file_row("MEMORY.md"), [chunk("the walrus note")], None)
    store._conn.execute("DROP TABLE forgotten")
    store._conn.execute("PRAGMA user_version = 0")
    store.close()

    store = MemoryStore.open(path, vector=False)
    try:
        assert (
            store._conn.execute("PRAGMA user_version").fetchone()[0] == store_module.STORE_VERSION
        )
        assert store.tombstones() == []
        assert list(store.files()) == ["MEMORY.md"]
        assert store.meta() is None  # IndexMeta untouched: nothing asks for a rebuild
    finally:
        store.close()
