"""Chunking for long-term memory: Markdown memory files and session transcripts.

Markdown (``chunk_markdown``) follows OpenClaw's ``chunkMarkdown``: line-based, a chunk is
flushed when the next line would overflow it, and the trailing lines of a flushed chunk
(at least ``overlap_tokens``) start the next one. On top of that it reads the Markdown:

* A chunk's text is always the file's lines ``start_line..end_line`` joined by ``"\\n"``
  (lines are ``text.split("\\n")``; read files with universal newlines), so a citation
  ``path#Lx-Ly`` is exact. Nothing is injected (no heading trail), for the same reason.
* A heading starts a new chunk once the current one is at least half full, and a chunk
  flushed for size does not end on a heading; such a break carries no overlap, because
  the new section is a fresh context.
* A fenced code block stays in one chunk unless it alone exceeds the limit (then it is
  split line-wise like ordinary text).
* A line longer than the limit is cut into pieces of at most ``max_tokens``, preferably
  after whitespace or CJK sentence punctuation and never inside a character cluster
  (combining marks, ZWJ emoji, flags); each piece is its own chunk on that line number.

Transcripts (``transcript_turns`` then ``chunk_turns``) are chunked by turn, never by
line: what a search snippet must show is who said what, and when. A chunk reads::

    [2023-05-08 13:56] Caroline: I went to a LGBTQ support group yesterday.
    Melanie: Wow, that's cool, Caroline!

One line per turn, exactly ``format_turn_line(turn)`` (after a ``[date time] `` prefix on
the first turn and on any turn whose UTC date differs from the previous one's). A turn is
never split across chunks.

Token counts are cl100k (``core.tokens``); every chunk satisfies
``count_tokens(chunk.text) <= max_tokens``, checked on the final text, not estimated.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import lru_cache
from typing import Any

from core.errors import TranscriptError
from core.memory.redact import redact_secrets
from core.messages import ImageBlock, TextBlock
from core.prompt import SILENT_REPLY, TURN_CONTEXT_PREFIX, is_recall_block, is_turn_context
from core.tokens import default_counter
from core.transcript import ENTRY_MESSAGE, Entry

__all__ = [
    "DEFAULT_CHUNK_OVERLAP_TOKENS",
    "DEFAULT_CHUNK_TOKENS",
    "DEFAULT_TURN_CHUNK_TOKENS",
    "DEFAULT_TURN_OVERLAP",
    "Chunk",
    "Turn",
    "chunk_markdown",
    "chunk_turns",
    "count_tokens",
    "format_turn_line",
    "split_lines",
    "split_text",
    "transcript_turns",
]

DEFAULT_CHUNK_TOKENS = 400  # OpenClaw's chunkTokens
DEFAULT_CHUNK_OVERLAP_TOKENS = 80  # OpenClaw's chunkOverlap
# Transcript chunks are small: a snippet should hold a few turns around the hit, not a
# whole conversation. Tuned by bench/ (the lead adjusts these from its figures).
DEFAULT_TURN_CHUNK_TOKENS = 160
DEFAULT_TURN_OVERLAP = 1  # turns repeated at the start of the next chunk
MIN_CHUNK_TOKENS = 8  # a code point is at most 4 tokens, so every cut can make progress
HEADING_BREAK_RATIO = 0.5  # a heading starts a new chunk once the current one is this full

USER_NAME = "User"
ASSISTANT_NAME = "Assistant"
IMAGE_NOTE = "[image]"
CUT_MARKER = "…"  # ends a turn cut to fit max_tokens
MAX_SPEAKER_CHARS = 64  # display names are user-controlled; keep the snippet about the words

_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")
_FENCE = re.compile(r" {0,3}(`{3,}+|~{3,}+)")
_TURN_CONTEXT_FROM = "; from: "
_TURN_CONTEXT_SUFFIX = "</turn-context>"
# Where a long CJK line may be cut with the least damage: after sentence punctuation.
_CJK_BREAKS = frozenset("。！？；，、…」』）】\u3000")


def count_tokens(text: str) -> int:
    """cl100k tokens of ``text`` (the shared counter, so repeated texts are cached)."""
    return default_counter().text(text)


def split_lines(text: str) -> list[str]:
    """The lines that ``Chunk.start_line``/``end_line`` of a Markdown chunk number (1-based)."""
    return text.split("\n")


@dataclass(frozen=True, slots=True)
class Chunk:
    start_line: int  # 1-based, inclusive (for transcripts: JSONL file line numbers)
    end_line: int
    text: str
    hash: str  # sha256 hex of text
    entry_ids: tuple[str, ...] = ()  # transcripts: the entries this chunk came from
    ts: str | None = None  # transcripts: ISO-8601 UTC timestamp of the chunk's first turn
    speakers: tuple[str, ...] = ()  # transcripts: distinct speaker names in the chunk


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _check_limits(max_tokens: int, overlap: int) -> None:
    if max_tokens < MIN_CHUNK_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_CHUNK_TOKENS}")
    if overlap < 0:
        raise ValueError("the overlap must not be negative")


# -- cutting text to a token budget ------------------------------------------------------


def _continues_cluster(text: str, i: int) -> bool:
    """Would a cut before ``text[i]`` split a user-perceived character? A practical
    subset of UAX #29: combining marks, variation selectors, ZWJ sequences, emoji
    modifiers, tag characters, halfwidth kana voicing marks, conjoining Hangul jamo and
    regional-indicator pairs."""
    if i <= 0 or i >= len(text):
        return False
    ch, prev = text[i], text[i - 1]
    code = ord(ch)
    if "\udc00" <= ch <= "\udfff" and "\ud800" <= prev <= "\udbff":
        return True  # a surrogate pair (only in text decoded with surrogatepass)
    if prev == "\u200d" or code == 0x200D:
        return True
    if unicodedata.category(ch) in ("Mn", "Mc", "Me"):
        return True
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF or 0xE0020 <= code <= 0xE007F:
        return True
    if 0x1F3FB <= code <= 0x1F3FF or code in (0xFF9E, 0xFF9F):
        return True
    if 0x1160 <= code <= 0x11FF or 0xD7B0 <= code <= 0xD7FF:
        return True  # a Hangul vowel or final jamo continues its syllable
    if 0x1100 <= code <= 0x115F and 0x1100 <= ord(prev) <= 0x115F:
        return True  # leading jamo run
    if _is_regional(ch) and _is_regional(prev):
        run = 0  # flags pair up from the start of a run of regional indicators
        j = i - 1
        while j >= 0 and _is_regional(text[j]):
            run += 1
            j -= 1
        return run % 2 == 1
    return False


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _fits(text: str, max_tokens: int) -> bool:
    return count_tokens(text) <= max_tokens


def _longest_fit(text: str, start: int, max_tokens: int, suffix: str = "") -> int:
    """The largest ``end`` such that ``text[start:end] + suffix`` fits ``max_tokens``
    (at least ``start + 1``). Doubling then bisection: O(piece · log piece) per piece."""
    n = len(text)
    lo = start + 1
    hi = min(n, start + max_tokens * 4)
    while hi < n and _fits(text[start:hi] + suffix, max_tokens):
        lo = hi
        hi = min(n, start + (hi - start) * 2)
    if _fits(text[start:hi] + suffix, max_tokens):
        return hi
    while hi - lo > 1:  # invariant: lo fits (or is the forced minimum), hi does not
        mid = (lo + hi) // 2
        if _fits(text[start:mid] + suffix, max_tokens):
            lo = mid
        else:
            hi = mid
    return lo


def _nice_cut(text: str, start: int, end: int) -> int:
    """Move a cut back to just after whitespace or CJK punctuation in the piece's second
    half if there is one, else off any character cluster; never to ``start``."""
    if end >= len(text):
        return end
    for i in range(end - 1, start + (end - start) // 2 - 1, -1):
        boundary = text[i].isspace() or text[i] in _CJK_BREAKS
        if boundary and not _continues_cluster(text, i + 1):
            return i + 1
    cut = end
    while cut > start + 1 and _continues_cluster(text, cut):
        cut -= 1
    return cut


def _cut(text: str, start: int, max_tokens: int, suffix: str = "") -> int:
    """Where the piece starting at ``start`` ends: the longest fit, moved back to a nicer
    boundary when that still fits (BPE counts are not strictly monotone, so re-check)."""
    end = _longest_fit(text, start, max_tokens, suffix)
    nice = _nice_cut(text, start, end)
    if nice != end and not _fits(text[start:nice] + suffix, max_tokens):
        return end
    return nice


def split_text(text: str, max_tokens: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_tokens`` whose concatenation is ``text``."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = _cut(text, start, max_tokens)
        pieces.append(text[start:end])
        start = end
    return pieces


def _cut_with_marker(text: str, max_tokens: int) -> str:
    """The longest head of ``text`` that, with CUT_MARKER appended, fits ``max_tokens``."""
    head = text[: _cut(text, 0, max_tokens, CUT_MARKER)]
    trimmed = head.rstrip() or head
    return trimmed + CUT_MARKER if _fits(trimmed + CUT_MARKER, max_tokens) else head + CUT_MARKER


# -- Markdown ------------------------------------------------------------------------------


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
        while len(units) > 1 and not _fits(self._text(_trim(units) or units), self.max_tokens):
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
    return Chunk(start_line, end_line, text, _sha256(text))


def chunk_markdown(
    text: str,
    *,
    max_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap_tokens: int = DEFAULT_CHUNK_OVERLAP_TOKENS,
) -> list[Chunk]:
    """Chunks of a Markdown file (see the module docstring); [] for a blank file."""
    _check_limits(max_tokens, overlap_tokens)
    if overlap_tokens >= max_tokens:
        raise ValueError("overlap_tokens must be smaller than max_tokens")
    if not text.strip():
        return []
    lines = split_lines(text)
    packer = _MarkdownPacker(lines, max_tokens, overlap_tokens)
    return packer.pack(_markdown_units(lines, max_tokens))


# -- transcripts ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    line: int  # 1-based JSONL line number of the entry in the file (header is line 1)
    entry_id: str
    role: str  # "user" | "assistant"
    speaker: str
    ts: str  # the entry's ts, as written
    text: str  # visible words only: one line, whitespace collapsed, secrets redacted


def format_turn_line(turn: Turn) -> str:
    """A turn as it appears in a chunk (after an optional ``[date time] `` prefix)."""
    return f"{turn.speaker}: {turn.text}"


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _short_name(name: str) -> str:
    name = _collapse(name)
    if len(name) <= MAX_SPEAKER_CHARS:
        return name
    return name[: MAX_SPEAKER_CHARS - 1].rstrip() + CUT_MARKER


def _sender_name(context: str) -> str | None:
    """NAME in ``render_turn_context``'s ``…; from: NAME [id]</turn-context>``."""
    body = context.strip().removeprefix(TURN_CONTEXT_PREFIX).removesuffix(_TURN_CONTEXT_SUFFIX)
    at = body.find(_TURN_CONTEXT_FROM)
    if at < 0:
        return None
    who = body[at + len(_TURN_CONTEXT_FROM) :]
    bracket = who.rfind(" [")
    if bracket >= 0 and who.endswith("]"):
        who = who[:bracket]
    return _short_name(who) or None


