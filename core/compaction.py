"""Compaction: fold the old part of a session into a summary plus a deterministic ledger.

A compaction appends one ``compaction`` entry to the transcript (never rewrites it):
the model's view then starts with the summary, followed by the kept entries from
``first_kept_entry_id`` on. What makes ours safe where peers lost work:

- the cut keeps about ``keep_recent_tokens`` of the newest history and at least the
  last ``keep_recent_turns`` user turns verbatim, and only ever cuts at a user turn or
  at an assistant message, so a tool call is never separated from its result;
- the ledger (``core.ledger``) is extracted by code from what is being summarised,
  merged with the previous one and stored beside the summary, so exact identifiers,
  open asks, "remember ..." statements and decisions survive however the model writes;
- a summariser failure writes nothing: the history is kept and the caller trims the
  view instead; a stretch with nothing real in it (tool noise, silent replies) writes
  no entry at all, never an empty skeleton;
- before each compaction the transcript file is copied to a checkpoint (the newest
  ``checkpoints_kept`` per session are kept), so even the pre-compaction bytes can be
  inspected later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from core.context_config import CompactionConfig
from core.errors import SummaryError, TranscriptError
from core.history import is_turn_start, summary_message
from core.ledger import Ledger, extract_ledger
from core.messages import Message, TextBlock, Usage
from core.prompt import SILENT_REPLY, is_turn_context
from core.summarizer import Summarizer
from core.transcript import ENTRY_COMPACTION, ENTRY_MESSAGE, Entry
from core.transcript_store import SessionTranscript, write_jsonl_file

log = logging.getLogger("parley.core.compaction")

TRIGGER_THRESHOLD = "threshold"
TRIGGER_OVERFLOW = "overflow"
TRIGGER_MANUAL = "manual"
CHECKPOINTS_DIR_NAME = "checkpoints"
# The kept part never takes more than this share of the compaction threshold (the
# summary, the system prompt and the 1.2 margin come on top of it): a
# compaction that keeps nearly everything would only have to run again.
MAX_KEEP_SHARE = 0.35
# The summary is asked to reproduce only the newest identifiers (one regeneration when
# it does not); the ledger carries all of them verbatim either way.
REQUIRED_IDENTIFIERS = 24

OutcomeStatus = Literal["compacted", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class CompactionOutcome:
    status: OutcomeStatus
    trigger: str
    reason: str = ""
    tokens_before: int = 0
    tokens_after: int = 0
    entry: Entry | None = None
    usage: Usage = field(default_factory=Usage)

    @property
    def compacted(self) -> bool:
        return self.status == "compacted"

    def describe(self) -> str:
        """The one line ``/compact`` answers with (and the log records)."""
        if self.status == "compacted":
            return f"Compacted ({self.tokens_before:,} → {self.tokens_after:,} tokens)"
        if self.status == "skipped":
            return f"Skipped: {self.reason}"
        return f"Compaction failed: {self.reason}. Nothing was lost: the history is kept."


@dataclass(frozen=True, slots=True)
class CutPlan:
    summarize: tuple[Entry, ...]  # message entries folded into the summary
    kept: tuple[Entry, ...]  # message entries kept verbatim (may be empty: fold all)


def plan_cut(
    entries: Sequence[Entry],
    *,
    count: Callable[[Entry], int],
    keep_recent_tokens: int,
    keep_recent_turns: int,
    max_keep_tokens: int,
) -> CutPlan | None:
    """Where to cut the live window, or None when nothing can be folded.

    Walks back from the newest message entry. The preferred cut is at the start of a
    user turn once both the token and the turn minimums are met; the kept part never
    grows past ``max_keep_tokens``. When even the newest turn is larger than that (one
    turn with a long tool loop), the cut falls on an assistant message inside it,
    which still keeps every call with its result.
    """
    messages = [e for e in entries if e.type == ENTRY_MESSAGE]
    if len(messages) < 2:
        return None
    best: int | None = None
    suffix = turns = 0
    too_big = False
    for index in range(len(messages) - 1, 0, -1):
        suffix += count(messages[index])
        if suffix > max_keep_tokens:
            too_big = True
            break
        if is_turn_start(messages[index].message):
            turns += 1
            best = index
            if turns >= keep_recent_turns and suffix >= keep_recent_tokens:
                break
    if best is None and too_big:
        # Only when the newest turn itself is too big to keep: a short session has
        # nothing to fold, and folding the middle of its only turn would not help.
        suffix = 0
        for index in range(len(messages) - 1, 0, -1):
            suffix += count(messages[index])
            if suffix > max_keep_tokens:
                break
            if messages[index].message.role == "assistant":
                best = index
    if best is None:
        return None
    return CutPlan(tuple(messages[:best]), tuple(messages[best:]))


def _fold_everything(
    entries: Sequence[Entry], count: Callable[[Entry], int], max_keep_tokens: int
) -> CutPlan | None:
    """``/compact`` when no cut can keep the newest turn (it is too big to keep, e.g. a
    pasted document larger than the window): fold the whole window into the summary.
    Only on request: an automatic compaction must never hide the user's newest words."""
    messages = tuple(e for e in entries if e.type == ENTRY_MESSAGE)
    if not messages or sum(count(e) for e in messages) <= max_keep_tokens:
        return None
    return CutPlan(messages, ())


