from __future__ import annotations

import logging

import pytest

from parley.core.context.config import CompactionConfig, ContextConfig, ModelWindowConfig
from parley.core.context.window import (
    KNOWN_CONTEXT_WINDOWS,
    WindowInfo,
    check_window,
    compaction_threshold,
    effective_reserve,
    known_window,
    resolve_window,
)
from parley.core.errors import ContextError, WindowTooSmallError

# --- the table ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("claude-sonnet-4-5-20250929", 200_000),
        ("claude-opus-4-1", 200_000),
        ("claude-3-5-haiku-latest", 200_000),
        ("claude-sonnet-4-5[1m]", 1_000_000),
        ("CLAUDE-SONNET-4[1M]", 1_000_000),
        ("gpt-4o", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("gpt-4.1-mini", 1_047_576),
        ("gpt-5-nano", 400_000),
        ("o1", 200_000),
        ("o3-mini", 200_000),
        ("o4-mini", 200_000),
        ("gpt-4-turbo-2024-04-09", 128_000),
        ("gpt-3.5-turbo-0125", 16_385),
        ("llama3.1:8b", 131_072),
        ("llama3.2", 131_072),
        ("qwen2.5:7b-instruct", 32_768),
        ("mistral:latest", 32_768),
        ("smollm2:135m", 8_192),
        ("openai/gpt-4o", 128_000),
    ],
)
def test_known_windows(model: str, expected: int) -> None:
    assert known_window(model) == expected


def test_longest_prefix_wins() -> None:
    assert KNOWN_CONTEXT_WINDOWS["gpt-4"] == 8_192
    assert known_window("gpt-4-0613") == 8_192
    assert known_window("gpt-4o-2024-08-06") == 128_000  # gpt-4o, not gpt-4
    assert known_window("gpt-4.1-nano") == 1_047_576  # gpt-4.1, not gpt-4
    assert known_window("o1-mini-2024") == 128_000  # o1-mini, not o1
    assert known_window("llama3:8b") == 8_192
    assert known_window("llama3.1:70b") == 131_072  # llama3.1, not llama3


def test_exact_id_and_case() -> None:
    assert known_window("GPT-4O") == 128_000
    assert known_window("  Gpt-4O-Mini  ") == 128_000


def test_unknown_models() -> None:
    assert known_window("totally-unknown") is None
    assert known_window("") is None
    assert known_window("some-model[1m]") is None  # the 1M suffix is Claude-only


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        KNOWN_CONTEXT_WINDOWS["x"] = 1  # type: ignore[index]


# --- resolve_window -----------------------------------------------------------------------


def _config(**kwargs: object) -> ContextConfig:
    return ContextConfig.model_validate(kwargs)


def test_config_context_tokens_preferred_over_context_window() -> None:
    cfg = _config(models={"my-model": {"context_tokens": 50_000, "context_window": 90_000}})
    assert resolve_window("my-model", cfg) == WindowInfo(50_000, "config", False)
    cfg = _config(models={"my-model": {"context_window": 90_000}})
    assert resolve_window("my-model", cfg) == WindowInfo(90_000, "config", False)


def test_config_key_and_model_case_insensitive() -> None:
    cfg = ContextConfig(models={"Claude-Custom": ModelWindowConfig(context_tokens=64_000)})
    assert resolve_window("CLAUDE-custom", cfg).tokens == 64_000


def test_config_beats_provider_beats_table_beats_default() -> None:
    model = "gpt-4o"
    cfg = _config(models={model: {"context_tokens": 40_000}})
    assert resolve_window(model, cfg, provider_window=100_000) == WindowInfo(
        40_000, "config", False
    )
    plain = _config()
    assert resolve_window(model, plain, provider_window=100_000) == WindowInfo(
        100_000, "provider", False
    )
    assert resolve_window(model, plain) == WindowInfo(128_000, "table", False)
    assert resolve_window("unknown-model", plain) == WindowInfo(200_000, "default", False)
    assert resolve_window("unknown-model", _config(default_window=64_000)).tokens == 64_000


def test_empty_config_entry_falls_through() -> None:
    cfg = _config(models={"gpt-4o": {}})
    assert resolve_window("gpt-4o", cfg) == WindowInfo(128_000, "table", False)


