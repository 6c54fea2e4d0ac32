"""Chunking a transcript from where the previous sync stopped gives exactly the chunks of
chunking the whole file: checked on random transcripts appended in random pieces (cut
anywhere, mid-line and mid-character included), and the fallbacks when what was chunked
changed (truncated, rewritten, another header)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.core.memory.chunking import chunk_turns, header_agent_name, transcript_turns
from parley.core.memory.chunking.resume import WINDOW_BYTES, ResumePoint
from parley.core.memory.index.discovery import IndexSources
from parley.core.memory.index.file_sync import default_scope_resolver
from parley.core.memory.index.transcript_sync import (
    TranscriptUpdate,
    chunk_whole_transcript,
    new_chunks,
    resume_transcript,
)
from parley.core.memory.memory_config import ChunkingSettings
from parley.core.memory.rows import NewChunk
from parley.core.memory.sources import SourceFile, read_header
from parley.core.messages import Message
from parley.core.transcript import Transcript

START = datetime(2026, 1, 1, 23, 50, tzinfo=UTC)
SOURCE = SourceFile("sessions/s.jsonl", Path("s.jsonl"), "sessions", None)


class Bytes:
    """A transcript source over bytes in memory (what ``IndexSources`` reads)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, source: SourceFile, limit: int) -> bytes:
        return self.data[:limit]

    def read_range(self, source: SourceFile, start: int, limit: int) -> bytes:
        return self.data[start : start + limit]


def reference(data: bytes, chunking: ChunkingSettings) -> list[NewChunk]:
    """The whole file chunked as the index always did (before it could resume)."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    header = read_header(lines[0].encode()) if lines else None
    first = 1 if header is None else 2
    turns = transcript_turns(
        ((i, line) for i, line in enumerate(lines[first - 1 :], start=first)),
        agent_name=header_agent_name(header) if header is not None else None,
    )
    raw = chunk_turns(
        turns,
        max_tokens=chunking.transcript_tokens,
        overlap_turns=chunking.transcript_overlap_turns,
    )
    return new_chunks(raw)


class Index:
    """What the index keeps of one transcript: its chunks and its file row's hash."""

    def __init__(self, chunking: ChunkingSettings) -> None:
        self.chunking = chunking
        self.chunks: list[NewChunk] = []
        self.hash = ""
        self.resumed = 0
        self.whole = 0

    def sync(self, data: bytes) -> None:
        point = ResumePoint.decode(self.hash)
        scope = default_scope_resolver(read_header(data.split(b"\n")[0]) or {})
        if point is not None:
            sources = cast(IndexSources, Bytes(data))
            update = resume_transcript(
                sources, SOURCE, point, scope, self.chunking, default_scope_resolver
            )
            if update is True:
                return
            if isinstance(update, TranscriptUpdate):
                assert update.from_line is not None
                kept = [c for c in self.chunks if c.start_line < update.from_line]
                self.chunks = kept + update.chunks
                self.hash = update.digest
                self.resumed += 1
                return
        result, _ = chunk_whole_transcript(data, self.chunking, default_scope_resolver)
        self.chunks = new_chunks(result.chunks)
        self.hash = result.point.encode() if result.point is not None else "whole"
        self.whole += 1


def transcript_bytes(
    tmp: Path, turns: list[tuple[str, str, int]], agent: str | None, scope: str
) -> bytes:
    path = tmp / "s.jsonl"
    path.unlink(missing_ok=True)
    meta: dict[str, Any] = {"memory_scope": scope}
    if agent is not None:
        meta["agent_name"] = agent
    with Transcript.create(path, "s", "key:s", meta) as transcript:
        for role, text, minutes in turns:
            message = Message.user(text) if role == "user" else Message.assistant(text)
            transcript.append_message(message, ts=START + timedelta(minutes=minutes))
    return path.read_bytes()


