"""What every compaction strategy shares: the cut, the fold request and its result.

A strategy decides two things and nothing else: where the live window is cut
(``cut``; most keep ``plan_cut``'s choice) and the summary text that stands for the
folded part (``fold``). ``core.context.compaction.compactor.Compactor`` does the rest
the same way for all of them: the ledger, the checkpoint, the ``compaction`` entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from parley.core.context.compaction.ledger import Ledger
from parley.core.messages import Message, Usage
from parley.core.transcript import Entry


@dataclass(frozen=True, slots=True)
class CutPlan:
    summarize: tuple[Entry, ...]  # message entries folded into the summary
    kept: tuple[Entry, ...]  # message entries kept verbatim (may be empty: fold all)


@dataclass(frozen=True, slots=True)
class FoldRequest:
    """The folded part, ready to be turned into a summary text."""

    messages: tuple[Message, ...]  # folded, oldest first, turn context removed
    kept: tuple[Message, ...]  # what stays verbatim after the summary
    previous_summary: str | None  # the latest compaction's text, ledger excluded
    fresh_ledger: Ledger  # extracted from ``messages`` alone
    window: int
    threshold: int
    focus: str = ""
    # The window's room for the folded part's text and a summary call's output
    # (core.context.budget); None: the strategy's own share of the threshold.
    fold_tokens: int | None = None
    summary_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Fold:
    """A strategy's answer: the summary text (the ledger is appended by the caller)."""

    text: str
    usage: Usage = field(default_factory=Usage)
    details: Mapping[str, Any] = field(default_factory=dict)


CountEntry = Callable[[Entry], int]
CountText = Callable[[str], int]


class CompactionStrategy(Protocol):
    name: str

    def cut(
        self, messages: Sequence[Entry], plan: CutPlan, *, count: CountEntry, max_keep_tokens: int
    ) -> CutPlan:
        """Where to cut, given the message entries of the window and ``plan_cut``'s plan."""
        ...

    async def fold(self, request: FoldRequest) -> Fold:
        """The summary text; raises ``SummaryError`` when it cannot make one."""
        ...


class KeepsPlannedCut:
    """Mixin for strategies that keep ``plan_cut``'s last turns verbatim."""

    def cut(
        self, messages: Sequence[Entry], plan: CutPlan, *, count: CountEntry, max_keep_tokens: int
    ) -> CutPlan:
        return plan


def previous_bullets(previous: str | None, limit: int) -> list[str]:
    """The newest ``limit`` top-level bullet lines of a previous summary: what a
    deterministic strategy carries forward of it (headings, sub-bullets and "- none"
    placeholders are structure, not content)."""
    if not previous:
        return []
    lines = [
        line.rstrip()
        for line in previous.splitlines()
        if line.startswith("- ") and line[2:].strip().lower() not in ("", "none")
    ]
    return lines[-limit:] if limit > 0 else []
