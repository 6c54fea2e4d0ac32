"""What a person is told when the context window cannot hold a turn (issue #21)."""

from __future__ import annotations

import pytest

from parley.core.errors import (
    CAUSE_HISTORY,
    CAUSE_MESSAGE,
    CAUSE_SYSTEM,
    ContextBudgetError,
    ContextOverflowError,
    WindowTooSmallError,
)
from parley.gateway.runtime.user_errors import describe_context_error, describe_provider_error


def budget_error(used: int | None, limit: int | None, cause: str) -> ContextBudgetError:
    return ContextBudgetError("the request does not fit", used=used, limit=limit, cause=cause)


def test_a_message_bigger_than_the_window_is_said_plainly() -> None:
    text = describe_context_error(budget_error(2_326, 1_536, CAUSE_MESSAGE))
    assert "(2,326 / 1,536 tokens)" in text
    assert "shorter parts" in text
    # Neither can help: the message alone does not fit.
    assert "/compact" not in text and "/new" not in text


def test_the_history_case_advises_compact_and_new() -> None:
    text = describe_context_error(budget_error(5_000, 3_000, CAUSE_HISTORY))
    assert "(5,000 / 3,000 tokens)" in text
    assert "/compact" in text and "/new" in text


def test_a_window_too_small_for_the_system_prompt_is_for_the_operator() -> None:
    text = describe_context_error(budget_error(1_200, 900, CAUSE_SYSTEM))
    assert "operator" in text and "/compact" not in text and "/new" not in text


@pytest.mark.parametrize(("used", "limit"), [(2_326, -102), (2_326, 0), (None, -5), (100, 200)])
def test_no_negative_or_absurd_number_is_shown(used: int | None, limit: int) -> None:
    text = describe_context_error(budget_error(used, limit, CAUSE_HISTORY))
    assert "-102" not in text and "-5" not in text and "(0" not in text
    assert "100 /" not in text  # a need below what fits is no explanation


def test_window_too_small_names_the_window() -> None:
    error = WindowTooSmallError("too small", limit=1_024)
    assert "(1,024 tokens)" in describe_context_error(error)


def test_an_overflow_of_the_newest_message_alone_advises_no_command() -> None:
    alone = ContextOverflowError(
        "too long", observed_tokens=9_000, limit=8_192, prompt_only=True, cause=CAUSE_MESSAGE
    )
    text = describe_provider_error(alone, attempts=1)
    assert "(9,000 / 8,192 tokens)" in text and "shorter parts" in text
    assert "/compact" not in text and "/new" not in text
    history = ContextOverflowError("too long", observed_tokens=250_000, limit=200_000)
    assert "/compact" in describe_provider_error(history, attempts=1)
