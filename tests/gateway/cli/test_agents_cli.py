"""`parley` with several agents, as a user runs it (a real process, the fake Messages
API): the terminal chat answered by the agent its binding names, `sessions list/show`
and `doctor` saying which agent is which."""

from __future__ import annotations

from pathlib import Path

from tests.fakes.anthropic_api import FakeAnthropic
from tests.gateway.cli.test_main import anthropic_env, parley

CONFIG = """
[[agents]]
id = "main"
name = "Parley"

[[agents]]
id = "desk"
name = "Desk"
model = "claude-desk-model"
workspace = "{workspace}"
tools_allow = ["current_time"]

[[bindings]]
agent = "desk"
channel = "terminal"
"""
KEY = "agent:desk:terminal:direct:local"


async def test_the_terminal_is_answered_by_its_bound_agent(tmp_path: Path) -> None:
    workspace = tmp_path / "desk-ws"
    (tmp_path / "parley.toml").write_text(CONFIG.format(workspace=workspace), encoding="utf-8")
    async with FakeAnthropic() as fake:
        env = anthropic_env(fake)
        code, out, err = await parley("chat", home=tmp_path, stdin="hello desk\n", env=env)
        assert code == 0, err
        (body,) = [r.body for r in fake.requests if r.path == "/v1/messages"]
        assert body["model"] == "claude-desk-model"
        assert [t["name"] for t in body["tools"]] == ["current_time"]
        assert (workspace / "AGENTS.md").is_file()  # its own workspace, made at start
        assert not (tmp_path / "workspace").exists() or not any(
            "hello desk" in p.read_text(errors="replace")
            for p in (tmp_path / "workspace").rglob("*")
            if p.is_file()
        )

        code, out, _ = await parley("sessions", "list", home=tmp_path)
        assert code == 0 and "AGENT" in out
        (row,) = [line for line in out.splitlines() if line.startswith(KEY)]
        assert row.split()[1] == "desk"
        code, out, _ = await parley("sessions", "list", "--agent", "main", home=tmp_path)
        assert code == 0 and KEY not in out
        code, out, _ = await parley("sessions", "show", KEY, home=tmp_path)
        assert code == 0 and "agent:        desk" in out and "hello desk" in out

        # Each agent's memory is its own: the desk's holds the chat, main's does not.
        for agent in ("desk", "main"):
            code, _, err = await parley("memory", "index", "--agent", agent, home=tmp_path)
            assert code == 0, err
        code, out, err = await parley(
            "memory", "search", "hello desk", "--all", "--agent", "desk", home=tmp_path
        )
        assert code == 0 and "sessions/" in out, out + err
        code, out, err = await parley(
            "memory", "search", "hello desk", "--all", "--agent", "main", home=tmp_path
        )
        assert code == 0 and "sessions/" not in out, out + err
        code, _, err = await parley("memory", "status", "--agent", "ghost", home=tmp_path)
        assert code != 0 and "no agent 'ghost'" in err

        code, out, _ = await parley("doctor", home=tmp_path, env=env)
        assert "agent main" in out and "agent desk" in out, out
        assert str(workspace) in out and "claude-desk-model" in out
        assert "channel=terminal -> desk; else main" in out


async def test_doctor_says_which_tool_name_is_none(tmp_path: Path) -> None:
    (tmp_path / "parley.toml").write_text(
        '[[agents]]\nid = "main"\n[[agents]]\nid = "x"\ntools_deny = ["red_file"]\n',
        encoding="utf-8",
    )
    code, out, _ = await parley("doctor", home=tmp_path)
    assert code != 0
    (line,) = [line for line in out.splitlines() if "agent x" in line]
    assert not line.startswith("[ok") and not line.startswith("[warn"), line
    assert "no tool named red_file" in line
