"""The `parley` command as a user runs it: a real process, real files, the real SDK
talking to the fake Messages API on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tests.fakes.anthropic_api import FakeAnthropic

KEY = "agent:main:terminal:direct:local"


async def parley(
    *args: str, home: Path, stdin: str = "", env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    full_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "OPENAI_", "PARLEY_"))
    }
    full_env.update({"PARLEY_HOME": str(home), "HF_HUB_OFFLINE": "1"}, **(env or {}))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "parley.gateway.cli.main",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=full_env,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate(stdin.encode())
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def anthropic_env(fake: FakeAnthropic) -> dict[str, str]:
    return {
        "ANTHROPIC_API_KEY": fake.api_key,
        "ANTHROPIC_BASE_URL": fake.base_url,
        "PARLEY_PROVIDERS__ANTHROPIC__MODEL": "claude-test-model",
    }


async def test_terminal_chat_end_to_end(tmp_path: Path) -> None:
    async with FakeAnthropic() as fake:
        code, out, err = await parley(
            "chat",
            home=tmp_path,
            stdin="hello there\n/status\n",
            env=anthropic_env(fake),
        )
        assert code == 0, err
        replies = [line for line in out.splitlines() if line.startswith("parley> ")]
        # /status answers at once, even while a turn runs, so the order may vary.
        assert any(line.startswith("parley> echo:") and "hello there" in line for line in replies)
        assert any(line.startswith("parley> Session: " + KEY) for line in replies)
        assert len(fake.requests) == 1  # /status never reached the model
        # A second run continues the same session: the model sees the first exchange.
        code, out, err = await parley(
            "chat", home=tmp_path, stdin="and again\n", env=anthropic_env(fake)
        )
        assert code == 0, err
        sent = fake.requests[-1].body["messages"]
        assert "hello there" in str(sent[0]) and "and again" in str(sent[-1])
    assert (tmp_path / "workspace" / "AGENTS.md").is_file()
    code, out, _ = await parley("sessions", "list", home=tmp_path)
    assert code == 0 and KEY in out and "active" in out
    code, out, _ = await parley("sessions", "show", KEY, home=tmp_path)
    assert code == 0 and "hello there" in out and "and again" in out


async def test_invalid_config_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[lanes]\nqueue_cap = -1\n[agent]\ncolour = 'red'\n", encoding="utf-8")
    home = tmp_path / "home"
    code, _, err = await parley("config", "check", "--config", str(bad), home=home)
    assert code == 2
    assert "lanes.queue_cap" in err and "agent.colour" in err
    code, _, _ = await parley("run", "--config", str(bad), home=home)
    assert code == 2
    assert not home.exists()


async def test_config_show_masks_secrets(tmp_path: Path) -> None:
    secret = "sk-ant-do-not-print-this-5678"
    code, out, _ = await parley("config", "show", home=tmp_path, env={"ANTHROPIC_API_KEY": secret})
    assert code == 0
    assert secret not in out and "****5678" in out
    assert "[session.reset]" in out


async def test_doctor_reports_a_broken_transcript(tmp_path: Path) -> None:
    async with FakeAnthropic() as fake:
        env = anthropic_env(fake)
        code, out, err = await parley("chat", home=tmp_path, stdin="hi\n", env=env)
        assert code == 0, err
        code, out, _ = await parley("doctor", home=tmp_path, env=env)
        assert code == 0, out
        assert "state.db" in out and "1 load cleanly" in out
        (tmp_path / "sessions" / "0123.jsonl").write_text("not json\n", encoding="utf-8")
        code, out, _ = await parley("doctor", home=tmp_path, env=env)
        assert code == 1
        assert "0123.jsonl" in out and "FAIL" in out
