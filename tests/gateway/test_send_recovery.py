"""A kill between Telegram accepting a reply and the gateway recording it: after the
restart the reply is neither lost nor shown twice. The whole gateway, the real
python-telegram-bot adapter and the fake Bot API; the "kill" cancels the gateway's
lanes from inside the fake's handler, at the exact moment a send arrives, so the
gateway never hears the answer, as with SIGKILL (``bench/crash_soak.py`` does it
with a real process)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from parley.channels.base import InboundMessage, OutboundMessage
from parley.channels.discord_adapter import DiscordChannel
from parley.channels.telegram import TelegramChannel
from parley.gateway.app import Gateway
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.storage.inbox import SentMessages
from parley.gateway.storage.sqlite.database import Database
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from tests.channels.discord_support import ANN, BOT_ID, LIMIT, fake_discord
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.telegram_helpers import FAST_BACKOFF, TOKEN, Sleeps, loopback_only
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.llm_common import Reply
from tests.fakes.telegram_api import DROP, ApiCall, FakeTelegram
from tests.gateway.test_discord_e2e import discord_settings
from tests.gateway.test_telegram_e2e import ALICE, telegram_settings

BOB = 5002
LONG = "\n\n".join(f"paragraph {n} " + "word " * 200 for n in range(14))


class Crash:
    """Cancels every lane when a matching ``sendMessage`` reaches the fake: the send
    is then handled (``accept``) or its connection dropped, and nobody records it."""

    def __init__(
        self, fake: FakeTelegram, nth: int = 1, *, accept: bool = True, chat: int | None = None
    ) -> None:
        self.fake, self.nth, self.accept, self.chat = fake, nth, accept, chat
        self.sends = 0
        self.done = asyncio.Event()
        fake.call_hooks.append(self)

    def __call__(self, call: ApiCall) -> None:
        if call.method != "sendMessage" or self.done.is_set():
            return
        if self.chat is not None and str(call.params.get("chat_id")) != str(self.chat):
            return
        self.sends += 1
        if self.sends < self.nth:
            return
        self.done.set()
        for task in asyncio.all_tasks():  # the turns, and the polling: nothing more comes in
            if task.get_name().startswith(("lane ", "telegram-poll")):
                task.cancel()
        if not self.accept:
            self.fake.fail_next("sendMessage", DROP, "connection dropped")


@asynccontextmanager
async def telegram_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[FakeTelegram, FakeAnthropic, LoadedConfig]]:
    loopback_only(monkeypatch)
    async with FakeTelegram(length_unit="utf16") as fake, FakeAnthropic() as llm:
        settings = telegram_settings(tmp_path, fake, llm)
        settings["PARLEY_LANES__MODE"] = "queue"
        settings["PARLEY_LANES__QUEUE_CAP"] = "100"
        yield fake, llm, load_config(env=settings)


@asynccontextmanager
async def running(loaded: LoadedConfig) -> AsyncIterator[Gateway]:
    channel = TelegramChannel(loaded.config.channels.telegram, sleep=Sleeps(), backoff=FAST_BACKOFF)
    async with Gateway(loaded, channels=[channel]) as gateway:
        yield gateway


async def crash_during(loaded: LoadedConfig, crash: Crash, push: Callable[[], Any]) -> None:
    """Run a gateway until ``crash`` fires, then stop it without letting it finish."""
    async with running(loaded) as gateway:
        push()
        await asyncio.wait_for(crash.done.wait(), 20)
        await gateway.lanes.stop(drain=False, timeout=0)


async def restart(loaded: LoadedConfig) -> dict[str, int]:
    """A new gateway on the same home: it answers what the crash left open."""
    async with running(loaded) as gateway:
        await gateway.wait_idle()
        return await gateway.inbox.counts()


def texts(fake: FakeTelegram) -> list[str]:
    return [m.visible_text for m in fake.sent]


async def sent_rows(loaded: LoadedConfig) -> list[tuple[str, int]]:
    async with Database(loaded.state_db) as db:
        return await db.run(
            lambda: db.conn.execute(
                "SELECT platform_message_id, inbox_id FROM sent_messages ORDER BY 1"
            ).fetchall()
        )


def dm(fake: FakeTelegram, text: str) -> dict[str, Any]:
    return fake.push_message(TOKEN, chat_id=ALICE, sender_id=ALICE, text=text)


async def test_a_reply_telegram_accepted_before_the_kill_is_not_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path, monkeypatch) as (fake, _, loaded):
        crash = Crash(fake, accept=True)
        await crash_during(loaded, crash, lambda: dm(fake, "hello"))
        assert texts(fake) == ["echo: hello"]
        async with Database(loaded.state_db) as db:
            [item] = await SqliteInbox(db).open_items()
        assert item.status == "replied" and item.send_mark is not None
        assert await restart(loaded) == {"delivered": 1}
        assert texts(fake) == ["echo: hello"]  # found, not sent again
        [sent] = fake.sent
        assert [(ref, n) for ref, n in await sent_rows(loaded)] == [
            (f"{ALICE}:{sent.message_id}", item.id)
        ]
        # Asking changed nothing, and the bot goes on answering.
        assert [e.method for e in fake.calls].count("editMessageReplyMarkup") >= 1
        async with running(loaded) as gateway:
            dm(fake, "and now?")
            await fake.wait_sent(2)
            await gateway.wait_idle()
        assert texts(fake) == ["echo: hello", "echo: and now?"]


async def test_a_reply_the_kill_kept_from_telegram_is_sent_once_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path, monkeypatch) as (fake, _, loaded):
        crash = Crash(fake, accept=False)
        await crash_during(loaded, crash, lambda: dm(fake, "hello"))
        assert texts(fake) == []
        assert await restart(loaded) == {"delivered": 1}
        assert texts(fake) == ["echo: hello"]


async def test_a_reply_resent_after_one_kill_and_cut_off_by_another_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first kill keeps the reply from Telegram; while the bot is down another chat
    takes 30 ids of the bot's counter; the restart resends the reply far above its old
    mark and is killed right after Telegram takes it. The next restart must find it:
    the resend renewed the mark, from a numbering that had seen the waiting updates."""
    async with telegram_world(tmp_path, monkeypatch) as (fake, _, loaded):
        first = Crash(fake, accept=False)
        await crash_during(loaded, first, lambda: dm(fake, "hello"))
        fake.call_hooks.remove(first)
        for n in range(30):
            fake.push_message(TOKEN, chat_id=BOB, sender_id=BOB, text=f"bob {n}")
        second = Crash(fake, accept=True, chat=ALICE)
        await crash_during(loaded, second, lambda: None)
        assert [t for t in texts(fake) if not t.startswith("echo: bob")] == ["echo: hello"]
        await restart(loaded)
        assert [t for t in texts(fake) if not t.startswith("echo: bob")] == ["echo: hello"]
        bob = sorted(t for t in texts(fake) if t.startswith("echo: bob"))
        assert bob == sorted(f"echo: bob {n}" for n in range(30))


