"""Platform faults through the whole gateway: the real python-telegram-bot and discord.py
adapters against the protocol fakes, the real anthropic SDK against the fake Messages API.

Every test ends the same way: each user message is answered exactly once, in order per
chat, after the fault cleared (counted at the fake: every message carries a unique tag,
and the echo model repeats the tags of the turn it answered; messages queued together
may share one folded turn, never two). What Telegram had queued is never lost: the
adapter acknowledges an update (moves the ``getUpdates`` offset) only after the gateway
stored it, so a failed poll just fetches it again.

On Discord, a non-resumable invalid session (op 9, d=false) starts a new session, and
Discord does not replay what was sent in between; the adapter reads those messages back
from the history of the channels it had seen (``channels/discord_backfill``), so they
are answered too, once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from parley.channels.discord_adapter import DiscordChannel
from parley.channels.telegram import TelegramChannel
from parley.channels.telegram_polling import Backoff
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.channels.discord_support import (
    ANN,
    BOB,
    BOT_ID,
    LIMIT,
    SECOND_BOT_ID,
    SECOND_TOKEN,
    fake_discord,
)
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.telegram_helpers import (
    OTHER_TOKEN,
    TOKEN,
    Sleeps,
    loopback_only,
)
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.telegram_api import ApiCall, FakeTelegram
from tests.gateway.test_discord_e2e import discord_settings
from tests.gateway.test_telegram_e2e import telegram_settings

ALICE, BOBBY, CAROL = 5001, 5002, 5003
_TAG = re.compile(r"\bq[a-z]\d{2}\b")

IDENTIFY_PAUSE = 5.0  # discord.py's wait before re-identifying (before_identify_hook)


def tags(texts: Iterable[str]) -> list[str]:
    """Every message tag in ``texts``, in order (e.g. ``qa01``)."""
    return [tag for text in texts for tag in _TAG.findall(text)]


def tagged(chat: str, count: int, start: int = 1) -> list[str]:
    return [f"q{chat}{n:02d}" for n in range(start, start + count)]


def assert_answered_once(replies: list[str], expected: list[str]) -> None:
    """In order, none lost, none twice; and every reply is a real answer (an echo)."""
    assert all(r.startswith("echo: ") for r in replies), replies
    assert tags(replies) == expected, Counter(tags(replies))


@dataclass(frozen=True)
class CountingBackoff(Backoff):
    """FAST_BACKOFF that also counts the failures it paced (a test waits on them)."""

    initial: float = 0.01
    maximum: float = 0.02
    paced: list[int] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def delay(self, failures: int) -> float:
        self.paced.append(failures)
        self.changed.set()
        return super().delay(failures)

    async def wait_failures(self, count: int) -> None:
        async with asyncio.timeout(LIMIT):
            while len(self.paced) < count:
                self.changed.clear()
                await self.changed.wait()


# -- Telegram ------------------------------------------------------------------------------


class TelegramWorld:
    def __init__(
        self, fake: FakeTelegram, gateway: Gateway, sleeps: Sleeps, backoff: CountingBackoff
    ) -> None:
        self.fake, self.gateway, self.sleeps, self.backoff = fake, gateway, sleeps, backoff

    def dm(self, chat_id: int, texts: list[str], token: str = TOKEN) -> None:
        for text in texts:
            self.fake.push_message(token, chat_id=chat_id, sender_id=chat_id, text=text)

    def replies(self, chat_id: int, token: str = TOKEN) -> list[str]:
        return [m.visible_text for m in self.fake.sent_to(chat_id) if m.token == token]

    async def answered(self, chat_id: int, expected: list[str], token: str = TOKEN) -> None:
        """Until every tag in ``expected`` was answered in ``chat_id``, then check."""
        await self.fake.wait_until(
            lambda: set(expected) <= set(tags(self.replies(chat_id, token))), LIMIT
        )
        await self.gateway.wait_idle()
        assert_answered_once(self.replies(chat_id, token), expected)

    def get_updates_calls(self) -> int:
        return len([c for c in self.fake.calls if c.method.lower() == "getupdates"])


@asynccontextmanager
async def telegram_world(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    before_start: Callable[[FakeTelegram], None] | None = None,
    second_bot: bool = False,
) -> AsyncIterator[TelegramWorld]:
    loopback_only(monkeypatch)
    async with FakeTelegram(length_unit="utf16") as fake, FakeAnthropic() as llm:
        settings = telegram_settings(tmp_path, fake, llm, second_bot=second_bot)
        if before_start is not None:
            before_start(fake)  # messages queued and faults armed before the first poll
        early_acks: list[str] = []
        fake.call_hooks.append(durable_before_acknowledged(fake, tmp_path, early_acks))
        loaded = load_config(env=settings)
        sleeps, backoff = Sleeps(), CountingBackoff()
        channel = TelegramChannel(loaded.config.channels.telegram, sleep=sleeps, backoff=backoff)
        async with Gateway(loaded, channels=[channel]) as gateway:
            yield TelegramWorld(fake, gateway, sleeps, backoff)
        assert fake.pending_updates(TOKEN) == []  # everything was acknowledged on stop
        assert early_acks == []


def durable_before_acknowledged(
    fake: FakeTelegram, home: Path, early: list[str]
) -> Callable[[ApiCall], None]:
    """A hook on every getUpdates: each update its offset confirms must already be in
    the gateway's inbox on disk (read with a separate connection: committed data only)."""
    known: dict[int, str] = {}

    def check(call: ApiCall) -> None:
        if call.method.lower() != "getupdates" or not call.params.get("offset"):
            return
        for update in fake.pending_updates(call.token):
            message = update.get("message")
            if message:
                known[update["update_id"]] = f"{message['chat']['id']}:{message['message_id']}"
        offset = int(call.params["offset"])
        confirmed = [ref for uid, ref in known.items() if uid < offset]
        if not confirmed:
            return
        with contextlib.closing(sqlite3.connect(home / "state.db")) as db:
            stored = {row[0] for row in db.execute("SELECT platform_message_id FROM inbox")}
        early.extend(ref for ref in confirmed if ref not in stored)
        for uid in [uid for uid in known if uid < offset]:
            del known[uid]

    return check


