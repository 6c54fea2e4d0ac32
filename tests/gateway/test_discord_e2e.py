"""Discord end to end: the fake REST API and gateway, the real discord.py adapter, the
whole gateway, the real anthropic SDK against the fake Messages API. Tests assert on
what the fake received."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from parley.channels.discord_adapter import DiscordChannel
from parley.core.fences import GROUP_CONTEXT_OPEN
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.channels.discord_support import (
    ANN,
    BOT_ID,
    GENERAL,
    LIMIT,
    ME,
    SECOND_BOT_ID,
    SECOND_TOKEN,
    THREAD,
    TOKEN,
    fake_discord,
)
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.discord_api import SEND_MESSAGE, FakeDiscord
from tests.fakes.llm_common import Reply
from tests.gateway.test_telegram_e2e import gateway_env, user_texts


class World:
    def __init__(self, fake: FakeDiscord, llm: FakeAnthropic, gateway: Gateway) -> None:
        self.fake, self.llm, self.gateway = fake, llm, gateway

    def replies(self) -> list[Any]:
        # The fake echoes a bot's own messages back on its gateway; only ours count here.
        return [m for m in self.fake.sent if m.bot_id in (BOT_ID, SECOND_BOT_ID)]


def discord_settings(home: Path, fake: Any, llm: FakeAnthropic) -> dict[str, str]:
    """The env of a gateway on the fake Discord's REST API and gateway."""
    return {
        **gateway_env(home, llm),
        "DISCORD_BOT_TOKEN": TOKEN,
        "PARLEY_CHANNELS__DISCORD__DM_POLICY": "open",
        "PARLEY_CHANNELS__DISCORD__API_BASE_URL": fake.api_base,
        "PARLEY_CHANNELS__DISCORD__GATEWAY_URL": fake.gateway_url,
        # These tests follow a reply sent at once; streamed ones: test_streaming_e2e.py.
        "PARLEY_CHANNELS__DISCORD__STREAMING": "off",
    }


@asynccontextmanager
async def world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, env: dict[str, str] | None = None
) -> AsyncIterator[World]:
    async with fake_discord(monkeypatch) as fake, FakeAnthropic() as llm:
        loaded = load_config(env={**discord_settings(tmp_path, fake, llm), **(env or {})})
        channel = DiscordChannel(loaded.config.channels.discord, ready_timeout=LIMIT)
        async with Gateway(loaded, channels=[channel]) as gateway:
            yield World(fake, llm, gateway)


async def wait_replies(w: World, count: int) -> list[Any]:
    await w.fake.wait_until(lambda: len(w.replies()) >= count, LIMIT)
    await w.gateway.wait_idle()
    return w.replies()


