"""A sparse index of a transcript file's entry lines: where every ``stride``-th starts.

Paging (``numbered_entries(offset, limit)``) would otherwise find entry line ``offset``
by reading every line before it, so a late page of a long transcript cost a scan of
the whole file. With the index, a page starts at the nearest mark at or before its
first line and reads fewer than ``stride`` lines it does not return.

The index only ever covers complete lines from the first entry line on, contiguously:
``lines`` entry lines are known, the next one starts at byte ``end``. It grows two
ways: ``scan`` finds newlines from ``end`` on (lazily, the first time a page lies past
what is known), and ``note`` takes in a line its owner just appended at ``end``. A
torn tail is repaired (or ignored) before a ``Transcript`` exists, and a failed append
leaves nothing it could have indexed, so the index never holds a position a reopen
would number differently.

Not locked: its owner holds its own lock around every method; the module's ``scan``
only reads (outside the lock, so appends go on) and returns what ``extend`` then
takes in under it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

STRIDE = 128  # entry lines per mark: a page reads at most this many lines it skips

Reader = Callable[[int, int], bytes]  # (offset, size) -> exactly that many bytes


@dataclass(frozen=True, slots=True)
class Extension:
    """What a ``scan`` found beyond the index: the marks to add, then the new frontier.
    ``start_lines``/``start_end`` say where it began, so a stale one is refused."""

    start_lines: int
    start_end: int
    marks: tuple[int, ...]
    lines: int
    end: int


class LineIndex:
    """Byte offsets of entry lines 0, stride, 2·stride, … up to the frontier."""

    def __init__(self, first_line_at: int, stride: int = STRIDE) -> None:
        if stride < 1:
            raise ValueError("stride must be positive")
        self.stride = stride
        self._marks: list[int] = []  # _marks[k]: the byte offset of entry line k·stride
        self.lines = 0  # entry lines indexed
        self.end = first_line_at  # where entry line ``lines`` starts

    @property
    def frontier(self) -> tuple[int, int]:
        """(entry lines known, where the next one starts), for ``scan``."""
        return self.lines, self.end

    def seek(self, line: int) -> tuple[int, int]:
        """The known (line number, byte offset) nearest at or before ``line``."""
        if line >= self.lines:
            return self.lines, self.end
        k = line // self.stride
        return k * self.stride, self._marks[k]

    def note(self, start: int, length: int) -> None:
        """Take in a line of ``length`` bytes (newline included) written at ``start``;
        ignored unless it starts at the frontier (the index does not reach it yet)."""
        if start != self.end:
            return
        if self.lines % self.stride == 0:
            self._marks.append(start)
        self.lines += 1
        self.end = start + length

    def extend(self, found: Extension) -> None:
        """Apply a ``scan``, unless the index moved since it began (another reader's
        scan, or an append at the frontier, got there first: the index is then at
        least as far along, or the next scan finds the rest)."""
        if (found.start_lines, found.start_end) != (self.lines, self.end):
            return
        self._marks.extend(found.marks)
        self.lines, self.end = found.lines, found.end


def scan(
    read: Reader,
    frontier: tuple[int, int],
    stride: int,
    size: int,
    until_line: int | None,
    block: int,
) -> Extension:
    """Find the lines from ``frontier`` (an index's ``lines`` and ``end``, taken under its
    owner's lock) until ``until_line`` is known (None: no limit) or ``size`` (a line
    boundary) is reached. Reads only, so it may run outside the lock; ``extend``
    applies the result."""
    marks: list[int] = []
    lines, pos = frontier
    if until_line is None:
        until_line = size  # a line holds a byte at least: never fewer bytes than lines
    while pos < size and lines < until_line:
        buf = read(pos, min(block, size - pos))
        at = 0
        while lines < until_line:
            nl = buf.find(b"\n", at)
            if nl < 0:
                break
            if lines % stride == 0:
                marks.append(pos + at)
            lines += 1
            at = nl + 1
        if at == 0:
            if pos + len(buf) >= size:
                break  # no newline before ``size``: not a line boundary after all
            block *= 2  # one line longer than the block: read more of it at once
            continue
        pos += at
    return Extension(frontier[0], frontier[1], tuple(marks), lines, pos)
