"""The model's view of a transcript: history limits, recorded prunes, and the view's key.

``build_view`` is the first step of every ``prepare``: ``build_history`` over the live
window (summary first, repaired, the turn limit of the chat type and the message limit),
then every recorded pruning decision re-applied, so the view is byte-identical to the
previous call's up to its newest entry. The key names what would make a view differ
from a plain continuation of the previous one (a compaction, a prune, a new first
message under a limit): the session's accountant trusts the provider's last reported
size only while the key stays the same.

``inspect_view`` is the same view for inspectors (``/context``, the admin API), with
the counts of what pruning and the history limits left out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from parley.core.context.budget import derived_history_messages, scaled_pruning
from parley.core.context.config import ContextConfig
from parley.core.context.history import build_history, is_turn_start
from parley.core.context.pruning import (
    PRUNE_CUSTOM_TYPE,
    PruneDecision,
    apply_decisions,
    decide,
    prune_old_images,
    recorded_decisions,
)
from parley.core.media import without_vision
from parley.core.messages import Message
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_CUSTOM, ENTRY_MESSAGE, Entry
from parley.core.transcript_store import SessionTranscript

log = logging.getLogger("parley.core.pruning")


@dataclass(frozen=True, slots=True)
class ContextView:
    """The model's view of a transcript and what shaped it, for inspectors."""

    messages: list[Message]
    trimmed: int  # tool results soft-trimmed by recorded prunes
    cleared: int  # tool results replaced by a placeholder
    dropped_turns: int  # user turns left out by the history turn limit


def _parse_ts(raw: str) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def last_call_at(entries: Sequence[Entry]) -> datetime | None:
    """When the provider last answered in this window: the newest assistant entry."""
    for entry in reversed(entries):
        if entry.type == ENTRY_MESSAGE and entry.message.role == "assistant":
            stamp = entry.meta.get("called_at")
            return _parse_ts(stamp if isinstance(stamp, str) else entry.ts)
    return None


def _latest_id(entries: Sequence[Entry], kind: str, custom_type: str | None = None) -> str:
    for entry in reversed(entries):
        if entry.type != kind:
            continue
        if custom_type is None or entry.custom_type == custom_type:
            return entry.id
    return "-"


def max_turns(config: ContextConfig, chat_type: str) -> int:
    """The chat type's history turn limit (0 = none)."""
    if chat_type == "direct":
        return config.dm_history_turns
    return config.group_history_turns


def max_messages(config: ContextConfig, chat_type: str, window: int) -> int:
    """The view's message limit (0 = none): ``history_messages`` when set, else
    derived from the window unless a turn limit already bounds the chat type."""
    configured = config.history_messages
    if configured > 0:
        return configured
    if configured < 0 or max_turns(config, chat_type) > 0:
        return 0
    return derived_history_messages(window)


def build_view(
    config: ContextConfig,
    entries: Sequence[Entry],
    chat_type: str,
    window: int | None = None,
    *,
    vision: bool = True,
) -> tuple[list[Message], str, list[PruneDecision]]:
    """The view of ``entries``, its key, and the recorded prunes it applied. ``window``
    sizes the derived message limit and the pruning figures (default: ``default_window``);
    without ``vision`` the pictures people sent are placeholders (``core.media``)."""
    window = window or config.default_window
    limit = max_messages(config, chat_type, window)
    messages = build_history(entries, max_turns=max_turns(config, chat_type), max_messages=limit)
    decisions = recorded_decisions(entries)
    if decisions:
        messages = apply_decisions(messages, decisions, scaled_pruning(config.pruning, window))
    aged = 0  # messages whose pictures aged out (a change to the prefix, like a prune)
    if config.pruning.mode != "off":
        shown = messages
        messages = prune_old_images(shown, config.pruning.keep_image_turns)
        aged = sum(new is not old for new, old in zip(messages, shown, strict=True))
    if not vision:
        messages = without_vision(messages)
    # The key names what makes this view differ from a plain continuation of the
    # previous one: a compaction, a prune, or (with a turn limit) a new first message.
    key = (
        f"{_latest_id(entries, ENTRY_COMPACTION)}|"
        f"{_latest_id(entries, ENTRY_CUSTOM, PRUNE_CUSTOM_TYPE)}"
    )
    if aged:
        key += f"|images:{aged}"
    if (max_turns(config, chat_type) > 0 or limit > 0) and messages:
        # In-process only (str hashes are salted per process), like the accountant.
        key += f"|{hash(messages[0].text)}:{len(messages[0].content)}"
    return messages, key, decisions


def inspect_view(
    config: ContextConfig,
    entries: Sequence[Entry],
    chat_type: str,
    window: int | None = None,
    *,
    vision: bool = True,
) -> ContextView:
    """``build_view`` plus the counts of what pruning and the history limits left out."""
    messages, _, decisions = build_view(config, entries, chat_type, window, vision=vision)
    dropped = 0
    limit = max_messages(config, chat_type, window or config.default_window)
    if max_turns(config, chat_type) > 0 or limit > 0:
        full = build_history(entries, max_turns=0)
        dropped = max(
            0,
            sum(map(is_turn_start, full)) - sum(map(is_turn_start, messages)),
        )
    trimmed = {i for d in decisions for i in d.soft}
    cleared = {i for d in decisions for i in d.hard}
    return ContextView(messages, len(trimmed - cleared), len(cleared), dropped)


async def record_prune(
    transcript: SessionTranscript,
    messages: list[Message],
    decisions: Sequence[PruneDecision],
    config: ContextConfig,
    *,
    window: int,
    now: datetime,
) -> PruneDecision | None:
    """Decide the next prune of ``messages`` (``core.context.pruning.decide``, with the
    window's scaled figures) and record it in the transcript; None when none is due."""
    if config.pruning.mode == "off":
        return None
    decision = decide(
        messages,
        now=now,
        last_call_at=last_call_at(transcript.live_entries()),
        window_tokens=window,
        settings=scaled_pruning(config.pruning, window),
        already=decisions,
    )
    if decision is None:
        return None
    await asyncio.to_thread(transcript.append_custom, PRUNE_CUSTOM_TYPE, decision.to_dict())
    log.info(
        "pruned session=%s reason=%s soft=%d hard=%d ratio %.2f→%.2f",
        transcript.header.key,
        decision.reason,
        len(decision.soft),
        len(decision.hard),
        decision.ratio_before,
        decision.ratio_after,
    )
    return decision
