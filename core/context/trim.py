"""The deterministic trim: making a view fit a token budget without a model.

The last step of the guard, after the flush and the compaction: when the request would
still not fit, the view is cut by code, in this order, until it does:

1. tool results are emptied (``TRIMMED_RESULT``), oldest first, sparing the newest user
   turn's own;
2. whole turns are dropped from the front (after a leading summary), oldest first; the
   newest turn always stays;
3. inside the newest turn, its older tool results are emptied too;
4. an earlier message that never fit (it failed, and the next one merged into the same
   user turn) is replaced by a note saying so; the newest words never are.

What still does not fit raises ``ContextBudgetError`` with the tokens needed and the
tokens that fit. The transcript is never touched: only this request's view is cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from parley.core.context.history import is_summary_block, is_turn_start, repair_history
from parley.core.errors import (
    CAUSE_HISTORY,
    CAUSE_MESSAGE,
    CAUSE_SYSTEM,
    ContextBudgetError,
)
from parley.core.messages import Message, TextBlock, ToolResultBlock
from parley.core.prompt import is_group_context, is_recall_block, is_turn_context

TRIMMED_RESULT = "[tool result removed from this request to fit the context window]"

# The request's estimated size with these messages (system prompt and tools included).
RequestTotal = Callable[[Sequence[Message]], int]


def fit_view(
    messages: Sequence[Message],
    budget: int,
    total: RequestTotal,
    count_text: Callable[[str], int],
) -> tuple[list[Message], int]:
    """Make the view fit ``budget`` tokens without a model: oldest tool results
    emptied first, then oldest turns dropped; the newest turn always stays."""
    fitted = list(messages)
    trimmed = 0

    if total(fitted) <= budget:
        return fitted, 0
    # 1. Empty tool results, oldest first, sparing the newest user turn's own.
    protect = _last_turn_start(fitted)
    for index, message in enumerate(fitted):
        if index >= protect or message.role != "tool_result":
            continue
        emptied = _emptied(message)
        if emptied is not message:
            fitted[index] = emptied
            trimmed += 1
            if total(fitted) <= budget:
                return fitted, trimmed
    # 2. Drop whole turns from the front (after a leading summary), oldest first.
    head = 1 if fitted and _is_summary(fitted[0]) else 0
    while total(fitted) > budget:
        start = _next_turn_start(fitted, head + 1)
        if start is None or start >= _last_turn_start(fitted):
            break
        trimmed += start - head
        fitted = fitted[:head] + fitted[start:]
    fitted = repair_history(fitted)
    # 3. Inside the newest turn: empty its older tool results too.
    for index, message in enumerate(fitted):
        if total(fitted) <= budget:
            break
        if message.role == "tool_result" and (emptied := _emptied(message)) is not message:
            fitted[index] = emptied
            trimmed += 1
    # 4. An earlier message that never fit (it failed, and the next one merged into the
    # same user turn) is left out of the request; the newest words never are.
    if total(fitted) > budget:
        fitted, dropped = _drop_merged_text(fitted, budget, total, count_text)
        trimmed += dropped
    needed = total(fitted)
    if needed > budget:
        cause = _cause(fitted, budget, total)
        raise ContextBudgetError(
            f"the request needs about {needed:,} tokens but only {budget:,} fit the "
            f"model's window {_CAUSE_TEXT[cause]}",
            used=needed,
            limit=budget,
            cause=cause,
        )
    return fitted, trimmed


_CAUSE_TEXT = {
    CAUSE_HISTORY: "even after trimming the history",
    CAUSE_MESSAGE: "with the newest message alone",
    CAUSE_SYSTEM: "with the system prompt and tools alone",
}


def _cause(fitted: Sequence[Message], budget: int, total: RequestTotal) -> str:
    """What keeps a trimmed view over ``budget``: the system prompt and tools alone, the
    newest turn alone, or what is left of the history (a summary) with it."""
    if total([]) > budget:
        return CAUSE_SYSTEM
    if total(fitted[_last_turn_start(fitted) :]) > budget:
        return CAUSE_MESSAGE
    return CAUSE_HISTORY


def _drop_merged_text(
    messages: list[Message],
    budget: int,
    total: RequestTotal,
    count_text: Callable[[str], int],
) -> tuple[list[Message], int]:
    index = _last_turn_start(messages)
    if not messages or messages[index].role != "user":
        return messages, 0
    blocks = list(messages[index].content)
    # Protect the newest message: its text and the turn context riding after it.
    protect = 2 if blocks and is_turn_context(blocks[-1]) else 1
    dropped = 0
    for position in range(max(0, len(blocks) - protect)):
        block = blocks[position]
        if not isinstance(block, TextBlock) or is_turn_context(block):
            continue
        tokens = count_text(block.text)
        if is_recall_block(block):
            # Recalled memory rides first in the message, so it goes first.
            note = f"[~{tokens:,} tokens of recalled memory left out to fit the window]"
        elif is_group_context(block):
            # Then what others said in the group, before any words of the person.
            note = f"[~{tokens:,} tokens of earlier group messages left out to fit the window]"
        else:
            note = (
                f"[an earlier message of ~{tokens:,} tokens did not fit the context window "
                "and is left out of this request]"
            )
        blocks[position] = TextBlock(note)
        dropped += 1
        candidate = [*messages[:index], Message("user", tuple(blocks)), *messages[index + 1 :]]
        if total(candidate) <= budget:
            return candidate, dropped
    if not dropped:
        return messages, 0
    return [*messages[:index], Message("user", tuple(blocks)), *messages[index + 1 :]], dropped


def _emptied(message: Message) -> Message:
    """The tool-result message with every result's text replaced by ``TRIMMED_RESULT``
    (the same object when there was nothing left to empty)."""
    blocks = tuple(
        ToolResultBlock(b.tool_use_id, TRIMMED_RESULT, b.is_error)
        if isinstance(b, ToolResultBlock) and b.content != TRIMMED_RESULT
        else b
        for b in message.content
    )
    return message if blocks == message.content else Message("tool_result", blocks)


def _is_summary(message: Message) -> bool:
    return message.role == "user" and bool(message.content) and is_summary_block(message.content[0])


def _turn_starts(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if is_turn_start(m)]


def _last_turn_start(messages: Sequence[Message]) -> int:
    starts = _turn_starts(messages)
    return starts[-1] if starts else 0


def newest_turn_start(messages: Sequence[Message]) -> int:
    """The index of the newest user turn's first message (0 when there is none)."""
    return _last_turn_start(messages)


def _next_turn_start(messages: Sequence[Message], after: int) -> int | None:
    for index in _turn_starts(messages):
        if index >= after:
            return index
    return None
