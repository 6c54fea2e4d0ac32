"""Every size the context engine plans with, derived in one place from the window.

The engine's figures were written for hosted models with 200,000-token windows: a 4,096
output reserve, a 20,000-token reserve, 20,000 tokens kept verbatim by a compaction, a
1,500-token recall block. On a 2,048-token llama.cpp server each of them alone is
larger than the window, and their differences went negative (issue #21). Here each
figure is ``min(configured, share × window)``: at 200,000 tokens and above the
configured value is the smaller one, so a large window plans exactly as before; below
that, the share takes over and the figure shrinks with the window, never past zero.

``context_budget`` computes the figures for one window into a ``ContextBudget``: the
engine's guard and trim, the compactor and its strategies, the flush's output and the
tool result cap read that object. The paths that have a window but no budget at hand
recompute their one figure from the config and the window with this module's
functions, never a copy of them: the flush's due check (``flush_soft_tokens`` of the
budget's threshold), the view's pruning (``scaled_pruning``) and message limit
(``derived_history_messages``), the summariser's call limit (``summary_tokens``) and
recall's cap (``recall_tokens``). Same functions, one module: the same window and config
give every path the same figure.

Why these shares (measured with ``bench/small_windows.py`` at 4k, 8k and 32k):

- output, a quarter: enough for a real answer (512 tokens at 2k), while three quarters
  stay for the prompt. A server that refuses prompt + max_tokens > window (OpenAI,
  vLLM) would refuse every request if the reply's reserve were the configured 4,096.
- reserve, 15%: the room between the compaction threshold and the trim limit, where a
  turn's growth (a user message, a tool result) lands before the next compaction
  folds it. 15% of 200,000 is 30,000, above the 20,000 default, so large windows keep it
  (and an operator's 30,000 still counts there).
- keep recent, 10%, and one kept turn per 2,048 tokens: a compaction must fold
  something; keeping 20,000 tokens verbatim at 8k keeps everything, and the view was
  trimmed instead (the lost "car on level 3, spot 42" of #21).
- summary and ledger, 10% each: they ride on every later call; together with the kept
  part (at most ``MAX_KEEP_SHARE`` of the threshold) and the system prompt a compacted
  view stays well under the threshold, so the next turns fit before another fold.
- recall, 7.5%: a reminder, not a second history (1,500 at 20k and above).
- what a compaction leaves, as shares of the room under the threshold once the system
  prompt and tools are counted: the kept turns at most 40%, the summary text (or
  selective's chosen messages) 30%, the ledger 20%, so 10% at least is left for the
  next turn before another fold (the kept turns rarely fill their share). At 200,000
  tokens the room is ~145,000: today's figures bind first (selective's text alone goes
  from 44,000 to ~43,700 tokens). At 2,048 these shares make a compaction leave a view
  that fits (a 400-token system prompt is a third of the room there).
- pruning, in characters of the window: hard-clear once the eligible results hold
  6.25% of it (50,000 characters at 200,000 tokens), soft-trim results over 2% of it
  (4,000 at 50,000 tokens and above), keeping head and tail in today's 3:8 proportion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from parley.core.context.config import (
    CompactionConfig,
    ContextConfig,
    FlushConfig,
    PruningConfig,
)
from parley.core.tokens import (
    CALIBRATION_MAX_RATIO,
    CALIBRATION_MIN_ESTIMATE,
    CALIBRATION_MIN_RATIO,
    TokenCounter,
)
from parley.core.transcript import ENTRY_MESSAGE, Entry

OUTPUT_SHARE = 0.25
RESERVE_SHARE = 0.15
KEEP_RECENT_SHARE = 0.10
TOKENS_PER_KEPT_TURN = 2_048
SUMMARY_SHARE = 0.10
MIN_SUMMARY_TOKENS = 256  # below this a summary is a headline, not a checkpoint
# ...but a compacted view that does not fit is worse: where the room under the threshold
# is too small for MIN_SUMMARY_TOKENS, the summary takes its fold share of the room,
# down to this sane floor.
MIN_FOLD_SUMMARY_TOKENS = 64
LEDGER_SHARE = 0.10
RECALL_SHARE = 0.075
PRUNABLE_SHARE = 0.0625
SOFT_TRIM_SHARE = 0.02
# The compaction threshold never falls below this share of the window, so a large
# output reserve cannot make every turn compact.
MIN_THRESHOLD_SHARE = 0.25
# What a compaction leaves, as shares of the room under the threshold (see above).
KEEP_ROOM_SHARE = 0.40
FOLD_ROOM_SHARE = 0.30
LEDGER_ROOM_SHARE = 0.20
# One tool result at most this share of the room (a 4k window's 0.3 x window result
# would fill what the system prompt and tools leave of it); at 200,000 tokens the
# configured 40,000-character cap is far below.
TOOL_ROOM_SHARE = 0.5
# The kept part never takes more than this share of the threshold (the summary, the
# system prompt and the 1.2 margin come on top of it): a compaction that keeps
# nearly everything would only have to run again.
MAX_KEEP_SHARE = 0.35
# The memory flush's answer: notes, not an essay (today's cap, also at large windows).
FLUSH_MAX_OUTPUT_TOKENS = 2_048
# Chars per token for the character-based pruning figures (as core.tools.truncation).
CHARS_PER_TOKEN = 4
# After an overflow the trim budget shrinks at least this much per attempt, and never
# below this share of the limit (a budget of zero would refuse even a greeting).
OVERFLOW_SHRINK = 0.85
MIN_BUDGET_SCALE = 0.05

# (window below, messages kept): the view's message limit when none is configured.
HISTORY_MESSAGE_BANDS: tuple[tuple[int, int], ...] = (
    (4_096, 12),
    (16_000, 20),
    (64_000, 50),
    (128_000, 100),
)
HISTORY_MESSAGES_ABOVE_BANDS = 200


def _share(configured: int, window: int, share: float) -> int:
    """``configured`` at most, ``share`` of the window at most, never below zero."""
    return max(0, min(configured, int(window * share)))


def output_tokens(window: int, max_output: int) -> int:
    """The reply's reserve: the engine's ``max_output``, at most a quarter of the window."""
    return max(1, min(max_output, int(window * OUTPUT_SHARE)))


def effective_reserve(window: int, compaction: CompactionConfig) -> int:
    """Tokens kept free below the trim limit: the configured reserve raised to its floor,
    at most ``RESERVE_SHARE`` of the window."""
    configured = max(compaction.reserve_tokens, compaction.reserve_tokens_floor)
    return _share(configured, window, RESERVE_SHARE)


def compaction_threshold(window: int, compaction: CompactionConfig, max_output: int) -> int:
    """Context size at which compaction triggers: the window less the output reserve
    and the reserve, never below a quarter of the window."""
    output = output_tokens(window, max(0, max_output)) if max_output > 0 else 0
    threshold = window - effective_reserve(window, compaction) - output
    return max(threshold, int(window * MIN_THRESHOLD_SHARE))


def summary_tokens(window: int, configured: int) -> int:
    """The output limit of one summary call."""
    return max(MIN_SUMMARY_TOKENS, _share(configured, window, SUMMARY_SHARE))


def recall_tokens(window: int, configured: int) -> int:
    """The recall block's cap for a window (the configured budget at large windows)."""
    return max(1, _share(configured, window, RECALL_SHARE))