def _header_agent_name(raw: str) -> str | None:
    """``meta.agent_name`` of a transcript header line (None for any other line)."""
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("type") != "session":
        return None
    return header_agent_name(record)


def header_agent_name(record: Mapping[str, Any]) -> str | None:
    """``meta.agent_name`` of a parsed transcript header, shortened for speaker labels."""
    meta = record.get("meta")
    name = meta.get("agent_name") if isinstance(meta, dict) else None
    if not isinstance(name, str):
        return None
    return _short_name(name) or None


def _visible(entry: Entry) -> tuple[str, str | None]:
    """The words a person saw, and the sender named by the turn context (if any). Tool
    calls and results are the agent's workings, not the conversation: left out."""
    parts: list[str] = []
    sender: str | None = None
    for block in entry.message.content:
        if isinstance(block, TextBlock) and is_turn_context(block):
            sender = _sender_name(block.text) or sender
        elif is_recall_block(block):
            # Memory shown to the model, not said by anyone: indexing it would bring
            # the same notes back as the user's words, again and again.
            continue
        elif isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ImageBlock):
            parts.append(IMAGE_NOTE)
    # Redact before collapsing: a PEM block is recognised by its own lines.
    return _collapse(redact_secrets("\n".join(parts))), sender


def transcript_turns(
    lines: Iterable[tuple[int, str]], *, agent_name: str | None = None
) -> list[Turn]:
    """The user and assistant turns of a transcript's ``(line_no, raw_line)`` pairs.

    The header line (if among ``lines``) names the assistant (``meta.agent_name``) unless
    ``agent_name`` is given; pass it when indexing only new lines of a file. Corrupt
    lines, compaction and custom entries, tool results, silent replies and turns without
    visible text are skipped."""
    header_name: str | None = None
    turns: list[Turn] = []
    for line_no, raw in lines:
        if not raw.strip():
            continue
        try:
            entry = Entry.from_json(raw)
        except TranscriptError:
            header_name = _header_agent_name(raw) or header_name
            continue
        if entry.type != ENTRY_MESSAGE or entry.message.role not in ("user", "assistant"):
            continue
        text, sender = _visible(entry)
        if not text or (entry.message.role == "assistant" and text == SILENT_REPLY):
            continue
        if entry.message.role == "user":
            speaker = sender or USER_NAME
        else:
            speaker = agent_name or header_name or ASSISTANT_NAME
        turns.append(Turn(line_no, entry.id, entry.message.role, speaker, entry.ts, text))
    return turns