def has_real_content(messages: Sequence[Message]) -> bool:
    """Is there anything a summary should keep? Tool noise and silent replies are not."""
    for message in messages:
        if message.role == "tool_result":
            continue
        for block in message.content:
            if not isinstance(block, TextBlock) or is_turn_context(block):
                continue
            text = block.text.strip()
            if text and text != SILENT_REPLY:
                return True
    return False


def _without_turn_context(message: Message) -> Message:
    """The message without its volatile turn context (time, channel, sender id): those
    would fill the ledger with one sender id and a timestamp per turn."""
    if message.role != "user":
        return message
    blocks = tuple(b for b in message.content if not is_turn_context(b))
    return message if len(blocks) == len(message.content) else Message("user", blocks)


def compose_summary(summary: str, ledger: Ledger) -> str:
    """What the model sees: the summary, then the ledger verbatim."""
    ledger_text = ledger.render()
    return f"{summary.strip()}\n\n{ledger_text}" if ledger_text else summary.strip()


def previous_state(entries: Sequence[Entry]) -> tuple[str | None, Ledger]:
    """The latest compaction's own summary (without the ledger) and its ledger."""
    for entry in reversed(entries):
        if entry.type != ENTRY_COMPACTION:
            continue
        details = entry.payload.get("details") or {}
        summary = details.get("summary_only")
        if not isinstance(summary, str):
            summary = entry.payload.get("summary")
        raw = details.get("ledger")
        ledger = Ledger.from_dict(raw) if isinstance(raw, dict) else Ledger()
        return summary, ledger
    return None, Ledger()


