"""Telegram end to end: the fake Bot API, the real python-telegram-bot adapter, the
whole gateway, the real anthropic SDK against the fake Messages API. Tests assert on
what the fake Bot API received."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from parley.channels.telegram import TelegramChannel
from parley.channels.text import utf16_len
from parley.core.fences import GROUP_CONTEXT_OPEN
from parley.core.transcript import Transcript
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.channels.telegram_helpers import (
    FAST_BACKOFF,
    OTHER_BOT_ID,
    OTHER_TOKEN,
    OTHER_USERNAME,
    TOKEN,
    USERNAME,
    Sleeps,
    loopback_only,
)
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.llm_common import Reply
from tests.fakes.telegram_api import FakeTelegram

ALICE = 5001
GROUP = -1001234


def said(body: dict[str, Any]) -> str:
    """The newest user text the model was sent, without the turn context (it follows)
    or group context (it comes first)."""
    texts = [t for t in user_texts(body) if not t.startswith(GROUP_CONTEXT_OPEN)]
    return texts[0] if texts else str(body["messages"][-1]["content"])


def user_texts(body: dict[str, Any]) -> list[str]:
    blocks = body["messages"][-1]["content"]
    if not isinstance(blocks, list):
        return []
    return [b["text"] for b in blocks if b.get("type") == "text"]


def gateway_env(home: Path, llm: FakeAnthropic) -> dict[str, str]:
    """A gateway on the real anthropic SDK against the fake, memory off (no model load)."""
    llm.responder = lambda body: Reply(text=f"echo: {said(body)}")
    return {
        "PARLEY_HOME": str(home),
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_MEMORY__ENABLED": "false",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
        "ANTHROPIC_API_KEY": llm.api_key,
        "ANTHROPIC_BASE_URL": llm.base_url,
        "PARLEY_PROVIDERS__ANTHROPIC__MODEL": "claude-test-model",
        "PARLEY_HTTP__PORT": "0",
    }


def telegram_settings(
    home: Path, fake: FakeTelegram, llm: FakeAnthropic, *, second_bot: bool = False
) -> dict[str, str]:
    """The bot(s) registered at the fake, and the env of a gateway polling them."""
    fake.add_bot(TOKEN, USERNAME, bot_id=int(TOKEN.split(":")[0]))
    settings = {
        **gateway_env(home, llm),
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "TELEGRAM_API_BASE_URL": fake.base_url,
        "PARLEY_CHANNELS__TELEGRAM__DM_POLICY": "open",
        "PARLEY_CHANNELS__TELEGRAM__POLL_TIMEOUT_SECONDS": "1",
        # These tests follow a reply sent at once; streamed ones: test_streaming_e2e.py.
        "PARLEY_CHANNELS__TELEGRAM__STREAMING": "off",
    }
    if second_bot:
        fake.add_bot(OTHER_TOKEN, OTHER_USERNAME, bot_id=OTHER_BOT_ID)
        settings["PARLEY_CHANNELS__TELEGRAM__ACCOUNTS__SECOND__TOKEN"] = OTHER_TOKEN
        settings["PARLEY_CHANNELS__TELEGRAM__ACCOUNTS__SECOND__API_BASE_URL"] = fake.base_url
        settings["PARLEY_SESSION__DM_SCOPE"] = "per-account-channel-peer"
    return settings


class World:
    def __init__(
        self, fake: FakeTelegram, llm: FakeAnthropic, gateway: Gateway, sleeps: Sleeps
    ) -> None:
        self.fake, self.llm, self.gateway, self.sleeps = fake, llm, gateway, sleeps

    async def settle(self, update: dict[str, Any], token: str = TOKEN) -> None:
        """Until the adapter acknowledged ``update`` and the gateway finished with it."""
        await self.fake.wait_polled(token, update["update_id"] + 1)
        await self.gateway.wait_idle()


@asynccontextmanager
async def world(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    env: dict[str, str] | None = None,
    second_bot: bool = False,
) -> AsyncIterator[World]:
    loopback_only(monkeypatch)
    async with FakeTelegram(length_unit="utf16") as fake, FakeAnthropic() as llm:
        settings = telegram_settings(tmp_path, fake, llm, second_bot=second_bot)
        loaded = load_config(env={**settings, **(env or {})})
        sleeps = Sleeps()
        channel = TelegramChannel(
            loaded.config.channels.telegram, sleep=sleeps, backoff=FAST_BACKOFF
        )
        async with Gateway(loaded, channels=[channel]) as gateway:
            yield World(fake, llm, gateway, sleeps)


def dm(fake: FakeTelegram, text: str, token: str = TOKEN, **kw: Any) -> dict[str, Any]:
    return fake.push_message(token, chat_id=ALICE, sender_id=ALICE, text=text, **kw)


async def test_typing_shows_while_a_reply_takes_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the grace (TYPING_DELAY_SECONDS) the chat says "typing", before the reply."""
    async with world(tmp_path, monkeypatch) as w:
        hold = asyncio.Event()
        w.llm.script.append(Reply(text="at last", hold=hold))
        dm(w.fake, "take your time")
        [action] = await w.fake.wait_actions(1)
        assert (action.chat_id, action.action) == (ALICE, "typing")
        assert not w.fake.sent  # the indicator came first
        hold.set()
        [sent] = await w.fake.wait_sent(1)
        assert sent.visible_text == "at last"


