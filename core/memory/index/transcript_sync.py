"""Syncing one transcript: only what was appended since the previous sync.

A transcript's file row holds a ``ResumePoint`` (``core.memory.chunking.resume``) as its
hash. When the file changed, the header line and the bytes from the point's window on
are read (not the whole file); if what was chunked before still holds, chunking resumes
at the open chunk and the store replaces the file's chunks from that line on, point
included, in one transaction. Otherwise (no point yet, an older index, a rewritten or
shortened file, another header or scope) the whole file is chunked, as Markdown files
and task logs always are (they are small). Either way the chunks are those of chunking
the whole file, which the tests check on random append sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parley.core.memory.chunking import Chunk, chunk_turns, header_agent_name, transcript_turns
from parley.core.memory.chunking.resume import ResumePoint, TranscriptChunks, chunk_transcript
from parley.core.memory.index.discovery import IndexSources
from parley.core.memory.memory_config import ChunkingSettings
from parley.core.memory.query import cjk_index_text
from parley.core.memory.rows import NewChunk
from parley.core.memory.sources import ScopeResolver, SourceFile, read_header

# Bounds a file the index will read: bigger memory files are indexed up to this size.
MAX_FILE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TranscriptUpdate:
    """What a transcript sync writes: ``chunks`` from ``from_line`` on (None: all of the
    file's chunks), its scope, and its new hash (the resume point, or a content hash)."""

    chunks: list[NewChunk]
    scope: str
    digest: str
    from_line: int | None


def new_chunks(raw: Sequence[Chunk | NewChunk]) -> list[NewChunk]:
    return [
        NewChunk(
            c.start_line, c.end_line, c.text, c.hash, c.ts, c.entry_ids, cjk_index_text(c.text)
        )
        for c in raw
    ]


def first_line(data: bytes) -> bytes:
    end = data.find(b"\n")
    return data if end < 0 else data[:end]


def chunk_whole_transcript(
    data: bytes, chunking: ChunkingSettings, scope_for: ScopeResolver
) -> tuple[TranscriptChunks, str]:
    """The chunks of a whole transcript, its scope, and where the next sync resumes."""
    head = first_line(data)
    # The header is parsed once, here: its agent name labels the turns after it.
    header = read_header(head.decode("utf-8", errors="replace").encode())
    scope = scope_for(header or {})
    if header is None:
        # Not one of ours (no header line): read from line 1, and never resume.
        lines = data.decode("utf-8", errors="replace").split("\n")
        turns = transcript_turns(enumerate(lines, start=1))
        raw = chunk_turns(
            turns,
            max_tokens=chunking.transcript_tokens,
            overlap_turns=chunking.transcript_overlap_turns,
        )
        return TranscriptChunks(raw, 1, None), scope
    result = chunk_transcript(
        data,
        header=head,
        agent_name=header_agent_name(header),
        max_tokens=chunking.transcript_tokens,
        overlap_turns=chunking.transcript_overlap_turns,
    )
    return result, scope


def resume_transcript(
    sources: IndexSources,
    source: SourceFile,
    point: ResumePoint,
    scope: str,
    chunking: ChunkingSettings,
    scope_for: ScopeResolver,
) -> TranscriptUpdate | bool | None:
    """Chunk what was appended since ``point`` (blocking: a worker thread). The update;
    True when nothing changed; None when the whole file must be chunked instead."""
    head = sources.read(source, point.header_len + 1)
    start = point.window_start
    data = sources.read_range(source, start, MAX_FILE_BYTES - start)
    if not point.still_holds(head, data):
        return None
    if point.unchanged(data):
        return True
    header = read_header(head[:-1].decode("utf-8", errors="replace").encode())
    if header is None or scope_for(header) != scope:
        return None  # another header, or a scope resolved otherwise now: start over
    result = chunk_transcript(
        data,
        base=start,
        header=head[:-1],
        agent_name=header_agent_name(header),
        point=point,
        max_tokens=chunking.transcript_tokens,
        overlap_turns=chunking.transcript_overlap_turns,
    )
    if result.point is None:
        return None
    return TranscriptUpdate(
        new_chunks(result.chunks), scope, result.point.encode(), result.from_line
    )
