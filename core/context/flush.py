"""The memory flush: one silent turn before a compaction, saving durable notes.

When a session nears its compaction threshold (within ``soft_threshold_tokens``) or its
live transcript passes ``force_transcript_bytes``, the model is asked once per
compaction cycle to write down what is worth keeping for the long term. Its answer is
appended, by code, to ``YYYY-MM-DD.md`` in the private notes of the session's own
audience (``core.memory.notes``; the date in the user's time zone): a person's flush
never lands where another person, a group or the agent-wide memory could read it. That
file is the only thing a flush can write, and only at its end. The model may answer
``NO_REPLY``.

Why not a write tool, as OpenClaw does: the flush must not depend on the model calling
a tool correctly (nanobot #1979), and the request reuses the session's exact tools,
system prompt and history so the provider's prompt cache pays for most of it.

The outcome is recorded as a ``memory_flush`` custom entry; that entry is also what
"already flushed in this cycle" means: one after the latest compaction. The flush turn
itself is not part of the conversation, so its messages are not in the transcript.

A small model loops ("- the user likes tea" forty times): a note where repeated
``REPEAT_NGRAM``-word runs cover more than half the words (``core.text_loops.loop_share``) is
de-looped (repeated lines dropped) and written only when what is left is no loop any
more; otherwise nothing is written and the outcome says why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Literal

from parley.core.context.budget import flush_soft_tokens
from parley.core.context.config import FlushConfig
from parley.core.errors import ProviderError
from parley.core.memory.audience import Audience
from parley.core.memory.notes import NoteError, NoteStore
from parley.core.messages import Message, ToolSpec, Usage
from parley.core.prompt import SILENT_REPLY
from parley.core.providers.base import Provider, ProviderRequest
from parley.core.providers.provider_config import RetryConfig
from parley.core.providers.retry import call_with_retry
from parley.core.text_loops import loop_share, words
from parley.core.transcript import (
    ENTRY_COMPACTION,
    ENTRY_CUSTOM,
    ENTRY_MESSAGE,
    Entry,
    TranscriptHeader,
)
from parley.core.transcript_store import SessionTranscript

log = logging.getLogger("parley.core.flush")

FLUSH_CUSTOM_TYPE = "memory_flush"
MAX_NOTE_CHARS = 8_000
FLUSH_PROMPT = (
    "[memory flush] This is a silent maintenance turn, not a message from the user: the "
    "conversation above will soon be compacted. Write down what is worth remembering long "
    "after it: decisions with their reasons, preferences, people, dates, commitments, open "
    "tasks and exact identifiers (ids, paths, URLs, numbers). Use short Markdown bullet "
    "points in the conversation's language; copy identifiers exactly. Your answer is "
    "appended as is to {path}; do not repeat what MEMORY.md already says and do not call "
    "tools. If nothing is worth storing, answer exactly " + SILENT_REPLY + "."
)

FlushStatus = Literal["written", "nothing", "failed"]
# Runs of this many words that recur make a note a loop; five words are longer than
# the stock phrases a real note repeats ("- The user prefers"), and any period a
# looping model falls into repeats all of its five-word runs.
REPEAT_NGRAM = 5
MAX_REPEAT_SHARE = 0.5
REPETITIVE_REASON = "the note was mostly repetition (a looping model); nothing written"


def deloop(text: str) -> str | None:
    """``text`` when it is no loop; else its lines without repeats, when that is no loop
    any more; else None (nothing worth writing)."""
    if loop_share(text, REPEAT_NGRAM) <= MAX_REPEAT_SHARE:
        return text
    lines: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        key = " ".join(words(line))
        if key and key in seen:
            continue
        seen.add(key)
        lines.append(line)
    kept = "\n".join(lines).strip()
    if not kept or loop_share(kept, REPEAT_NGRAM) > MAX_REPEAT_SHARE:
        return None
    return kept


@dataclass(frozen=True, slots=True)
class FlushOutcome:
    status: FlushStatus
    trigger: str
    path: str | None = None  # relative to the workspace
    chars: int = 0
    reason: str = ""
    usage: Usage = field(default_factory=Usage)


def flushed_this_cycle(entries: Sequence[Entry]) -> bool:
    """Has a flush run since the latest compaction (or since the session began)?"""
    for entry in reversed(entries):
        if entry.type == ENTRY_COMPACTION:
            return False
        if entry.type == ENTRY_CUSTOM and entry.custom_type == FLUSH_CUSTOM_TYPE:
            return True
    return False


def _may_flush(entries: Sequence[Entry]) -> bool:
    """False when a flush ran in this compaction cycle, or when no message came after the
    newest flush (a compaction right after it starts a new cycle with nothing new in it:
    another flush would only repeat the last one). One backward scan for both."""
    seen_compaction = seen_message = False
    for entry in reversed(entries):
        if entry.type == ENTRY_COMPACTION:
            seen_compaction = True
        elif entry.type == ENTRY_MESSAGE:
            seen_message = True
        elif entry.type == ENTRY_CUSTOM and entry.custom_type == FLUSH_CUSTOM_TYPE:
            return seen_compaction and seen_message
        if seen_compaction and seen_message:
            return True
    return True


def flush_due(
    entries: Sequence[Entry],
    *,
    tokens: int,
    threshold: int,
    live_bytes: int,
    config: FlushConfig,
) -> bool:
    if not config.enabled or not _may_flush(entries):
        return False
    soft = flush_soft_tokens(config, threshold)
    near = tokens >= threshold - soft
    big = config.force_transcript_bytes > 0 and live_bytes >= config.force_transcript_bytes
    return near or big


@dataclass(frozen=True, slots=True)
class FlushTarget:
    """Where flushes write: the private notes, in the audience of the transcript's
    header (None: the transcript belongs to nobody known, and nothing is written)."""

    notes: NoteStore
    audience_of: Callable[[TranscriptHeader], Audience | None]


class MemoryFlusher:
    def __init__(
        self,
        *,
        provider: Provider,
        retry: RetryConfig,
        config: FlushConfig,
        target: FlushTarget | None,
        zone: Callable[[], tzinfo],
        now: Callable[[], datetime],
    ) -> None:
        self.provider = provider
        self.retry = retry
        self.config = config
        self.target = target
        self.zone = zone
        self.now = now

    async def run(
        self,
        transcript: SessionTranscript,
        *,
        system: str,
        tools: Sequence[ToolSpec],
        messages: Sequence[Message],
        model: str,
        max_output: int,
        trigger: str,
    ) -> FlushOutcome:
        """One flush call; never raises for a provider failure (the outcome says it)."""
        when = self.now().astimezone(self.zone())
        target = self.target
        audience = target.audience_of(transcript.header) if target is not None else None
        if target is None or audience is None or audience.kind == "agent":
            # Nothing the bot writes on its own is agent-wide: no audience, no flush.
            skipped = FlushOutcome("failed", trigger, reason="the session has no audience")
            await self._record(transcript, skipped)
            return skipped
        relative = target.notes.display(audience, f"{when:%Y-%m-%d}.md")
        request = ProviderRequest(
            model=model,
            system=system,
            messages=(*messages, Message.user(FLUSH_PROMPT.format(path=relative))),
            tools=tuple(tools),
            max_tokens=max_output,
        )
        outcome: FlushOutcome
        try:
            response = await call_with_retry(self.provider, request, self.retry)
        except ProviderError as exc:
            outcome = FlushOutcome("failed", trigger, reason=f"{type(exc).__name__}: {exc.message}")
        else:
            text = response.message.text.strip()
            note = deloop(text[:MAX_NOTE_CHARS]) if text and text != SILENT_REPLY else ""
            if note is None:
                log.warning(
                    "memory flush session=%s: the note was mostly repetition (%d chars); "
                    "nothing written",
                    transcript.header.key,
                    len(text),
                )
                outcome = FlushOutcome(
                    "nothing", trigger, reason=REPETITIVE_REASON, usage=response.usage
                )
            elif not note:
                outcome = FlushOutcome("nothing", trigger, usage=response.usage)
            else:
                if note != text[:MAX_NOTE_CHARS]:
                    log.warning(
                        "memory flush session=%s: repeated lines dropped from a looping "
                        "note (%d → %d chars)",
                        transcript.header.key,
                        len(text),
                        len(note),
                    )
                text = note
                try:
                    relative = await asyncio.to_thread(
                        target.notes.append_flush, audience, when, text
                    )
                    outcome = FlushOutcome(
                        "written", trigger, relative, len(text), usage=response.usage
                    )
                except (OSError, NoteError) as exc:
                    outcome = FlushOutcome(
                        "failed", trigger, reason=f"cannot write {relative}: {exc}"
                    )
        await self._record(transcript, outcome)
        return outcome

    async def _record(self, transcript: SessionTranscript, outcome: FlushOutcome) -> None:
        await asyncio.to_thread(
            transcript.append_custom,
            FLUSH_CUSTOM_TYPE,
            {
                "status": outcome.status,
                "trigger": outcome.trigger,
                "path": outcome.path,
                "chars": outcome.chars,
                "reason": outcome.reason,
                "usage": outcome.usage.to_dict(),
            },
        )
        log.info(
            "memory flush session=%s trigger=%s status=%s chars=%d %s",
            transcript.header.key,
            outcome.trigger,
            outcome.status,
            outcome.chars,
            outcome.reason,
        )
