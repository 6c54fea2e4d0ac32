"""The memory flush: one silent turn before a compaction, saving durable notes.

When a session nears its compaction threshold (within ``soft_threshold_tokens``) or its
live transcript passes ``force_transcript_bytes``, the model is asked once per
compaction cycle to write down what is worth keeping for the long term. Its answer is
appended, by code, to ``memory/YYYY-MM-DD.md`` in the workspace (the date in the
user's time zone): that file is the only thing a flush can write, and only at its end.
The model may answer ``NO_REPLY``.

Why not a write tool, as OpenClaw does: the flush must not depend on the model calling
a tool correctly (nanobot #1979), and the request reuses the session's exact tools,
system prompt and history so the provider's prompt cache pays for most of it.

The outcome is recorded as a ``memory_flush`` custom entry; that entry is also what
"already flushed in this cycle" means: one after the latest compaction. The flush turn
itself is not part of the conversation, so its messages are not in the transcript.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Literal

from core.config import RetryConfig
from core.context_config import FlushConfig
from core.errors import ProviderError
from core.messages import Message, ToolSpec, Usage
from core.prompt import SILENT_REPLY
from core.providers.base import Provider, ProviderRequest
from core.providers.retry import call_with_retry
from core.transcript import ENTRY_COMPACTION, ENTRY_CUSTOM, ENTRY_MESSAGE, Entry
from core.transcript_store import SessionTranscript

log = logging.getLogger("parley.core.flush")

FLUSH_CUSTOM_TYPE = "memory_flush"
MEMORY_DIR_NAME = "memory"
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
        if entry.type == ENTRY_CUSTOM and entry.payload.get("custom_type") == FLUSH_CUSTOM_TYPE:
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
        elif entry.type == ENTRY_CUSTOM and entry.payload.get("custom_type") == FLUSH_CUSTOM_TYPE:
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
    # On a small window the soft zone would cover most of the threshold (a flush right
    # after every compaction): it never takes more than a quarter of it.
    soft = min(config.soft_threshold_tokens, threshold // 4)
    near = tokens >= threshold - soft
    big = config.force_transcript_bytes > 0 and live_bytes >= config.force_transcript_bytes
    return near or big


def memory_file(workspace: Path, when: datetime) -> Path:
    return workspace / MEMORY_DIR_NAME / f"{when:%Y-%m-%d}.md"


def append_note(workspace: Path, when: datetime, text: str, session_key: str) -> Path:
    """Append ``text`` to today's memory file; refuse anything outside workspace/memory."""
    folder = workspace / MEMORY_DIR_NAME
    folder.mkdir(parents=True, exist_ok=True)
    path = memory_file(workspace, when)
    root = folder.resolve()
    if path.resolve().parent != root:  # a symlinked file pointing elsewhere
        raise OSError(f"refusing to write outside {root}: {path}")
    header = f"\n## {when:%H:%M} — saved before compaction ({session_key})\n\n"
    # O_APPEND: concurrent flushes of two sessions interleave whole writes, never bytes.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (header + text.strip() + "\n").encode("utf-8"))
    finally:
        os.close(fd)
    return path


class MemoryFlusher:
    def __init__(
        self,
        *,
        provider: Provider,
        retry: RetryConfig,
        config: FlushConfig,
        workspace: Path,
        zone: Callable[[], tzinfo],
        now: Callable[[], datetime],
    ) -> None:
        self.provider = provider
        self.retry = retry
        self.config = config
        self.workspace = workspace
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
        relative = f"{MEMORY_DIR_NAME}/{when:%Y-%m-%d}.md"
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
            if not text or text == SILENT_REPLY:
                outcome = FlushOutcome("nothing", trigger, usage=response.usage)
            else:
                text = text[:MAX_NOTE_CHARS]
                try:
                    await asyncio.to_thread(
                        append_note, self.workspace, when, text, transcript.header.key
                    )
                    outcome = FlushOutcome(
                        "written", trigger, relative, len(text), usage=response.usage
                    )
                except OSError as exc:
                    outcome = FlushOutcome(
                        "failed", trigger, reason=f"cannot write {relative}: {exc}"
                    )
        await asyncio.to_thread(
            transcript.append_custom,
            FLUSH_CUSTOM_TYPE,
            {
                "status": outcome.status,
                "trigger": trigger,
                "path": outcome.path,
                "chars": outcome.chars,
                "reason": outcome.reason,
                "usage": outcome.usage.to_dict(),
            },
        )
        log.info(
            "memory flush session=%s trigger=%s status=%s chars=%d %s",
            transcript.header.key,
            trigger,
            outcome.status,
            outcome.chars,
            outcome.reason,
        )
        return outcome
