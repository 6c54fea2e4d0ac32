"""Compaction strategies: how the folded part of a session becomes a summary text.

``compaction.strategy`` picks one; all keep the ledger and the newest turns:

- ``summary``: the staged model summary (``summary.py``; the default);
- ``selective``: the most important folded messages verbatim, no model
  (``selective.py``, rules in ``core.importance``);
- ``hierarchical``: recent tasks by key points, old ones in one line, the active
  task summarised (``hierarchical.py``);
- ``sliding-window``: the last N messages and the ledger only (``sliding_window.py``),
  also the last resort when another strategy fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from parley.core.context.compaction.strategies.base import (
    CompactionStrategy,
    CountText,
    CutPlan,
    Fold,
    FoldRequest,
)
from parley.core.context.compaction.strategies.hierarchical import HierarchicalStrategy
from parley.core.context.compaction.strategies.selective import SelectiveStrategy
from parley.core.context.compaction.strategies.sliding_window import SlidingWindowStrategy
from parley.core.context.compaction.strategies.summary import (
    FALLBACK_MODEL,
    PRIMARY,
    NamedSummarizer,
    SummaryChainError,
    SummaryStrategy,
)
from parley.core.context.compaction.summarizer import Summarizer
from parley.core.context.config import CompactionConfig

STRATEGY_SUMMARY = "summary"
STRATEGY_SELECTIVE = "selective"
STRATEGY_HIERARCHICAL = "hierarchical"
STRATEGY_SLIDING_WINDOW = "sliding-window"
# How a model that cannot write summaries compacts: the folded part's important
# messages verbatim, chosen by code; the ledger keeps the identifiers either way.
NO_MODEL_STRATEGY = STRATEGY_SELECTIVE
_NEEDS_MODEL = frozenset({STRATEGY_SUMMARY, STRATEGY_HIERARCHICAL})

__all__ = [
    "FALLBACK_MODEL",
    "NO_MODEL_STRATEGY",
    "PRIMARY",
    "STRATEGY_HIERARCHICAL",
    "STRATEGY_SELECTIVE",
    "STRATEGY_SLIDING_WINDOW",
    "STRATEGY_SUMMARY",
    "CompactionStrategy",
    "CutPlan",
    "Fold",
    "FoldRequest",
    "HierarchicalStrategy",
    "NamedSummarizer",
    "SelectiveStrategy",
    "SlidingWindowStrategy",
    "SummaryChainError",
    "SummaryStrategy",
    "build_strategy",
    "strategy_without_model",
    "summarizer_chain",
]


def strategy_without_model(configured: str) -> str | None:
    """The strategy to use instead of ``configured`` when no model can summarise
    (None: ``configured`` needs no model call)."""
    return NO_MODEL_STRATEGY if configured in _NEEDS_MODEL else None


def summarizer_chain(
    summarizer: Summarizer, fallback: Summarizer | None
) -> tuple[NamedSummarizer, ...]:
    steps = [NamedSummarizer(PRIMARY, summarizer)]
    if fallback is not None:
        steps.append(NamedSummarizer(FALLBACK_MODEL, fallback))
    return tuple(steps)


def build_strategy(
    config: CompactionConfig,
    *,
    chain: Sequence[NamedSummarizer],
    count_text: CountText,
    name: str | None = None,
) -> CompactionStrategy:
    """The strategy ``name`` (default: the configured one) wired to its dependencies."""
    chosen = name or config.strategy
    if chosen == STRATEGY_SELECTIVE:
        return SelectiveStrategy(target_ratio=config.selective_target_ratio, count_text=count_text)
    if chosen == STRATEGY_HIERARCHICAL:
        return HierarchicalStrategy(chain, recent_tasks=config.hierarchical_recent_tasks)
    if chosen == STRATEGY_SLIDING_WINDOW:
        return SlidingWindowStrategy(max_messages=config.sliding_window_messages)
    if chosen == STRATEGY_SUMMARY:
        return SummaryStrategy(chain)
    raise ValueError(f"unknown compaction strategy {chosen!r}")
