"""The ``summary`` strategy: the staged model summary of ``core.context.compaction.summarizer``.

The summariser retries each call with backoff (``call_with_retry``); when its model
still fails, the same provider is asked with ``compaction.fallback_model``. Only
when both fail does the strategy raise, and the compactor falls back to the sliding
window, so a compaction always produces an entry.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from parley.core.context.compaction.strategies.base import Fold, FoldRequest, KeepsPlannedCut
from parley.core.context.compaction.summarizer import Summarizer, SummaryResult
from parley.core.errors import SummaryError
from parley.core.messages import Message

log = logging.getLogger("parley.core.compaction")

# The summary is asked to reproduce only the newest identifiers (one regeneration when
# it does not); the ledger carries all of them verbatim either way.
REQUIRED_IDENTIFIERS = 24
PRIMARY = "summarizer"
FALLBACK_MODEL = "fallback-model"


@dataclass(frozen=True, slots=True)
class NamedSummarizer:
    name: str  # PRIMARY or FALLBACK_MODEL: recorded as the step that produced a text
    summarizer: Summarizer


class SummaryChainError(SummaryError):
    """Every summariser failed; ``failures`` names each step and why."""

    def __init__(self, failures: Sequence[str]) -> None:
        super().__init__("; ".join(failures) or "no summariser configured")
        self.failures = tuple(failures)


async def summarize_with_fallback(
    chain: Sequence[NamedSummarizer],
    messages: Sequence[Message],
    *,
    window: int,
    previous_summary: str | None,
    focus: str,
    required_identifiers: Sequence[str],
    max_tokens: int | None = None,
) -> tuple[SummaryResult, str, list[str]]:
    """The first summariser of ``chain`` that succeeds: its result, its name and the
    failures before it. Raises ``SummaryChainError`` when all fail."""
    failures: list[str] = []
    for step in chain:
        try:
            result = await step.summarizer.summarize(
                messages,
                window=window,
                previous_summary=previous_summary,
                focus=focus,
                required_identifiers=required_identifiers,
                max_tokens=max_tokens,
            )
        except SummaryError as exc:
            log.warning("compaction summariser step %s failed: %s", step.name, exc.message)
            failures.append(f"{step.name}: {exc.message}")
            continue
        return result, step.name, failures
    raise SummaryChainError(failures)


class SummaryStrategy(KeepsPlannedCut):
    name = "summary"

    def __init__(self, chain: Sequence[NamedSummarizer]) -> None:
        self.chain = tuple(chain)

    async def fold(self, request: FoldRequest) -> Fold:
        result, produced_by, failures = await summarize_with_fallback(
            self.chain,
            request.messages,
            window=request.window,
            previous_summary=request.previous_summary,
            focus=request.focus,
            required_identifiers=request.fresh_ledger.identifiers[-REQUIRED_IDENTIFIERS:],
            max_tokens=request.summary_tokens,
        )
        details: dict[str, object] = {
            "produced_by": produced_by,
            "summary_calls": result.calls,
            "summary_stages": result.stages,
            "oversized_omitted": result.oversized,
            "regenerated": result.regenerated,
        }
        if failures:
            details["fallbacks"] = failures
        return Fold(result.text, result.usage, details)
