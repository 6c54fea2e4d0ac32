"""A conversation that keeps going: each sync chunks only what a turn appended, the chunks
are findable by keyword as soon as they are written, and their vectors follow from one
batched pass over every file; a kill at any moment leaves the index old or new."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.index import MemoryIndex
from parley.core.memory.memory_config import ChunkingSettings, SyncSettings
from parley.core.memory.store import MemoryStore
from tests.core.memory.helpers import (
    Layout,
    assert_consistent,
    make_layout,
    open_index,
    quiet_settings,
    read_db,
)
from tests.fakes.embedder import HashingEmbedder, resilient

ALICE = ["agent", "person:alice"]
BOB = ["agent", "person:bob"]
SMALL = ChunkingSettings(transcript_tokens=40)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return make_layout(tmp_path)


def turns(start: int, n: int, topic: str = "gardening") -> list[tuple[str, str]]:
    return [
        ("user" if i % 2 == 0 else "assistant", f"Message {i} about {topic}.")
        for i in range(start, start + n)
    ]


def chunk_rows(db: Path, path: str) -> list[tuple[int, int, str]]:
    store = MemoryStore.open(db, vector=False)
    try:
        rows = store._conn.execute(
            "SELECT start_line, end_line, text FROM chunks WHERE path = ? ORDER BY start_line, id",
            (path,),
        ).fetchall()
        return [(int(a), int(b), str(t)) for a, b, t in rows]
    finally:
        store.close()


async def whole_file_chunks(layout: Layout, tmp: Path, path: str) -> list[tuple[int, int, str]]:
    """The chunks a fresh index makes of the same transcripts (chunked whole)."""
    fresh = make_layout(tmp / "fresh")
    shutil.copytree(layout.sessions, fresh.sessions)
    async with open_index(fresh, quiet_settings(chunking=SMALL), None) as index:
        await index.sync()
    return chunk_rows(fresh.db, path)


async def test_appended_turns_are_chunked_as_the_whole_file_would_be(
    layout: Layout, tmp_path: Path
) -> None:
    fake = HashingEmbedder()
    layout.transcript("s-1", turns(0, 9), scope="person:alice")
    async with open_index(layout, quiet_settings(chunking=SMALL), resilient(fake)) as index:
        await index.sync()
        reports = []
        for step in range(6):
            layout.append("s-1", turns(9 + 3 * step, step % 3 + 1, topic=f"topic{step}"))
            reports.append(await index.sync())

    assert all(r.files_resumed == 1 and not r.errors for r in reports)
    assert chunk_rows(layout.db, "sessions/s-1.jsonl") == await whole_file_chunks(
        layout, tmp_path, "sessions/s-1.jsonl"
    )
    assert_consistent(layout.db)


async def test_a_kill_before_the_tail_is_written_resumes_from_the_old_point(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks and the resume point are one transaction: a write that never commits
    (a kill) leaves both as they were, and the next sync redoes the append."""
    layout.transcript("s-1", turns(0, 9), scope="person:alice")
    async with open_index(layout, quiet_settings(chunking=SMALL), None) as index:
        await index.sync()
        before = read_db(layout.db)
        layout.append("s-1", turns(9, 4, topic="tomatoes"))

        def killed(*args: Any) -> None:
            raise KeyboardInterrupt  # as if the process died mid-write

        monkeypatch.setattr(MemoryStore, "replace_tail", killed)
        with pytest.raises(KeyboardInterrupt):
            await index.sync()
        assert read_db(layout.db).texts == before.texts
        monkeypatch.undo()

        report = await index.sync()
        found = await index.search("tomatoes", scopes=ALICE)

    assert report.files_resumed == 1
    assert "tomatoes" in found.hits[0].snippet
    assert chunk_rows(layout.db, "sessions/s-1.jsonl") == await whole_file_chunks(
        layout, tmp_path, "sessions/s-1.jsonl"
    )
    assert_consistent(layout.db, vectors=False)


