"""The ``sliding-window`` strategy: keep the last N messages, drop the rest.

The summary text is only a fixed note and the ledger (appended by the compactor),
so open asks, identifiers and decisions still survive. No model call, so it cannot
fail: it is also the last resort of every other strategy.

The cut keeps at most ``sliding_window_messages`` messages and at most the
compaction's keep budget of tokens, and falls only on a user turn start or an
assistant message, so a tool call is never separated from its result.
"""

from __future__ import annotations

from collections.abc import Sequence

from parley.core.context.compaction.strategies.base import CountEntry, CutPlan, Fold, FoldRequest
from parley.core.context.history import is_turn_start
from parley.core.transcript import Entry

SLIDING_WINDOW_NOTE = (
    "Older messages of this conversation were dropped to fit the context window; "
    "what must not be lost is listed below."
)


def sliding_cut(
    messages: Sequence[Entry], *, max_messages: int, count: CountEntry, max_keep_tokens: int
) -> int | None:
    """The index of the first kept message, or None when no cut fits the limits
    (the newest turn alone is longer) or nothing would be folded."""
    best: int | None = None
    tokens = 0
    for index in range(len(messages) - 1, 0, -1):
        tokens += count(messages[index])
        if len(messages) - index > max_messages or tokens > max_keep_tokens:
            break
        message = messages[index].message
        if is_turn_start(message) or message.role == "assistant":
            best = index
    return best


class SlidingWindowStrategy:
    name = "sliding-window"

    def __init__(self, *, max_messages: int) -> None:
        self.max_messages = max_messages

    def cut(
        self, messages: Sequence[Entry], plan: CutPlan, *, count: CountEntry, max_keep_tokens: int
    ) -> CutPlan:
        index = sliding_cut(
            messages,
            max_messages=self.max_messages,
            count=count,
            max_keep_tokens=max_keep_tokens,
        )
        if index is None:
            return plan  # the planned cut still keeps every call with its result
        return CutPlan(tuple(messages[:index]), tuple(messages[index:]))

    async def fold(self, request: FoldRequest) -> Fold:
        return Fold(SLIDING_WINDOW_NOTE, details={"dropped_messages": len(request.messages)})