async def test_a_long_reply_cut_after_its_first_part_sends_only_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path, monkeypatch) as (fake, llm, loaded):
        llm.responder = lambda body: Reply(text=LONG)
        crash = Crash(fake, nth=2, accept=False)
        await crash_during(loaded, crash, lambda: dm(fake, "a long one"))
        [first] = texts(fake)
        assert await restart(loaded) == {"delivered": 1}
        parts = texts(fake)
        assert parts[0] == first and len(parts) >= 3
        assert len(set(parts)) == len(parts)  # no part twice
        assert " ".join(" ".join(p.split()) for p in parts) == " ".join(LONG.split())


async def test_a_folded_turns_reply_found_out_answers_all_its_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Collect mode answers messages that arrived together with one reply; after a
    kill each of them is open, and the reply must go out once, not once per message."""
    async with telegram_world(tmp_path, monkeypatch) as (fake, _, loaded):
        async with running(loaded) as gateway:
            dm(fake, "warm up")
            await fake.wait_sent(1)
            await gateway.wait_idle()
        # What the killed process had done: both messages stored, one reply stored for
        # both, and that reply out at Telegram, unrecorded.
        dm(fake, "one")
        dm(fake, "two")
        received = Collector()
        channel = TelegramChannel(
            loaded.config.channels.telegram, sleep=Sleeps(), backoff=FAST_BACKOFF
        )
        await channel.start(received)
        try:
            messages = await received.wait(2)
            async with Database(loaded.state_db) as db:
                inbox = SqliteInbox(db)
                ids = [(await inbox.record(m)).item.id for m in messages]
                outbound = OutboundMessage(
                    "telegram", "default", str(ALICE), "one reply to both",
                    reply_to_message_id=messages[-1].message_id,
                )  # fmt: skip
                mark = await channel.send_mark(outbound)
                assert mark is not None
                await inbox.mark_replied(ids, None, [outbound.text], send_mark=mark)
            await channel.send(outbound)
        finally:
            await channel.stop()
        assert await restart(loaded) == {"delivered": 3}
        assert texts(fake) == ["echo: warm up", "one reply to both"]


class Collector:
    """An inbound handler that keeps what it is given."""

    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self.arrived = asyncio.Event()

    async def __call__(self, message: InboundMessage) -> None:
        self.messages.append(message)
        self.arrived.set()

    async def wait(self, count: int) -> list[InboundMessage]:
        async with asyncio.timeout(10):
            while len(self.messages) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.messages


async def test_with_another_reply_open_in_the_chat_the_reply_is_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replies to one chat whose fate is unknown: a bot message found above the
    mark could be either one's, so both are sent (twice beats never)."""
    async with telegram_world(tmp_path, monkeypatch) as (fake, _, loaded):
        crash = Crash(fake, accept=True)
        await crash_during(loaded, crash, lambda: dm(fake, "hello"))
        async with Database(loaded.state_db) as db:
            inbox = SqliteInbox(db)
            [first] = await inbox.open_items()
            other = (await inbox.record(_other_message(first.message))).item
            await inbox.mark_replied([other.id], None, ["the other reply"], send_mark="1")
        await restart(loaded)
        assert sorted(texts(fake)) == ["echo: hello", "echo: hello", "the other reply"]


