"""Tools are offered to a model only when it can use them: the operator's per-model word,
else what the model's server said at start (``supports_tools``), else yes."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.gateway.app import Gateway
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.test_app import make_config, say


class ToollessServer(ScriptedProvider):
    """A model whose server said at start that its template has no tools."""

    supports_tools = False


@pytest.mark.parametrize(
    ("provider_says", "configured", "offered"),
    [
        (None, None, True),  # nobody says no: tools are offered
        (False, None, False),  # the server says no
        (False, "true", True),  # the operator overrules the server
        (None, "false", False),  # the operator withholds them from a capable server
    ],
)
async def test_tools_reach_the_model_only_when_it_can_use_them(
    tmp_path: Path, provider_says: bool | None, configured: str | None, offered: bool
) -> None:
    provider = ToollessServer() if provider_says is False else ScriptedProvider()
    env = {}
    if configured is not None:
        env["PARLEY_CONTEXT__MODELS"] = f'{{ "{provider.model}" = {{ tools = {configured} }} }}'
    channel = RecordingChannel()
    gateway = Gateway(make_config(tmp_path, **env), channels=[channel], provider=provider)
    async with gateway:
        await say(gateway, channel, "hello")
    request = provider.requests[-1]
    assert bool(request.tools) is offered
    # The system prompt's tool instructions follow the same decision.
    assert ("memory_search" in request.system) is offered
