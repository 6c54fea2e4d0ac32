"""Which agent answers a message (``Bindings``), each agent's config (``loaded_for``)
and the agent of a session key (``gateway.agents``, ``gateway.routing``)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from parley.channels.base import InboundMessage
from parley.gateway.agents import Bindings, agent_specs, agent_workspace, loaded_for
from parley.gateway.agents_config import BindingConfig
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.memory import memory_db_path, notes_dir
from parley.gateway.routing import key_agent_id


def message(**kw: Any) -> InboundMessage:
    base: dict[str, Any] = {
        "channel": "telegram",
        "account": "default",
        "chat_type": "direct",
        "chat_id": "100",
        "sender_id": "100",
        "sender_name": "Alice",
        "text": "hi",
        "message_id": "1",
        "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
    }
    return InboundMessage(**{**base, **kw})


def bindings(*entries: dict[str, str]) -> Bindings:
    return Bindings([BindingConfig.model_validate(e) for e in entries], "main")


def test_no_bindings_is_the_default_agent() -> None:
    found = bindings()
    assert not found
    assert found.agent_for(message()) == "main"


def test_the_most_specific_binding_wins_whatever_the_order() -> None:
    found = bindings(
        {"agent": "chan", "channel": "telegram"},
        {"agent": "acct", "channel": "telegram", "account": "second"},
        {"agent": "group", "chat": "-500"},
        {"agent": "guild", "guild": "77"},
        {"agent": "person", "peer": "100"},
    )
    assert found.agent_for(message()) == "person"
    assert found.agent_for(message(sender_id="101", chat_id="101")) == "chan"
    assert found.agent_for(message(sender_id="101", account="second")) == "acct"
    # peer binds direct chats only: in a group the conversation decides.
    assert found.agent_for(message(chat_type="group", chat_id="-500")) == "group"
    assert found.agent_for(message(chat_type="thread", chat_id="-500", thread_id="9")) == "group"
    assert found.agent_for(message(chat_type="group", chat_id="-501")) == "chan"
    # chat beats guild; guild beats account and channel.
    guild = {"channel": "discord", "chat_type": "group", "guild_id": "77"}
    assert found.agent_for(message(**guild, chat_id="-500")) == "group"
    assert found.agent_for(message(**guild, chat_id="5")) == "guild"
    assert found.agent_for(message(channel="web", sender_id="x", chat_id="x")) == "main"


def test_a_binding_must_match_on_every_field_it_gives() -> None:
    found = bindings(
        {"agent": "tg-alice", "channel": "telegram", "peer": "100"},
        {"agent": "alice", "peer": "100"},
    )
    assert found.agent_for(message()) == "tg-alice"
    assert found.agent_for(message(channel="discord")) == "alice"


def test_the_same_fields_twice_the_first_in_the_file_wins() -> None:
    found = bindings({"agent": "first", "peer": "100"}, {"agent": "second", "peer": "100"})
    assert found.agent_for(message()) == "first"


def test_names_and_ids_compare_as_the_session_keys_write_them() -> None:
    found = bindings(
        {"agent": "a", "channel": "Telegram", "account": "Second Bot"},
        {"agent": "b", "peer": "AbC"},
    )
    assert found.agent_for(message(account="second-bot", sender_id="1")) == "a"
    assert found.agent_for(message(sender_id="abc")) == "b"


def test_resolving_is_lookups_in_one_table_per_field_set() -> None:
    many = [{"agent": f"a{i}", "peer": str(i)} for i in range(5000)]
    found = bindings(*many, {"agent": "c", "channel": "web"})
    assert len(found._tables) == 2  # peer, channel: not 5001 entries to scan
    assert found.agent_for(message(sender_id="4999")) == "a4999"


def test_key_agent_id() -> None:
    assert key_agent_id("agent:main:telegram:direct:1") == "main"
    assert key_agent_id("agent:work:main") == "work"
    assert key_agent_id("nonsense") == ""
    assert key_agent_id("agent:") == ""


def _loaded(tmp_path: Path, text: str) -> LoadedConfig:
    path = tmp_path / "parley.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={"PARLEY_HOME": str(tmp_path)})


def test_single_agent_config_is_used_as_it_is(tmp_path: Path) -> None:
    loaded = _loaded(tmp_path, "")
    (spec,) = agent_specs(loaded.config)
    assert spec.is_default and spec.id == "main"
    assert loaded_for(loaded, spec) is loaded
    assert memory_db_path(loaded) == tmp_path / "memory" / "main" / "memory.db"


def test_each_agent_has_its_own_workspace_memory_and_notes(tmp_path: Path) -> None:
    loaded = _loaded(
        tmp_path,
        """
[memory]
db_path = "/srv/main-memory.db"
extra_paths = ["/srv/shared-notes", "notes"]
[[agents]]
id = "main"
[[agents]]
id = "work"
memory = false
[[agents]]
id = "home"
workspace = "/srv/home-ws"
""",
    )
    main, work, home = agent_specs(loaded.config)
    assert (main.id, work.id, home.id) == ("main", "work", "home")
    assert agent_workspace(loaded, main) == tmp_path / "workspace"
    assert agent_workspace(loaded, work) == tmp_path / "agents" / "work" / "workspace"
    assert agent_workspace(loaded, home) == Path("/srv/home-ws")
    main_loaded, work_loaded = loaded_for(loaded, main), loaded_for(loaded, work)
    assert memory_db_path(main_loaded) == Path("/srv/main-memory.db")
    assert memory_db_path(work_loaded) == tmp_path / "memory" / "work" / "memory.db"
    assert notes_dir(work_loaded) == tmp_path / "memory" / "work" / "notes"
    assert not work_loaded.config.memory.enabled
    assert loaded_for(loaded, home).config.memory.enabled
    # Only the default agent reads [memory]'s absolute extra paths.
    assert main_loaded.config.memory.extra_paths == (Path("/srv/shared-notes"), Path("notes"))
    assert work_loaded.config.memory.extra_paths == (Path("notes"),)
    assert work_loaded.workspace == tmp_path / "agents" / "work" / "workspace"


@pytest.mark.parametrize("deny", [["read_file"], ["memory_search", "list_files"]])
def test_an_agent_keeps_the_tools_its_lists_leave(deny: list[str]) -> None:
    from parley.core.tools.builtin import default_registry
    from parley.gateway.agents import AgentSpec
    from parley.gateway.runtime.agents import agent_tools

    registry = default_registry()
    base = agent_specs(load_config(env={}).config)[0].config
    kept = agent_tools(registry, AgentSpec(base, True, tools_deny=tuple(deny)))
    assert set(kept.names) == set(registry.names) - set(deny)
    only = agent_tools(registry, AgentSpec(base, True, tools_allow=("current_time",)))
    assert only.names == ("current_time",)
    assert agent_tools(registry, AgentSpec(base, True)) is registry


def test_an_unknown_tool_name_is_an_error_not_a_tool_left_on() -> None:
    from parley.core.tools.builtin import default_registry
    from parley.gateway.agents import AgentSpec
    from parley.gateway.runtime.agents import AgentToolsError, agent_tools

    base = agent_specs(load_config(env={}).config)[0].config
    with pytest.raises(AgentToolsError, match="no tool named read_fiel"):
        agent_tools(default_registry(), AgentSpec(base, True, tools_deny=("read_fiel",)))