@lru_cache(maxsize=4096)
def _utc(ts: str) -> datetime | None:
    try:
        moment = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # the transcript writes UTC
    return moment.astimezone(UTC)


def _render(turns: Sequence[Turn]) -> str:
    """One line per turn; a ``[YYYY-MM-DD HH:MM]`` prefix (UTC) on the first turn and on
    each turn whose date differs from the previous turn's."""
    out: list[str] = []
    previous: date | None = None
    for i, turn in enumerate(turns):
        moment = _utc(turn.ts)
        line = format_turn_line(turn)
        if moment is not None and (i == 0 or moment.date() != previous):
            line = f"[{moment:%Y-%m-%d %H:%M}] {line}"
        previous = None if moment is None else moment.date()
        out.append(line)
    return "\n".join(out)


def _turn_chunk(turns: Sequence[Turn], text: str) -> Chunk:
    first = turns[0]
    moment = _utc(first.ts)
    ts = first.ts if moment is None else moment.isoformat().replace("+00:00", "Z")
    return Chunk(
        start_line=first.line,
        end_line=turns[-1].line,
        text=text,
        hash=_sha256(text),
        entry_ids=tuple(t.entry_id for t in turns),
        ts=ts,
        speakers=tuple(dict.fromkeys(t.speaker for t in turns)),
    )