def flush_soft_tokens(flush: FlushConfig, threshold: int) -> int:
    """How close below the threshold the memory flush runs: on a small window the
    configured zone would cover most of the threshold (a flush right after every
    compaction), so it never takes more than a quarter of it."""
    return max(0, min(flush.soft_threshold_tokens, threshold // 4))


def derived_history_messages(window: int) -> int:
    """How many messages the view keeps when no history limit is configured: a small
    window fills with a few dozen messages long before the threshold would fold them,
    and each message the model rereads on every call costs latency on a small model."""
    for below, messages in HISTORY_MESSAGE_BANDS:
        if window < below:
            return messages
    if window <= 128_000:
        return HISTORY_MESSAGE_BANDS[-1][1]
    return HISTORY_MESSAGES_ABOVE_BANDS


def scaled_pruning(settings: PruningConfig, window: int) -> PruningConfig:
    """The pruning settings for a window: the character thresholds scaled down, the
    configured ones at large windows. The same window gives the same settings, so a
    replayed prune gives the same bytes."""
    chars = window * CHARS_PER_TOKEN
    prunable = _share(settings.min_prunable_tool_chars, chars, PRUNABLE_SHARE)
    max_chars = max(100, _share(settings.soft_trim_max_chars, chars, SOFT_TRIM_SHARE))
    if max_chars >= settings.soft_trim_max_chars and prunable == settings.min_prunable_tool_chars:
        return settings
    scale = max_chars / settings.soft_trim_max_chars
    return settings.model_copy(
        update={
            "min_prunable_tool_chars": prunable,
            "soft_trim_max_chars": max_chars,
            "soft_trim_head_chars": int(settings.soft_trim_head_chars * scale),
            "soft_trim_tail_chars": int(settings.soft_trim_tail_chars * scale),
        }
    )


@dataclass(frozen=True, slots=True)
class ContextBudget:
    """The effective figures for one window, every one of them positive or zero."""

    window: int
    output: int  # the reply's reserve, and the request's max_tokens
    threshold: int  # compaction triggers past it
    limit: int  # the most a prompt may take before the view is trimmed: window - output
    keep_recent_tokens: int
    keep_recent_turns: int
    summary_tokens: int  # a summary call's output limit
    ledger_tokens: int  # the rendered ledger's cap
    max_keep_tokens: int  # a compaction keeps at most this much verbatim
    fold_tokens: int  # the folded part's text (summary or selected messages) at most
    tool_result_chars: int  # one tool result at most (besides core.tools' own cap)
    flush_output: int


def context_budget(
    window: int,
    config: ContextConfig,
    max_output: int,
    *,
    base_tokens: int = 0,
    margin: float = 1.0,
) -> ContextBudget:
    """The figures for ``window`` tokens with the engine's ``max_output``. ``base_tokens``:
    the system prompt and tools, counted; ``margin``: what the guard multiplies a count
    by (safety margin times calibration), so the fold figures leave a view that fits."""
    window = max(1, window)
    compaction = config.compaction
    output = output_tokens(window, max_output)
    threshold = compaction_threshold(window, compaction, max_output)
    room = max(1, int(threshold / max(margin, 1.0)) - max(0, base_tokens))
    summary = summary_tokens(window, compaction.summary_max_tokens)
    return ContextBudget(
        window=window,
        output=output,
        threshold=threshold,
        limit=max(1, window - output),
        keep_recent_tokens=_share(compaction.keep_recent_tokens, window, KEEP_RECENT_SHARE),
        keep_recent_turns=max(
            min(1, compaction.keep_recent_turns),
            min(compaction.keep_recent_turns, window // TOKENS_PER_KEPT_TURN),
        ),
        # The fold share of the room caps it, even below MIN_SUMMARY_TOKENS (a 2,048
        # window with 750 tokens of prompt and tools): the compacted view must fit.
        summary_tokens=min(summary, max(MIN_FOLD_SUMMARY_TOKENS, int(room * FOLD_ROOM_SHARE))),
        ledger_tokens=max(1, min(int(window * LEDGER_SHARE), int(room * LEDGER_ROOM_SHARE))),
        max_keep_tokens=max(1, min(int(threshold * MAX_KEEP_SHARE), int(room * KEEP_ROOM_SHARE))),
        fold_tokens=max(1, int(room * FOLD_ROOM_SHARE)),
        tool_result_chars=max(1, int(room * TOOL_ROOM_SHARE * CHARS_PER_TOKEN)),
        flush_output=min(output, FLUSH_MAX_OUTPUT_TOKENS),
    )


def shrunk_scale(scale: float, budget: ContextBudget, observed: int, limit: int) -> float:
    """The trim budget's scale after an overflow that nothing was compacted for: what
    fits (the provider's limit less the reply's reserve) over what was needed, at least
    ``OVERFLOW_SHRINK`` less each time, never below ``MIN_BUDGET_SCALE``. The reserve is
    at most a quarter of the window and of the limit, so what fits is never negative."""
    room = max(1, limit - min(budget.output, int(limit * OUTPUT_SHARE)))
    return max(MIN_BUDGET_SCALE, scale * min(OVERFLOW_SHRINK, room / max(observed, 1)))


def plausible_count(reported: int, estimated: int) -> bool:
    """Whether a provider's token count can describe the request estimated at
    ``estimated`` tokens: within the ratios calibration accepts. A reply's usage of 1
    token for a 500-token prompt says nothing about the prompt, and calibrating on it
    would halve every later estimate."""
    if estimated < CALIBRATION_MIN_ESTIMATE:
        return True  # too small to tell; calibration ignores it anyway
    ratio = reported / estimated
    return CALIBRATION_MIN_RATIO <= ratio <= CALIBRATION_MAX_RATIO


def keep_under_history_limit(
    budget: ContextBudget, entries: Sequence[Entry], limit: int, counter: TokenCounter
) -> ContextBudget:
    """``budget`` with its keep figures capped at the tokens of the newest ``limit // 2``
    messages, for a compaction the history limit triggered.

    The keep figures are token counts, and a chat of short messages fits hundreds of
    them in ``keep_recent_tokens``: a cut by tokens alone kept more messages than the
    limit shows, so the trigger fired again on the very next turn, and every turn paid
    a summary, a flush and a checkpoint copy of the whole transcript. Capped, the kept
    part is at most half the limit (every strategy's cut honours ``max_keep_tokens``),
    so the next history compaction is ``limit // 2`` messages away."""
    keep = max(1, limit // 2)
    messages = [e for e in entries if e.type == ENTRY_MESSAGE]
    if limit <= 0 or len(messages) <= keep:
        return budget
    cap = max(1, sum(counter.entry(e) for e in messages[-keep:]))
    return replace(
        budget,
        keep_recent_tokens=min(budget.keep_recent_tokens, cap),
        max_keep_tokens=min(budget.max_keep_tokens, cap),
    )