def _other_message(message: InboundMessage) -> InboundMessage:
    return dataclasses.replace(message, message_id=f"{ALICE}:999", text="other")


async def test_a_bot_message_recorded_for_another_reply_is_not_taken_for_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path, monkeypatch) as (fake, _, loaded):
        crash = Crash(fake, accept=False)
        await crash_during(loaded, crash, lambda: dm(fake, "hello"))
        # Above the lost reply's mark: a bot message the gateway recorded for another
        # reply (sent, say, by the replica that answered it).
        assert texts(fake) == []
        async with Database(loaded.state_db) as db:
            inbox = SqliteInbox(db)
            [lost] = await inbox.open_items()
        channel = TelegramChannel(
            loaded.config.channels.telegram, sleep=Sleeps(), backoff=FAST_BACKOFF
        )
        await channel.start(Collector())
        try:
            sent = await channel.send(
                OutboundMessage("telegram", "default", str(ALICE), "an earlier reply")
            )
        finally:
            await channel.stop()
        async with Database(loaded.state_db) as db:
            inbox = SqliteInbox(db)
            earlier = (await inbox.record(_other_message(lost.message))).item
            await inbox.mark_delivered(
                [earlier.id], SentMessages("telegram", "default", sent.platform_message_ids)
            )
        await restart(loaded)
        assert texts(fake) == ["an earlier reply", "echo: hello"]


class CrashOnCreate(list[Any]):
    """The fake Discord's ``sent`` list: the first message created cancels the lanes
    (as a kill would), before the fake answers the request."""

    def __init__(self) -> None:
        super().__init__()
        self.done = asyncio.Event()

    def append(self, item: Any) -> None:
        super().append(item)
        if not self.done.is_set():
            self.done.set()
            for task in asyncio.all_tasks():
                if task.get_name().startswith("lane "):
                    task.cancel()


async def test_discord_gets_the_same_reply_again_and_keeps_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Discord checks nonces itself: the reply resent after the kill carries the
    nonces of the first send, and the message stays one."""
    async with fake_discord(monkeypatch) as fake, FakeAnthropic() as llm:
        loaded = load_config(env={**discord_settings(tmp_path, fake, llm),
                                  "PARLEY_LANES__MODE": "queue"})  # fmt: skip
        crash = CrashOnCreate()
        fake.sent = crash

        def discord_gateway() -> Gateway:
            channel = DiscordChannel(loaded.config.channels.discord, ready_timeout=LIMIT)
            return Gateway(loaded, channels=[channel])

        async with discord_gateway() as gateway:
            dm = fake.add_dm(DISCORD_TOKEN, ANN)
            await fake.push_message(DISCORD_TOKEN, channel_id=dm, content="hello there", author=ANN)
            await asyncio.wait_for(crash.done.wait(), 20)
            await gateway.lanes.stop(drain=False, timeout=0)
        async with Database(loaded.state_db) as db:
            [open_item] = await SqliteInbox(db).open_items()
        assert open_item.status == "replied"
        async with discord_gateway() as gateway:
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        replies = [m.content for m in fake.sent if m.bot_id == BOT_ID]
        assert replies == ["echo: hello there"]
        assert fake.deduplicated == 1
