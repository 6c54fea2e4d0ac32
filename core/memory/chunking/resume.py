"""Chunking a transcript from where the previous sync stopped.

Transcripts are append-only JSONL, so a sync after a turn need not re-chunk the whole
file: the chunks that closed before the last, still-open chunk never change (``pack_turns``
emits a chunk once and never touches it again). A ``ResumePoint`` remembers where that
open chunk starts (its byte offset and line number), how many of the turns from there it
holds, and what the reader had learnt by then (the agent name a header line gave). The
next sync re-reads from that offset only, and replaces the file's chunks from that line
on (``store.replace_tail``): the result is exactly what chunking the whole file gives.

What was chunked is trusted not to have changed, checked in O(1): the first line (the
header) and a window of bytes just before the resume offset must hash as before, and the
file must not have shrunk. Anything else (a rewritten, truncated or erased file, another
header) falls back to chunking the whole file.

The point is stored as the file row's ``hash`` (``encode``): it is the fingerprint of what
is indexed, it is written in the same transaction as the chunks (so a kill leaves the
file's rows and its point in agreement), and every store and ``parley migrate`` already
keep that column. A row whose hash is not a point (an older index, a Markdown file) is
simply chunked whole.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from parley.core.memory.chunking.text import Chunk
from parley.core.memory.chunking.transcripts import (
    DEFAULT_TURN_CHUNK_TOKENS,
    DEFAULT_TURN_OVERLAP,
    Turn,
    TurnReader,
    pack_turns,
)

RESUME_PREFIX = "resume1:"
# Bytes before the resume offset that must hash as before: an edit of what was chunked
# that leaves the size alone would most likely touch the end of the file.
WINDOW_BYTES = 1024


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class ResumePoint:
    offset: int  # byte offset of the first line to re-read (a line start, after the header)
    line: int  # its 1-based line number
    current: int  # turns from there on that the open chunk already holds
    carried: int  # of those, how many repeat the previous chunk (the overlap)
    header_name: str | None  # the agent name a header line had given by then
    header_len: int  # bytes of the first line (without its newline)
    header_hash: str
    window_hash: str  # sha256 of the WINDOW_BYTES (fewer near the start) before offset
    size: int  # bytes chunked
    tail_hash: str  # sha256 of the bytes from offset to size

    @property
    def window_start(self) -> int:
        """Where the bytes to read for resuming begin (the window, then the rest)."""
        return max(0, self.offset - WINDOW_BYTES)

    def encode(self) -> str:
        return RESUME_PREFIX + json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, raw: str) -> ResumePoint | None:
        """The point a file row's hash holds, or None (a content hash: chunk it whole)."""
        if not raw.startswith(RESUME_PREFIX):
            return None
        try:
            point = cls(**json.loads(raw[len(RESUME_PREFIX) :]))
        except (ValueError, TypeError):
            return None
        if not 0 < point.offset <= point.size or point.line < 2:
            return None
        return point

    def still_holds(self, header: bytes, data: bytes) -> bool:
        """Is what was chunked unchanged? ``header``: the file's first ``header_len + 1``
        bytes now; ``data``: its bytes from ``window_start`` on. O(window), not O(file)."""
        if len(header) != self.header_len + 1 or header[-1:] != b"\n":
            return False
        if _sha(header[:-1]) != self.header_hash:
            return False
        before = self.offset - self.window_start
        if self.window_start + len(data) < self.size:
            return False  # shrunk (truncated, or rewritten shorter)
        return _sha(data[:before]) == self.window_hash

    def unchanged(self, data: bytes) -> bool:
        """Nothing appended either (``data`` as for ``still_holds``, which held)."""
        tail = data[self.offset - self.window_start :]
        return self.window_start + len(data) == self.size and _sha(tail) == self.tail_hash


@dataclass(frozen=True, slots=True)
class TranscriptChunks:
    """Chunks from ``from_line`` on (they replace the file's chunks starting there; the
    chunks before it stay), and the point the next sync resumes from (None: the file
    cannot be resumed, e.g. it has no header line yet; chunk it whole next time)."""

    chunks: list[Chunk]
    from_line: int
    point: ResumePoint | None


def chunk_transcript(
    data: bytes,
    *,
    base: int = 0,
    header: bytes,
    agent_name: str | None,
    point: ResumePoint | None = None,
    max_tokens: int = DEFAULT_TURN_CHUNK_TOKENS,
    overlap_turns: int = DEFAULT_TURN_OVERLAP,
) -> TranscriptChunks:
    """Chunk a transcript whose first line is the header ``header`` (its bytes, without
    the newline) from ``point`` on, or from just after the header when ``point`` is None.
    ``data`` holds the file's bytes from offset ``base`` to its end (from
    ``point.window_start``, or the whole file)."""
    if point is None:
        start, line, resume, header_name = len(header) + 1, 2, (0, 0), None
    else:
        start, line = point.offset, point.line
        resume, header_name = (point.current, point.carried), point.header_name
    reader = TurnReader(agent_name=agent_name, header_name=header_name)
    turns: list[Turn] = []
    # Where each turn's line starts and what the reader knew before it: a turn can become
    # the first of the open chunk, where the next sync resumes.
    marks: list[tuple[int, int, str | None]] = []
    pos = start
    raw_lines = data[start - base :].split(b"\n") if start <= base + len(data) else [b""]
    last = (pos, line, reader.header_name)
    for i, raw in enumerate(raw_lines):
        last = (pos, line + i, reader.header_name)
        turn = reader.read(line + i, raw.decode("utf-8", errors="replace"))
        if turn is not None:
            turns.append(turn)
            marks.append(last)
        pos += len(raw) + 1
    packed = pack_turns(turns, max_tokens=max_tokens, overlap_turns=overlap_turns, resume=resume)
    # No open chunk's turns: resume at the last line, which may be half written.
    offset, at_line, name = marks[packed.current] if packed.current < len(turns) else last
    if start > base + len(data):
        return TranscriptChunks(packed.chunks, line, None)  # no line after the header yet
    size = base + len(data)
    window_start = max(0, offset - WINDOW_BYTES)
    resumed = ResumePoint(
        offset=offset,
        line=at_line,
        current=len(turns) - packed.current,
        carried=packed.carried,
        header_name=name,
        header_len=len(header),
        header_hash=_sha(header),
        window_hash=_sha(data[window_start - base : offset - base]),
        size=size,
        tail_hash=_sha(data[offset - base :]),
    )
    return TranscriptChunks(packed.chunks, line, resumed)
