"""Chunking session transcripts: by turn, never by line.

What a search snippet must show is who said what, and when (``transcript_turns`` then
``chunk_turns``). A chunk reads::

    [2023-05-08 13:56] Caroline: I went to a LGBTQ support group yesterday.
    Melanie: Wow, that's cool, Caroline!

One line per turn, exactly ``format_turn_line(turn)`` (after a ``[date time] `` prefix on
the first turn and on any turn whose UTC date differs from the previous one's). A turn is
never split across chunks; one too long for a chunk alone is cut, ending in
``CUT_MARKER``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import lru_cache
from typing import Any

from parley.core.errors import TranscriptError
from parley.core.memory.chunking.text import (
    CUT_MARKER,
    Chunk,
    check_limits,
    cut_with_marker,
    fits,
    sha256_hex,
)
from parley.core.memory.redact import redact_secrets
from parley.core.messages import ImageBlock, TextBlock
from parley.core.prompt import (
    SILENT_REPLY,
    TURN_CONTEXT_PREFIX,
    is_group_context,
    is_recall_block,
    is_turn_context,
)
from parley.core.transcript import ENTRY_MESSAGE, Entry

# Transcript chunks are small: a snippet should hold a few turns around the hit, not a
# whole conversation. Tuned by bench/ (the lead adjusts these from its figures).
DEFAULT_TURN_CHUNK_TOKENS = 160
DEFAULT_TURN_OVERLAP = 1  # turns repeated at the start of the next chunk

USER_NAME = "User"
ASSISTANT_NAME = "Assistant"
IMAGE_NOTE = "[image]"
MAX_SPEAKER_CHARS = 64  # display names are user-controlled; keep the snippet about the words

_TURN_CONTEXT_FROM = "; from: "
_TURN_CONTEXT_SUFFIX = "</turn-context>"


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
        elif is_recall_block(block) or is_group_context(block):
            # Memory shown to the model, not said by anyone: indexing it would bring
            # the same notes back as the user's words, again and again. Group context
            # is what others said in passing, not this conversation with the agent.
            continue
        elif isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ImageBlock):
            parts.append(IMAGE_NOTE)
    # Redact before collapsing: a PEM block is recognised by its own lines.
    return _collapse(redact_secrets("\n".join(parts))), sender


class TurnReader:
    """Reads a transcript's turns one line at a time, remembering what earlier lines said
    (the agent's name from a header line), so that reading can stop and resume at any
    line (``core.memory.chunking.resume``)."""

    def __init__(self, *, agent_name: str | None = None, header_name: str | None = None) -> None:
        self.agent_name = agent_name
        self.header_name = header_name  # from a header line read so far

    def read(self, line_no: int, raw: str) -> Turn | None:
        """The turn on this line, or None (see ``transcript_turns``)."""
        if not raw.strip():
            return None
        try:
            entry = Entry.from_json(raw)
        except TranscriptError:
            self.header_name = _header_agent_name(raw) or self.header_name
            return None
        if entry.type != ENTRY_MESSAGE or entry.message.role not in ("user", "assistant"):
            return None
        text, sender = _visible(entry)
        if not text or (entry.message.role == "assistant" and text == SILENT_REPLY):
            return None
        if entry.message.role == "user":
            speaker = sender or USER_NAME
        else:
            speaker = self.agent_name or self.header_name or ASSISTANT_NAME
        return Turn(line_no, entry.id, entry.message.role, speaker, entry.ts, text)


def transcript_turns(
    lines: Iterable[tuple[int, str]], *, agent_name: str | None = None
) -> list[Turn]:
    """The user and assistant turns of a transcript's ``(line_no, raw_line)`` pairs.

    The header line (if among ``lines``) names the assistant (``meta.agent_name``) unless
    ``agent_name`` is given; pass it when indexing only new lines of a file. Corrupt
    lines, compaction and custom entries, tool results, silent replies and turns without
    visible text are skipped."""
    reader = TurnReader(agent_name=agent_name)
    return [turn for line_no, raw in lines if (turn := reader.read(line_no, raw)) is not None]


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
        hash=sha256_hex(text),
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
    packed = pack_turns(turns, max_tokens=max_tokens, overlap_turns=overlap_turns)
    return packed.chunks


@dataclass(frozen=True, slots=True)
class Packed:
    """What ``pack_turns`` made: the chunks (the last one, ``open``, may still grow), and
    where packing can resume: the turns from index ``current`` on are the open chunk's
    (``carried`` of them repeated from the chunk before), the turns before are done."""

    chunks: list[Chunk]
    open: bool  # the last chunk is the open one (more turns may join it)
    current: int
    carried: int


def pack_turns(
    turns: Sequence[Turn],
    *,
    max_tokens: int = DEFAULT_TURN_CHUNK_TOKENS,
    overlap_turns: int = DEFAULT_TURN_OVERLAP,
    resume: tuple[int, int] = (0, 0),
) -> Packed:
    """``chunk_turns``, resumable. ``resume`` (n, carried): the first n turns are the open
    chunk a previous call left (``Packed.current`` onwards, ``Packed.carried``), so the
    chunks are exactly those packing the whole transcript would make from there on."""
    check_limits(max_tokens, overlap_turns)
    chunks: list[Chunk] = []
    start, carried = resume
    current: list[Turn] = list(turns[:start])
    for turn in turns[start:]:
        if len(current) > carried:
            if fits(_render([*current, turn]), max_tokens):
                current.append(turn)
                continue
            chunks.append(_turn_chunk(current, _render(current)))
            carried = min(overlap_turns, len(current) - 1)
            current = current[len(current) - carried :]
        while current and not fits(_render([*current, turn]), max_tokens):
            current.pop(0)  # the overlap yields to the new turn
            carried -= 1
        if current or fits(_render([turn]), max_tokens):
            current.append(turn)
            continue
        # A turn is never split across chunks, so one too long for any chunk is cut to
        # max_tokens and marked: its head carries the topic, and a search hit on the tail
        # is the accepted loss (the transcript keeps the whole turn).
        chunks.append(_turn_chunk([turn], cut_with_marker(_render([turn]), max_tokens)))
    is_open = len(current) > carried
    if is_open:
        chunks.append(_turn_chunk(current, _render(current)))
    # ``current`` is always the tail of the turns seen (empty after a cut turn).
    return Packed(chunks, is_open, len(turns) - len(current), carried)
