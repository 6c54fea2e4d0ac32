"""``[[agents]]`` and ``[[bindings]]``: what the file may say, what it may not, and
what a config without them keeps (``gateway.agents_config``, ``gateway.config``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.gateway.config import effective_config_toml, load_config
from parley.gateway.errors import ConfigFileError


def _load(tmp_path: Path, text: str, **env: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "parley.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env={"PARLEY_HOME": str(tmp_path), **env})


def _problems(tmp_path: Path, text: str, **env: str) -> str:
    with pytest.raises(ConfigFileError) as caught:
        _load(tmp_path, text, **env)
    return str(caught.value)


def test_without_agents_the_agent_section_is_the_one_agent(tmp_path: Path) -> None:
    loaded = _load(tmp_path, '[agent]\nname = "Ada"\n')
    assert loaded.config.agents == () and loaded.config.bindings == ()
    assert loaded.config.default_agent() is loaded.config.agent
    assert loaded.workspace == tmp_path / "workspace"


def test_the_default_entry_stands_in_the_agent_sections_place(tmp_path: Path) -> None:
    loaded = _load(
        tmp_path,
        """
[agent]
max_output_tokens = 1234
[[agents]]
id = "helper"
[[agents]]
id = "boss"
name = "Boss"
default = true
max_tool_iterations = 2
""",
    )
    agent = loaded.config.agent
    assert (agent.id, agent.name, agent.max_tool_iterations) == ("boss", "Boss", 2)
    # [agent]'s limits are every entry's defaults; an entry's own value wins.
    assert [a.max_output_tokens for a in loaded.config.agents] == [1234, 1234]
    assert loaded.workspace == tmp_path / "workspace"


def test_the_first_entry_is_the_default_when_none_says_so(tmp_path: Path) -> None:
    loaded = _load(tmp_path, '[[agents]]\nid = "one"\n[[agents]]\nid = "two"\n')
    assert loaded.config.agent.id == "one"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[agents]]\nid = "a"\n[[agents]]\nid = "a"\n', "the id 'a' is used twice"),
        (
            '[[agents]]\nid = "a"\ndefault = true\n[[agents]]\nid = "b"\ndefault = true\n',
            "only one may be default = true",
        ),
        (
            '[[agents]]\nid = "a"\n[[bindings]]\nagent = "ghost"\nchannel = "telegram"\n',
            "bindings: entry 1 names the agent 'ghost'",
        ),
        ('[[agents]]\nid = "a"\n[[bindings]]\nagent = "a"\n', "needs at least one of peer"),
        (
            '[[agents]]\nid = "a"\nworkspace = "/w"\n[[agents]]\nid = "b"\nworkspace = "/w"\n',
            "share the workspace",
        ),
        ('[[agents]]\nid = "A B"\n', "agents.0.id"),
        ('[[agents]]\nid = "a"\ntools_deny = ["no such!"]\n', "is not a tool name"),
        ('[[agents]]\nid = "a"\ncolour = "red"\n', "agents.0.colour"),
        ('[[agents]]\nid = "a"\nprovider = "gemini"\n', "agents.0.provider"),
        ('[[bindings]]\nagent = "main"\npeer = "1"\nroom = "x"\n', "bindings.0.room"),
    ],
)
def test_mistakes_are_refused_with_what_is_wrong(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _problems(tmp_path, text)


def test_a_binding_may_name_the_single_agent(tmp_path: Path) -> None:
    loaded = _load(tmp_path, '[[bindings]]\nagent = "main"\npeer = 42\n')
    (binding,) = loaded.config.bindings
    assert binding.peer == "42" and binding.fields == ("peer",)


def test_the_environment_does_not_reach_arrays_of_tables(tmp_path: Path) -> None:
    text = '[[agents]]\nid = "a"\n'
    assert "set in the file only" in _problems(tmp_path, text, PARLEY_AGENTS__0__NAME="x")
    assert "set in the file only" in _problems(tmp_path, text, PARLEY_BINDINGS__AGENT="a")
    # [agent]'s limits do: they are every entry's defaults.
    loaded = _load(tmp_path, text, PARLEY_AGENT__MAX_TOOL_ITERATIONS="3")
    assert loaded.config.agents[0].max_tool_iterations == 3


def test_config_show_prints_agents_and_bindings_as_arrays_of_tables(tmp_path: Path) -> None:
    loaded = _load(
        tmp_path,
        '[[agents]]\nid = "a"\nmodel = "m"\n[[bindings]]\nagent = "a"\nchannel = "web"\n',
    )
    text = effective_config_toml(loaded.config)
    assert '[[agents]]\nid = "a"' in text and '[[bindings]]\nagent = "a"' in text
    assert 'model = "m"' in text
    again = tmp_path / "again.toml"
    again.write_text(text, encoding="utf-8")
    reread = load_config(again, env={"PARLEY_HOME": str(tmp_path)})
    assert reread.config.agents == loaded.config.agents
    assert reread.config.bindings == loaded.config.bindings