async def test_direct_message_is_answered_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        dm(w.fake, "hello bot")
        [sent] = await w.fake.wait_sent(1)
        assert sent.chat_id == ALICE and sent.visible_text == "echo: hello bot"
        assert sent.reply_to_message_id is None  # no quoting in a private chat
        await w.gateway.wait_idle()
        record = await w.gateway.registry.get_active("agent:main:telegram:direct:5001")
        assert record is not None
        assert record.last_message_ids == [f"{ALICE}:{sent.message_id}"]
        assert w.gateway.channels["telegram"].connected()  # what /health reports
    assert not w.gateway.channels["telegram"].connected()
    transcript = Transcript.open(tmp_path / "sessions" / f"{record.session_id}.jsonl")
    delivery = [e.payload["data"] for e in transcript.entries() if e.type == "custom"][-1]
    assert delivery["ok"] and delivery["platform_message_ids"] == [f"{ALICE}:{sent.message_id}"]


async def test_group_answers_only_when_mentioned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        chatter = w.fake.push_message(
            TOKEN, chat_id=GROUP, chat_type="supergroup", sender_id=ALICE, text="lunch anyone?"
        )
        await w.settle(chatter)
        assert w.fake.sent == [] and w.llm.requests_bodies == []
        asked = w.fake.push_message(
            TOKEN,
            chat_id=GROUP,
            chat_type="supergroup",
            sender_id=ALICE,
            text=f"@{USERNAME} what time is it?",
        )
        [sent] = await w.fake.wait_sent(1)
        assert sent.chat_id == GROUP
        assert sent.visible_text == "echo: Alice: what time is it?"  # mention stripped
        assert sent.reply_to_message_id == asked["message"]["message_id"]
        # The chatter came with it, as group context before the words (issue 23).
        [body] = w.llm.requests_bodies
        context = user_texts(body)[0]
        assert context.startswith(GROUP_CONTEXT_OPEN)
        assert f"Alice [{ALICE}]: lunch anyone?" in context


async def test_forum_topic_is_its_own_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(
        tmp_path, monkeypatch, env={"PARLEY_CHANNELS__TELEGRAM__GROUP_ACTIVATION": "always"}
    ) as w:
        for topic, text in ((7, "in topic seven"), (9, "in topic nine")):
            w.fake.push_message(
                TOKEN,
                chat_id=GROUP,
                chat_type="supergroup",
                is_forum=True,
                is_topic_message=True,
                message_thread_id=topic,
                sender_id=ALICE,
                text=text,
            )
        sent = await w.fake.wait_sent(2)
        assert {(m.message_thread_id, m.visible_text) for m in sent} == {
            (7, "echo: Alice: in topic seven"),
            (9, "echo: Alice: in topic nine"),
        }
        await w.gateway.wait_idle()
        for topic in (7, 9):
            key = f"agent:main:telegram:group:{GROUP}:thread:{topic}"
            assert await w.gateway.registry.get_active(key) is not None


async def test_long_reply_is_split_under_the_limit_with_code_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = "```python\n" + "\n".join(f"print({i})  # 🐍" for i in range(200)) + "\n```"
    prose = "\n\n".join(f"Paragraph {i}: " + "words 😀 " * 60 for i in range(12))
    long_text = f"{prose}\n\n{code}\n\nThe end."
    async with world(tmp_path, monkeypatch) as w:
        w.llm.enqueue(Reply(text=long_text))
        dm(w.fake, "tell me everything")
        await w.fake.wait_until(lambda: any("The end." in m.visible_text for m in w.fake.sent))
        await w.gateway.wait_idle()
        parts = w.fake.sent_to(ALICE)
    assert len(parts) >= 3
    assert all(utf16_len(p.visible_text) <= 4096 for p in parts)
    assert all(p.parse_mode == "HTML" for p in parts)
    # The code block is never cut open: every part's <pre> is closed in that part.
    assert all(p.text.count("<pre>") == p.text.count("</pre>") for p in parts)
    visible = "\n".join(p.visible_text for p in parts)
    for i in range(200):
        assert f"print({i})  # 🐍" in visible
    assert visible.count("Paragraph") == 12