WORDS = st.sampled_from(
    [
        "tea",
        "oolong",
        "garden",
        "Oslo",
        "naïve",
        "北京",
        "会议",
        "🙂",
        "👩‍👩‍👧",
        "x" * 30,
        "NO_REPLY",
    ]
)
TURN = st.tuples(
    st.sampled_from(["user", "assistant"]),
    st.lists(WORDS, min_size=1, max_size=40).map(" ".join),
    st.integers(0, 3000),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    turns=st.lists(TURN, min_size=0, max_size=14).map(
        lambda ts: sorted(ts, key=lambda t: t[2])  # entries are appended in time order
    ),
    cuts=st.lists(st.floats(0, 1), max_size=12),
    tokens=st.sampled_from([32, 48, 160]),
    overlap=st.integers(0, 2),
    agent=st.sampled_from([None, "Nora"]),
)
def test_resumed_chunking_equals_chunking_the_whole_file(
    tmp_path: Path,
    turns: list[tuple[str, str, int]],
    cuts: list[float],
    tokens: int,
    overlap: int,
    agent: str | None,
) -> None:
    data = transcript_bytes(tmp_path, turns, agent, "person:alice")
    chunking = ChunkingSettings(transcript_tokens=tokens, transcript_overlap_turns=overlap)
    index = Index(chunking)
    # Appended in pieces cut anywhere: mid-line, mid-character, the header itself.
    ends = sorted({int(c * len(data)) for c in cuts} | {len(data)})
    for end in ends:
        index.sync(data[:end])
        assert index.chunks == reference(data[:end], chunking), end
    # Once the header line is whole, every later sync resumes instead of starting over.
    header_done = next((i for i, e in enumerate(ends) if b"\n" in data[:e]), len(ends))
    assert index.whole <= header_done + 1


def long_transcript(tmp: Path, n: int = 40) -> bytes:
    turns = [
        ("user" if i % 2 else "assistant", f"Message {i} about tea and Oslo.", i) for i in range(n)
    ]
    return transcript_bytes(tmp, turns, "Nora", "person:alice")


def synced(data: bytes) -> Index:
    index = Index(ChunkingSettings(transcript_tokens=48))
    index.sync(data)
    assert ResumePoint.decode(index.hash) is not None
    return index


def test_a_truncated_transcript_is_chunked_whole(tmp_path: Path) -> None:
    data = long_transcript(tmp_path)
    index = synced(data)
    shorter = data[: data.rindex(b"\n", 0, len(data) - 1) + 1]  # the last line gone
    index.sync(shorter)
    assert (index.whole, index.resumed) == (2, 0)
    assert index.chunks == reference(shorter, index.chunking)


def test_a_rewritten_tail_of_what_was_chunked_is_chunked_whole(tmp_path: Path) -> None:
    data = long_transcript(tmp_path)
    cut = data.rindex(b"\n", 0, len(data) - 1) + 1
    index = synced(data[:cut])
    point = ResumePoint.decode(index.hash)
    assert point is not None and point.offset > WINDOW_BYTES
    # One byte of what was chunked changed, just before the resume point; then an append.
    at = point.offset - 10
    edited = data[:at] + (b"X" if data[at : at + 1] != b"X" else b"Y") + data[at + 1 :]
    index.sync(edited)
    assert (index.whole, index.resumed) == (2, 0)
    assert index.chunks == reference(edited, index.chunking)


def test_another_header_is_chunked_whole(tmp_path: Path) -> None:
    data = long_transcript(tmp_path)
    index = synced(data)
    renamed = data.replace(b'"agent_name": "Nora"', b'"agent_name": "Vera"', 1)
    renamed = renamed.replace(b'"agent_name":"Nora"', b'"agent_name":"Vera"', 1)
    assert renamed != data
    index.sync(renamed)
    assert index.whole == 2
    assert index.chunks == reference(renamed, index.chunking)
    assert any("Vera" in c.text for c in index.chunks)


def test_an_unchanged_transcript_is_not_chunked_again(tmp_path: Path) -> None:
    data = long_transcript(tmp_path)
    index = synced(data)
    before = index.chunks
    index.sync(data)
    assert (index.whole, index.resumed) == (1, 0)
    assert index.chunks is before


def test_a_resumed_sync_reads_only_the_window_and_what_is_new(tmp_path: Path) -> None:
    data = long_transcript(tmp_path, n=400)
    index = synced(data[: len(data) // 2 + 1])
    reads: list[tuple[int, int]] = []

    class Counting(Bytes):
        def read(self, source: SourceFile, limit: int) -> bytes:
            reads.append((0, len(self.data[:limit])))
            return super().read(source, limit)

        def read_range(self, source: SourceFile, start: int, limit: int) -> bytes:
            reads.append((start, len(self.data[start : start + limit])))
            return super().read_range(source, start, limit)

    point = ResumePoint.decode(index.hash)
    assert point is not None
    update = resume_transcript(
        cast(IndexSources, Counting(data)), SOURCE, point, "person:alice",
        index.chunking, default_scope_resolver,
    )  # fmt: skip
    assert isinstance(update, TranscriptUpdate)
    header, tail = reads
    assert header == (0, point.header_len + 1)
    assert tail[0] == point.window_start and tail[1] == len(data) - point.window_start
