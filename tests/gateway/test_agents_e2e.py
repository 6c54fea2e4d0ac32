"""Several agents end to end: the fake Bot API and python-telegram-bot, the fake
Discord gateway and discord.py, the whole gateway, the real anthropic SDK against the
fake Messages API. Bindings pick the agent; each agent's requests carry its own model,
its own workspace's system prompt and its own tools; /status and the admin API say
which agent answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.channels.telegram_helpers import TOKEN, USERNAME
from tests.gateway.test_telegram_e2e import ALICE, GROUP, dm, world

BOB = 5002
WORK_SOUL = "You are Atlas, the WORK-SOUL-MARK assistant."
CONFIG = f"""
[[agents]]
id = "main"
name = "Parley"
default = true

[[agents]]
id = "work"
name = "Atlas"
model = "claude-work-model"
tools_deny = ["read_file", "list_files"]

[[bindings]]
agent = "work"
peer = "{BOB}"

[[bindings]]
agent = "work"
channel = "telegram"
chat = "{GROUP}"

# Less specific than the peer binding above: Alice's DMs stay with main.
[[bindings]]
agent = "main"
channel = "telegram"
"""


def _prepare(home: Path) -> None:
    (home / "parley.toml").write_text(CONFIG, encoding="utf-8")
    workspace = home / "agents" / "work" / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "SOUL.md").write_text(WORK_SOUL + "\n", encoding="utf-8")


def _system(body: dict[str, Any]) -> str:
    system = body.get("system", "")
    if isinstance(system, list):
        return "\n".join(b.get("text", "") for b in system)
    return str(system)


def _tools(body: dict[str, Any]) -> set[str]:
    return {t["name"] for t in body.get("tools", [])}


async def test_bindings_route_each_chat_to_its_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _prepare(tmp_path)
    async with world(tmp_path, monkeypatch) as w:
        await w.settle(dm(w.fake, "hello from alice"))
        await w.settle(w.fake.push_message(TOKEN, chat_id=BOB, sender_id=BOB, text="hi from bob"))
        asked = w.fake.push_message(
            TOKEN,
            chat_id=GROUP,
            chat_type="supergroup",
            sender_id=ALICE,
            text=f"@{USERNAME} hello group",
        )
        await w.settle(asked)
        alice, bob, group = w.llm.requests_bodies
        assert alice["model"] == "claude-test-model"
        assert "WORK-SOUL-MARK" not in _system(alice)
        assert {"read_file", "list_files"} <= _tools(alice)
        for body in (bob, group):
            assert body["model"] == "claude-work-model"
            assert "WORK-SOUL-MARK" in _system(body) and "Atlas" in _system(body)
            assert not _tools(body) & {"read_file", "list_files"}
            assert "current_time" in _tools(body)

        keys = {r.key: r.agent_id for r in (await w.gateway.registry.list()).sessions}
        assert keys == {
            f"agent:main:telegram:direct:{ALICE}": "main",
            f"agent:work:telegram:direct:{BOB}": "work",
            f"agent:work:telegram:group:{GROUP}": "work",
        }

        status = w.fake.push_message(TOKEN, chat_id=BOB, sender_id=BOB, text="/status")
        await w.settle(status)
        text = w.fake.sent[-1].text
        assert "Agent: Atlas (work)" in text and "claude-work-model" in text
        await w.settle(dm(w.fake, "/status"))
        assert "Agent: Parley (main)" in w.fake.sent[-1].text

        # The admin API: each session's agent, and a filter by agent.
        http = w.gateway.http
        assert http is not None
        token = (tmp_path / "admin.token").read_text(encoding="utf-8").strip()
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession(headers=headers) as client,
            client.get(http.url("/api/sessions"), params={"agent": "work"}) as r,
        ):
            assert r.status == 200, await r.text()
            page = await r.json()
        listed = {s["key"]: s["agent_id"] for s in page["items"]}
        assert listed == {
            f"agent:work:telegram:direct:{BOB}": "work",
            f"agent:work:telegram:group:{GROUP}": "work",
        }


async def test_one_agent_without_agents_tables_keeps_the_sessions_it_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home from before [[agents]]: agent:main keys, [agent]'s workspace, same session."""
    async with world(tmp_path, monkeypatch) as w:
        await w.settle(dm(w.fake, "first"))
        (before,) = (await w.gateway.registry.list()).sessions
    (tmp_path / "parley.toml").write_text(
        '[[agents]]\nid = "main"\n[[agents]]\nid = "work"\nmodel = "claude-work-model"\n',
        encoding="utf-8",
    )
    async with world(tmp_path, monkeypatch) as w:
        await w.settle(dm(w.fake, "second", message_id=900))  # ids restart with the fake
        (after,) = (await w.gateway.registry.list()).sessions
        assert after.session_id == before.session_id
        assert after.key == f"agent:main:telegram:direct:{ALICE}"
        body = w.llm.requests_bodies[-1]
        assert body["model"] == "claude-test-model"
        assert "first" in str(body["messages"]) and "second" in str(body["messages"])


