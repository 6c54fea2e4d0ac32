"""OpenAICompatProvider against a real llama.cpp server (``tests.llama_server``).

What a fake cannot show: the real wire format and its deltas, the window and tool
support the server publishes, its own overflow error, a reply stopped by the window,
a server that goes away, and streams that stall or merely crawl (through a shaping TCP
proxy, ``tests.net_faults``). The model is SmolLM2-135M on one thread, so replies are
kept to a few tokens where the test allows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from parley.core.errors import ContextOverflowError, ProviderConnectionError, ProviderTimeoutError
from parley.core.messages import Message, ToolSpec
from parley.core.providers.base import (
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    ModelFacts,
    ProviderRequest,
)
from parley.core.providers.openai_compat import OpenAICompatProvider
from parley.core.providers.provider_config import RetryConfig
from parley.core.providers.retry import call_with_retry
from tests.core.providers.conftest import LLAMA_N_CTX
from tests.llama_server import LlamaServer
from tests.net_faults import ShapingProxy

MODEL = "smollm2"  # llama.cpp serves its one model whatever the id says
KEY = "not-needed"
SMALL_N_CTX = 256  # llama.cpp's smallest window
PROMPT = "Tell me a long story about a lighthouse keeper."
# Most of the small window: the reply fills the rest quickly (reading a prompt is several
# times faster than writing a reply on a CPU).
LONG_PROMPT = PROMPT + " The sea, the light, the keeper and the storm." * 16
WEATHER = ToolSpec(
    "weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
# Every wait in these tests is bounded: a regression fails, it does not hang the run.
LIMIT = 60.0


def request(
    text: str = PROMPT, *, max_tokens: int = 12, tools: tuple[ToolSpec, ...] = ()
) -> ProviderRequest:
    # Greedy decoding: the same prompt always gives the same reply.
    return ProviderRequest(
        MODEL, "", (Message.user(text),), tools, max_tokens=max_tokens, temperature=0.0
    )


class Deltas:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.times: list[float] = []

    async def __call__(self, text: str) -> None:
        self.items.append(text)
        self.times.append(time.monotonic())


@pytest.fixture
def small_server() -> Iterator[LlamaServer]:
    """A server of this test's own (a small window, or one the test stops)."""
    with LlamaServer(n_ctx=SMALL_N_CTX) as server:
        yield server


def provider_for(base_url: str, **kwargs: float) -> OpenAICompatProvider:
    return OpenAICompatProvider(MODEL, KEY, base_url=base_url, **kwargs)


@pytest.fixture
async def provider(llama_server: LlamaServer) -> AsyncIterator[OpenAICompatProvider]:
    provider = provider_for(llama_server.base_url)
    yield provider
    await provider.aclose()