async def test_typing_shows_while_a_reply_takes_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the grace (TYPING_DELAY_SECONDS) the channel says "typing", before the reply."""
    async with world(tmp_path, monkeypatch) as w:
        hold = asyncio.Event()
        w.llm.script.append(Reply(text="at last", hold=hold))
        dm = w.fake.add_dm(TOKEN, ANN)
        await w.fake.push_message(TOKEN, channel_id=dm, content="take your time", author=ANN)
        await w.fake.wait_until(lambda: any(t.channel_id == dm for t in w.fake.typing), LIMIT)
        assert not w.replies()  # the indicator came first
        hold.set()
        [reply] = await wait_replies(w, 1)
        assert reply.content == "at last"


async def test_direct_message_is_answered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with world(tmp_path, monkeypatch) as w:
        dm = w.fake.add_dm(TOKEN, ANN)
        await w.fake.push_message(TOKEN, channel_id=dm, content="hello there", author=ANN)
        [reply] = await wait_replies(w, 1)
        assert reply.channel_id == dm and reply.content == "echo: hello there"
        assert reply.message_reference is None  # no reply reference in a DM
        key = f"agent:main:discord:direct:{ANN['id']}"
        record = await w.gateway.registry.get_active(key)
        assert record is not None and record.last_message_ids == [reply.id]
        assert w.gateway.channels["discord"].connected()  # what /health reports
    assert not w.gateway.channels["discord"].connected()


async def test_guild_answers_only_when_mentioned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        await w.fake.push_message(TOKEN, channel_id=GENERAL, content="anyone here?", author=ANN)
        asked = await w.fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            content=f"<@{BOT_ID}> summarise please",
            author=ANN,
            mentions=[ME],
        )
        [reply] = await wait_replies(w, 1)
        assert reply.channel_id == GENERAL
        assert reply.content == "echo: Annie: summarise please"  # the nick, mention removed
        assert str(reply.message_reference["message_id"]) == asked["id"]
        allowed = reply.allowed_mentions
        assert allowed["parse"] == [] and allowed.get("replied_user") is True
        # The chatter was no turn of its own: it came with the mention, as group context.
        [body] = w.llm.requests_bodies
        context = user_texts(body)[0]
        assert context.startswith(GROUP_CONTEXT_OPEN) and "Annie" in context
        assert "anyone here?" in context


async def test_thread_is_its_own_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"PARLEY_CHANNELS__DISCORD__GUILD_ACTIVATION": "always"}
    async with world(tmp_path, monkeypatch, env=env) as w:
        await w.fake.push_message(TOKEN, channel_id=THREAD, content="in the thread", author=ANN)
        [reply] = await wait_replies(w, 1)
        assert reply.channel_id == THREAD
        key = f"agent:main:discord:group:{GENERAL}:thread:{THREAD}"
        assert await w.gateway.registry.get_active(key) is not None


async def test_long_reply_is_split_with_fences_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = "```js\n" + "\n".join(f"console.log({i});" for i in range(150)) + "\n```"
    text = "\n\n".join(f"Point {i}. " + "detail " * 40 for i in range(8)) + f"\n\n{code}\n\nDone."
    async with world(tmp_path, monkeypatch) as w:
        w.llm.enqueue(Reply(text=text))
        dm = w.fake.add_dm(TOKEN, ANN)
        await w.fake.push_message(TOKEN, channel_id=dm, content="explain", author=ANN)
        await w.fake.wait_until(lambda: any("Done." in m.content for m in w.replies()), LIMIT)
        await w.gateway.wait_idle()
        parts = w.replies()
    assert len(parts) >= 3
    assert all(len(p.content) <= 2000 for p in parts)
    assert all(p.content.count("```") % 2 == 0 for p in parts)  # every fence closed
    joined = "\n".join(p.content for p in parts)
    assert all(f"console.log({i});" in joined for i in range(150))


async def test_rate_limit_then_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with world(tmp_path, monkeypatch) as w:
        w.fake.rate_limit_next(retry_after=0.05, route=SEND_MESSAGE)
        dm = w.fake.add_dm(TOKEN, ANN)
        await w.fake.push_message(TOKEN, channel_id=dm, content="hi", author=ANN)
        [reply] = await wait_replies(w, 1)
        assert reply.content == "echo: hi"
        statuses = [r.status for r in w.fake.requests if r.route == SEND_MESSAGE]
        assert statuses[:2] == [429, 200]  # discord.py waited and retried by itself
        assert await w.gateway.inbox.counts() == {"delivered": 1}


async def test_blocked_user_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with world(tmp_path, monkeypatch) as w:
        dm = w.fake.add_dm(TOKEN, ANN)
        w.fake.block_dm(ANN["id"])
        await w.fake.push_message(TOKEN, channel_id=dm, content="bye", author=ANN)
        key = f"agent:main:discord:direct:{ANN['id']}"
        await w.fake.wait_until(lambda: any(r.status == 403 for r in w.fake.requests), LIMIT)
        await w.gateway.wait_idle()
        assert await w.gateway.inbox.counts() == {"failed": 1}
        record = await w.gateway.registry.get_active(key)
        assert record is not None and "blocked" in (record.delivery_error or "")
        assert len([r for r in w.fake.requests if r.route == SEND_MESSAGE]) == 1


async def test_the_same_message_twice_is_answered_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        dm = w.fake.add_dm(TOKEN, ANN)
        first = await w.fake.push_message(TOKEN, channel_id=dm, content="once", author=ANN)
        await w.fake.push_message(
            TOKEN, channel_id=dm, content="once", author=ANN, message_id=first["id"]
        )
        await wait_replies(w, 1)
        marker = await w.fake.push_message(TOKEN, channel_id=dm, content="next", author=ANN)
        replies = await wait_replies(w, 2)
        assert [r.content for r in replies] == ["echo: once", "echo: next"]
        assert marker["id"] != first["id"]


async def test_two_bot_accounts_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"PARLEY_CHANNELS__DISCORD__ACCOUNTS__SECOND__TOKEN": SECOND_TOKEN}
    async with world(tmp_path, monkeypatch, env=env) as w:
        first = w.fake.add_dm(TOKEN, ANN)
        second = w.fake.add_dm(SECOND_TOKEN, ANN)
        await w.fake.push_message(TOKEN, channel_id=first, content="to one", author=ANN)
        await w.fake.push_message(SECOND_TOKEN, channel_id=second, content="to two", author=ANN)
        replies = await wait_replies(w, 2)
        assert {(r.bot_id, r.channel_id, r.content) for r in replies} == {
            (BOT_ID, first, "echo: to one"),
            (SECOND_BOT_ID, second, "echo: to two"),
        }