DISCORD_CONFIG = """
[[agents]]
id = "main"

[[agents]]
id = "guild"
name = "Guildie"
model = "claude-guild-model"

[[agents]]
id = "random"
name = "Randy"
model = "claude-random-model"

[[bindings]]
agent = "guild"
guild = "{guild}"

# A channel of that guild: more specific than the guild.
[[bindings]]
agent = "random"
chat = "{random}"
"""


async def test_discord_guild_and_channel_bindings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.channels.discord_support import ANN, BOT_ID, GUILD_ID, ME, RANDOM, THREAD
    from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
    from tests.gateway.test_discord_e2e import wait_replies
    from tests.gateway.test_discord_e2e import world as discord_world

    text = DISCORD_CONFIG.format(guild=GUILD_ID, random=RANDOM)
    (tmp_path / "parley.toml").write_text(text, encoding="utf-8")
    env = {"PARLEY_CHANNELS__DISCORD__GUILD_ACTIVATION": "always"}
    async with discord_world(tmp_path, monkeypatch, env=env) as w:
        dm = w.fake.add_dm(DISCORD_TOKEN, ANN)
        await w.fake.push_message(DISCORD_TOKEN, channel_id=dm, content="in a dm", author=ANN)
        await wait_replies(w, 1)
        await w.fake.push_message(DISCORD_TOKEN, channel_id=THREAD, content="thread", author=ANN)
        await wait_replies(w, 2)
        await w.fake.push_message(
            DISCORD_TOKEN,
            channel_id=RANDOM,
            content=f"<@{BOT_ID}> random",
            author=ANN,
            mentions=[ME],
        )
        await wait_replies(w, 3)
        models = [body["model"] for body in w.llm.requests_bodies]
        assert models == ["claude-test-model", "claude-guild-model", "claude-random-model"]
        agents = {r.agent_id for r in (await w.gateway.registry.list()).sessions}
        assert agents == {"main", "guild", "random"}


async def test_an_agent_on_another_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's provider is Anthropic; Bob's agent talks to an OpenAI-compatible
    server through the real openai SDK, with its own model."""
    from tests.fakes.llm_common import Reply
    from tests.fakes.openai_api import FakeOpenAI

    (tmp_path / "parley.toml").write_text(
        f'[[agents]]\nid = "main"\n[[agents]]\nid = "oai"\nprovider = "openai"\n'
        f'model = "gpt-agent-model"\n[[bindings]]\nagent = "oai"\npeer = "{BOB}"\n',
        encoding="utf-8",
    )
    async with FakeOpenAI() as openai_fake:
        openai_fake.responder = lambda body: Reply(text="from openai")
        env = {"OPENAI_API_KEY": openai_fake.api_key, "OPENAI_BASE_URL": openai_fake.base_url}
        async with world(tmp_path, monkeypatch, env=env) as w:
            await w.settle(w.fake.push_message(TOKEN, chat_id=BOB, sender_id=BOB, text="hi"))
            await w.settle(dm(w.fake, "hello"))
            bob, alice = w.fake.sent[-2:]
            assert (bob.chat_id, bob.text) == (BOB, "from openai")
            assert (alice.chat_id, alice.text) == (ALICE, "echo: hello")
            (body,) = [r.body for r in openai_fake.requests if r.path.endswith("/completions")]
            assert body["model"] == "gpt-agent-model"
            assert [b["model"] for b in w.llm.requests_bodies] == ["claude-test-model"]
            status = w.fake.push_message(TOKEN, chat_id=BOB, sender_id=BOB, text="/status")
            await w.settle(status)
            assert "gpt-agent-model" in w.fake.sent[-1].text
