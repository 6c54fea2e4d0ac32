"""Each agent's parts at start (``gateway.runtime.agents``): a start that fails on one
agent stops what the others started; the hot path of one agent stays one lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.core.memory.index import MemoryIndex
from parley.gateway.app import Gateway
from parley.gateway.runtime.agents import AgentToolsError
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import memory_config, say, use_hashing_embedder


async def test_a_failed_start_stops_what_the_agents_before_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_hashing_embedder(monkeypatch)
    (tmp_path / "parley.toml").write_text(
        '[[agents]]\nid = "main"\n[[agents]]\nid = "bad"\ntools_deny = ["no_such_tool"]\n',
        encoding="utf-8",
    )
    closed: list[str] = []
    real_close = MemoryIndex.close

    async def close(self: MemoryIndex) -> None:
        closed.append(str(self.db_path))
        await real_close(self)

    monkeypatch.setattr(MemoryIndex, "close", close)
    gateway = Gateway(
        memory_config(tmp_path), channels=[RecordingChannel()], provider=ScriptedProvider()
    )
    with pytest.raises(AgentToolsError, match="agent 'bad': no tool named no_such_tool"):
        await gateway.start()
    # Both agents' indexes had started (the bad one's tools are checked after): both closed.
    assert sorted(closed) == sorted(
        str(tmp_path / "memory" / agent / "memory.db") for agent in ("main", "bad")
    )
    assert not gateway.ready and gateway.rt.agents == {}


async def test_one_agent_is_the_default_parts_for_every_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_hashing_embedder(monkeypatch)
    channel, provider = RecordingChannel(), ScriptedProvider()
    async with Gateway(memory_config(tmp_path), channels=[channel], provider=provider) as gateway:
        rt = gateway.rt
        (parts,) = rt.agents.values()
        assert parts.id == "main" and rt.agent("agent:main:test:direct:alice") is parts
        assert rt.agent("agent:gone:x") is parts and rt.agent(None) is parts
        assert (rt.runner, rt.memory) == (parts.runner, parts.memory)
        assert not rt.bindings
        assert await say(gateway, channel, "hi") == "echo: hi"
        assert provider.requests[-1].model == "scripted-model"
