"""`parley doctor`'s model check: the context window and where it came from, whether the
model is offered tools, and the profile, as the gateway would find them at start."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from parley.core.context.config import WINDOW_HARD_MIN_TOKENS
from parley.core.providers.base import ModelFacts
from parley.core.providers.openai_compat import OpenAICompatProvider
from parley.gateway.cli import doctor_checks
from parley.gateway.cli.doctor_checks import _check_model, _check_provider_and_model
from parley.gateway.config import LoadedConfig, load_config

MODEL = "house-model-3b"  # not in parley's built-in table


def config(home: Path, **env: str) -> LoadedConfig:
    return load_config(env={"PARLEY_HOME": str(home), "PARLEY_HTTP__PORT": "0", **env})


@asynccontextmanager
async def llama_server(n_ctx: int, *, tools: bool) -> AsyncIterator[str]:
    """A llama.cpp server's answers to what parley asks at start; yields its base URL."""

    async def props(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "default_generation_settings": {"n_ctx": n_ctx},
                "chat_template_caps": {"supports_tools": tools},
            }
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = web.Application()
    app.router.add_get("/props", props)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


@pytest.mark.skipif(
    not hasattr(OpenAICompatProvider, "discover"),
    reason="the OpenAI-compatible provider does not ask its server yet",
)
async def test_the_window_and_tools_come_from_the_llama_cpp_server(tmp_path: Path) -> None:
    async with llama_server(32_768, tools=False) as base:
        env = {"OPENAI_BASE_URL": base, "PARLEY_PROVIDERS__OPENAI__MODEL": MODEL}
        provider, model = await _check_provider_and_model(config(tmp_path, **env))
    assert provider.severity == "ok"
    assert model.check == "model" and model.severity == "ok", model.detail
    assert model.detail.startswith(
        f"{MODEL}: window 32,768 tokens, from the llama.cpp server (/props); "
        "tools withheld: the llama.cpp server says the model cannot use them; profile "
    )


class FakeProvider:
    """A provider at the seam: its model, what its server says (when it is asked)."""

    name = "openai"

    def __init__(self, model: str, facts: ModelFacts | None = None) -> None:
        self.model = model
        self.facts = ModelFacts()
        self._said = facts
        self.asked = 0
        self.closed = False

    @property
    def context_window(self) -> int | None:
        return self.facts.context_window

    @property
    def supports_tools(self) -> bool:
        return self.facts.supports_tools is not False

    async def discover(self) -> ModelFacts:
        self.asked += 1
        if self._said is None:
            raise RuntimeError("a provider breaking the never-fails contract")
        self.facts = self._said
        return self.facts

    async def aclose(self) -> None:
        self.closed = True


class NoDiscovery:
    """A provider without ``discover`` (Anthropic): parley's table has its window."""

    name = "anthropic"
    model = "claude-sonnet-4-5"
    closed = False

    async def aclose(self) -> None:
        self.closed = True


def use(monkeypatch: pytest.MonkeyPatch, provider: Any) -> None:
    monkeypatch.setattr(doctor_checks, "build_provider", lambda providers: (provider, None))


async def test_a_provider_without_discover_gets_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = NoDiscovery()
    use(monkeypatch, provider)
    finding = await _check_model(config(tmp_path))
    assert finding.severity == "ok"
    assert finding.detail == (
        "claude-sonnet-4-5: window 200,000 tokens, from parley's built-in table; "
        "tools offered; profile standard "
        "(auto: small below 16,384 tokens and for the embedded model)"
    )
    assert provider.closed


async def test_an_unknown_window_is_a_warning_that_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FakeProvider(MODEL, ModelFacts())  # the server says nothing
    use(monkeypatch, provider)
    finding = await _check_model(config(tmp_path))
    assert provider.asked == 1 and provider.closed
    assert finding.severity == "warning"
    assert (
        f'window 200,000 tokens, assumed default: set context.models."{MODEL}".context_tokens'
        in finding.detail
    )


async def test_the_config_wins_and_a_broken_discover_does_not_fail_the_doctor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FakeProvider(MODEL, None)  # discover raises
    use(monkeypatch, provider)
    models = f'{{ "{MODEL}" = {{ context_tokens = 24576, tools = false }} }}'
    finding = await _check_model(
        config(tmp_path, PARLEY_CONTEXT__MODELS=models, PARLEY_AGENT__PROFILE="small")
    )
    assert finding.severity == "ok"
    assert finding.detail == (
        f'{MODEL}: window 24,576 tokens, from your config (context.models."{MODEL}"); '
        f'tools withheld: context.models."{MODEL}".tools = false; profile small'
    )


async def test_a_window_below_the_minimum_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = WINDOW_HARD_MIN_TOKENS // 2
    use(monkeypatch, FakeProvider(MODEL, ModelFacts()))
    models = f'{{ "{MODEL}" = {{ context_tokens = {tiny} }} }}'
    finding = await _check_model(config(tmp_path, PARLEY_CONTEXT__MODELS=models))
    assert finding.severity == "error"
    assert f"window {tiny:,} tokens, from your config" in finding.detail
    assert "below the minimum" in finding.detail


async def test_an_unreachable_server_is_not_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = FakeProvider(MODEL, ModelFacts(8192, "llama.cpp /props", server="llama.cpp"))
    use(monkeypatch, provider)
    finding = await _check_model(config(tmp_path), ask=False)
    assert provider.asked == 0 and provider.closed
    assert "(the server was not asked: see provider)" in finding.detail
