"""The gateway drives a model by its size: the small profile (a short system prompt, a
one-line turn context) for a small window, the standard one for a large window, and
/status says which."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.core.model_profile import SMALL
from parley.core.prompt import TURN_CONTEXT_OPEN, is_turn_context
from parley.gateway.app import Gateway
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.test_app import make_config, say


def window_env(model: str, tokens: int, **extra: str) -> dict[str, str]:
    return {"PARLEY_CONTEXT__MODELS": f'{{ "{model}" = {{ context_tokens = {tokens} }} }}', **extra}


async def first_request(tmp_path: Path, env: dict[str, str]) -> tuple[ScriptedProvider, str]:
    provider = ScriptedProvider()
    channel = RecordingChannel()
    gateway = Gateway(
        make_config(tmp_path, **window_env(provider.model, **env)),
        channels=[channel],
        provider=provider,
    )  # type: ignore[arg-type]
    async with gateway:
        await say(gateway, channel, "hello there")
        status = await say(gateway, channel, "/status")
    return provider, status


def turn_context_text(provider: ScriptedProvider) -> str:
    user = provider.requests[-1].messages[-1]
    blocks = [b for b in user.content if is_turn_context(b)]
    assert len(blocks) == 1
    return blocks[0].text  # type: ignore[attr-defined]


@pytest.mark.parametrize(("tokens", "setting", "small"), [
    (8_192, "auto", True),  # a small window: the small profile
    (200_000, "auto", False),  # a large one: the standard profile
    (200_000, "small", True),  # the operator's choice wins
    (8_192, "standard", False),
])  # fmt: skip
async def test_the_profile_follows_the_window_unless_the_operator_chooses(
    tmp_path: Path, tokens: int, setting: str, small: bool
) -> None:
    provider, status = await first_request(
        tmp_path,
        {"tokens": tokens, "PARLEY_AGENT__PROFILE": setting},  # type: ignore[dict-item]
    )
    system = provider.requests[-1].system
    context = turn_context_text(provider)
    assert context.startswith(TURN_CONTEXT_OPEN)
    # A direct chat has one person in it: the compact context does not name them.
    assert ("Alice" not in context) is small, context
    assert ("Answer briefly and plainly" in system) is small, system[:200]
    assert f"Profile: {'small' if small else 'standard'}" in status


async def test_context_shows_the_small_profiles_cap_on_the_workspace_files(tmp_path: Path) -> None:
    provider = ScriptedProvider()
    channel = RecordingChannel()
    config = make_config(tmp_path, **window_env(provider.model, 8_192))
    gateway = Gateway(config, channels=[channel], provider=provider)
    async with gateway:
        await say(gateway, channel, "hello there")
        report = await say(gateway, channel, "/context")
    cap = SMALL.workspace_max_chars
    assert f"Workspace file cap: {cap:,} chars per file, {cap:,} in total" in report
