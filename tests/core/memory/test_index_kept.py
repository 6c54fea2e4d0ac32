"""Kept sources through a rebuild (``core.memory.index.kept``), end to end on both stores.

Retention with ``archived_memory = "keep"`` marks an archived transcript's chunks kept
(``MemoryIndex.keep_removed``), then deletes the file. A rebuild (``--force``, or the
settings changed) reads only the sources left, so it carries the kept ones over from the
live index: they are still found, by the same audience only, without duplicates after a
killed rebuild resumes; what was dropped rather than kept does not come back. Real
memory.db with sqlite-vec, real PostgreSQL (pgvector ranking exactly, and PostgreSQL 16
running HNSW), real transcripts; the deterministic fake embedder, so a test can tell
what was embedded again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.backend import SqliteBackend
from parley.core.memory.index import MemoryIndex
from parley.core.memory.memory_config import ChunkingSettings, MemorySettings
from parley.core.memory.store_protocol import MemoryStoreProtocol, StoreBackend
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from tests.core.memory.helpers import Layout, make_layout, open_index, quiet_settings
from tests.fakes.embedder import HashingEmbedder, resilient

# PostgreSQL twice, as in test_store_backends: exact ranking on the main test server
# (its pgvector's HNSW dies with SIGILL here), HNSW on PostgreSQL 16 with pgvector 0.6.
PG_SERVERS = {"postgres": ("pg_url", "exact"), "postgres-hnsw": ("pg16_url", "hnsw")}
ALICE_PATH = "sessions/s-alice.jsonl"
BOB_PATH = "sessions/s-bob.jsonl"
ALICE = [
    ("user", "My cat is called Zanzibar and she eats tuna every morning."),
    ("assistant", "Zanzibar is a lovely name for a cat who likes tuna."),
]
BOB = [("user", "My cat is called Mittens and she eats salmon."), ("assistant", "Noted.")]
ALICE_VIEWER = Viewer(Audience.person("alice"), frozenset({"alice"}))
BOB_VIEWER = Viewer(Audience.person("bob"), frozenset({"bob"}))


def settings(**overrides: object) -> MemorySettings:
    """No embedding cache: what a rebuild does not carry over it must embed again, so a
    test sees which vectors came along."""
    return quiet_settings(cache_max_entries=0, **overrides)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = make_layout(tmp_path)
    layout.write("MEMORY.md", "# Memory\n\nThe user's favourite tea is oolong.\n")
    layout.transcript("s-alice", ALICE, scope="person:alice")
    layout.transcript("s-bob", BOB, scope="person:bob")
    return layout


async def _backend(
    name: str, layout: Layout, request: pytest.FixtureRequest
) -> AsyncIterator[StoreBackend]:
    if name == "sqlite":
        yield SqliteBackend(layout.db)
        return
    url_fixture, vector_index = PG_SERVERS[name]
    async with PgDatabase(request.getfixturevalue(url_fixture)) as db:
        yield PgMemoryBackend(db, "agent-1", vector_index=vector_index)


@pytest.fixture(params=["sqlite", *PG_SERVERS])
async def backend(request: pytest.FixtureRequest, layout: Layout) -> AsyncIterator[StoreBackend]:
    """Every store: memory.db, PostgreSQL, and PostgreSQL 16 with HNSW."""
    async for made in _backend(request.param, layout, request):
        yield made


@pytest.fixture(params=["sqlite", "postgres"])
async def store_backend(
    request: pytest.FixtureRequest, layout: Layout
) -> AsyncIterator[StoreBackend]:
    """memory.db and PostgreSQL (for the tests that need not run HNSW too)."""
    async for made in _backend(request.param, layout, request):
        yield made


async def _index_and_keep_alice(layout: Layout, backend: StoreBackend) -> int:
    """Index everything, then do what retention does with ``keep``: mark Alice's
    transcript kept, delete it, and sync (which leaves its rows). Its chunk count."""
    async with open_index(
        layout, settings(), resilient(HashingEmbedder()), backend=backend
    ) as index:
        await index.sync()
        await index.keep_removed([ALICE_PATH])
        (layout.sessions / "s-alice.jsonl").unlink()
        report = await index.sync()
        assert report.files_deleted == 0
        chunks = len(await _chunk_texts(index, ALICE_PATH))
        assert chunks > 0
        assert await _paths(index, "Zanzibar tuna", ALICE_VIEWER) == [ALICE_PATH]
        return chunks


async def _chunk_texts(index: MemoryIndex, path: str) -> list[str]:
    store = index._store()
    return [text for _, _, text in await index._w(store.chunk_texts, path)]


async def _paths(index: MemoryIndex, query: str, viewer: Viewer) -> list[str]:
    """The paths a person's search finds: its scopes by the one visibility rule."""
    scopes = await index.visible_scopes(viewer)
    result = await index.search(query, scopes=scopes)
    return sorted({hit.path for hit in result.hits if hit.path.startswith("sessions/")})