def queue_two_chats(fake: FakeTelegram) -> None:
    for chat, tag in ((ALICE, "a"), (BOBBY, "b")):
        for text in tagged(tag, 3):
            fake.push_message(TOKEN, chat_id=chat, sender_id=chat, text=text)


async def test_telegram_flood_control_on_get_updates_is_waited_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def arm(fake: FakeTelegram) -> None:
        queue_two_chats(fake)
        fake.flood("getUpdates", retry_after=3, times=2)  # the first two polls

    async with telegram_world(tmp_path, monkeypatch, before_start=arm) as w:
        await w.answered(ALICE, tagged("a", 3))
        await w.answered(BOBBY, tagged("b", 3))
        assert w.sleeps.delays.count(3) == 2  # waited what Telegram asked, each time
        # Again while a long poll is pending: the flood answers that very poll.
        await w.fake.wait_until(lambda: w.fake.pending_updates(TOKEN) == [], LIMIT)
        w.fake.flood("getUpdates", retry_after=5)
        w.dm(ALICE, tagged("a", 2, start=4))
        await w.answered(ALICE, tagged("a", 5))
        assert 5 in w.sleeps.delays
        assert await w.gateway.inbox.counts() == {"delivered": 8}


@pytest.mark.parametrize("status", [500, 502])
async def test_telegram_server_errors_during_polling_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    def arm(fake: FakeTelegram) -> None:
        queue_two_chats(fake)
        fake.fail_next("getUpdates", status, "Internal Server Error", times=3)

    async with telegram_world(tmp_path, monkeypatch, before_start=arm) as w:
        await w.answered(ALICE, tagged("a", 3))
        await w.answered(BOBBY, tagged("b", 3))
        assert len(w.backoff.paced) == 3  # one paced retry per failed poll
        # Mid-run: the pending long poll gets the error, the queued messages survive it.
        w.fake.fail_next("getUpdates", status, "Bad Gateway", times=2)
        w.dm(BOBBY, tagged("b", 2, start=4))
        await w.answered(BOBBY, tagged("b", 5))
        assert await w.gateway.inbox.counts() == {"delivered": 8}


async def test_telegram_conflict_with_another_instance_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path, monkeypatch) as w:
        w.dm(ALICE, tagged("a", 1))
        await w.answered(ALICE, tagged("a", 1))
        url = f"{w.fake.base_url}/bot{TOKEN}/getUpdates"
        conflicts = 0
        async with aiohttp.ClientSession() as other_instance:
            # Another process polls the same token (without acknowledging anything):
            # each of its polls ends ours with 409, ours ends its next one.
            for n in range(4):
                await w.fake.wait_calls("getUpdates", w.get_updates_calls() + 1)
                async with other_instance.post(url, data={"timeout": "1"}) as response:
                    conflicts += response.status == 409
                w.dm(ALICE, tagged("a", 1, start=2 + n))
        await w.answered(ALICE, tagged("a", 5))
        assert conflicts >= 1  # the two instances really fought
        assert len(w.backoff.paced) >= 1  # and ours backed off before polling again
        assert await w.gateway.inbox.counts() == {"delivered": 5}