def test_nonpositive_provider_window_ignored() -> None:
    assert resolve_window("gpt-4o", _config(), provider_window=0).source == "table"


def test_agent_cap_only_downward() -> None:
    capped = resolve_window("claude-sonnet-4", _config(agent_max_tokens=100_000))
    assert capped == WindowInfo(100_000, "table", True)
    not_raised = resolve_window("gpt-3.5-turbo", _config(agent_max_tokens=100_000))
    assert not_raised == WindowInfo(16_385, "table", False)
    equal = resolve_window("gpt-4o", _config(agent_max_tokens=128_000))
    assert equal == WindowInfo(128_000, "table", False)


# --- check_window -------------------------------------------------------------------------


def test_block_below_minimum_with_clear_message() -> None:
    info = WindowInfo(8_192, "table", False)
    with pytest.raises(WindowTooSmallError) as caught:
        check_window(info, min_tokens=16_000, warn_below=32_000)
    err = caught.value
    assert isinstance(err, ContextError)
    assert err.limit == 8_192
    assert err.used is None
    assert "8,192" in str(err)
    assert "16,000" in str(err)


def test_capped_window_named_in_message() -> None:
    with pytest.raises(WindowTooSmallError, match="agent_max_tokens"):
        check_window(WindowInfo(4_000, "config", True), min_tokens=16_000, warn_below=32_000)


def test_at_minimum_passes_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="parley.core.window"):
        check_window(WindowInfo(16_000, "table", False), min_tokens=16_000, warn_below=32_000)
    records = [r for r in caplog.records if r.name == "parley.core.window"]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert "16,000" in records[0].getMessage()


def test_warn_below_but_not_at_threshold(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="parley.core.window"):
        check_window(WindowInfo(31_999, "table", False), min_tokens=16_000, warn_below=32_000)
        assert len(caplog.records) == 1
        caplog.clear()
        check_window(WindowInfo(32_000, "table", False), min_tokens=16_000, warn_below=32_000)
        check_window(WindowInfo(200_000, "table", False), min_tokens=16_000, warn_below=32_000)
        assert caplog.records == []


# --- reserve and threshold ----------------------------------------------------------------


def test_reserve_floor_applies() -> None:
    defaults = CompactionConfig()
    assert effective_reserve(200_000, defaults) == 20_000  # max(16384, floor 20000)
    big = CompactionConfig(reserve_tokens=30_000)
    assert effective_reserve(200_000, big) == 30_000
    no_floor = CompactionConfig(reserve_tokens_floor=0)
    assert effective_reserve(200_000, no_floor) == 16_384


def test_reserve_scales_with_small_windows() -> None:
    defaults = CompactionConfig()
    # 15% of the window below 133,334 tokens; the configured 20,000 above.
    assert effective_reserve(16_000, defaults) == 2_400
    assert effective_reserve(8_192, defaults) == 1_228
    assert effective_reserve(2_048, defaults) == 307
    assert effective_reserve(128_000, defaults) == 19_200
    assert effective_reserve(1_000_000, defaults) == 20_000
    assert effective_reserve(0, defaults) == 0


def test_threshold_200k_defaults() -> None:
    defaults = CompactionConfig()
    assert compaction_threshold(200_000, defaults, 8_192) == 200_000 - 20_000 - 8_192
    assert compaction_threshold(200_000, defaults, 0) == 180_000


def test_threshold_never_below_quarter_window() -> None:
    defaults = CompactionConfig()
    # The output reserve is at most a quarter of the window: 16,000 - 2,400 - 4,000.
    assert compaction_threshold(16_000, defaults, 8_000) == 9_600
    assert compaction_threshold(200_000, defaults, 190_000) == 130_000
    # A negative max_output is treated as 0, never raising the threshold above window - reserve.
    assert compaction_threshold(200_000, defaults, -5) == 180_000


@pytest.mark.parametrize("window", [2_048, 4_096, 8_192, 16_000])
def test_threshold_is_positive_and_below_the_window_at_small_windows(window: int) -> None:
    # The case: max_output 4,096 above a 2,048-token window.
    threshold = compaction_threshold(window, CompactionConfig(), 4_096)
    assert window // 4 <= threshold < window