async def _counts_consistent(index: MemoryIndex) -> None:
    """Every chunk has its vector and nothing waits for one."""
    counts = await index._w(index._store().counts)
    assert counts.vectors == counts.chunks and counts.pending_vector_files == 0


# -- found after a rebuild ------------------------------------------------------------------

REBUILDS = {
    "force": (HashingEmbedder, ChunkingSettings()),
    "model": (lambda: HashingEmbedder(model="hash-v2"), ChunkingSettings()),
    "dimensions": (lambda: HashingEmbedder(dimensions=32), ChunkingSettings()),
    "chunking": (HashingEmbedder, ChunkingSettings(transcript_tokens=60)),
}


@pytest.mark.parametrize("rebuild", list(REBUILDS))
async def test_a_kept_transcript_is_found_after_a_rebuild(
    layout: Layout, backend: StoreBackend, rebuild: str
) -> None:
    chunks = await _index_and_keep_alice(layout, backend)
    make_embedder, chunking = REBUILDS[rebuild]
    embedder = make_embedder()
    async with open_index(
        layout, settings(chunking=chunking), resilient(embedder), backend=backend
    ) as index:
        report = await index.sync(force=rebuild == "force")
        alice_scopes = await index.visible_scopes(ALICE_VIEWER)
        result = await index.search("Zanzibar tuna", scopes=alice_scopes)
        store = index._store()
        query = await embedder.embed_queries(["Zanzibar tuna"])
        near = await index._w(store.vector_hits, query[0], ["person:alice"], 5)
        rows = await index._w(store.chunks_by_id, [i for i, _ in near])
        texts = await _chunk_texts(index, ALICE_PATH)
        again = await index.sync()
        await _counts_consistent(index)

    assert report.reindexed and report.files_kept == 1 and not report.errors
    assert result.mode == "hybrid"
    assert result.hits[0].path == ALICE_PATH and result.hits[0].scope == "person:alice"
    # Found by its vector too, in the new model's space and its own scope.
    assert ALICE_PATH in {row.path for row in rows.values()}
    # Its old chunking: the file is gone, its chunks cannot be cut again.
    assert len(texts) == chunks
    embedded = {text for call in embedder.passage_calls for text in call}
    if rebuild in ("model", "dimensions"):  # another model: its text embedded anew
        assert set(texts) <= embedded
    else:  # the same model: its vectors came along, none embedded
        assert not set(texts) & embedded
    # The next sync leaves it be: still kept in the new index.
    assert not again.reindexed and again.files_deleted == 0


async def test_a_kept_chunk_of_one_person_stays_invisible_to_another(
    layout: Layout, store_backend: StoreBackend
) -> None:
    await _index_and_keep_alice(layout, store_backend)
    embedder = HashingEmbedder(model="hash-v2")  # re-embedded: the vectors are written anew
    async with open_index(layout, settings(), resilient(embedder), backend=store_backend) as index:
        await index.sync()
        bob_sees = await _paths(index, "Zanzibar cat tuna", BOB_VIEWER)
        alice_sees = await _paths(index, "Zanzibar cat tuna", ALICE_VIEWER)
        bob_scopes = await index.visible_scopes(BOB_VIEWER)
        store = index._store()
        ids = [i for i, _, _ in await index._w(store.chunk_texts, ALICE_PATH)]
        scopes = {row.scope for row in (await index._w(store.chunks_by_id, ids)).values()}
        query = await embedder.embed_queries(["Zanzibar tuna"])
        bob_near = await index._w(store.vector_hits, query[0], list(bob_scopes), 10)
        bob_rows = await index._w(store.chunks_by_id, [i for i, _ in bob_near])
        file = (await index._w(store.files))[ALICE_PATH]
        await index.sync(force=True)  # and once more, carried with its vectors
        bob_after_force = await _paths(index, "Zanzibar cat tuna", BOB_VIEWER)

    assert "person:alice" not in bob_scopes
    assert alice_sees == [ALICE_PATH]
    assert bob_sees == [BOB_PATH]  # Bob's own cat, never Alice's
    assert scopes == {"person:alice"} and file.scope == "person:alice"
    assert ALICE_PATH not in {row.path for row in bob_rows.values()}
    assert bob_after_force == [BOB_PATH]