async def test_telegram_dropped_and_refused_connections_lose_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def arm(fake: FakeTelegram) -> None:
        queue_two_chats(fake)
        fake.drop_next("getUpdates", times=2)  # the socket dies, no answer at all

    async with telegram_world(tmp_path, monkeypatch, before_start=arm) as w:
        await w.answered(ALICE, tagged("a", 3))
        await w.answered(BOBBY, tagged("b", 3))
        assert len(w.backoff.paced) == 2
        # A network outage: the pending poll is cut, reconnecting is refused.
        failed = len(w.backoff.paced)
        await w.fake.go_offline()
        w.dm(ALICE, tagged("a", 2, start=4))  # queued at Telegram meanwhile
        w.dm(CAROL, tagged("c", 2))
        await w.backoff.wait_failures(failed + 3)  # refused, refused, refused...
        assert w.fake.sent_to(CAROL) == []
        await w.fake.go_online()
        await w.answered(ALICE, tagged("a", 5))
        await w.answered(CAROL, tagged("c", 2))
        assert await w.gateway.inbox.counts() == {"delivered": 10}


async def test_telegram_one_account_down_the_other_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path, monkeypatch, second_bot=True) as w:
        # The first bot's polls fail until the fault is cleared; the second's do not.
        w.fake.fail_next("getUpdates", 502, "Bad Gateway", times=1_000_000, token=TOKEN)
        w.dm(ALICE, tagged("a", 3))
        w.dm(ALICE, tagged("z", 2), token=OTHER_TOKEN)
        await w.answered(ALICE, tagged("z", 2), token=OTHER_TOKEN)
        assert w.replies(ALICE) == []  # the first bot's chat waits...
        assert len(w.fake.pending_updates(TOKEN)) == 3  # ...with its updates kept
        w.fake.clear_failures()
        await w.answered(ALICE, tagged("a", 3))
        assert await w.gateway.inbox.counts() == {"delivered": 5}


# -- Discord -------------------------------------------------------------------------------


class DiscordWorld:
    def __init__(self, fake: FakeDiscord, gateway: Gateway) -> None:
        self.fake, self.gateway = fake, gateway
        self.ann_dm = fake.add_dm(DISCORD_TOKEN, ANN)
        self.bob_dm = fake.add_dm(DISCORD_TOKEN, BOB)

    async def say(self, channel_id: str, text: str, token: str = DISCORD_TOKEN) -> None:
        author = ANN if channel_id != self.bob_dm else BOB
        await self.fake.push_message(token, channel_id=channel_id, content=text, author=author)

    def replies(self, channel_id: str) -> list[str]:
        # The fake echoes a bot's own messages back on its gateway; only ours count here.
        ours = (BOT_ID, SECOND_BOT_ID)
        return [m.content for m in self.fake.sent_to(channel_id) if m.bot_id in ours]

    async def answered(self, channel_id: str, expected: list[str]) -> None:
        await self.fake.wait_until(
            lambda: set(expected) <= set(tags(self.replies(channel_id))), LIMIT
        )
        await self.gateway.wait_idle()
        assert_answered_once(self.replies(channel_id), expected)

    def up(self) -> bool:
        """Every account's gateway session is up (what /health reports)."""
        return bool(self.gateway.channels["discord"].connected())


@asynccontextmanager
async def discord_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, env: dict[str, str] | None = None
) -> AsyncIterator[DiscordWorld]:
    async with fake_discord(monkeypatch) as fake, FakeAnthropic() as llm:
        loaded = load_config(env={**discord_settings(tmp_path, fake, llm), **(env or {})})
        channel = DiscordChannel(loaded.config.channels.discord, ready_timeout=LIMIT)
        async with Gateway(loaded, channels=[channel]) as gateway:
            yield DiscordWorld(fake, gateway)


async def test_discord_socket_dropped_mid_burst_resumes_and_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_world(tmp_path, monkeypatch) as w:
        ann, bob = tagged("a", 8), tagged("b", 8)
        for n in range(8):
            if n == 3:
                assert await w.fake.drop_connection(DISCORD_TOKEN, code=4000) == 1  # close frame
            if n == 6:
                # Once back, the TCP connection dies without a close frame.
                await w.fake.wait_until(lambda: w.fake.gateway.connected(DISCORD_TOKEN), LIMIT)
                assert await w.fake.sever_connection(DISCORD_TOKEN) == 1
            await w.say(w.ann_dm, ann[n])
            await w.say(w.bob_dm, bob[n])
        await w.answered(w.ann_dm, ann)
        await w.answered(w.bob_dm, bob)
        await w.fake.wait_until(lambda: len(w.fake.resumes) == 2, LIMIT)
        assert len(w.fake.identifies) == 1  # the same session throughout
        assert sum(r.replayed for r in w.fake.resumes) >= 1  # the gap came by replay
        assert w.up()
        assert await w.gateway.inbox.counts() == {"delivered": 16}


