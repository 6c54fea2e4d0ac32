"""Cache-TTL pruning: shrinking old tool results in the model's view, never in the transcript.

Old tool results are usually the bulk of a long session and the part the model needs
least. Pruning them rewrites the prompt prefix, which throws the provider's prompt cache
away; so it runs only when the cache is already cold (``now - last_call_at >= ttl``), or
when the session is so full that keeping the cache costs more than it saves
(``prune_on_share``: the char ratio passed ``hard_clear_ratio``; a busy session would
otherwise never prune).

Decisions are **sticky**. ``decide`` names the tool_use_ids to soft-trim (head and tail
kept) or hard-clear (a placeholder); the caller records the decision as a transcript
custom entry (``PRUNE_CUSTOM_TYPE``) and ``apply_decisions`` replays every recorded
decision on each later view. Same decisions, same input, same bytes: the pruned prefix
stays identical from turn to turn, so the cache rebuilt after a prune stays warm.
``decide`` only ever returns new work (a result is soft-trimmed once; a soft-trimmed
one may later be hard-cleared).

What is never touched: user and assistant messages, everything before the first user
message (identity reads at the start of a session), the ``keep_last_assistants`` most
recent assistant messages and every tool result after the oldest of them (the current
tool loop), and tools the allow/deny globs exclude.

Sizes are characters (a ratio of the window at ``CHARS_PER_TOKEN``), not tokens: pruning
is a coarse, cheap decision made before every call.

Images: in this codebase's message vocabulary a ``ToolResultBlock``'s content is a
string, so a result holds no image blocks and its text is what gets trimmed or cleared.
An ``ImageBlock`` that shares a ``tool_result`` message with a pruned result (never made
by the runtime, but loaded transcripts may hold one) is treated as part of that result
and becomes ``PRUNED_IMAGE_PLACEHOLDER``.

Pictures people sent (``ImageBlock`` with a media store ``ref``) are pruned by age, not
size, the way OpenClaw prunes old tool results: once ``keep_image_turns`` completed
turns came after the one a picture was sent in, ``prune_old_images`` shows it as a
placeholder naming it (``core.media.pruned_placeholder``). Deterministic from the view
alone, so it needs no recorded decision: the same view prunes the same pictures.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from parley.core.context.config import PruningConfig
from parley.core.media import pruned_placeholder
from parley.core.messages import (
    Block,
    DerivedKey,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from parley.core.tools.truncation import CHARS_PER_TOKEN
from parley.core.transcript import ENTRY_CUSTOM, Entry

log = logging.getLogger("parley.core.pruning")

PRUNE_CUSTOM_TYPE = "context_prune"
PRUNED_IMAGE_PLACEHOLDER = "[image removed during context pruning]"
REASON_TTL = "ttl"
REASON_SHARE = "share"
REASONS = (REASON_TTL, REASON_SHARE)
SOFT_TRIM_JOINER = "\n…\n"
# The note soft_trim_text ends with; text ending so has been trimmed already.
_TRIM_NOTE = re.compile(
    r"\n\[Tool result trimmed: kept first \d+ chars and last \d+ chars of \d+ chars\.\]\Z"
)


@dataclass(frozen=True)
class PruneDecision:
    """One prune: which results to trim or clear, why, and the char ratio before and after."""

    soft: tuple[str, ...]
    hard: tuple[str, ...]
    reason: str
    ratio_before: float
    ratio_after: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "soft": list(self.soft),
            "hard": list(self.hard),
            "reason": self.reason,
            "ratio_before": self.ratio_before,
            "ratio_after": self.ratio_after,
        }

    @classmethod
    def from_dict(cls, raw: object) -> PruneDecision:
        """Parse ``to_dict`` output; raises ValueError for anything else."""
        if not isinstance(raw, Mapping):
            raise ValueError("a prune decision must be an object")
        ids: dict[str, tuple[str, ...]] = {}
        for key in ("soft", "hard"):
            value = raw.get(key, ())
            if not isinstance(value, list | tuple) or not all(isinstance(i, str) for i in value):
                raise ValueError(f"prune decision {key!r} must be a list of tool_use ids")
            ids[key] = tuple(value)
        reason = raw.get("reason")
        if not isinstance(reason, str):
            raise ValueError("prune decision without a reason")
        ratios: list[float] = []
        for key in ("ratio_before", "ratio_after"):
            value = raw.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"prune decision {key!r} must be a number")
            ratios.append(float(value))
        return cls(ids["soft"], ids["hard"], reason, ratios[0], ratios[1])


def recorded_decisions(entries: Sequence[Entry]) -> list[PruneDecision]:
    """The decisions recorded in ``entries``, in order; unreadable ones are skipped (logged)."""
    decisions: list[PruneDecision] = []
    for entry in entries:
        if entry.type != ENTRY_CUSTOM or entry.custom_type != PRUNE_CUSTOM_TYPE:
            continue
        try:
            decisions.append(PruneDecision.from_dict(entry.payload.get("data")))
        except ValueError as exc:
            log.warning("skipping unreadable prune decision in entry %s: %s", entry.id, exc)
    return decisions


# -- applying ------------------------------------------------------------------------------


def soft_trim_text(text: str, settings: PruningConfig) -> str:
    """The first and last chars of ``text`` with a note saying what was kept.

    Text no longer than ``soft_trim_max_chars`` (or than head plus tail) is returned
    unchanged, and so is text that already ends with the note: trimming is idempotent
    whatever the settings, so a view that already has the decisions applied can have
    them applied again.
    """
    head_n, tail_n = settings.soft_trim_head_chars, settings.soft_trim_tail_chars
    if len(text) <= settings.soft_trim_max_chars or len(text) <= head_n + tail_n:
        return text
    if _TRIM_NOTE.search(text):
        return text
    head = text[:head_n]
    tail = text[len(text) - tail_n :] if tail_n else ""
    note = (
        f"[Tool result trimmed: kept first {head_n} chars and last {tail_n} chars "
        f"of {len(text)} chars.]"
    )
    return f"{head}{SOFT_TRIM_JOINER}{tail}\n{note}"


def _prune_message(
    message: Message, soft: frozenset[str], hard: frozenset[str], settings: PruningConfig
) -> Message:
    blocks: list[Block] = []
    pruned = False
    for block in message.content:
        if isinstance(block, ToolResultBlock) and block.tool_use_id in hard:
            content = settings.hard_clear_placeholder
        elif isinstance(block, ToolResultBlock) and block.tool_use_id in soft:
            content = soft_trim_text(block.content, settings)
        else:
            blocks.append(block)
            continue
        pruned = True
        if content == block.content:
            blocks.append(block)
        else:
            blocks.append(ToolResultBlock(block.tool_use_id, content, block.is_error))
    if pruned:
        blocks = [
            TextBlock(PRUNED_IMAGE_PLACEHOLDER) if isinstance(b, ImageBlock) else b for b in blocks
        ]
    if all(new is old for new, old in zip(blocks, message.content, strict=True)):
        return message
    return Message(message.role, tuple(blocks))


def apply_decisions(
    messages: Sequence[Message], decisions: Sequence[PruneDecision], settings: PruningConfig
) -> list[Message]:
    """``messages`` with every decision applied; the input is not changed.

    Hard wins over soft. Only ``tool_result`` messages are rewritten; a message with
    nothing to change is returned as the same object, so callers (and caches keyed on
    identity) see the untouched prefix as it was. Idempotent: applying the decisions to
    a view that already has them gives that view back, message for message.
    """
    hard = frozenset(i for d in decisions for i in d.hard)
    soft = frozenset(i for d in decisions for i in d.soft) - hard
    if not hard and not soft:
        return list(messages)
    return [
        _prune_message(m, soft, hard, settings) if m.role == "tool_result" else m for m in messages
    ]


def _without_images(message: Message) -> Message:
    """``message`` with its stored pictures as placeholders; kept on the message, so the
    view hands the same copy from turn to turn (its counts and wire form kept with it)."""
    kept = message.derived(_IMAGES_PRUNED)
    if kept is None:
        kept = Message(
            message.role,
            tuple(
                TextBlock(pruned_placeholder(b)) if isinstance(b, ImageBlock) and b.ref else b
                for b in message.content
            ),
        )
        message.keep_derived(_IMAGES_PRUNED, kept)
    return kept


_IMAGES_PRUNED: DerivedKey[Message] = DerivedKey("images pruned")


def prune_old_images(messages: Sequence[Message], keep_turns: int) -> list[Message]:
    """``messages`` with the pictures of user messages older than the last ``keep_turns``
    completed turns (a user message the model has answered) as placeholders. Messages
    with nothing to change are handed back as the same objects."""
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    completed = [i for i, m in enumerate(messages) if m.role == "user" and i < last_assistant]
    if len(completed) <= keep_turns:
        return list(messages)
    cutoff = completed[-keep_turns] if keep_turns else last_assistant
    return [
        _without_images(m)
        if i < cutoff
        and m.role == "user"
        and any(isinstance(b, ImageBlock) and b.ref for b in m.content)
        else m
        for i, m in enumerate(messages)
    ]


# -- measuring -----------------------------------------------------------------------------


def _block_chars(block: Block) -> int:
    if isinstance(block, TextBlock):
        return len(block.text)
    if isinstance(block, ToolResultBlock):
        return len(block.content)
    if isinstance(block, ToolUseBlock):
        try:
            arguments = json.dumps(block.input, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError, RecursionError):  # malformed input: count its repr
            arguments = repr(block.input)
        return len(block.name) + len(arguments)
    return 0  # images: not text; see the module docstring


# Kept on each message (``Message.derived``): the view reuses the same Message objects
# from call to call, and this runs before every call. A fixed-size cache beside them
# (16,384 messages) missed on every turn once 1,000 chats' windows outgrew it.
_CHARS: DerivedKey[int] = DerivedKey("characters")


def message_chars(message: Message) -> int:
    chars = message.derived(_CHARS)
    if chars is None:
        chars = sum(_block_chars(b) for b in message.content)
        message.keep_derived(_CHARS, chars)
    return chars


def view_chars(messages: Iterable[Message]) -> int:
    """Total characters of text in the view: text, tool results, tool names and input JSON."""
    return sum(message_chars(m) for m in messages)


def _is_prunable(name: str, settings: PruningConfig) -> bool:
    name = name.lower()
    if any(fnmatchcase(name, p.lower()) for p in settings.tools_deny):
        return False
    if not settings.tools_allow:
        return True
    return any(fnmatchcase(name, p.lower()) for p in settings.tools_allow)


def _eligible_range(messages: Sequence[Message], keep_last: int) -> range | None:
    """Indexes whose tool results may be pruned; None when nothing may be."""
    first_user = next((i for i, m in enumerate(messages) if m.role == "user"), None)
    if first_user is None:
        return None
    cutoff = len(messages)
    if keep_last > 0:
        assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
        if len(assistants) < keep_last:
            return None
        cutoff = assistants[-keep_last]
    return range(first_user, cutoff) if first_user < cutoff else None


def _eligible_results(
    messages: Sequence[Message], settings: PruningConfig
) -> list[ToolResultBlock] | None:
    """Prunable result blocks in order, oldest first (first block per id wins)."""
    span = _eligible_range(messages, settings.keep_last_assistants)
    if span is None:
        return None
    names = {b.id: b.name for m in messages if m.role == "assistant" for b in m.tool_uses}
    seen: set[str] = set()
    results: list[ToolResultBlock] = []
    for index in span:
        message = messages[index]
        if message.role != "tool_result":
            continue
        for block in message.content:
            if not isinstance(block, ToolResultBlock) or block.tool_use_id in seen:
                continue
            seen.add(block.tool_use_id)
            # A result without a call has no name: only an unfiltered setup prunes it.
            if _is_prunable(names.get(block.tool_use_id, ""), settings):
                results.append(block)
    return results


# -- deciding ------------------------------------------------------------------------------


def _trigger(
    now: datetime, last_call_at: datetime | None, ratio: float, settings: PruningConfig
) -> str | None:
    if last_call_at is not None and (now - last_call_at).total_seconds() >= settings.ttl_seconds:
        return REASON_TTL
    if settings.prune_on_share and ratio > settings.hard_clear_ratio:
        return REASON_SHARE
    return None


def decide(
    messages: Sequence[Message],
    *,
    now: datetime,
    last_call_at: datetime | None,
    window_tokens: int,
    settings: PruningConfig,
    already: Sequence[PruneDecision] = (),
) -> PruneDecision | None:
    """The next prune for this view, or None when none is due or nothing new would change.

    ``messages`` may be the raw view or one with ``already`` applied (applying is
    idempotent). Works on the view with ``already`` applied, and returns only new work: results
    already soft-trimmed are not named again (one may be hard-cleared now), results
    already cleared are left alone. Soft trim first; hard clear only while the ratio is
    still at or above ``hard_clear_ratio`` and the eligible results hold at least
    ``min_prunable_tool_chars``, oldest first, stopping as soon as the ratio is below.
    Deterministic: the same arguments give the same decision.
    """
    if settings.mode != "cache-ttl":
        return None
    if window_tokens < 1:
        raise ValueError("window_tokens must be positive")
    window_chars = window_tokens * CHARS_PER_TOKEN
    view = apply_decisions(messages, already, settings)
    total = view_chars(view)
    ratio_before = total / window_chars
    reason = _trigger(now, last_call_at, ratio_before, settings)
    if reason is None or ratio_before < settings.soft_trim_ratio:
        return None
    eligible = _eligible_results(view, settings)
    if not eligible:
        return None
    done_soft = {i for d in already for i in d.soft}
    done_hard = {i for d in already for i in d.hard}
    candidates = [b for b in eligible if b.tool_use_id not in done_hard]

    sizes: dict[str, int] = {}
    new_soft: list[str] = []
    for block in candidates:
        size = len(block.content)
        if block.tool_use_id not in done_soft and size > settings.soft_trim_max_chars:
            trimmed = len(soft_trim_text(block.content, settings))
            if trimmed < size:
                new_soft.append(block.tool_use_id)
                total -= size - trimmed
                size = trimmed
        sizes[block.tool_use_id] = size

    new_hard: list[str] = []
    placeholder = len(settings.hard_clear_placeholder)
    if (
        settings.hard_clear_enabled
        and total / window_chars >= settings.hard_clear_ratio
        and sum(sizes.values()) >= settings.min_prunable_tool_chars
    ):
        for block in candidates:
            if total / window_chars < settings.hard_clear_ratio:
                break
            size = sizes[block.tool_use_id]
            if size <= placeholder:
                continue  # the placeholder would not make the view any smaller
            new_hard.append(block.tool_use_id)
            total -= size - placeholder

    hard_set = set(new_hard)
    soft = tuple(i for i in new_soft if i not in hard_set)
    if not soft and not new_hard:
        return None
    return PruneDecision(soft, tuple(new_hard), reason, ratio_before, total / window_chars)
