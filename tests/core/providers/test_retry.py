"""The retry policy and the error classification it rests on.

Policy tests drive a scripted provider built on a plain function (the policy is
provider-agnostic); the end-to-end tests go through the real SDK and the fake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from parley.core.errors import (
    AuthenticationError,
    ContextOverflowError,
    InvalidRequestError,
    OverloadedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
)
from parley.core.messages import Message, TextBlock
from parley.core.providers.anthropic import AnthropicProvider
from parley.core.providers.base import ProviderRequest, ProviderResponse, TextCallback
from parley.core.providers.provider_config import RetryConfig
from parley.core.providers.retry import (
    backoff_delay,
    call_with_retry,
    classify_status_error,
    parse_retry_after,
)
from tests.core.providers.conftest import TEST_ANTHROPIC_MODEL
from tests.fakes.anthropic_api import FakeAnthropic, overloaded, rate_limited
from tests.fakes.llm_common import Reply, StreamError

REQUEST = ProviderRequest("m", "system", (Message.user("hi"),))
REQUEST_FOR_FAKE = ProviderRequest(TEST_ANTHROPIC_MODEL, "system", (Message.user("hi"),))
OK = ProviderResponse((TextBlock("done"),), "end_turn")
POLICY = RetryConfig(
    max_attempts=4, base_delay_seconds=0.5, max_delay_seconds=1.5, max_retry_after_seconds=10
)


@dataclass(frozen=True)
class Streams:
    """An attempt that passes ``deltas`` to on_text (``gap`` seconds apart), then ends
    with ``then`` (raised, or returned)."""

    deltas: tuple[str, ...]
    then: ProviderError | ProviderResponse
    gap: float = 0.0


Outcome = ProviderError | ProviderResponse | Streams | Callable[[], object]


class ScriptedProvider:
    """Answers each call with the next outcome: raise an error, return a response,
    stream some text first, or hang."""

    name = "scripted"
    model = "m"

    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Streams):
            for delta in outcome.deltas:
                if outcome.gap:
                    await asyncio.sleep(outcome.gap)  # a slow, steady stream
                if on_text is not None:
                    await on_text(delta)
            outcome = outcome.then
        if isinstance(outcome, ProviderError):
            raise outcome
        if isinstance(outcome, ProviderResponse):
            return outcome
        await asyncio.Event().wait()  # a call that never answers
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        pass


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


# -- the policy -----------------------------------------------------------------------------


async def test_success_needs_no_retry() -> None:
    provider, sleeps = ScriptedProvider(OK), Sleeps()
    assert await call_with_retry(provider, REQUEST, POLICY, sleep=sleeps) is OK
    assert provider.calls == 1
    assert sleeps.delays == []


async def test_retryable_errors_are_retried_until_success() -> None:
    provider, sleeps = (
        ScriptedProvider(ServerError("500"), ProviderConnectionError("reset"), OK),
        Sleeps(),
    )
    seen: list[tuple[int, str, float]] = []

    response = await call_with_retry(
        provider,
        REQUEST,
        POLICY,
        sleep=sleeps,
        rand=lambda: 1.0,
        on_retry=lambda n, e, d: seen.append((n, e.message, d)),
    )

    assert response is OK
    assert provider.calls == 3
    assert sleeps.delays == [0.5, 1.0]
    assert seen == [(1, "500", 0.5), (2, "reset", 1.0)]


async def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    errors = [OverloadedError(f"overloaded {i}") for i in range(5)]
    provider, sleeps = ScriptedProvider(*errors), Sleeps()

    with pytest.raises(OverloadedError) as caught:
        await call_with_retry(provider, REQUEST, POLICY, sleep=sleeps, rand=lambda: 1.0)

    assert caught.value is errors[3]
    assert provider.calls == POLICY.max_attempts == 4
    assert sleeps.delays == [0.5, 1.0, 1.5]  # capped at max_delay


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequestError("bad", status=400),
        ContextOverflowError("too long", status=400),
        AuthenticationError("who?", status=401),
    ],
)
async def test_non_retryable_errors_are_raised_at_once(error: ProviderError) -> None:
    provider, sleeps = ScriptedProvider(error, OK), Sleeps()
    with pytest.raises(type(error)) as caught:
        await call_with_retry(provider, REQUEST, POLICY, sleep=sleeps)
    assert caught.value is error
    assert provider.calls == 1
    assert sleeps.delays == []


async def test_retry_after_is_honoured_exactly() -> None:
    provider, sleeps = ScriptedProvider(RateLimitError("slow down", retry_after=7.25), OK), Sleeps()
    await call_with_retry(provider, REQUEST, POLICY, sleep=sleeps, rand=lambda: 0.0)
    assert sleeps.delays == [7.25]


async def test_retry_after_over_the_cap_gives_up_at_once() -> None:
    error = RateLimitError("come back in an hour", retry_after=3600)
    provider, sleeps = ScriptedProvider(error, OK), Sleeps()
    retried: list[int] = []
    with pytest.raises(RateLimitError) as caught:
        await call_with_retry(
            provider, REQUEST, POLICY, sleep=sleeps, on_retry=lambda n, e, d: retried.append(n)
        )
    assert caught.value is error
    assert provider.calls == 1
    assert sleeps.delays == retried == []


async def test_a_configured_timeout_caps_each_whole_attempt() -> None:
    never = lambda: None  # noqa: E731 - marks "hang" in the script
    provider, sleeps = ScriptedProvider(never, never), Sleeps()
    policy = RetryConfig(max_attempts=2, base_delay_seconds=0, timeout_seconds=0.05)
    with pytest.raises(ProviderTimeoutError) as caught:
        await call_with_retry(provider, REQUEST, policy, sleep=sleeps)
    assert caught.value.provider == "scripted"
    assert caught.value.message == "no complete answer within 0.05 s"
    assert provider.calls == 2


async def test_no_whole_call_cap_unless_configured() -> None:
    """A steady stream longer than the opt-in cap: cut with the cap, whole without it."""
    steady = Streams(("a",) * 6, OK, gap=0.05)  # 0.3 s of output in all
    capped = RetryConfig(max_attempts=1, timeout_seconds=0.1)
    with pytest.raises(ProviderTimeoutError):
        await call_with_retry(ScriptedProvider(steady), REQUEST, capped, sleep=Sleeps())

    assert RetryConfig().timeout_seconds is None
    shown: list[str] = []

    async def on_text(text: str) -> None:
        shown.append(text)

    response = await call_with_retry(
        ScriptedProvider(steady), REQUEST, RetryConfig(max_attempts=1), on_text, sleep=Sleeps()
    )
    assert response is OK
    assert shown == ["a"] * 6


# -- partial output and retries -----------------------------------------------------------


async def test_partial_output_without_a_retry_hook_is_not_retried() -> None:
    """Nobody could take back "Hal": a second attempt would show "HalWhole answer"."""
    error = OverloadedError("overloaded mid-stream")
    provider, sleeps = ScriptedProvider(Streams(("Hal",), error), OK), Sleeps()
    shown: list[str] = []

    async def on_text(text: str) -> None:
        shown.append(text)

    with pytest.raises(OverloadedError) as caught:
        await call_with_retry(provider, REQUEST, POLICY, on_text, sleep=sleeps)
    assert caught.value is error
    assert provider.calls == 1
    assert sleeps.delays == []
    assert shown == ["Hal"]


async def test_failure_before_any_output_is_retried_without_a_hook() -> None:
    provider, sleeps = ScriptedProvider(Streams((), ServerError("500")), OK), Sleeps()

    async def on_text(text: str) -> None:
        pass

    assert await call_with_retry(provider, REQUEST, POLICY, on_text, sleep=sleeps) is OK
    assert provider.calls == 2


async def test_partial_output_with_a_hook_is_retried_after_the_hook() -> None:
    final = ProviderResponse((TextBlock("Whole answer"),), "end_turn")
    provider = ScriptedProvider(
        Streams(("Hal",), OverloadedError("overloaded")), Streams(("Whole", " answer"), final)
    )
    events: list[str] = []

    async def on_text(text: str) -> None:
        events.append(f"text:{text}")

    def on_retry(attempt: int, error: ProviderError, delay: float) -> None:
        events.append(f"retry:{attempt}")

    response = await call_with_retry(
        provider, REQUEST, POLICY, on_text, sleep=Sleeps(), on_retry=on_retry
    )
    assert response is final
    # The hook comes between the failed attempt's text and the next attempt's, so the
    # caller knows exactly which deltas to discard.
    assert events == ["text:Hal", "retry:1", "text:Whole", "text: answer"]


def test_backoff_grows_and_stays_within_jitter_bounds() -> None:
    policy = RetryConfig(base_delay_seconds=1, max_delay_seconds=5)
    assert [backoff_delay(n, policy, lambda: 1.0) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert [backoff_delay(n, policy, lambda: 0.0) for n in (1, 2, 3, 4)] == [0.5, 1, 2, 2.5]


# -- end to end through the SDK ---------------------------------------------------------------


async def test_retry_after_ms_from_the_wire_then_success(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.enqueue(
        rate_limited(retry_after=30, retry_after_ms=20), overloaded(), Reply("finally")
    )
    sleeps = Sleeps()
    response = await call_with_retry(
        anthropic_provider, REQUEST_FOR_FAKE, POLICY, sleep=sleeps, rand=lambda: 1.0
    )
    assert response.message.text == "finally"
    assert len(anthropic_fake.requests) == 3
    assert sleeps.delays == [0.02, 1.0]


async def test_partial_text_then_retry_is_announced(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.enqueue(
        StreamError("overloaded_error", "Overloaded", partial_text="Hal"), Reply("Whole answer")
    )
    shown: list[str] = []

    async def on_text(text: str) -> None:
        shown.append(text)

    def on_retry(attempt: int, error: ProviderError, delay: float) -> None:
        assert isinstance(error, OverloadedError)
        shown.clear()  # what a caller does with text from a failed attempt

    response = await call_with_retry(
        anthropic_provider, REQUEST_FOR_FAKE, POLICY, on_text, sleep=Sleeps(), on_retry=on_retry
    )
    assert "".join(shown) == response.message.text == "Whole answer"


# -- classification ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type", "code", "expected"),
    [
        (429, "rate_limit_error", None, RateLimitError),
        (429, "insufficient_quota", "insufficient_quota", InvalidRequestError),
        (529, "overloaded_error", None, OverloadedError),
        (503, None, None, OverloadedError),
        (200, "overloaded_error", None, OverloadedError),
        (None, "rate_limit_exceeded", None, RateLimitError),
        (500, "overloaded_error", None, OverloadedError),
        (500, "api_error", None, ServerError),
        (502, None, None, ServerError),
        (200, "api_error", None, ServerError),
        (200, "something_new", None, ServerError),
        (401, "authentication_error", None, AuthenticationError),
        (403, "permission_error", None, AuthenticationError),
        (408, None, None, ProviderTimeoutError),
        (400, "invalid_request_error", None, InvalidRequestError),
        (422, None, None, InvalidRequestError),
        (200, "invalid_request_error", None, InvalidRequestError),
        (400, "invalid_request_error", "context_length_exceeded", ContextOverflowError),
    ],
)
def test_classification(
    status: int | None, error_type: str | None, code: str | None, expected: type
) -> None:
    error = classify_status_error(
        provider="p", status=status, message="something", error_type=error_type, code=code
    )
    assert type(error) is expected
    assert error.status == status
    assert error.provider == "p"


def test_classification_keeps_retry_after_for_overload() -> None:
    error = classify_status_error(
        provider="p", status=529, message="x", headers={"retry-after": "3"}
    )
    assert isinstance(error, OverloadedError)
    assert error.retry_after == 3.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "4"}, 4.0),
        ({"retry-after": "0.25", "retry-after-ms": "100"}, 0.1),
        ({"retry-after-ms": "soon", "retry-after": "2"}, 2.0),
        ({"retry-after": "-5"}, 0.0),
        ({"retry-after": "whenever"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str] | None, expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert parse_retry_after({"retry-after": later}, now=now.timestamp()) == 30.0
