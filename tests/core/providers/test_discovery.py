"""Window and tool discovery (core.providers.discovery) against a small aiohttp fake.

The real llama.cpp answers are covered in test_llama_server.py; vLLM and Ollama are
not installed, so their answers are served here as their documented payloads, with
the garbage a server (or something else on the port) might send instead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from parley.core.messages import Message, ToolSpec
from parley.core.providers.base import ModelFacts, ProviderRequest
from parley.core.providers.discovery import (
    OLLAMA_DEFAULT_NUM_CTX,
    discover_openai_compat,
    parse_llamacpp_props,
    parse_models,
    parse_ollama_show,
    server_root,
)
from parley.core.providers.openai_compat import OpenAICompatProvider

MODEL = "llama3.2:3b"
KEY = "sk-local"


@dataclass
class FakeServer:
    """Answers each path with a canned (status, body); ``hang`` paths never answer."""

    answers: dict[str, tuple[int, Any]] = field(default_factory=dict)
    hang: set[str] = field(default_factory=set)
    seen: list[tuple[str, str, Mapping[str, str], bytes]] = field(default_factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append((request.method, request.path, dict(request.headers), body))
        if request.path in self.hang:
            await asyncio.Event().wait()
        status, payload = self.answers.get(request.path, (404, {"error": "not found"}))
        if isinstance(payload, bytes):
            return web.Response(status=status, body=payload, content_type="application/json")
        return web.json_response(payload, status=status)


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    server = FakeServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.port = runner.addresses[0][1]
    yield server
    await runner.cleanup()


def vllm_models(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"object": "list", "data": list(entries)}


def ollama_show(
    *, arch: str = "llama", trained: object = 131072, parameters: object = "", caps: object = None
) -> dict[str, Any]:
    return {
        "modelfile": "FROM llama3.2",
        "parameters": parameters,
        "template": "{{ .Prompt }}",
        "details": {"family": arch},
        "model_info": {"general.architecture": arch, f"{arch}.context_length": trained},
        "capabilities": ["completion", "tools"] if caps is None else caps,
    }


# -- vLLM ---------------------------------------------------------------------------------


async def test_vllm_window_for_the_model_id(fake: FakeServer) -> None:
    fake.answers["/v1/models"] = (
        200,
        vllm_models(
            {"id": "other", "object": "model", "owned_by": "vllm", "max_model_len": 8192},
            {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 32768},
        ),
    )
    facts = await discover_openai_compat(fake.base_url, MODEL, api_key=KEY, seconds=5)
    assert facts == ModelFacts(
        context_window=32768,
        source="vllm /v1/models",
        supports_tools=None,  # vLLM does not say
        prompt_only_window=False,
        server="vllm",
    )
    models = [s for s in fake.seen if s[1] == "/v1/models"]
    assert models[0][2]["Authorization"] == f"Bearer {KEY}"


def test_vllm_single_model_served_under_another_name() -> None:
    one = vllm_models({"id": "/models/qwen", "root": "/models/qwen", "max_model_len": 4096})
    assert parse_models(one, "qwen") == ModelFacts(4096, "vllm /v1/models", None, False, "vllm")
    two = vllm_models({"id": "a", "max_model_len": 1}, {"id": "b", "max_model_len": 2})
    assert parse_models(two, "c") is None  # which one? not said


# -- Ollama -------------------------------------------------------------------------------


async def test_ollama_window_is_num_ctx_not_the_trained_length(fake: FakeServer) -> None:
    parameters = 'num_ctx                        8192\nstop                           "<|eot_id|>"'
    fake.answers["/api/show"] = (200, ollama_show(parameters=parameters))
    facts = await discover_openai_compat(fake.base_url, MODEL, api_key=KEY, seconds=5)
    assert facts == ModelFacts(
        context_window=8192,
        source="ollama /api/show (num_ctx)",
        supports_tools=True,
        prompt_only_window=True,
        server="ollama",
        supports_vision=False,  # its capabilities list no "vision"
    )
    shows = [s for s in fake.seen if s[1] == "/api/show"]
    assert shows[0][0] == "POST"
    assert json.loads(shows[0][3])["model"] == MODEL


def test_ollama_without_num_ctx_runs_with_its_default() -> None:
    facts = parse_ollama_show(ollama_show(parameters='stop "<|eot_id|>"'))
    assert facts is not None
    assert facts.context_window == OLLAMA_DEFAULT_NUM_CTX == 4096
    assert facts.source == "ollama /api/show (default num_ctx 4096)"


def test_ollama_trained_length_below_num_ctx_wins() -> None:
    facts = parse_ollama_show(ollama_show(trained=2048, parameters="num_ctx 8192"))
    assert facts is not None
    assert (facts.context_window, facts.source) == (2048, "ollama /api/show (trained length)")


def test_ollama_without_tools_capability() -> None:
    facts = parse_ollama_show(ollama_show(caps=["completion"]))
    assert facts is not None and facts.supports_tools is False
    unsaid = parse_ollama_show(ollama_show(caps="tools"))  # not a list: not said
    assert unsaid is not None and unsaid.supports_tools is None


# -- llama.cpp ----------------------------------------------------------------------------


async def test_llamacpp_props_win_over_other_answers(fake: FakeServer) -> None:
    props = {
        "default_generation_settings": {"n_ctx": 4096},
        "chat_template_caps": {"supports_tools": True},
    }
    fake.answers["/props"] = (200, props)
    meta = {"id": "m.gguf", "owned_by": "llamacpp", "meta": {"n_ctx": 16384}}
    fake.answers["/v1/models"] = (200, vllm_models(meta))
    facts = await discover_openai_compat(fake.base_url, MODEL, seconds=5)
    assert facts == ModelFacts(4096, "llama.cpp /props", True, True, "llama.cpp")


async def test_llamacpp_models_meta_when_props_is_off(fake: FakeServer) -> None:
    meta = {"id": "m.gguf", "owned_by": "llamacpp", "meta": {"n_ctx": 16384}}
    fake.answers["/v1/models"] = (200, vllm_models(meta))
    facts = await discover_openai_compat(fake.base_url, "m.gguf", seconds=5)
    assert facts == ModelFacts(16384, "llama.cpp /v1/models", None, True, "llama.cpp")


# -- strict but tolerant --------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [],
        "props",
        {"default_generation_settings": None},
        {"default_generation_settings": {"n_ctx": "4096"}},
        {"default_generation_settings": {"n_ctx": True}},
        {"default_generation_settings": {"n_ctx": 0}},
        {"default_generation_settings": {"n_ctx": -5}},
        {"default_generation_settings": {"n_ctx": 4096.0}},
        {"default_generation_settings": {"n_ctx": 10**12}},
    ],
)
def test_props_without_a_usable_window_say_nothing(payload: object) -> None:
    assert parse_llamacpp_props(payload) is None


def test_props_with_a_window_but_an_odd_tools_flag() -> None:
    payload = {
        "default_generation_settings": {"n_ctx": 2048},
        "chat_template_caps": {"supports_tools": "false"},
    }
    facts = parse_llamacpp_props(payload)
    assert facts is not None
    assert (facts.context_window, facts.supports_tools) == (2048, None)


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {"data": "models"},
        {"data": [1, 2, 3]},
        {"data": [{"id": ["not", "hashable"], "max_model_len": "8192"}]},
        {"data": [{"id": MODEL, "max_model_len": None}]},
        {"data": [{"id": MODEL, "meta": {"n_ctx": 2048}, "owned_by": "someone"}]},
    ],
)
def test_model_lists_without_a_usable_window_say_nothing(payload: object) -> None:
    assert parse_models(payload, MODEL) is None


@pytest.mark.parametrize(
    "payload",
    [None, {"modelfile": "x"}, {"model_info": "llama", "capabilities": None}],
)
def test_show_answers_that_are_not_ollamas(payload: object) -> None:
    assert parse_ollama_show(payload) is None


async def test_garbage_and_errors_give_empty_facts(fake: FakeServer) -> None:
    fake.answers["/props"] = (200, b"<html>not json</html>")
    fake.answers["/api/show"] = (500, {"error": "boom"})
    fake.answers["/v1/models"] = (200, b'{"data": [{"id": "m", "max_model_len": ')
    assert await discover_openai_compat(fake.base_url, MODEL, seconds=5) == ModelFacts()


async def test_a_silent_server_is_given_up_on_in_time(fake: FakeServer) -> None:
    fake.hang = {"/props", "/api/show", "/v1/models"}
    started = time.monotonic()
    facts = await discover_openai_compat(fake.base_url, MODEL, seconds=0.3)
    assert facts == ModelFacts()
    assert time.monotonic() - started < 5


async def test_openai_itself_is_not_probed() -> None:
    for base_url in (None, "https://api.openai.com/v1"):
        facts = await discover_openai_compat(base_url, "gpt-test", seconds=0.01)
        assert facts == ModelFacts(prompt_only_window=False, server="openai")


@pytest.mark.parametrize(
    ("base", "root"),
    [
        ("http://h:1/v1", "http://h:1"),
        ("http://h:1/v1/", "http://h:1"),
        ("http://h:1/api/v1", "http://h:1/api"),
        ("http://h:1", "http://h:1"),
    ],
)
def test_server_root(base: str, root: str) -> None:
    assert server_root(base) == root


# -- the provider ---------------------------------------------------------------------------


async def test_start_never_hangs_and_leaves_facts_empty(fake: FakeServer) -> None:
    fake.hang = {"/props", "/api/show", "/v1/models"}
    provider = OpenAICompatProvider(MODEL, KEY, base_url=fake.base_url, discovery_timeout=0.3)
    try:
        async with asyncio.timeout(5):
            await provider.start()
    finally:
        await provider.aclose()
    assert provider.facts == ModelFacts()
    assert provider.context_window is None
    assert provider.supports_tools is True  # unknown is not "no"


async def test_start_asks_once(fake: FakeServer) -> None:
    fake.answers["/v1/models"] = (200, vllm_models({"id": MODEL, "max_model_len": 8192}))
    provider = OpenAICompatProvider(MODEL, KEY, base_url=fake.base_url)
    try:
        await provider.start()
        await provider.start()
    finally:
        await provider.aclose()
    assert provider.context_window == 8192
    assert len([s for s in fake.seen if s[1] == "/v1/models"]) == 1


@pytest.mark.parametrize("said", [True, None, False])
async def test_the_server_says_whether_tools_are_offered_and_the_request_decides(
    said: bool | None,
) -> None:
    # The gateway withholds tools when the server says no (gateway.app.tools_offered), and
    # the operator may overrule it: whatever tools the request holds are sent.
    provider = OpenAICompatProvider(MODEL, KEY, base_url="http://127.0.0.1:9/v1")
    try:
        provider.facts = ModelFacts(context_window=4096, supports_tools=said)
        tool = ToolSpec("t", "a tool", {"type": "object", "properties": {}})
        request = ProviderRequest(MODEL, "", (Message.user("hi"),), (tool,))
        assert "tools" in provider.build_params(request)
        assert provider.supports_tools is (said is not False)
    finally:
        await provider.aclose()


def test_vision_as_the_server_says_it() -> None:
    props = {"default_generation_settings": {"n_ctx": 4096}, "modalities": {"vision": True}}
    facts = parse_llamacpp_props(props)
    assert facts is not None and facts.supports_vision is True
    blind = parse_llamacpp_props({"default_generation_settings": {"n_ctx": 4096}})
    assert blind is not None and blind.supports_vision is None  # an older server: not said
    seeing = parse_ollama_show(ollama_show(caps=["completion", "vision"]))
    assert seeing is not None and seeing.supports_vision is True
    text_only = parse_ollama_show(ollama_show(caps=["completion"]))
    assert text_only is not None and text_only.supports_vision is False


@pytest.mark.parametrize(("configured", "said", "sees"), [
    (None, True, True), (None, None, False), (None, False, False),
    (False, True, False), (True, False, True),
])  # fmt: skip
async def test_vision_unset_is_what_the_server_says_at_start(
    fake: FakeServer, configured: bool | None, said: bool | None, sees: bool
) -> None:
    props: dict[str, object] = {"default_generation_settings": {"n_ctx": 4096}}
    if said is not None:
        props["modalities"] = {"vision": said}
    fake.answers["/props"] = (200, props)
    provider = OpenAICompatProvider(MODEL, KEY, base_url=fake.base_url, vision=configured)
    try:
        assert provider.vision is (configured is True)  # before start: only what is set
        await provider.start()
        assert provider.vision is sees
    finally:
        await provider.aclose()