async def test_refused_markup_falls_back_to_plain_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        w.fake.refuse_entities = True
        w.llm.enqueue(Reply(text="This is **important**: use `pip`."))
        dm(w.fake, "advice?")
        [sent] = await w.fake.wait_sent(1)
    assert sent.parse_mode is None
    assert "important" in sent.visible_text and "pip" in sent.visible_text


async def test_flood_control_is_waited_out_then_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        w.fake.flood("sendMessage", retry_after=3)
        dm(w.fake, "hi")
        [sent] = await w.fake.wait_sent(1)
        await w.gateway.wait_idle()
        assert sent.visible_text == "echo: hi"
        assert 3 in w.sleeps.delays  # the adapter waited what Telegram asked
        assert await w.gateway.inbox.counts() == {"delivered": 1}


async def test_blocked_user_is_recorded_and_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        update = dm(w.fake, "bye")
        w.fake.block(ALICE)
        await w.settle(update)
        await w.fake.wait_calls("sendMessage")
        await w.gateway.wait_idle()
        sends = [c for c in w.fake.calls if c.method.lower() == "sendmessage"]
        assert len(sends) == 1 and w.fake.sent == []
        record = await w.gateway.registry.get_active("agent:main:telegram:direct:5001")
        assert record is not None and "blocked" in (record.delivery_error or "")
        assert await w.gateway.inbox.counts() == {"failed": 1}


async def test_the_same_update_twice_is_answered_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        first = dm(w.fake, "only once please")
        # Telegram redelivers a message (e.g. after a lost acknowledgement) under a new
        # update id; the message itself is the same.
        again = w.fake.push_update(TOKEN, {"message": first["message"]})
        await w.settle(again)
        await w.fake.wait_sent(1)
        await w.gateway.wait_idle()
        assert [m.visible_text for m in w.fake.sent] == ["echo: only once please"]


async def test_two_bot_accounts_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with world(tmp_path, monkeypatch, second_bot=True) as w:
        dm(w.fake, "to the first bot")
        dm(w.fake, "to the second bot", token=OTHER_TOKEN)
        sent = await w.fake.wait_sent(2)
        await w.gateway.wait_idle()
        by_bot = {m.bot_username: m.visible_text for m in sent}
        assert by_bot == {
            USERNAME: "echo: to the first bot",
            OTHER_USERNAME: "echo: to the second bot",
        }
        for account in ("default", "second"):
            key = f"agent:main:telegram:{account}:direct:5001"
            assert await w.gateway.registry.get_active(key) is not None


async def test_pairing_through_the_real_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"PARLEY_CHANNELS__TELEGRAM__DM_POLICY": "pairing"}
    async with world(tmp_path, monkeypatch, env=env) as w:
        dm(w.fake, "hi, who are you?")
        [notice] = await w.fake.wait_sent(1)
        assert "pairing code" in notice.visible_text and w.llm.requests_bodies == []
        code = notice.visible_text.split("parley pairing approve ")[1].split()[0]
        await w.gateway.pairing.approve(code)
        dm(w.fake, "and now?")
        sent = await w.fake.wait_sent(2)
        assert sent[1].visible_text == "echo: and now?"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_webhook_mode_through_the_gateway_http_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    env = {
        "PARLEY_CHANNELS__TELEGRAM__MODE": "webhook",
        "PARLEY_CHANNELS__TELEGRAM__ACCOUNTS__DEFAULT__WEBHOOK_URL": (
            f"http://127.0.0.1:{port}/telegram/default"
        ),
        "PARLEY_CHANNELS__TELEGRAM__ACCOUNTS__DEFAULT__WEBHOOK_SECRET": "s3cret-token",
        "PARLEY_HTTP__PORT": str(port),
    }
    async with world(tmp_path, monkeypatch, env=env) as w:
        assert w.fake.webhook_of(TOKEN) is not None  # setWebhook was called
        dm(w.fake, "via webhook")
        [sent] = await w.fake.wait_sent(1)
        assert sent.visible_text == "echo: via webhook"
        assert [d.status for d in await w.fake.wait_webhook(1)] == [200]
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/telegram/default"
            headers = {"X-Telegram-Bot-Api-Secret-Token": "wrong"}
            async with session.post(url, json={"update_id": 1}, headers=headers) as response:
                assert response.status == 401
