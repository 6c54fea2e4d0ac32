"""Compaction triggers beyond the token threshold: message count and age.

``compaction.max_messages`` (default 500) fires once that many messages were
written since the last compaction; ``compaction.max_age_seconds`` (off by default)
once that long has passed since it (since the first message when there was none).
A third, ``history``, fires when the live window holds more messages than the view's
history limit (``history_messages``, by default derived from the window) shows: the
limit alone would hide them from the model with no summary; folding them keeps what
matters (the summary and the ledger) in view.

All fire only at the start of a turn, when the newest message is the user's: an
assistant message with tool calls awaiting results, or results awaiting the
assistant's continuation, would be folded mid tool loop otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from parley.core.context.compaction.compactor import TRIGGER_AGE, TRIGGER_HISTORY, TRIGGER_MESSAGES
from parley.core.context.config import CompactionConfig
from parley.core.context.history import is_turn_start
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_MESSAGE, Entry


def parse_timestamp(raw: str) -> datetime | None:
    """An entry's ``ts`` as an aware datetime (naive ones are UTC); None if unreadable."""
    try:
        stamp = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _since_last_compaction(entries: Sequence[Entry]) -> tuple[Sequence[Entry], Entry | None]:
    for index in range(len(entries) - 1, -1, -1):
        if entries[index].type == ENTRY_COMPACTION:
            return entries[index + 1 :], entries[index]
    return entries, None


def at_turn_start(entries: Sequence[Entry]) -> bool:
    """Whether the newest message entry opens a user turn."""
    newest = next((e for e in reversed(entries) if e.type == ENTRY_MESSAGE), None)
    return newest is not None and is_turn_start(newest.message)


def due_trigger(
    entries: Sequence[Entry], config: CompactionConfig, now: datetime, *, history_limit: int = 0
) -> str | None:
    """``TRIGGER_MESSAGES``, ``TRIGGER_HISTORY`` or ``TRIGGER_AGE`` when one is due now,
    else None. ``history_limit``: the view's message limit (0 = none)."""
    if not at_turn_start(entries):
        return None
    since, last = _since_last_compaction(entries)
    messages = [e for e in since if e.type == ENTRY_MESSAGE]
    if config.max_messages > 0 and len(messages) >= config.max_messages:
        return TRIGGER_MESSAGES
    if history_limit > 0 and sum(e.type == ENTRY_MESSAGE for e in entries) > history_limit:
        return TRIGGER_HISTORY
    if config.max_age_seconds is not None:
        start = last if last is not None else (messages[0] if messages else None)
        stamp = parse_timestamp(start.ts) if start is not None else None
        if stamp is not None and (now - stamp).total_seconds() >= config.max_age_seconds:
            return TRIGGER_AGE
    return None
