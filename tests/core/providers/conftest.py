"""Fixtures for the provider tests: a clean environment, the fakes, providers on them,
and a real llama.cpp server (``tests.llama_server``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

from parley.core.providers.anthropic import AnthropicProvider
from parley.core.providers.openai_compat import OpenAICompatProvider
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.openai_api import FakeOpenAI
from tests.llama_server import LlamaServer

TEST_ANTHROPIC_MODEL = "claude-test-model"  # not in the SDK's deprecation table
TEST_OPENAI_MODEL = "gpt-test-model"
TEST_KEY = "sk-test"
# The stall timeout: short enough that a hung stream fails fast, long enough for a
# loaded 2-core machine.
TEST_STALL_SECONDS = 2.0

# The shared real server's window: small enough to overflow cheaply, big enough for a
# few short exchanges.
LLAMA_N_CTX = 2048

_PROXY_VARS = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"})


@pytest.fixture(scope="session", autouse=True)
def _clean_http_env() -> Iterator[None]:
    """Both SDKs' httpx2 trusts proxy variables and reads ANTHROPIC_*/OPENAI_* settings;
    either would send loopback traffic elsewhere or change what the tests see."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            upper = name.upper()
            if upper in _PROXY_VARS or upper.startswith(("ANTHROPIC_", "OPENAI_")):
                patch.delenv(name)
        patch.setenv("NO_PROXY", "127.0.0.1,localhost")
        patch.setenv("no_proxy", "127.0.0.1,localhost")
        yield


@pytest.fixture
async def anthropic_fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(api_key=TEST_KEY) as fake:
        yield fake


@pytest.fixture
async def openai_fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(api_key=TEST_KEY) as fake:
        yield fake


@pytest.fixture
async def anthropic_provider(anthropic_fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider(
        TEST_ANTHROPIC_MODEL,
        TEST_KEY,
        base_url=anthropic_fake.base_url,
        stall_timeout=TEST_STALL_SECONDS,
    )
    yield provider
    await provider.aclose()


@pytest.fixture
async def openai_provider(openai_fake: FakeOpenAI) -> AsyncIterator[OpenAICompatProvider]:
    provider = OpenAICompatProvider(
        TEST_OPENAI_MODEL, TEST_KEY, base_url=openai_fake.base_url, stall_timeout=TEST_STALL_SECONDS
    )
    yield provider
    await provider.aclose()


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """One real llama.cpp server (SmolLM2-135M) for the whole session; tests that stop
    a server start their own."""
    with LlamaServer(n_ctx=LLAMA_N_CTX) as server:
        yield server
