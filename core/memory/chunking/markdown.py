"""Chunking Markdown memory files: line-based, aware of headings and code fences.

``chunk_markdown`` follows OpenClaw's ``chunkMarkdown``: a chunk is flushed when the
next line would overflow it, and the trailing lines of a flushed chunk (at least
``overlap_tokens``) start the next one. On top of that it reads the Markdown:

* A chunk's text is always the file's lines ``start_line..end_line`` joined by ``"\\n"``
  (lines are ``text.split("\\n")``; read files with universal newlines), so a citation
  ``path#Lx-Ly`` is exact. Nothing is injected (no heading trail), for the same reason.
* A heading starts a new chunk once the current one is at least half full, and a chunk
  flushed for size does not end on a heading; such a break carries no overlap, because
  the new section is a fresh context.
* A fenced code block stays in one chunk unless it alone exceeds the limit (then it is
  split line-wise like ordinary text).
* A line longer than the limit is cut into pieces of at most ``max_tokens``
  (``split_text``); each piece is its own chunk on that line number.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from parley.core.memory.chunking.text import (
    Chunk,
    check_limits,
    count_tokens,
    fits,
    sha256_hex,
    split_lines,
    split_text,
)

DEFAULT_CHUNK_TOKENS = 400  # OpenClaw's chunkTokens
DEFAULT_CHUNK_OVERLAP_TOKENS = 80  # OpenClaw's chunkOverlap
HEADING_BREAK_RATIO = 0.5  # a heading starts a new chunk once the current one is this full

_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")
_FENCE = re.compile(r" {0,3}(`{3,}+|~{3,}+)")


@dataclass(frozen=True, slots=True)
class _Unit:
    """Lines packed as one: a single line, or a whole fenced code block; or one piece of
    an over-long line (``piece`` set), which always becomes a chunk of its own."""

    start: int  # 0-based index of the first line
    end: int  # exclusive
    tokens: int
    heading: bool = False
    blank: bool = False
    piece: str | None = None


def _line_units(lines: Sequence[str], start: int, end: int, max_tokens: int) -> list[_Unit]:
    units: list[_Unit] = []
    for i in range(start, end):
        line = lines[i]
        tokens = count_tokens(line)
        if tokens <= max_tokens:
            heading = _HEADING.match(line) is not None
            units.append(_Unit(i, i + 1, tokens, heading=heading, blank=not line.strip()))
            continue
        for piece in split_text(line, max_tokens):
            if piece.strip():
                units.append(_Unit(i, i + 1, count_tokens(piece), piece=piece))
    return units


def _fence_end(lines: Sequence[str], start: int, marker: str) -> int:
    """Exclusive end of the fenced block opened at ``start``: the closing fence uses the
    same character, at least as long. Unclosed, it runs to the file's end (CommonMark),
    less trailing blank lines, which no chunk starts or ends with."""
    for i in range(start + 1, len(lines)):
        close = _FENCE.match(lines[i])
        if (
            close is not None
            and close.group(1)[0] == marker[0]
            and len(close.group(1)) >= len(marker)
            and not lines[i][close.end() :].strip()
        ):
            return i + 1
    end = len(lines)
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return end


def _markdown_units(lines: Sequence[str], max_tokens: int) -> list[_Unit]:
    units: list[_Unit] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None or (fence.group(1)[0] == "`" and "`" in lines[i][fence.end() :]):
            units.extend(_line_units(lines, i, i + 1, max_tokens))  # not a fence opener
            i += 1
            continue
        end = _fence_end(lines, i, fence.group(1))
        tokens = count_tokens("\n".join(lines[i:end]))
        if tokens <= max_tokens:
            units.append(_Unit(i, end, tokens))
        else:
            units.extend(_line_units(lines, i, end, max_tokens))
        i = end
    return units


def _estimate(units: Sequence[_Unit]) -> int:
    # One token per joining newline; the exact count is checked before a chunk is emitted.
    return sum(u.tokens for u in units) + max(0, len(units) - 1)


def _trim(units: Sequence[_Unit]) -> list[_Unit]:
    lo, hi = 0, len(units)
    while lo < hi and units[lo].blank:
        lo += 1
    while hi > lo and units[hi - 1].blank:
        hi -= 1
    return list(units[lo:hi])


def _overlap_tail(units: Sequence[_Unit], overlap_tokens: int) -> list[_Unit]:
    """Trailing units worth at least ``overlap_tokens``, never the whole chunk."""
    tail: list[_Unit] = []
    total = 0
    for unit in reversed(units[1:]):
        if total >= overlap_tokens:
            break
        tail.insert(0, unit)
        total += unit.tokens
    return _trim(tail)


class _MarkdownPacker:
    def __init__(self, lines: Sequence[str], max_tokens: int, overlap_tokens: int) -> None:
        self.lines = lines
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self.chunks: list[Chunk] = []
        self.queue: deque[_Unit] = deque()
        self.current: list[_Unit] = []
        self.carried = 0  # leading units of `current` repeated from the previous chunk

    def _text(self, units: Sequence[_Unit]) -> str:
        return "\n".join(self.lines[units[0].start : units[-1].end])

    def _fresh(self) -> bool:
        return len(self.current) > self.carried and bool(_trim(self.current[self.carried :]))

    def pack(self, units: Iterable[_Unit]) -> list[Chunk]:
        self.queue.extend(units)
        while self.queue:
            unit = self.queue.popleft()
            if unit.piece is not None:
                self._emit(overlap=False)
                self.chunks.append(_chunk(unit.start + 1, unit.end, unit.piece))
                continue
            if not self._fresh():
                self._make_room(unit)
                if unit.blank and not self.current:
                    continue  # blank lines never open a chunk
            else:
                if _estimate([*self.current, unit]) > self.max_tokens:
                    self.queue.appendleft(unit)
                    self._emit(overlap=not self._hand_back_heading())
                    continue
                half_full = _estimate(self.current) >= self.max_tokens * HEADING_BREAK_RATIO
                if unit.heading and half_full:
                    self.queue.appendleft(unit)
                    self._emit(overlap=False)
                    continue
            self.current.append(unit)
        self._emit(overlap=False)
        return self.chunks

    def _make_room(self, unit: _Unit) -> None:
        """Before a chunk's first new unit: the overlap (and blank lines after it) yields to
        new content, and a heading gets none, since a new section is a fresh context."""
        if unit.heading:
            self.current, self.carried = [], 0
        while self.current and _estimate([*self.current, unit]) > self.max_tokens:
            self.current.pop(0)
            self.carried = max(0, self.carried - 1)

    def _hand_back_heading(self) -> bool:
        """A chunk flushed for size should not end on a heading: return the heading (and
        the blank lines after it) to the queue so it opens the next chunk."""
        body = _trim(self.current[self.carried :])
        if len(body) < 2 or not body[-1].heading:
            return False
        while self.current[-1] is not body[-1]:
            self.queue.appendleft(self.current.pop())
        self.queue.appendleft(self.current.pop())
        return True

    def _emit(self, *, overlap: bool) -> None:
        units = self.current
        # The estimate can miss by a token where BPE merges across a newline: shed the
        # overlap first, then hand trailing units back, until the exact count fits.
        while len(units) > 1 and not fits(self._text(_trim(units) or units), self.max_tokens):
            if self.carried:
                units.pop(0)
                self.carried -= 1
            else:
                self.queue.appendleft(units.pop())
        body = _trim(units)
        fresh = _trim(units[self.carried :])
        self.current, self.carried = [], 0
        if not fresh:
            return
        self.chunks.append(_chunk(body[0].start + 1, body[-1].end, self._text(body)))
        if overlap and self.overlap_tokens > 0:
            self.current = _overlap_tail(body, self.overlap_tokens)
            self.carried = len(self.current)


def _chunk(start_line: int, end_line: int, text: str) -> Chunk:
    return Chunk(start_line, end_line, text, sha256_hex(text))


def chunk_markdown(
    text: str,
    *,
    max_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap_tokens: int = DEFAULT_CHUNK_OVERLAP_TOKENS,
) -> list[Chunk]:
    """Chunks of a Markdown file (see the module docstring); [] for a blank file."""
    check_limits(max_tokens, overlap_tokens)
    if overlap_tokens >= max_tokens:
        raise ValueError("overlap_tokens must be smaller than max_tokens")
    if not text.strip():
        return []
    lines = split_lines(text)
    packer = _MarkdownPacker(lines, max_tokens, overlap_tokens)
    return packer.pack(_markdown_units(lines, max_tokens))