async def test_discord_resumable_invalid_session_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_world(tmp_path, monkeypatch) as w:
        await w.say(w.ann_dm, "qa01")
        await w.answered(w.ann_dm, ["qa01"])
        assert await w.fake.invalidate_session(DISCORD_TOKEN, resumable=True) == 1
        for text in tagged("a", 3, start=2):
            await w.say(w.ann_dm, text)  # buffered for the RESUME
        await w.answered(w.ann_dm, tagged("a", 4))
        assert len(w.fake.identifies) == 1 and len(w.fake.resumes) == 1
        assert await w.gateway.inbox.counts() == {"delivered": 4}


async def test_discord_non_resumable_invalid_session_reidentifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"PARLEY_CHANNELS__DISCORD__ACCOUNTS__SECOND__TOKEN": SECOND_TOKEN}
    async with discord_world(tmp_path, monkeypatch, env=env) as w:
        other_dm = w.fake.add_dm(SECOND_TOKEN, ANN)
        await w.say(w.ann_dm, "qa01")
        await w.answered(w.ann_dm, ["qa01"])
        assert await w.fake.invalidate_session(DISCORD_TOKEN, resumable=False) == 1
        # Until the client identifies again the bot has no session: real Discord delivers
        # this to nobody and never replays it; the backfill after READY reads it back.
        assert not any(s.token == DISCORD_TOKEN for s in w.fake.gateway.sessions.values())
        await w.say(w.ann_dm, "qx99 sent while the session was gone")
        # The other account keeps serving meanwhile.
        await w.say(other_dm, "qz01", token=SECOND_TOKEN)
        await w.answered(other_dm, ["qz01"])
        # Two accounts identified at start; the new session exists once it identified
        # again, so what is sent from here on reaches it (buffered until it reads).
        # discord.py pauses 5 s before any IDENTIFY but the first (Client.
        # before_identify_hook): the bound covers that pause plus the usual limit, or a
        # fast turn above leaves the pause no slack and a loaded machine fails the test.
        await w.fake.wait_until(lambda: len(w.fake.identifies) == 3, LIMIT + IDENTIFY_PAUSE)
        for text in tagged("a", 3, start=2):
            await w.say(w.ann_dm, text)
        await w.answered(w.ann_dm, ["qa01", "qx99", *tagged("a", 3, start=2)])
        assert w.up()
        assert await w.gateway.inbox.counts() == {"delivered": 6}


async def test_discord_resume_replaying_handled_events_answers_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with discord_world(tmp_path, monkeypatch) as w:
        for text in tagged("a", 3):
            await w.say(w.ann_dm, text)
        await w.say(w.bob_dm, "qb01")
        await w.answered(w.ann_dm, tagged("a", 3))
        await w.answered(w.bob_dm, ["qb01"])
        w.fake.replay_seen_on_resume(100)  # at-least-once: everything comes again
        assert await w.fake.request_reconnect(DISCORD_TOKEN) == 1
        await w.fake.wait_until(lambda: len(w.fake.resumes) == 1, LIMIT)
        [resume] = w.fake.resumes
        assert resume.replayed >= 4  # the handled messages really came back
        await w.say(w.ann_dm, "qa04")
        await w.answered(w.ann_dm, tagged("a", 4))
        await w.answered(w.bob_dm, ["qb01"])
        assert len(w.fake.identifies) == 1
        assert await w.gateway.inbox.counts() == {"delivered": 5}


async def test_discord_messages_sent_while_the_bot_was_down_are_answered_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Discord does not redeliver: what Ann sends while no process runs reaches nobody.
    # The restarted gateway tells the adapter where her conversation stopped
    # (``catch_up``), and the first READY reads the rest back from the DM's history.
    async with fake_discord(monkeypatch) as fake, FakeAnthropic() as llm:
        loaded = load_config(env=discord_settings(tmp_path, fake, llm))

        def gateway() -> Gateway:
            channel = DiscordChannel(loaded.config.channels.discord, ready_timeout=LIMIT)
            return Gateway(loaded, channels=[channel])

        async with gateway() as first:
            w = DiscordWorld(fake, first)
            await w.say(w.ann_dm, "qa01")
            await w.answered(w.ann_dm, ["qa01"])
        assert not fake.gateway.connected(DISCORD_TOKEN)  # down
        for text in tagged("a", 2, start=2):
            await w.say(w.ann_dm, text)
        async with gateway() as second:
            w.gateway = second
            await w.answered(w.ann_dm, tagged("a", 3))  # qa01 once: not read back
            assert await second.inbox.counts() == {"delivered": 3}
