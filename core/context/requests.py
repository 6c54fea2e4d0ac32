"""What the context engine's callers hand it and get back, per request and per turn.

``ViewRequest`` is what a request shares besides the transcript (system prompt, tools,
model, chat type); ``PreparedView`` is one call's view with the figures it was planned
with; ``TurnEvents`` is what the engine did during a turn. ``core.context.engine``
re-exports all three.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from parley.core.context.budget import ContextBudget
from parley.core.context.compaction.compactor import CompactionOutcome
from parley.core.context.flush import FlushOutcome
from parley.core.messages import Message, ToolSpec, Usage
from parley.core.tokens import ContextSize


@dataclass(frozen=True, slots=True)
class PreparedView:
    messages: tuple[Message, ...]
    size: ContextSize
    view_key: str
    window: int
    threshold: int
    budget: ContextBudget  # the figures this view was planned with (output: max_tokens)


@dataclass(slots=True)
class TurnEvents:
    """What the engine did during one turn (for the turn result, /status and logs)."""

    compactions: list[CompactionOutcome] = field(default_factory=list)
    flushes: list[FlushOutcome] = field(default_factory=list)
    prunes: int = 0
    trims: int = 0
    usage: Usage = field(default_factory=Usage)  # summariser and flush calls
    # Told what the engine is busy with while it is (a compaction, a memory flush), then
    # None: a chat shows it as a status line.
    on_status: Callable[[str | None], None] | None = None

    def status(self, text: str | None) -> None:
        if self.on_status is not None:
            self.on_status(text)

    @contextlib.contextmanager
    def busy(self, text: str) -> Iterator[None]:
        """``text`` is the status while the block runs."""
        self.status(text)
        try:
            yield
        finally:
            self.status(None)


@dataclass(frozen=True, slots=True)
class ViewRequest:
    """The parts of a request that do not come from the transcript."""

    session_key: str
    system: str
    tools: tuple[ToolSpec, ...]
    model: str
    chat_type: str = "direct"
