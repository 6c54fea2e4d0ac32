"""The figures the engine plans with, from a 2,048-token window to 1,000,000 tokens."""

from __future__ import annotations

import pytest

from parley.core.context.budget import (
    MIN_BUDGET_SCALE,
    context_budget,
    derived_history_messages,
    effective_reserve,
    flush_soft_tokens,
    plausible_count,
    recall_tokens,
    scaled_pruning,
    shrunk_scale,
)
from parley.core.context.config import ContextConfig
from parley.core.memory.recall import DEFAULT_RECALL_BUDGET_TOKENS

WINDOWS = [2_048, 4_096, 8_192, 32_768, 200_000, 1_000_000]
DEFAULTS = ContextConfig()


@pytest.mark.parametrize("window", WINDOWS)
def test_every_figure_is_positive_and_fits_the_window(window: int) -> None:
    # max_output 4,096 is more than a 2,048-token window holds: the issue's case.
    b = context_budget(window, DEFAULTS, 4_096)
    assert 0 < b.output <= window // 4
    assert 0 < b.threshold < b.limit < window
    assert b.limit == window - b.output
    reserve = effective_reserve(window, DEFAULTS.compaction)
    assert b.threshold + reserve + b.output <= window
    for figure in (reserve, b.keep_recent_tokens, b.summary_tokens, b.ledger_tokens):
        assert 0 < figure < b.threshold
    assert b.keep_recent_turns >= 1
    assert 0 < flush_soft_tokens(DEFAULTS.flush, b.threshold) <= b.threshold // 4
    assert 0 < b.flush_output <= b.output
    # What a compaction keeps plus the summary and the ledger leave room under the
    # threshold for the system prompt and the next turns.
    assert b.keep_recent_tokens + b.summary_tokens + b.ledger_tokens <= 0.6 * b.threshold


@pytest.mark.parametrize("window", [200_000, 1_000_000])
def test_large_windows_keep_the_configured_figures(window: int) -> None:
    b = context_budget(window, DEFAULTS, 4_096)
    compaction = DEFAULTS.compaction
    assert b.output == 4_096
    assert effective_reserve(window, compaction) == compaction.reserve_tokens_floor == 20_000
    assert b.threshold == window - 20_000 - 4_096
    assert b.keep_recent_tokens == compaction.keep_recent_tokens
    assert b.keep_recent_turns == compaction.keep_recent_turns
    assert b.summary_tokens == compaction.summary_max_tokens
    assert flush_soft_tokens(DEFAULTS.flush, b.threshold) == DEFAULTS.flush.soft_threshold_tokens
    assert b.flush_output == 2_048
    assert recall_tokens(window, DEFAULT_RECALL_BUDGET_TOKENS) == DEFAULT_RECALL_BUDGET_TOKENS
    # Pruning keeps the very settings object: replayed prunes give the same bytes.
    assert scaled_pruning(DEFAULTS.pruning, window) is DEFAULTS.pruning


def test_figures_grow_with_the_window() -> None:
    budgets = [context_budget(w, DEFAULTS, 4_096) for w in WINDOWS]
    for field in (
        "output",
        "threshold",
        "limit",
        "keep_recent_tokens",
        "keep_recent_turns",
        "summary_tokens",
    ):
        values = [getattr(b, field) for b in budgets]
        assert values == sorted(values), field
    reserves = [effective_reserve(w, DEFAULTS.compaction) for w in WINDOWS]
    assert reserves == sorted(reserves)
    soft = [flush_soft_tokens(DEFAULTS.flush, b.threshold) for b in budgets]
    assert soft == sorted(soft)
    caps = [recall_tokens(w, DEFAULT_RECALL_BUDGET_TOKENS) for w in WINDOWS]
    assert caps == sorted(caps) and caps[0] == int(2_048 * 0.075)
    history = [derived_history_messages(w) for w in WINDOWS]
    assert history == sorted(history) and history[0] < history[-1]


def test_small_window_figures() -> None:
    b = context_budget(2_048, DEFAULTS, 4_096)
    assert (b.output, b.threshold, b.limit) == (512, 1_229, 1_536)
    assert effective_reserve(2_048, DEFAULTS.compaction) == 307
    assert (b.keep_recent_tokens, b.keep_recent_turns) == (204, 1)
    assert b.summary_tokens == 256  # the floor, when the room has it: a headline is no checkpoint
    eight = context_budget(8_192, DEFAULTS, 4_096)
    assert (eight.output, eight.keep_recent_tokens, eight.keep_recent_turns) == (2_048, 819, 3)


def test_at_2048_with_a_real_prompt_the_summary_fits_the_room() -> None:
    # ~750 tokens of system prompt and tools leave 479 under the 1,229 threshold: the
    # 256-token floor would not fit beside the kept turns and the ledger, so the summary
    # takes its fold share of the room instead.
    b = context_budget(2_048, DEFAULTS, 4_096, base_tokens=750)
    room = b.threshold - 750
    assert b.summary_tokens == int(room * 0.30) < 256
    assert b.summary_tokens <= b.fold_tokens
    assert b.summary_tokens + b.ledger_tokens + b.max_keep_tokens <= room
    # A room with next to nothing left still gets a sane summary, not zero.
    tiny = context_budget(2_048, DEFAULTS, 4_096, base_tokens=1_200)
    assert tiny.summary_tokens == 64


def test_a_configured_figure_below_the_share_wins() -> None:
    config = ContextConfig.model_validate(
        {"compaction": {"keep_recent_tokens": 100, "keep_recent_turns": 1}}
    )
    b = context_budget(32_768, config, 1_000)
    assert (b.output, b.keep_recent_tokens, b.keep_recent_turns) == (1_000, 100, 1)


def test_pruning_figures_scale_with_small_windows() -> None:
    small = scaled_pruning(DEFAULTS.pruning, 4_096)
    assert small.min_prunable_tool_chars == int(4_096 * 4 * 0.0625)
    assert small.soft_trim_max_chars == int(4_096 * 4 * 0.02)
    # Head and tail keep today's proportion of the kept size.
    assert small.soft_trim_head_chars == small.soft_trim_tail_chars
    assert small.soft_trim_head_chars + small.soft_trim_tail_chars < small.soft_trim_max_chars


def test_the_issues_overflow_never_gives_a_negative_budget() -> None:
    # llama.cpp, n_ctx 2,048: "needs about 2,326 tokens" with max_output 4,096. The old
    # (limit - max_output) / observed was (2,048 - 4,096) / 2,326 < 0.
    b = context_budget(2_048, DEFAULTS, 4_096)
    scale = shrunk_scale(1.0, b, 2_326, 2_048)
    assert MIN_BUDGET_SCALE < scale < 1
    assert int(b.limit * scale) > 0
    # Repeated overflows shrink it further, never to zero.
    for _ in range(10):
        scale = shrunk_scale(scale, b, 2_326, 2_048)
    assert scale == MIN_BUDGET_SCALE and int(b.limit * scale) > 0
    # A limit far below the window (the provider knows better) still leaves room.
    big = context_budget(200_000, DEFAULTS, 4_096)
    assert shrunk_scale(1.0, big, 3_000, 2_048) > MIN_BUDGET_SCALE


def test_a_count_far_from_the_estimate_is_not_plausible() -> None:
    assert plausible_count(2_300, 2_000)
    assert not plausible_count(1, 500)  # a reply's usage, not the prompt's
    assert not plausible_count(300_000, 1_000)
    assert plausible_count(1, 50)  # too small an estimate to tell
