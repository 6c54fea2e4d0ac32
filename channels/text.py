"""Text helpers for adapters: platform lengths, splitting long replies, Markdown rendering.

Pure functions, no I/O. The renderers live in ``channels.markdown_html`` and are re-exported
here so adapters import everything about reply text from one module.

``split_message`` works on the Markdown source; adapters render each part afterwards. That
order is safe because rendering never makes the visible text longer than its source.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from parley.channels.markdown_html import (
    Fence,
    find_fences,
    markdown_to_telegram_html,
    strip_markdown,
)

__all__ = [
    "MIN_SPLIT_LIMIT",
    "markdown_to_telegram_html",
    "split_message",
    "strip_markdown",
    "utf16_len",
]

# Below this a reopened and a closed fence would leave no room for the code they wrap.
MIN_SPLIT_LIMIT = 16


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, as Telegram counts: astral characters (emoji) count 2."""
    # surrogatepass: a lone surrogate, which a Python str may hold, still counts one unit.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# Where to cut, best first. Each pattern finds the *last* qualifying whitespace character in a
# window: the greedy ".*" runs to the end and backtracks inside the regex engine, so choosing a
# cut costs one C-level scan of the window rather than a Python loop over its words.
_PARAGRAPH = re.compile(r".*\n[^\S\n]*(\n)", re.DOTALL)
_LINE = re.compile(r".*(\n)", re.DOTALL)
_SENTENCE = re.compile(r".*[.!?…。！？][\"'”’)\]]*(\s)", re.DOTALL)
_SPACE = re.compile(r".*(\s)", re.DOTALL)
_BREAKS = (_PARAGRAPH, _LINE, _SENTENCE, _SPACE)
_WHITESPACE = re.compile(r"\s*")
_FENCE_RUN = re.compile(r" {0,3}(`{3,}|~{3,})")
_ZWJ = "\u200d"


def split_message(text: str, limit: int, *, measure: Callable[[str], int] = len) -> list[str]:
    """Split a Markdown reply into parts with ``measure(part) <= limit``.

    Cuts at the last paragraph break that fits, else the last line break, else after a
    sentence, else at any whitespace, else (one over-long word) between grapheme clusters.
    A fenced code block is never cut when it fits in one part; a longer one is cut between
    lines, each part closing the fence and the next reopening it with the same opener line.

    Every part is ``[reopened fence line + "\\n"] + slice + ["\\n" + closing fence]``, where
    the slices are in order and only whitespace of ``text`` lies between them, or a block's
    own closing line when an added closing fence stands in for it (it did not fit after the
    block's trailing blank lines). Text that fits comes back as ``[text.rstrip()]``;
    whitespace-only text as ``[]``.

    ``measure`` must be additive over concatenation, as ``len`` and ``utf16_len`` are.
    """
    if limit < MIN_SPLIT_LIMIT:
        raise ValueError(f"limit must be at least {MIN_SPLIT_LIMIT}, got {limit}")
    text = text.rstrip()
    if not text:
        return []
    if measure(text) <= limit:
        return [text]
    return _Splitter(text, limit, measure).split()


@dataclass(frozen=True, slots=True)
class _Block:
    """A fenced code block as the splitter sees it."""

    fence: Fence
    atomic: bool  # fits in one part: never cut inside
    reopen: str  # prepended to a part that starts inside the block
    close: str  # appended to a part that ends inside it
    content_end: int  # end of the last non-blank content line: no cut may leave only the closer


@dataclass(frozen=True, slots=True)
class _Segment:
    lo: int  # where the whitespace of a cut may start
    hi: int  # ... and where it must have started before
    bound: int  # the furthest a hard cut may go
    block: _Block | None  # the block being cut, whose fences the part must close
    # The rest of the block's code fits with an added closing fence, but not with its own
    # closing line (blank lines or a long fence run before it): the added fence replaces it.
    finishes: bool = False