class Compactor:
    """Plans, summarises and records one compaction; the caller decides when."""

    def __init__(
        self,
        *,
        summarizer: Summarizer,
        count: Callable[[Entry], int],
        count_message: Callable[[Message], int],
        config: CompactionConfig,
        checkpoints_dir: Path | None = None,
    ) -> None:
        self.summarizer = summarizer
        self.count = count
        self.count_message = count_message
        self.config = config
        self.checkpoints_dir = checkpoints_dir

    def plan(self, entries: Sequence[Entry], *, threshold: int, trigger: str) -> CutPlan | str:
        """What a compaction would fold now, or the reason it would be skipped (no model
        call is made to find out: the flush before a compaction asks this first)."""
        newest = next(
            (e for e in reversed(entries) if e.type in (ENTRY_MESSAGE, ENTRY_COMPACTION)), None
        )
        if newest is not None and newest.type == ENTRY_COMPACTION:
            # Custom entries (deliveries, flushes, prunes) do not count as new content.
            return "already compacted; nothing new since"
        max_keep = max(1, int(threshold * MAX_KEEP_SHARE))
        plan = plan_cut(
            entries,
            count=self.count,
            keep_recent_tokens=self.config.keep_recent_tokens,
            keep_recent_turns=self.config.keep_recent_turns,
            max_keep_tokens=max_keep,
        )
        if plan is None and trigger == TRIGGER_MANUAL:
            plan = _fold_everything(entries, self.count, max_keep)
        if plan is None:
            return "nothing compactable in this session yet"
        if not has_real_content([_without_turn_context(e.message) for e in plan.summarize]):
            return "no real conversation to summarise yet"
        return plan

    async def compact(
        self,
        transcript: SessionTranscript,
        *,
        trigger: str,
        window: int,
        threshold: int,
        base_tokens: int,
        tokens_before: int,
        focus: str = "",
    ) -> CompactionOutcome:
        entries = transcript.live_entries()
        plan = self.plan(entries, threshold=threshold, trigger=trigger)
        if isinstance(plan, str):
            return CompactionOutcome("skipped", trigger, plan)
        messages = [_without_turn_context(e.message) for e in plan.summarize]
        previous_summary, previous_ledger = previous_state(entries)
        fresh = extract_ledger(messages)
        ledger = previous_ledger.merge(fresh)
        try:
            result = await self.summarizer.summarize(
                messages,
                window=window,
                previous_summary=previous_summary,
                focus=focus,
                required_identifiers=fresh.identifiers[-REQUIRED_IDENTIFIERS:],
            )
        except SummaryError as exc:
            log.warning("compaction (%s) failed: %s; history kept", trigger, exc)
            return CompactionOutcome("failed", trigger, f"the summary failed ({exc.message})")
        text = compose_summary(result.text, ledger)
        tokens_after = (
            base_tokens
            + self.count_message(summary_message(text))
            + sum(self.count(e) for e in plan.kept)
        )
        if tokens_after >= tokens_before and trigger != TRIGGER_OVERFLOW:
            return CompactionOutcome(
                "skipped",
                trigger,
                f"a summary would not make it smaller ({tokens_before:,} → {tokens_after:,})",
                usage=result.usage,
            )
        details: dict[str, Any] = {
            "summary_only": result.text,
            "ledger": ledger.to_dict(),
            "summarized_messages": len(messages),
            "summary_calls": result.calls,
            "summary_stages": result.stages,
            "oversized_omitted": result.oversized,
            "regenerated": result.regenerated,
        }
        if focus:
            details["focus"] = focus[:4000]
        if self.checkpoints_dir is not None and self.config.checkpoints_kept > 0:
            try:
                checkpoint = await asyncio.to_thread(self._checkpoint, transcript, trigger)
                details["checkpoint"] = checkpoint.name
            except OSError:
                log.warning(
                    "compaction checkpoint of %s failed", transcript.location, exc_info=True
                )
        try:
            entry = await asyncio.to_thread(
                transcript.append_compaction,
                text,
                first_kept_entry_id=plan.kept[0].id if plan.kept else None,
                tokens_before=tokens_before,
                tokens_after=tokens_after,
                trigger=trigger,
                details=details,
            )
        except TranscriptError as exc:
            return CompactionOutcome(
                "failed", trigger, f"the transcript could not be written: {exc}"
            )
        log.info(
            "compacted session %s (%s): %d messages summarised, %d → %d tokens",
            transcript.header.key,
            trigger,
            len(messages),
            tokens_before,
            tokens_after,
        )
        return CompactionOutcome(
            "compacted",
            trigger,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            entry=entry,
            usage=result.usage,
        )

    def _checkpoint(self, transcript: SessionTranscript, trigger: str) -> Path:
        """Copy the transcript as it is before the compaction; keep the newest N copies."""
        assert self.checkpoints_dir is not None
        folder = self.checkpoints_dir / transcript.header.id
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = folder / f"{stamp}-{trigger}.jsonl"
        write_jsonl_file(transcript, target)  # mode 0600; from the file or the database
        copies = sorted(folder.glob("*.jsonl"))
        for old in copies[: max(0, len(copies) - self.config.checkpoints_kept)]:
            old.unlink(missing_ok=True)
        return target
