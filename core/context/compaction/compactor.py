"""Compaction: fold the old part of a session into a summary plus a deterministic ledger.

A compaction appends one ``compaction`` entry to the transcript (never rewrites it):
the model's view then starts with the summary, followed by the kept entries from
``first_kept_entry_id`` on. What makes ours safe where peers lost work:

- the cut keeps about ``keep_recent_tokens`` of the newest history and at least the
  last ``keep_recent_turns`` user turns verbatim, and only ever cuts at a user turn or
  at an assistant message, so a tool call is never separated from its result;
- the ledger (``core.context.compaction.ledger``) is extracted by code from what is
  being summarised, merged with the previous one and stored beside the summary, so exact
  identifiers, open asks, "remember ..." statements and decisions survive however the
  model writes;
- the summary text comes from the configured strategy (``compaction.strategy``:
  summary, selective, hierarchical, sliding-window; see ``core.context.compaction.strategies``).
  The summariser retries with backoff, then ``fallback_model`` is tried, then the
  sliding window folds with the ledger alone, so a compaction always succeeds and
  the transcript keeps every folded message; ``details`` records which step made
  the entry. A stretch with nothing real in it (tool noise, silent replies) writes
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

from parley.core.context.budget import MAX_KEEP_SHARE, ContextBudget
from parley.core.context.compaction.ledger import Ledger, extract_ledger
from parley.core.context.compaction.strategies import (
    STRATEGY_SLIDING_WINDOW,
    STRATEGY_SUMMARY,
    CompactionStrategy,
    CutPlan,
    Fold,
    FoldRequest,
    SummaryChainError,
    build_strategy,
    summarizer_chain,
)
from parley.core.context.compaction.summarizer import Summarizer
from parley.core.context.config import CompactionConfig
from parley.core.context.history import is_turn_start, summary_message
from parley.core.errors import SummaryError, TranscriptError
from parley.core.messages import Message, TextBlock, Usage
from parley.core.prompt import SILENT_REPLY, is_volatile
from parley.core.providers.base import Provider
from parley.core.providers.provider_config import RetryConfig
from parley.core.tokens import TokenCounter
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_MESSAGE, Entry
from parley.core.transcript_store import SessionTranscript, write_jsonl_file

log = logging.getLogger("parley.core.compaction")

TRIGGER_THRESHOLD = "threshold"
TRIGGER_OVERFLOW = "overflow"
TRIGGER_MANUAL = "manual"
TRIGGER_MESSAGES = "messages"  # compaction.max_messages since the last compaction
TRIGGER_AGE = "age"  # compaction.max_age_seconds since the last compaction
TRIGGER_HISTORY = "history"  # the view's history limit hides messages: fold them
CHECKPOINTS_DIR_NAME = "checkpoints"
# The triggers whose compaction must make the context smaller to be worth it; the
# count and age triggers fold by design, and an overflow must fold whatever it saves.
SIZE_TRIGGERS = frozenset({TRIGGER_THRESHOLD, TRIGGER_MANUAL})

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
    strategy: str = ""  # the strategy that made (or would have made) the entry

    @property
    def compacted(self) -> bool:
        return self.status == "compacted"

    def describe(self) -> str:
        """The one line ``/compact`` answers with (and the log records)."""
        if self.status == "compacted":
            via = f"; {self.strategy}" if self.strategy not in ("", STRATEGY_SUMMARY) else ""
            return f"Compacted ({self.tokens_before:,} → {self.tokens_after:,} tokens{via})"
        if self.status == "skipped":
            return f"Skipped: {self.reason}"
        return f"Compaction failed: {self.reason}. Nothing was lost: the history is kept."


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
    which still keeps every call with its result; when no assistant message is near
    enough the end either, the cut falls at the newest turn's start.
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
    if best is None and too_big:
        # Not even its newest call fits the keep share (a tool result that is most of a
        # small window): fold the turns before it and keep it whole. The kept part is
        # over the share, but the view is smaller than with nothing folded, and the
        # alternative is a trim that drops those turns with no summary at all.
        best = next(
            (i for i in range(len(messages) - 1, 0, -1) if is_turn_start(messages[i].message)),
            None,
        )
    if best is None:
        return None
    return CutPlan(tuple(messages[:best]), tuple(messages[best:]))


def _max_keep(threshold: int) -> int:
    return max(1, int(threshold * MAX_KEEP_SHARE))


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
            if not isinstance(block, TextBlock) or is_volatile(block):
                continue
            text = block.text.strip()
            if text and text != SILENT_REPLY:
                return True
    return False


def _without_turn_context(message: Message) -> Message:
    """The message without its volatile blocks: the turn context (time, channel, sender
    id would fill the ledger with one sender id and a timestamp per turn) and recalled
    memory (already in long-term memory; summarising it would pass it off as said)."""
    if message.role != "user":
        return message
    blocks = tuple(b for b in message.content if not is_volatile(b))
    return message if len(blocks) == len(message.content) else Message("user", blocks)


def compose_summary(
    summary: str,
    ledger: Ledger,
    *,
    max_ledger_tokens: int | None = None,
    count_text: Callable[[str], int] | None = None,
) -> str:
    """What the model sees: the summary, then the ledger verbatim (within
    ``max_ledger_tokens`` when given: a small window cannot hold 400 identifiers)."""
    ledger_text = ledger.render(max_ledger_tokens, count_text)
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
    """Plans, folds and records one compaction; the caller decides when.

    The configured strategy (``core.context.compaction.strategies``) makes the summary text;
    when it fails (the summariser and the fallback model both, or a bug), the
    sliding window makes it instead, so a compaction that has something to fold
    always writes an entry. ``details["strategy"]`` names the strategy that made it
    and ``details["fallbacks"]`` the steps that failed before.
    """

    def __init__(
        self,
        *,
        summarizer: Summarizer,
        count: Callable[[Entry], int],
        count_message: Callable[[Message], int],
        config: CompactionConfig,
        checkpoints_dir: Path | None = None,
        fallback_summarizer: Summarizer | None = None,
        count_text: Callable[[str], int] | None = None,
    ) -> None:
        self.summarizer = summarizer
        self.fallback_summarizer = fallback_summarizer
        self.count = count
        self.count_message = count_message
        self.count_text = count_text or (lambda text: count_message(Message.user(text)))
        self.config = config
        self.checkpoints_dir = checkpoints_dir

    def plan(
        self,
        entries: Sequence[Entry],
        *,
        threshold: int,
        trigger: str,
        budget: ContextBudget | None = None,
    ) -> CutPlan | str:
        """What a compaction would fold now, or the reason it would be skipped (no model
        call is made to find out: the flush before a compaction asks this first).
        ``budget``: the window's scaled keep figures (default: the configured ones)."""
        newest = next(
            (e for e in reversed(entries) if e.type in (ENTRY_MESSAGE, ENTRY_COMPACTION)), None
        )
        if newest is not None and newest.type == ENTRY_COMPACTION:
            # Custom entries (deliveries, flushes, prunes) do not count as new content.
            return "already compacted; nothing new since"
        max_keep = budget.max_keep_tokens if budget else _max_keep(threshold)
        plan = plan_cut(
            entries,
            count=self.count,
            keep_recent_tokens=(
                budget.keep_recent_tokens if budget else self.config.keep_recent_tokens
            ),
            keep_recent_turns=(
                budget.keep_recent_turns if budget else self.config.keep_recent_turns
            ),
            max_keep_tokens=max_keep,
        )
        if plan is None and trigger == TRIGGER_MANUAL:
            plan = _fold_everything(entries, self.count, max_keep)
        if plan is None:
            return "nothing compactable in this session yet"
        if not has_real_content([_without_turn_context(e.message) for e in plan.summarize]):
            return "no real conversation to summarise yet"
        return plan

    def strategies(self, name: str | None = None) -> list[CompactionStrategy]:
        """The strategy to try, then the sliding window as the last resort."""
        chain = summarizer_chain(self.summarizer, self.fallback_summarizer)
        first = build_strategy(self.config, chain=chain, count_text=self.count_text, name=name)
        if first.name == STRATEGY_SLIDING_WINDOW:
            return [first]
        return [
            first,
            build_strategy(
                self.config, chain=chain, count_text=self.count_text, name=STRATEGY_SLIDING_WINDOW
            ),
        ]

    async def _fold(
        self,
        entries: Sequence[Entry],
        plan: CutPlan,
        *,
        threshold: int,
        window: int,
        focus: str,
        strategy_name: str | None = None,
        budget: ContextBudget | None = None,
    ) -> tuple[CompactionStrategy, CutPlan, Fold, Ledger, list[str]] | list[str]:
        """The first strategy that folds: it, its cut, its fold, the merged ledger and
        the failures before it; or only the failures when none could."""
        previous_summary, previous_ledger = previous_state(entries)
        messages = [e for e in entries if e.type == ENTRY_MESSAGE]
        failures: list[str] = []
        for strategy in self.strategies(strategy_name):
            cut = strategy.cut(
                messages,
                plan,
                count=self.count,
                max_keep_tokens=budget.max_keep_tokens if budget else _max_keep(threshold),
            )
            folded = tuple(_without_turn_context(e.message) for e in cut.summarize)
            fresh = extract_ledger(folded)
            request = FoldRequest(
                messages=folded,
                kept=tuple(e.message for e in cut.kept),
                previous_summary=previous_summary,
                fresh_ledger=fresh,
                window=window,
                threshold=threshold,
                focus=focus,
                fold_tokens=budget.fold_tokens if budget else None,
                summary_tokens=budget.summary_tokens if budget else None,
            )
            try:
                fold = await strategy.fold(request)
            except SummaryChainError as exc:
                failures.extend(exc.failures)
                continue
            except SummaryError as exc:
                failures.append(f"{strategy.name}: {exc.message}")
                continue
            except Exception as exc:
                # A bug in one strategy must not cost the session its compaction:
                # the sliding window still folds, and the log keeps the traceback.
                log.exception("compaction strategy %s failed", strategy.name)
                failures.append(f"{strategy.name}: {type(exc).__name__}: {exc}")
                continue
            return strategy, cut, fold, previous_ledger.merge(fresh), failures
        return failures

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
        budget: ContextBudget | None = None,
        strategy: str | None = None,
    ) -> CompactionOutcome:
        """Fold the live window. ``budget``: the window's scaled figures (keep, ledger);
        ``strategy``: instead of the configured one (a model that cannot summarise)."""
        entries = transcript.live_entries()
        plan = self.plan(entries, threshold=threshold, trigger=trigger, budget=budget)
        if isinstance(plan, str):
            return CompactionOutcome("skipped", trigger, plan)
        folded = await self._fold(
            entries,
            plan,
            threshold=threshold,
            window=window,
            focus=focus,
            strategy_name=strategy,
            budget=budget,
        )
        if isinstance(folded, list):
            log.warning("compaction (%s) failed: %s; history kept", trigger, "; ".join(folded))
            return CompactionOutcome(
                "failed", trigger, f"every strategy failed ({'; '.join(folded)})"
            )
        made_by, cut, fold, ledger, failures = folded
        text = compose_summary(
            fold.text,
            ledger,
            max_ledger_tokens=budget.ledger_tokens if budget else None,
            count_text=self.count_text,
        )
        tokens_after = (
            base_tokens
            + self.count_message(summary_message(text))
            + sum(self.count(e) for e in cut.kept)
        )
        if tokens_after >= tokens_before and trigger in SIZE_TRIGGERS:
            return CompactionOutcome(
                "skipped",
                trigger,
                f"a summary would not make it smaller ({tokens_before:,} → {tokens_after:,})",
                usage=fold.usage,
                strategy=made_by.name,
            )
        details: dict[str, Any] = {
            "strategy": made_by.name,
            "summary_only": fold.text,
            "ledger": ledger.to_dict(),
            "summarized_messages": len(cut.summarize),
            **fold.details,
        }
        if made_by.name == STRATEGY_SLIDING_WINDOW and failures:
            details["produced_by"] = STRATEGY_SLIDING_WINDOW
        fallbacks = [*failures, *fold.details.get("fallbacks", ())]
        if fallbacks:
            details["fallbacks"] = fallbacks
        if strategy is not None and strategy != self.config.strategy:
            # The configured strategy needs a model summary this model cannot write.
            details["configured_strategy"] = self.config.strategy
        if made_by.name != (strategy or self.config.strategy):
            details["requested_strategy"] = strategy or self.config.strategy
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
                first_kept_entry_id=cut.kept[0].id if cut.kept else None,
                tokens_before=tokens_before,
                tokens_after=tokens_after,
                trigger=trigger,
                details=details,
            )
        except TranscriptError as exc:
            return CompactionOutcome(
                "failed",
                trigger,
                f"the transcript could not be written: {exc}",
                strategy=made_by.name,
            )
        log.info(
            "compacted session %s (%s, %s): %d messages folded, %d → %d tokens",
            transcript.header.key,
            trigger,
            made_by.name,
            len(cut.summarize),
            tokens_before,
            tokens_after,
        )
        return CompactionOutcome(
            "compacted",
            trigger,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            entry=entry,
            usage=fold.usage,
            strategy=made_by.name,
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


def build_compactor(
    config: CompactionConfig,
    *,
    provider: Provider,
    counter: TokenCounter,
    retry: RetryConfig,
    checkpoints_dir: Path | None,
) -> Compactor:
    """The compactor of ``config``: its summariser (``compaction.model`` or the session's
    own), the fallback model's when set, counting with ``counter``."""
    # summary_retries counts retries: the first attempt comes on top, and each retry
    # waits call_with_retry's exponential backoff (with jitter).
    summary_retry = retry.model_copy(update={"max_attempts": min(10, config.summary_retries + 1)})

    def summarizer_for(model: str | None) -> Summarizer:
        return Summarizer(
            provider,
            model=model,
            counter=counter,
            retry=summary_retry,
            max_output_tokens=config.summary_max_tokens,
            custom_instructions=config.custom_instructions,
        )

    return Compactor(
        summarizer=summarizer_for(config.model),
        fallback_summarizer=(
            summarizer_for(config.fallback_model) if config.fallback_model else None
        ),
        count=counter.entry,
        count_message=counter.message,
        count_text=counter.text,
        config=config,
        checkpoints_dir=checkpoints_dir,
    )