async def test_a_rewritten_transcript_is_chunked_whole_again(
    layout: Layout, tmp_path: Path
) -> None:
    path = layout.transcript("s-1", turns(0, 12), scope="person:alice")
    async with open_index(layout, quiet_settings(chunking=SMALL), None) as index:
        await index.sync()
        # Rewritten shorter (an operator truncated it): no resuming from the old point.
        lines = path.read_bytes().split(b"\n")
        path.write_bytes(b"\n".join(lines[:5]) + b"\n")
        shrunk = await index.sync()
        layout.append("s-1", turns(40, 2, topic="kiwis"))
        grown = await index.sync()

    assert shrunk.files_indexed == 1 and shrunk.files_resumed == 0
    assert grown.files_resumed == 1
    assert chunk_rows(layout.db, "sessions/s-1.jsonl") == await whole_file_chunks(
        layout, tmp_path, "sessions/s-1.jsonl"
    )


async def test_a_fact_is_found_by_keyword_before_its_vector_and_by_vector_after(
    layout: Layout,
) -> None:
    """The sync a turn triggers writes the text; the embedding follows in the background,
    and a search meanwhile finds the fact by keyword, in its person's scope only."""
    fake = HashingEmbedder()
    layout.transcript("s-a", turns(0, 6), scope="person:alice")
    layout.transcript("s-b", turns(0, 6), scope="person:bob")
    settings = quiet_settings(
        chunking=SMALL,
        sync=SyncSettings(on_start=False, watch=False, transcript_debounce_seconds=0),
    )
    async with open_index(layout, settings, resilient(fake)) as index:
        await index.sync()
        fake.hold_after = len(fake.passage_calls)  # the next embedding waits
        layout.append("s-a", [("user", "My locker code is CANARY-4417.")])
        index.notify_transcript()
        await asyncio.wait_for(fake.held.wait(), 5)  # the text is in; its vector is held
        keyword = await index.search("locker CANARY-4417", scopes=ALICE, catch_up=False)
        other = await index.search("locker CANARY-4417", scopes=BOB, catch_up=False)
        status = await index.status()
        fake.release.set()
        await asyncio.wait_for(_vectors_done(index), 5)
        hybrid = await index.search("locker CANARY-4417", scopes=ALICE, catch_up=False)

    assert "CANARY-4417" in keyword.hits[0].snippet
    assert keyword.hits[0].vector_score is None  # not embedded yet
    assert status.counts.pending_vector_files == 1
    assert not any("CANARY" in h.snippet for h in other.hits)
    assert "CANARY-4417" in hybrid.hits[0].snippet
    assert hybrid.hits[0].vector_score is not None
    assert_consistent(layout.db)


async def _vectors_done(index: MemoryIndex) -> None:
    task = index._vectors.task
    if task is not None:
        await task


async def test_one_vector_pass_embeds_every_files_new_chunks_in_batches(layout: Layout) -> None:
    fake = HashingEmbedder()
    fake.max_batch = 4
    for person in ("alice", "bob", "carol"):
        layout.transcript(f"s-{person}", turns(0, 4), scope=f"person:{person}")
    async with open_index(layout, quiet_settings(chunking=SMALL), resilient(fake)) as index:
        await index.sync()
        calls = len(fake.passage_calls)
        for person in ("alice", "bob", "carol"):
            layout.append(f"s-{person}", turns(4, 2, topic=f"{person}'s kiwis"))
        report = await index.sync()

    new = [t for call in fake.passage_calls[calls:] for t in call]
    assert report.files_resumed == 3
    assert report.embedded == len(new) >= 3
    assert len(fake.passage_calls) - calls == -(-len(new) // 4)  # full batches across files
    assert_consistent(layout.db)


async def test_an_older_index_with_pending_vectors_fills_them_after_the_upgrade(
    layout: Layout,
) -> None:
    """memory.db layout 2 knew pending vectors per file only: the upgrade lists their
    chunks, and the next sync embeds them."""
    fake = HashingEmbedder()
    fake.fail = "down"
    layout.write("MEMORY.md", "# Memory\n- Oolong tea at four.\n")
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        assert (await index.sync()).vectors_pending == 1
    store = MemoryStore.open(layout.db, vector=False)
    store._conn.executescript("DROP TABLE chunks_pending; PRAGMA user_version = 2;")
    store.close()

    fake.fail = None
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        report = await index.sync()

    assert report.embedded == 1 and report.vectors_pending == 0
    assert_consistent(layout.db)
