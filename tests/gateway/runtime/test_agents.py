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
        assert (rt.runner, rt.memory, rt.profile) == (parts.runner, parts.memory, parts.profile)
        assert rt.memory is not None
        assert not rt.bindings
        assert await say(gateway, channel, "hi") == "echo: hi"
        assert provider.requests[-1].model == "scripted-model"
    # Its index closed with the gateway: none is handed out after the stop.
    assert gateway.memory is None and rt.agents == {}


async def test_file_tools_never_reach_another_agents_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default agent's workspace is the whole home here: the other agent's workspace
    (under agents/) is inside it, and still out of its file tools' reach."""
    from tests.gateway.memory_helpers import final, tool_call, tool_results

    use_hashing_embedder(monkeypatch)
    (tmp_path / "parley.toml").write_text(
        f'[[agents]]\nid = "main"\nworkspace = "{tmp_path}"\n[[agents]]\nid = "work"\n',
        encoding="utf-8",
    )
    secret = tmp_path / "agents" / "work" / "workspace" / "SOUL.md"
    secret.parent.mkdir(parents=True)
    secret.write_text("WORK-ONLY-SECRET\n", encoding="utf-8")
    (tmp_path / "mine.md").write_text("MAIN-FILE\n", encoding="utf-8")
    channel, provider = RecordingChannel(), ScriptedProvider()
    async with Gateway(memory_config(tmp_path), channels=[channel], provider=provider) as gateway:
        provider.push(
            tool_call("r1", "read_file", path="agents/work/workspace/SOUL.md"),
            tool_call("r2", "read_file", path="mine.md"),
            tool_call("l1", "list_files", path="agents"),
            final("done"),
        )
        await say(gateway, channel, "read them")
    shown = [r.content for i in (-3, -2, -1) for r in tool_results(provider.requests[i])]
    assert "WORK-ONLY-SECRET" not in shown[0] and "MAIN-FILE" in shown[1]
    assert "workspace" not in shown[2]