def chunk_turns(
    turns: Sequence[Turn],
    *,
    max_tokens: int = DEFAULT_TURN_CHUNK_TOKENS,
    overlap_turns: int = DEFAULT_TURN_OVERLAP,
) -> list[Chunk]:
    """Consecutive turns packed into chunks of at most ``max_tokens``; the last
    ``overlap_turns`` turns of a chunk open the next one (never all of them)."""
    _check_limits(max_tokens, overlap_turns)
    chunks: list[Chunk] = []
    current: list[Turn] = []
    carried = 0  # leading turns of `current` repeated from the previous chunk
    for turn in turns:
        if len(current) > carried:
            if _fits(_render([*current, turn]), max_tokens):
                current.append(turn)
                continue
            chunks.append(_turn_chunk(current, _render(current)))
            carried = min(overlap_turns, len(current) - 1)
            current = current[len(current) - carried :]
        while current and not _fits(_render([*current, turn]), max_tokens):
            current.pop(0)  # the overlap yields to the new turn
            carried -= 1
        if current or _fits(_render([turn]), max_tokens):
            current.append(turn)
            continue
        # A turn is never split across chunks, so one too long for any chunk is cut to
        # max_tokens and marked: its head carries the topic, and a search hit on the tail
        # is the accepted loss (the transcript keeps the whole turn).
        chunks.append(_turn_chunk([turn], _cut_with_marker(_render([turn]), max_tokens)))
    if len(current) > carried:
        chunks.append(_turn_chunk(current, _render(current)))
    return chunks