async def whole_answer(server: LlamaServer, body: dict[str, object]) -> dict[str, object]:
    """The server's own non-streamed answer, asked without the SDK."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.base_url}/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        answer: dict[str, object] = await response.json()
        return answer


# -- streaming ------------------------------------------------------------------------------


async def test_deltas_arrive_in_order_and_join_to_the_reply(
    llama_server: LlamaServer, provider: OpenAICompatProvider
) -> None:
    deltas = Deltas()
    async with asyncio.timeout(LIMIT):
        response = await provider.complete(request(max_tokens=12), deltas)
        reference = await whole_answer(
            llama_server,
            {
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 12,
                "temperature": 0.0,
            },
        )
    text = response.message.text
    assert len(deltas.items) >= 6  # token by token, not one block at the end
    assert "".join(deltas.items) == text
    # The server's own whole answer to the same greedy request: same words, same order.
    choices = reference["choices"]
    assert isinstance(choices, list)
    assert choices[0]["message"]["content"] == text
    # Its own cap stopped it, far from the window: not an overflow.
    assert response.stop_reason == STOP_MAX_TOKENS
    assert response.usage.output_tokens == 12
    assert response.usage.context_tokens > 0


# -- what the server says of its model --------------------------------------------------------


async def test_discovery_reads_the_window_and_tool_support(
    provider: OpenAICompatProvider,
) -> None:
    async with asyncio.timeout(LIMIT):
        await provider.start()
    assert provider.facts == ModelFacts(
        context_window=LLAMA_N_CTX,
        source="llama.cpp /props",
        supports_tools=False,  # SmolLM2's template has no tool support
        prompt_only_window=True,
        server="llama.cpp",
        supports_vision=False,  # /props' modalities: no vision projector loaded
    )
    assert provider.context_window == LLAMA_N_CTX
    assert provider.supports_tools is False


async def test_the_server_says_the_model_takes_no_tools(llama_server: LlamaServer) -> None:
    provider = provider_for(llama_server.base_url)
    try:
        async with asyncio.timeout(LIMIT):
            assert provider.supports_tools is True  # nobody has said otherwise yet
            await provider.start()
    finally:
        await provider.aclose()
    # SmolLM2's template has no tools: the gateway withholds them (gateway.app.tools_offered).
    assert provider.supports_tools is False
    assert provider.facts.supports_tools is False


# -- the window ---------------------------------------------------------------------------------


async def test_a_prompt_over_the_window_is_context_overflow(
    provider: OpenAICompatProvider,
) -> None:
    with pytest.raises(ContextOverflowError) as caught:
        async with asyncio.timeout(LIMIT):
            await provider.complete(request("lighthouse " * 3000))
    error = caught.value
    assert error.limit == LLAMA_N_CTX
    assert error.observed_tokens is not None and error.observed_tokens > LLAMA_N_CTX
    assert not error.retryable


async def test_a_reply_stopped_by_the_window_is_overflow(small_server: LlamaServer) -> None:
    provider = provider_for(small_server.base_url)
    try:
        async with asyncio.timeout(LIMIT):
            first = await provider.complete(request(LONG_PROMPT, max_tokens=4096))
            prompt = first.usage.context_tokens
            await provider.start()
            assert provider.context_window == SMALL_N_CTX
            # A cap far above the window, and the window known: only it stopped the reply.
            second = await provider.complete(request(LONG_PROMPT, max_tokens=4096))
            # A cap reached exactly at the window's edge: a retry would be cut the same way.
            third = await provider.complete(request(LONG_PROMPT, max_tokens=SMALL_N_CTX - prompt))
    finally:
        await provider.aclose()
    # Without the window the server published, a short "length" may be its own output cap.
    assert first.stop_reason == STOP_MAX_TOKENS
    assert prompt > SMALL_N_CTX // 2
    assert prompt + first.usage.output_tokens == SMALL_N_CTX
    assert second.stop_reason == STOP_OVERFLOW
    assert second.message.text  # what it wrote is kept
    assert third.usage.output_tokens == SMALL_N_CTX - prompt
    assert third.stop_reason == STOP_MAX_TOKENS


# -- a server that goes away ------------------------------------------------------------------


async def test_a_stopped_server_is_a_retryable_connection_error(
    small_server: LlamaServer,
) -> None:
    provider = provider_for(small_server.base_url)
    delays: list[float] = []

    async def no_wait(delay: float) -> None:
        delays.append(delay)

    try:
        async with asyncio.timeout(LIMIT):
            await provider.complete(request(max_tokens=2))
            await asyncio.to_thread(small_server.stop)
            with pytest.raises(ProviderConnectionError) as caught:
                await provider.complete(request(max_tokens=2))
            assert caught.value.retryable
            policy = RetryConfig(max_attempts=3)
            with pytest.raises(ProviderConnectionError):
                await call_with_retry(provider, request(max_tokens=2), policy, sleep=no_wait)
    finally:
        await provider.aclose()
    assert len(delays) == 2  # retried, then given up after the last attempt


# -- stalled and slow streams -------------------------------------------------------------------


async def test_a_stalled_stream_hits_the_stall_timeout(llama_server: LlamaServer) -> None:
    async with ShapingProxy(llama_server.port, pause_after_events=3) as proxy:
        provider = provider_for(proxy.base_url, stall_timeout=0.5)
        deltas = Deltas()
        try:
            async with asyncio.timeout(LIMIT):
                with pytest.raises(ProviderTimeoutError) as caught:
                    await provider.complete(request(max_tokens=64), deltas)
                stalled_for = time.monotonic() - deltas.times[-1]
        finally:
            await provider.aclose()
    assert proxy.paused.is_set()
    assert caught.value.message == "no data for 0.5 s"
    assert caught.value.retryable
    assert deltas.items  # it stalled mid-stream, after some text
    # Given up soon after the silence began, not after some whole-call limit.
    assert 0.5 <= stalled_for < 10


async def test_a_slow_but_steady_stream_is_not_cut(llama_server: LlamaServer) -> None:
    stall = 1.5
    ask = request(max_tokens=12)
    warm = provider_for(llama_server.base_url)
    try:
        async with asyncio.timeout(LIMIT):
            # The same prompt once, directly: the server caches it, so the first event
            # through the proxy is not held up by prompt processing on a busy machine.
            await warm.complete(ask)
    finally:
        await warm.aclose()
    async with ShapingProxy(llama_server.port, delay_per_event=0.25) as proxy:
        provider = provider_for(proxy.base_url, stall_timeout=stall)
        deltas = Deltas()
        try:
            async with asyncio.timeout(LIMIT):
                started = time.monotonic()
                response = await provider.complete(ask, deltas)
                took = time.monotonic() - started
        finally:
            await provider.aclose()
    assert response.usage.output_tokens == 12
    assert "".join(deltas.items) == response.message.text
    # Longer than the stall timeout twice over, and never silent for that long.
    assert took > 2 * stall
    gaps = [b - a for a, b in zip(deltas.times, deltas.times[1:], strict=False)]
    assert max(gaps) < stall
