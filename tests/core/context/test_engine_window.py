"""The engine's window for a session: what it learns from overflows, whose window the
provider's discovered size is, and who is exempt from the minimum."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine, TurnEvents, ViewRequest
from parley.core.errors import ContextOverflowError, WindowTooSmallError
from parley.core.messages import Message
from parley.core.providers.base import ModelFacts
from parley.core.providers.provider_config import RetryConfig
from parley.core.transcript import Transcript
from tests.fakes.scripted_provider import ScriptedProvider

MODEL = "scripted-model"


def engine_for(provider: ScriptedProvider, config: ContextConfig | None = None) -> ContextEngine:
    return ContextEngine(
        config=config or ContextConfig.model_validate({"compaction": {"enabled": False}}),
        provider=provider,
        retry=RetryConfig(max_attempts=1),
        max_output=1_000,
    )


@pytest.fixture
def transcript(tmp_path: Path) -> Transcript:
    t = Transcript.create(tmp_path / "s.jsonl", "sid", "agent:main:x")
    t.append_message(Message.user("hello"))
    return t


def request(model: str = MODEL) -> ViewRequest:
    return ViewRequest("k", "You are T.", (), model)


def overflow(limit: int, observed: int | None = None) -> ContextOverflowError:
    return ContextOverflowError(
        "too long", provider="scripted", observed_tokens=observed, limit=limit
    )


async def test_a_stopped_reply_teaches_no_window(transcript: Transcript) -> None:
    engine = engine_for(ScriptedProvider())
    events = TurnEvents()
    view = await engine.prepare(transcript, request(), events)
    # A reply stopped at 2,048 tokens (prompt plus output) is where it stopped, not a
    # refusal: the session keeps its window.
    stop = ContextOverflowError("stopped", provider="scripted", limit=2_048, prompt_only=True)
    await engine.recover_overflow(transcript, request(), view, stop, events, stopped=True)
    assert engine.session_window("k", MODEL) == view.window


async def test_a_refusal_teaches_a_window_but_never_below_the_minimum(
    transcript: Transcript,
) -> None:
    engine = engine_for(ScriptedProvider())
    events = TurnEvents()
    view = await engine.prepare(transcript, request(), events)
    await engine.recover_overflow(transcript, request(), view, overflow(100_000), events)
    assert engine.session_window("k", MODEL) == 100_000
    # A refusal naming a window below the minimum cannot shrink it past the minimum.
    await engine.recover_overflow(transcript, request(), view, overflow(300), events)
    assert engine.session_window("k", MODEL) == engine.config.min_window_tokens


def sized(window: int, server: str) -> ScriptedProvider:
    """A provider that discovered its model's window (``context_window`` and facts)."""
    provider = ScriptedProvider()
    provider.context_window = window  # type: ignore[attr-defined]
    provider.facts = ModelFacts(context_window=window, source="test", server=server)  # type: ignore[attr-defined]
    return provider


def test_a_server_with_a_window_below_the_minimum_is_refused() -> None:
    # A llama.cpp server run with -c 512: refused up front, not failing every turn later.
    engine = engine_for(sized(512, "llama.cpp"))
    with pytest.raises(WindowTooSmallError):
        engine.check(MODEL)


def test_the_embedded_model_is_exempt_from_the_minimum() -> None:
    engine = engine_for(sized(512, "embedded"))
    assert engine.check(MODEL).tokens == 512


def test_the_discovered_window_is_the_providers_own_models_only() -> None:
    engine = engine_for(sized(8_192, "llama.cpp"))
    assert engine.window(MODEL).tokens == 8_192
    # Another model id of the session is not the server's loaded model.
    other = engine.window("claude-sonnet-4-5")
    assert other.tokens != 8_192
    assert other.tokens == engine_for(ScriptedProvider()).window("claude-sonnet-4-5").tokens
