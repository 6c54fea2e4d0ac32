"""The streaming timeouts (core.providers.streaming): which limit fires, and says so.

The stall limit on a real server (a stalled stream and a slow, steady one) is in
test_llama_server.py; hung fakes are in each provider's tests. Here: the connect limit,
the opt-in whole-call cap, and the helpers both SDK providers share.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest

from parley.core.errors import ProviderTimeoutError, ServerError
from parley.core.messages import Message
from parley.core.providers.anthropic import AnthropicProvider
from parley.core.providers.base import ProviderRequest
from parley.core.providers.openai_compat import OpenAICompatProvider
from parley.core.providers.provider_config import ProvidersConfig, RetryConfig
from parley.core.providers.streaming import (
    StreamTimeouts,
    drive_stream,
    timeout_error,
    within_deadline,
)
from parley.gateway.providers import build_provider
from tests.core.providers.conftest import TEST_ANTHROPIC_MODEL, TEST_KEY, TEST_OPENAI_MODEL
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.llm_common import Hang
from tests.fakes.openai_api import FakeOpenAI
from tests.net_faults import unanswered_port

LIMIT = 10.0  # bounds every wait here: a regression fails instead of hanging


def request(model: str) -> ProviderRequest:
    return ProviderRequest(model, "system", (Message.user("hi"),))


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_unreachable_server_hits_the_connect_timeout(kind: str) -> None:
    with unanswered_port() as port:
        provider: OpenAICompatProvider | AnthropicProvider
        if kind == "openai":
            url = f"http://127.0.0.1:{port}/v1"
            provider = OpenAICompatProvider(
                TEST_OPENAI_MODEL, TEST_KEY, base_url=url, connect_timeout=0.3
            )
            model = TEST_OPENAI_MODEL
        else:
            url = f"http://127.0.0.1:{port}"
            provider = AnthropicProvider(
                TEST_ANTHROPIC_MODEL, TEST_KEY, base_url=url, connect_timeout=0.3
            )
            model = TEST_ANTHROPIC_MODEL
        started = time.monotonic()
        try:
            async with asyncio.timeout(LIMIT):
                with pytest.raises(ProviderTimeoutError) as caught:
                    await provider.complete(request(model))
        finally:
            await provider.aclose()
    assert caught.value.message == "could not connect within 0.3 s"
    assert caught.value.retryable
    assert caught.value.provider == kind
    assert time.monotonic() - started < LIMIT / 2


async def test_the_whole_call_cap_is_opt_in_and_says_so() -> None:
    async with FakeOpenAI(api_key=TEST_KEY) as fake:
        fake.enqueue(Hang("Started"))
        capped = OpenAICompatProvider(
            TEST_OPENAI_MODEL, TEST_KEY, base_url=fake.base_url, timeout=0.3, stall_timeout=60
        )
        assert OpenAICompatProvider(TEST_OPENAI_MODEL, TEST_KEY).timeouts.total is None
        try:
            async with asyncio.timeout(LIMIT):
                with pytest.raises(ProviderTimeoutError) as caught:
                    await capped.complete(request(TEST_OPENAI_MODEL))
        finally:
            await capped.aclose()
    assert caught.value.message == "no complete answer within 0.3 s"


async def test_anthropic_stall_through_the_provider() -> None:
    async with FakeAnthropic(api_key=TEST_KEY) as fake:
        fake.enqueue(Hang("Half"))
        provider = AnthropicProvider(
            TEST_ANTHROPIC_MODEL, TEST_KEY, base_url=fake.base_url, stall_timeout=0.3
        )
        try:
            async with asyncio.timeout(LIMIT):
                with pytest.raises(ProviderTimeoutError) as caught:
                    await provider.complete(request(TEST_ANTHROPIC_MODEL))
        finally:
            await provider.aclose()
    assert caught.value.message == "no data for 0.3 s"


def test_the_sdk_clients_get_per_operation_timeouts() -> None:
    limits = StreamTimeouts(connect=3, stall=45, total=None)
    http = limits.for_http()
    assert (http.connect, http.pool, http.write, http.read) == (3, 3, 3, 45)
    provider = OpenAICompatProvider(
        TEST_OPENAI_MODEL, TEST_KEY, connect_timeout=3, stall_timeout=45
    )
    timeout = provider._client.timeout
    assert isinstance(timeout, httpx2.Timeout)
    assert (timeout.connect, timeout.read) == (3, 45)


@pytest.mark.parametrize("default", ["anthropic", "openai"])
async def test_the_gateway_builds_providers_with_the_configured_limits(default: str) -> None:
    retry = RetryConfig(connect_timeout_seconds=3, stall_timeout_seconds=45)
    config = ProvidersConfig(default=default, retry=retry)  # type: ignore[arg-type]
    provider, _ = build_provider(config)
    try:
        assert isinstance(provider, OpenAICompatProvider | AnthropicProvider)
        assert provider.timeouts == StreamTimeouts(connect=3, stall=45, total=None)
    finally:
        await provider.aclose()
    capped, _ = build_provider(
        ProvidersConfig(default=default, retry=RetryConfig(timeout_seconds=600))  # type: ignore[arg-type]
    )
    try:
        assert isinstance(capped, OpenAICompatProvider | AnthropicProvider)
        assert capped.timeouts.total == 600
    finally:
        await capped.aclose()


def test_http_timeouts_name_their_limit() -> None:
    limits = StreamTimeouts(connect=2, stall=30)
    http_request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    read = httpx2.ReadTimeout("read", request=http_request)
    connect = httpx2.ConnectTimeout("connect", request=http_request)
    wrapped = openai.APITimeoutError(request=http_request)
    wrapped.__cause__ = connect
    cases: list[tuple[BaseException, str]] = [
        (read, "no data for 30 s"),
        (connect, "could not connect within 2 s"),
        (httpx2.PoolTimeout("pool", request=http_request), "could not connect within 2 s"),
        (wrapped, "could not connect within 2 s"),
    ]
    for exc, message in cases:
        error = timeout_error(exc, limits, "p")
        assert error is not None and error.message == message
    assert timeout_error(ValueError("no"), limits, "p") is None


async def test_within_deadline_passes_other_timeouts_through() -> None:
    async def raises_its_own() -> None:
        raise TimeoutError("from inside")

    with pytest.raises(TimeoutError, match="from inside"):
        await within_deadline(raises_its_own(), 5.0, "p")
    assert await within_deadline(asyncio.sleep(0, "done"), None, "p") == "done"


class _Events:
    """An event stream that yields its events, then waits forever."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    async def __aenter__(self) -> _Events:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[Any]:
        for event in self.events:
            yield event
        await asyncio.Event().wait()


async def test_time_in_on_text_is_not_counted_as_a_stall() -> None:
    """A slow consumer is the caller's business: only the server's silence counts."""
    seen: list[str] = []

    async def slow_on_text(text: str) -> None:
        seen.append(text)
        await asyncio.sleep(0.3)  # longer than the stall limit below

    async def open_stream() -> _Events:
        return _Events(["a", "b"])

    def apply(state: list[str], event: Any) -> str:
        state.append(event)
        return str(event)

    def translate(exc: BaseException) -> ServerError:
        return ServerError(str(exc))

    limits = StreamTimeouts(connect=1, stall=0.2)
    async with asyncio.timeout(LIMIT):
        with pytest.raises(ProviderTimeoutError) as caught:
            await drive_stream(
                open_stream,
                [],
                apply,
                translate,
                slow_on_text,
                provider="p",
                unit="event",
                timeouts=limits,
            )
    # Both events were read despite 0.3 s in on_text after each; then the real silence.
    assert seen == ["a", "b"]
    assert caught.value.message == "no data for 0.2 s"