# -- a killed rebuild, and what was dropped -------------------------------------------------


async def _shadow_chunks(backend: StoreBackend, path: str) -> list[str]:
    shadow: MemoryStoreProtocol = await asyncio.to_thread(backend.open_shadow, vector=True)
    try:
        return [t for _, _, t in await asyncio.to_thread(shadow.chunk_texts, path)]
    finally:
        await asyncio.to_thread(shadow.close)


async def test_a_killed_rebuild_resumes_without_duplicating_kept_chunks(
    layout: Layout, store_backend: StoreBackend
) -> None:
    chunks = await _index_and_keep_alice(layout, store_backend)
    killed = HashingEmbedder(model="hash-v2")
    killed.hold_after = 0  # the shadow's rows are in, kept ones too; its vectors are held
    async with open_index(layout, settings(), resilient(killed), backend=store_backend) as index:
        task = index.request_sync("start")
        await killed.held.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(await _shadow_chunks(store_backend, ALICE_PATH)) == chunks

    resumed = HashingEmbedder(model="hash-v2")
    async with open_index(layout, settings(), resilient(resumed), backend=store_backend) as index:
        report = await index.sync()
        texts = await _chunk_texts(index, ALICE_PATH)
        result = await index.search("Zanzibar tuna", scopes=["person:alice"])
        await _counts_consistent(index)

    assert report.reindexed and not report.errors
    assert report.files_kept == 0  # carried by the killed run; this one resumed it
    assert len(texts) == chunks and len(set(texts)) == len(texts)
    citations = [hit.citation for hit in result.hits]
    assert citations and len(citations) == len(set(citations))


async def test_a_removed_source_that_was_not_kept_does_not_come_back(
    layout: Layout, store_backend: StoreBackend
) -> None:
    async with open_index(
        layout, settings(), resilient(HashingEmbedder()), backend=store_backend
    ) as index:
        await index.sync()
        # Alice's: kept, then dropped after all (``parley people erase``): the mark stays.
        await index.keep_removed([ALICE_PATH])
        (layout.sessions / "s-alice.jsonl").unlink()
        assert await index.drop_removed([ALICE_PATH]) == 1
        # Bob's: deleted without a mark; no sync has seen it go yet, so the live index
        # still holds its rows when the rebuild starts.
        (layout.sessions / "s-bob.jsonl").unlink()
        report = await index.sync(force=True)
        files = await index._w(index._store().files)
        alice = await _paths(index, "Zanzibar tuna", ALICE_VIEWER)
        bob = await _paths(index, "Mittens salmon", BOB_VIEWER)

    assert report.reindexed and report.files_kept == 0
    assert ALICE_PATH not in files and BOB_PATH not in files
    assert alice == [] and bob == []


async def test_a_source_kept_during_a_rebuild_stays_kept_in_the_new_index(
    layout: Layout,
) -> None:
    """memory.db keeps the marks in the file a rebuild replaces (PostgreSQL shares them
    between live and shadow): a mark written while a rebuild runs waits for it, so it
    lands in the index swapped in, not in the one thrown away."""
    async with open_index(layout, settings(), resilient(HashingEmbedder())) as index:
        await index.sync()
    slow = HashingEmbedder(model="hash-v2")
    slow.hold_after = 0
    async with open_index(layout, settings(), resilient(slow)) as index:
        rebuild = index.request_sync("start")
        await slow.held.wait()  # the kept marks are copied; the vectors are held
        keep = asyncio.create_task(index.keep_removed([ALICE_PATH]))
        await asyncio.sleep(0)  # it runs as far as it can
        # Unless it waits for the rebuild, it has queued its mark's write on the
        # writer's thread by now: a call queued behind it returns after that write,
        # and the task (woken first) has finished by then.
        await index._w(lambda: None)
        await asyncio.sleep(0)
        waited = not keep.done()
        slow.release.set()
        assert (await rebuild).reindexed
        await keep
        (layout.sessions / "s-alice.jsonl").unlink()  # as retention does, after the mark
        after = await index.sync()
        alice = await _paths(index, "Zanzibar tuna", ALICE_VIEWER)

    assert waited
    assert after.files_deleted == 0
    assert alice == [ALICE_PATH]
