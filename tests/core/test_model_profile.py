from __future__ import annotations

import pytest

from parley.core.model_profile import (
    SMALL,
    SMALL_WINDOW_TOKENS,
    STANDARD,
    choose_profile,
    is_embedded,
)
from parley.core.providers.base import ModelFacts
from parley.core.providers.local import LocalProvider


class Remote:
    """A provider that says nothing about itself (Anthropic, OpenAI)."""

    name = "openai"


class Served:
    """An OpenAI-compatible server's provider after discovery."""

    def __init__(self, server: str = "llama.cpp", summaries: bool = True) -> None:
        self.facts = ModelFacts(context_window=4096, server=server)
        self.supports_summaries = summaries


def test_auto_is_small_for_the_embedded_model_whatever_its_window() -> None:
    provider = LocalProvider()

    assert is_embedded(provider)
    assert choose_profile("auto", window=32_768, provider=provider) is SMALL


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (SMALL_WINDOW_TOKENS - 1, SMALL),
        (8192, SMALL),
        (SMALL_WINDOW_TOKENS, STANDARD),
        (200_000, STANDARD),
        (None, STANDARD),
    ],
)
def test_auto_follows_the_window_for_other_providers(window: int | None, expected: object) -> None:
    assert choose_profile("auto", window=window, provider=Remote()) is expected
    assert choose_profile("auto", window=window, provider=Served()) is expected


def test_auto_is_small_for_a_model_that_cannot_summarise() -> None:
    assert choose_profile("auto", window=128_000, provider=Served(summaries=False)) is SMALL


@pytest.mark.parametrize("setting", ["standard", "small"])
def test_an_explicit_setting_wins_over_window_and_provider(setting: str) -> None:
    expected = {"standard": STANDARD, "small": SMALL}[setting]

    assert choose_profile(setting, window=1024, provider=LocalProvider()) is expected
    assert choose_profile(setting, window=1_000_000, provider=Remote()) is expected


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model profile 'tiny'"):
        choose_profile("tiny", window=8192, provider=Remote())


def test_what_the_small_profile_changes() -> None:
    assert SMALL.short_prompt and SMALL.compact_turn_context
    assert SMALL.sampling()["repeat_penalty"] > 1
    assert 0 < SMALL.workspace_max_chars <= 1000


def test_the_standard_profile_changes_nothing() -> None:
    assert not STANDARD.short_prompt and not STANDARD.compact_turn_context
    assert STANDARD.sampling() == {}
