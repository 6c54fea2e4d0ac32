"""The ``sessions`` source read through a ``TranscriptStore`` (``StoreTranscriptSource``):
the same paths, bytes and chunks as the transcript files give, and a change marker that
moves whenever the transcript grows. The file store stands in for any store here; the
PostgreSQL one is exercised in tests/gateway/test_memory_pg_gateway.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.core.errors import TranscriptError
from parley.core.memory.index import MemoryIndex
from parley.core.memory.sources import (
    SESSIONS_SOURCE,
    FileTranscriptSource,
    SourceFile,
    StoreTranscriptSource,
    stamp_marker,
    transcript_files,
)
from parley.core.messages import Message
from parley.core.transcript import Transcript
from parley.core.transcript_store import FileTranscriptStore, TranscriptInfo
from tests.core.memory.helpers import Layout, make_layout, quiet_settings
from tests.fakes.embedder import HashingEmbedder, resilient

SID_A = "a" * 32
SID_B = "b" * 32


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = make_layout(tmp_path)
    layout.transcript(SID_B, [("user", "the shed key is under the mat"), ("assistant", "ok")])
    layout.transcript(SID_A, [("user", "my ferret is called Pumpernickel")], scope="person:a")
    return layout


def test_a_store_lists_the_paths_the_files_give(layout: Layout) -> None:
    source = StoreTranscriptSource(FileTranscriptStore(layout.sessions))
    listed = source.transcripts()
    files = transcript_files(layout.sessions)
    assert [s.path for s in listed] == [f.path for f in files]
    assert [s.path for s in listed] == [f"sessions/{SID_A}.jsonl", f"sessions/{SID_B}.jsonl"]
    assert {(s.source, s.scope) for s in listed} == {(SESSIONS_SOURCE, None)}
    assert [s.session_id for s in listed] == [SID_A, SID_B]
    # The listing's marker is the file's own (mtime, size): one stat, not two. (From
    # st_mtime_ns: it may differ from st_mtime in the last bit.)
    by_files = FileTranscriptSource(layout.sessions)
    for listed_one, file in zip(listed, files, strict=True):
        marker, stat_marker = source.marker(listed_one), by_files.marker(file)
        assert marker is not None and stat_marker is not None
        assert marker[1] == stat_marker[1]
        assert marker[0] == pytest.approx(stat_marker[0], abs=1e-6)


def test_a_store_reads_the_files_bytes_up_to_the_limit(layout: Layout) -> None:
    source = StoreTranscriptSource(FileTranscriptStore(layout.sessions))
    (first, _) = source.transcripts()
    data = (layout.sessions / f"{SID_A}.jsonl").read_bytes()
    assert source.read(first, 1 << 20) == data
    assert source.read(first, 10) == data[:10]
    assert source.read(first, 0) == b""


def test_the_marker_moves_as_the_transcript_grows(layout: Layout) -> None:
    store = FileTranscriptStore(layout.sessions)
    source = StoreTranscriptSource(store)
    before = {s.session_id: source.marker(s) for s in source.transcripts()}
    layout.append(SID_A, [("assistant", "a fine name")])
    after = {s.session_id: source.marker(s) for s in source.transcripts()}
    assert after[SID_B] == before[SID_B]
    assert after[SID_A] != before[SID_A]
    # A source file without a listing's marker asks the store; gone is None.
    bare = SourceFile(f"sessions/{SID_A}.jsonl", Path("x"), SESSIONS_SOURCE, None, SID_A)
    assert source.marker(bare) == after[SID_A]
    gone = SourceFile("sessions/c.jsonl", Path("x"), SESSIONS_SOURCE, None, "c" * 32)
    assert source.marker(gone) is None
    with pytest.raises(TranscriptError):
        source.read(gone, 100)


def test_stamp_marker() -> None:
    assert stamp_marker((120, 1_500_000_000)) == (1.5, 120)  # a file: (size, mtime_ns)
    assert stamp_marker((7,)) == (0.0, 7)  # a table: its line count
    assert stamp_marker(()) == (0.0, 0)
    info = TranscriptInfo(SID_A, (7,), "db#transcripts/a")
    source = StoreTranscriptSource(FileTranscriptStore(Path("unused")))
    assert source._source(info).marker == (0.0, 7)


class _CountingStore(FileTranscriptStore):
    """A store whose lines are not files of the sessions directory the index knows."""

    def __init__(self, sessions_dir: Path) -> None:
        super().__init__(sessions_dir)
        self.opened: list[str] = []

    def open(self, session_id: str, *, read_only: bool = False) -> Transcript:
        self.opened.append(session_id)
        return super().open(session_id, read_only=read_only)


async def test_an_index_over_a_store_finds_and_follows_its_transcripts(
    layout: Layout, tmp_path: Path
) -> None:
    # The index is told of an empty sessions directory: all it reads comes via the store.
    store = _CountingStore(layout.sessions)
    index = MemoryIndex(
        quiet_settings(),
        db_path=layout.db,
        workspace=layout.workspace,
        sessions_dir=tmp_path / "elsewhere",
        embedder=resilient(HashingEmbedder(dimensions=8)),
        transcripts=StoreTranscriptSource(store),
    )
    await index.open()
    try:
        first = await index.sync()
        assert (first.files_seen, first.files_indexed, first.errors) == (2, 2, [])
        result = await index.search("ferret Pumpernickel", scopes=["person:a"])
        assert [h.path for h in result.hits] == [f"sessions/{SID_A}.jsonl"]
        assert (await index.status()).dirty_files == []

        store.opened.clear()
        unchanged = await index.sync()
        assert (unchanged.files_unchanged, store.opened) == (2, [])  # the marker said so

        with store.open(SID_A) as transcript:
            transcript.append_message(Message.assistant("Pumpernickel sleeps in the basket"))
        assert (await index.status()).dirty_files == [f"sessions/{SID_A}.jsonl"]
        store.opened.clear()
        grown = await index.sync()
        assert (grown.files_indexed, grown.files_unchanged) == (1, 1)
        # Opened twice: its header line, then the lines from where chunking stopped.
        assert store.opened == [SID_A, SID_A]
        result = await index.search("basket", scopes=["person:a"])
        assert any("basket" in h.snippet for h in result.hits)
    finally:
        await index.close()