class _Splitter:
    def __init__(self, text: str, limit: int, measure: Callable[[str], int]) -> None:
        self.text, self.limit, self.measure = text, limit, measure
        self.blocks = [b for f in find_fences(text) if (b := self._block(f)) is not None]

    def _block(self, fence: Fence) -> _Block | None:
        text, measure = self.text, self.measure
        close = "\n" + fence.marker
        # A fence whose decoration would eat over half a part is not worth protecting: it is
        # split like prose (a 300-character info string, a 40-backtick run with a tiny limit).
        # So is a block of nothing but whitespace that is too long for one part.
        if measure(text[fence.start : fence.content_start]) + measure(close) > self.limit // 2:
            return None
        end = fence.close_start
        while end > fence.content_start and text[end - 1].isspace():
            end -= 1
        atomic = measure(text[fence.start : fence.end]) <= self.limit
        if not atomic and end == fence.content_start:
            return None  # only whitespace inside: no cut could leave code in both parts
        return _Block(fence, atomic, fence.opener + "\n", close, end)

    def split(self) -> list[str]:
        text, measure = self.text, self.measure
        parts: list[str] = []
        first = 0  # index of the first block that may still matter
        p = self._resume(0)
        while p < len(text):
            while first < len(self.blocks) and self.blocks[first].fence.end <= p:
                first += 1
            inside = self._inside(first, p)
            prefix = inside.reopen if inside else ""
            budget = self.limit - measure(prefix)
            reach = self._reach(p, budget)
            if reach == len(text):
                parts.append(prefix + text[p:])
                break
            end, resume, block = self._cut(p, reach, budget, first)
            parts.append(prefix + text[p:end] + (block.close if block else ""))
            p = resume
        return parts

    def _inside(self, first: int, p: int) -> _Block | None:
        if first < len(self.blocks):
            block = self.blocks[first]
            fence = block.fence
            if not block.atomic and fence.content_start <= p < fence.close_start:
                return block
        return None

    def _reach(self, p: int, budget: int) -> int:
        """The furthest end with ``measure(text[p:end]) <= budget``: gallop, then bisect, so
        each probe is a C-level measure of at most a few windows."""
        text, measure, n = self.text, self.measure, len(self.text)
        lo, hi = p, p + max(budget, 1)
        while True:
            if hi >= n:
                if measure(text[p:]) <= budget:
                    return n
                hi = n
                break
            if measure(text[p:hi]) > budget:
                break
            lo, hi = hi, p + 2 * (hi - p)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if measure(text[p:mid]) <= budget:
                lo = mid
            else:
                hi = mid
        return lo

    def _segments(self, p: int, reach: int, budget: int, first: int) -> list[_Segment]:
        """The stretches after ``p`` where a cut may fall: around atomic blocks, and inside a
        block that must be cut (where its closing fence counts against the budget)."""
        n = len(self.text)
        segments: list[_Segment] = []
        lo = p
        for k in range(first, len(self.blocks)):
            block = self.blocks[k]
            fence = block.fence
            if fence.start >= reach:
                break
            if fence.start >= p:
                segments.append(_Segment(lo, fence.start, fence.start, None))
            if not block.atomic:
                bound = self._reach(p, budget - self.measure(block.close))
                finishes = block.content_end <= bound and fence.end > reach
                # The whitespace a cut drops may sit just past the bound; but a cut must
                # leave some content for the part that reopens the block.
                hi = min(block.content_end, bound + 1)
                bound = min(block.content_end - 1, bound)
                lo = max(p, fence.content_start)
                segments.append(_Segment(lo, hi, bound, block, finishes))
            lo = fence.end
        segments.append(_Segment(lo, min(reach + 1, n), reach, None))
        return [s for s in segments if s.hi > s.lo]

    def _cut(self, p: int, reach: int, budget: int, first: int) -> tuple[int, int, _Block | None]:
        """Where the part starting at ``p`` ends, where the next one starts, and the block
        the cut falls inside, if any."""
        text = self.text
        segments = self._segments(p, reach, budget, first)
        for segment in segments:
            if segment.finishes and segment.block:
                fence = segment.block.fence
                return segment.block.content_end, self._resume(fence.end), segment.block
        for pattern in _BREAKS:
            for segment in reversed(segments):
                m = pattern.match(text, segment.lo, segment.hi)
                if m is None:
                    continue
                end = m.start(1)
                while end > p and text[end - 1].isspace():
                    end -= 1
                # Only the last match of a segment can qualify: an earlier one would start
                # even closer to p (or even further into the opener line).
                block = segment.block
                if end <= p or (block is not None and end <= block.fence.content_start):
                    continue
                if self._fence_run_before(p, end) is None:
                    return end, self._resume(end), block
        for segment in reversed(segments):
            if segment.bound > max(segment.lo, p):
                end = self._hard_cut(max(segment.lo, p), segment.bound)
                return end, self._resume(end), segment.block
        # Unreachable with limit >= MIN_SPLIT_LIMIT, kept so the loop always advances.
        end = self._hard_cut(p, max(reach, p + 1))
        return end, self._resume(end), None

    def _hard_cut(self, lo: int, hi: int) -> int:
        """The last grapheme-cluster boundary in ``(lo, hi]``; failing that (one cluster
        longer than a part), at least a cut that does not start with a combining mark."""
        end = self._boundary(lo, hi)
        run = self._fence_run_before(lo, end)
        if run is not None and run + 2 > lo:
            return run + 2  # "``" is no fence
        return end

    def _fence_run_before(self, p: int, end: int) -> int | None:
        """Where a bare ``` or ~~~ run starts, if a cut at ``end`` would make one the last
        line of the part starting at ``p`` (a line "```python" cut after its backticks):
        the part would then close or open a code block that the text does not have."""
        text = self.text
        line = max(p, text.rfind("\n", 0, end) + 1)
        run = _FENCE_RUN.fullmatch(text, line, end)
        if run is None:
            return None
        newline = text.find("\n", end)
        rest = text[end : newline if newline >= 0 else len(text)]
        return run.start(1) if rest.strip() else None

    def _boundary(self, lo: int, hi: int) -> int:
        for ok in (_is_cluster_boundary, _not_combining):
            end = hi
            while end > lo + 1 and not ok(self.text, end):
                end -= 1
            if ok(self.text, end):
                return end
        return hi

    def _resume(self, i: int) -> int:
        """Where the next part starts after a cut at ``i``: past the whitespace, but keeping a
        line's indentation (code, nested lists) unless it is absurdly long."""
        text = self.text
        m = _WHITESPACE.match(text, i)
        j = m.end() if m else i
        if i < j < len(text) and not _is_cluster_boundary(text, j):
            return j - 1  # a mark on a space belongs to it: a part must not start mid-cluster
        newline = text.rfind("\n", i, j)
        if newline >= 0 and self.measure(text[newline + 1 : j]) <= self.limit // 4:
            return newline + 1
        return j


def _not_combining(text: str, i: int) -> bool:
    return unicodedata.category(text[i])[0] != "M"


def _is_regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _is_cluster_boundary(text: str, i: int) -> bool:
    """Whether ``text[i]`` starts a grapheme cluster: the cheap rules that matter for chat
    (combining marks, ZWJ emoji sequences, skin tones, flags, tag sequences, CRLF)."""
    ch, prev = text[i], text[i - 1]
    if ch == _ZWJ or prev == _ZWJ or not _not_combining(text, i):
        return False
    if "\U0001f3fb" <= ch <= "\U0001f3ff" or "\U000e0020" <= ch <= "\U000e007f":
        return False
    if "\udc00" <= ch <= "\udfff" and "\ud800" <= prev <= "\udbff":
        return False  # a surrogate pair stored as two code points
    if prev == "\r" and ch == "\n":
        return False
    if _is_regional(ch) and _is_regional(prev):
        run = i - 1
        while run > 0 and _is_regional(text[run - 1]):
            run -= 1
        return (i - run) % 2 == 0  # flags are pairs of regional indicators
    return True
