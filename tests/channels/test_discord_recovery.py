"""The Discord adapter recovering what it would otherwise lose: messages the gateway
could not store (handed over again with a backoff) and messages sent while the bot
had no gateway session (backfilled from history after the new READY)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import discord
import pytest

from parley.channels.base import InboundMessage, InboundNotStored, SeenMark
from parley.channels.discord_adapter import DiscordChannel
from parley.channels.discord_backfill import LastSeen
from tests.channels.discord_support import (
    ANN,
    BOB,
    GENERAL,
    LIMIT,
    RANDOM,
    THREAD,
    TOKEN,
    Inbox,
    fake_discord,
    make_config,
    reply,
    running,
)
from tests.fakes.discord_api import GET_MESSAGES, FakeDiscord

LOGGER = "parley.channels.discord"
ROBOT = {"id": "720000000000000009", "username": "robot", "bot": True}


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    async def identify_at_once(self: Any, shard_id: int | None, *, initial: bool = False) -> None:
        """discord.py waits 5 s before every IDENTIFY but the first, for Discord's
        identify rate limit; the fake has none, and the tests need not wait."""

    monkeypatch.setattr(discord.Client, "before_identify_hook", identify_at_once)
    async with fake_discord(monkeypatch) as server:
        yield server


def account_of(channel: DiscordChannel) -> Any:
    return channel._accounts["default"]


# -- messages the gateway could not store -------------------------------------------


def _found(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match is not None, (pattern, text)
    return match[1]


async def test_a_message_not_stored_is_handed_over_again_in_order(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("parley.channels.discord_adapter.STORE_RETRY_INITIAL_SECONDS", 0.001)
    monkeypatch.setattr("parley.channels.discord_adapter.STORE_RETRY_MAX_SECONDS", 0.004)
    attempts: list[str] = []
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def storage_full_at_first(message: InboundMessage) -> None:
        attempts.append(message.text)
        # Refuse "first" four times, and until both later messages wait behind it.
        if message.text == "first" and (len(attempts) <= 4 or queue.qsize() < 2):
            raise InboundNotStored("disk full")

    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with running(fake, Inbox(storage_full_at_first)) as (channel, inbox):
            queue = account_of(channel).queue
            await fake.push_message(TOKEN, channel_id=GENERAL, content="first", author=ANN)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="second", author=ANN)
            await fake.push_message(TOKEN, channel_id=RANDOM, content="third", author=BOB)
            messages = await inbox.wait(3)
            assert [m.text for m in messages] == ["first", "second", "third"]
    failed = attempts.count("first") - 1
    assert failed >= 4 and attempts[failed:] == ["first", "second", "third"]  # once each
    warnings = [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
    ]
    assert [_found(r"attempt (\d+)", w) for w in warnings] == [str(n) for n in range(1, failed + 1)]
    delays = [float(_found(r"again in ([0-9.e-]+) s", w)) for w in warnings]
    assert delays[:4] == [0.001, 0.002, 0.004, 0.004]  # doubling, then capped
    assert f"stored after {failed} failed attempt(s)" in caplog.text


async def test_other_handler_errors_still_drop_the_message(fake: FakeDiscord) -> None:
    async def poisoned(message: InboundMessage) -> None:
        if message.text == "poison":
            raise ValueError("cannot handle this one")

    async with running(fake, Inbox(poisoned)) as (_, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="poison", author=ANN)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="next", author=ANN)
        [message] = await inbox.wait(1)
    assert message.text == "next"


async def test_stop_ends_the_backoff_at_once(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An hour's wait, and a grace long enough that only an interruptible wait ends it.
    monkeypatch.setattr("parley.channels.discord_adapter.STORE_RETRY_INITIAL_SECONDS", 3600.0)
    monkeypatch.setattr("parley.channels.discord_adapter.STOP_GRACE_SECONDS", 3600.0)
    refused = asyncio.Event()
    calls = 0

    async def storage_full(message: InboundMessage) -> None:
        nonlocal calls
        calls += 1
        refused.set()
        raise InboundNotStored("disk full")

    channel = DiscordChannel(make_config(fake), ready_timeout=LIMIT)
    await channel.start(storage_full)
    consumer = account_of(channel)._consumer
    try:
        await fake.push_message(TOKEN, channel_id=GENERAL, content="lost", author=ANN)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="behind", author=ANN)
        async with asyncio.timeout(LIMIT):
            await refused.wait()
    finally:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            async with asyncio.timeout(LIMIT):  # a hang guard, not a timing assertion
                await channel.stop()
    assert consumer.done() and not consumer.cancelled()  # it ended by itself
    assert calls == 1  # no retry after stop
    assert "stopping with message" in caplog.text and "not stored" in caplog.text


# -- the fake's history endpoint ------------------------------------------------------


async def _history(fake: FakeDiscord, channel_id: str, **params: Any) -> tuple[int, Any]:
    url = f"{fake.api_base}/channels/{channel_id}/messages"
    headers = {"Authorization": f"Bot {TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, params={k: str(v) for k, v in params.items()}, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_the_fake_history_reads_like_discord(fake: FakeDiscord) -> None:
    pushed = [
        await fake.push_message(TOKEN, channel_id=GENERAL, content=f"m{n}", author=ANN)
        for n in range(5)
    ]
    await fake.push_message(TOKEN, channel_id=RANDOM, content="elsewhere", author=ANN)
    ids = [m["id"] for m in pushed]

    def page(body: list[dict[str, Any]]) -> list[str]:
        return [m["id"] for m in body]

    status, body = await _history(fake, GENERAL)
    assert status == 200 and page(body) == ids[::-1]  # newest first, this channel only
    assert all("member" not in m and "guild_id" not in m for m in body)  # gateway-only
    _, body = await _history(fake, GENERAL, limit=2)
    assert page(body) == [ids[4], ids[3]]
    _, body = await _history(fake, GENERAL, after=ids[0], limit=2)
    assert page(body) == [ids[2], ids[1]]  # the oldest after it, still newest first
    _, body = await _history(fake, GENERAL, before=ids[3], limit=2)
    assert page(body) == [ids[2], ids[1]]
    _, body = await _history(fake, GENERAL, after=ids[4])
    assert body == []
    for bad in ({"limit": 0}, {"limit": 101}, {"limit": "x"}, {"after": "abc"},
                {"before": ids[3], "after": ids[0]}):  # fmt: skip
        status, body = await _history(fake, GENERAL, **bad)
        assert (status, body["code"]) == (400, 50035), bad
    fake.hide_channel(RANDOM)
    status, body = await _history(fake, RANDOM)
    assert (status, body["code"]) == (403, 50001)
    status, body = await _history(fake, "499999999999999999")
    assert (status, body["code"]) == (404, 10003)


# -- backfill after a lost session --------------------------------------------------


async def _lose_the_session(fake: FakeDiscord) -> None:
    """Op 9, not resumable: until the client identifies again, nothing reaches it."""
    assert await fake.invalidate_session(TOKEN, resumable=False) == 1
    assert not any(s.token == TOKEN for s in fake.gateway.sessions.values())


def _no_session(fake: FakeDiscord) -> bool:
    return not any(s.token == TOKEN for s in fake.gateway.sessions.values())


def _history_reads(fake: FakeDiscord) -> list[str]:
    return [r.path.split("/")[-2] for r in fake.requests if r.route == GET_MESSAGES]


async def test_messages_sent_without_a_session_are_backfilled_once_in_order(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with running(fake) as (channel, inbox):
            await fake.push_message(TOKEN, channel_id=GENERAL, content="before", author=ANN)
            await fake.push_message(TOKEN, channel_id=THREAD, content="thread 1", author=ANN)
            await fake.push_message(TOKEN, channel_id=dm, content="dm 1", author=BOB)
            handled = await inbox.wait(3)
            await channel.send(reply(handled[0], "the bot's answer"))  # in the history too
            assert _history_reads(fake) == []  # the first READY needs no backfill

            await _lose_the_session(fake)
            for text in ("gap 1", "gap 2"):
                await fake.push_message(TOKEN, channel_id=GENERAL, content=text, author=ANN)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="beep", author=ROBOT)
            await fake.push_message(TOKEN, channel_id=THREAD, content="thread gap", author=ANN)
            await fake.push_message(TOKEN, channel_id=dm, content="dm gap", author=BOB)
            assert _no_session(fake)  # all of that reached nobody

            messages = await inbox.wait(7)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="after", author=ANN)
            messages = await inbox.wait(8)
            assert len(fake.identifies) == 2
    texts = [m.text for m in messages]
    assert texts[:3] == ["before", "thread 1", "dm 1"] and texts[-1] == "after"
    assert sorted(texts[3:7]) == ["dm gap", "gap 1", "gap 2", "thread gap"]
    assert texts.index("gap 1") < texts.index("gap 2")  # in order within the channel
    assert len(messages) == 8 and len({m.message_id for m in messages}) == 8  # once each
    by_text = {m.text: m for m in messages}
    thread_gap, dm_gap = by_text["thread gap"], by_text["dm gap"]
    assert (thread_gap.chat_type, thread_gap.chat_id, thread_gap.thread_id) == (
        "thread", GENERAL, THREAD,
    )  # fmt: skip
    assert (dm_gap.chat_type, dm_gap.chat_id, dm_gap.mentions_bot) == ("direct", dm, True)
    assert by_text["gap 1"].chat_type == "group" and by_text["gap 1"].guild_id is not None
    assert sorted(_history_reads(fake)) == sorted([GENERAL, THREAD, dm])  # one read each
    assert "backfill done: 4 message(s) from 3 channel(s)" in caplog.text


async def test_a_restart_catches_up_from_the_gateways_marks(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    """What was sent while no process ran is read back on the first READY, from the
    marks the gateway passed to ``catch_up``; a day-old message is not answered."""
    dm = fake.add_dm(TOKEN, BOB)
    now = datetime.now(UTC)
    old = discord.utils.time_snowflake(now - timedelta(days=3))
    stale = discord.utils.time_snowflake(now - timedelta(days=2))
    # The history as the bot left it, then what came while it was down.
    await fake.push_message(TOKEN, channel_id=GENERAL, content="seen", author=ANN, message_id=old)
    await fake.push_message(
        TOKEN, channel_id=GENERAL, content="days ago", author=ANN, message_id=stale
    )
    seen_dm = await fake.push_message(TOKEN, channel_id=dm, content="dm seen", author=BOB)
    for text in ("missed 1", "missed 2"):
        await fake.push_message(TOKEN, channel_id=GENERAL, content=text, author=ANN)
    await fake.push_message(TOKEN, channel_id=dm, content="dm missed", author=BOB)
    await fake.push_message(TOKEN, channel_id=RANDOM, content="never seen", author=ANN)

    channel = DiscordChannel(make_config(fake), ready_timeout=LIMIT)
    channel.catch_up(
        [
            SeenMark("default", dm, None, seen_dm["id"]),
            SeenMark("default", GENERAL, None, f"{old}:edit:1"),  # an edit names its message
            SeenMark("other-account", GENERAL, None, "1"),  # another account's: not ours
        ]
    )
    inbox = Inbox()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await channel.start(inbox.handle)
        try:
            messages = await inbox.wait(3)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="live", author=ANN)
            messages = await inbox.wait(4)
        finally:
            await channel.stop()
    texts = [m.text for m in messages]
    assert sorted(texts[:3]) == ["dm missed", "missed 1", "missed 2"] and texts[3] == "live"
    assert texts.index("missed 1") < texts.index("missed 2")
    assert sorted(_history_reads(fake)) == sorted([GENERAL, dm])
    assert "1 missed message(s) in channel" in caplog.text  # "days ago", skipped


async def test_a_resume_needs_no_backfill(fake: FakeDiscord) -> None:
    async with running(fake) as (_, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="before", author=ANN)
        await inbox.wait(1)
        assert await fake.invalidate_session(TOKEN, resumable=True) == 1
        await fake.push_message(TOKEN, channel_id=GENERAL, content="replayed", author=ANN)
        await fake.wait_until(lambda: len(fake.resumes) == 1)
        messages = await inbox.wait(2)
    assert [m.text for m in messages] == ["before", "replayed"]
    assert _history_reads(fake) == [] and len(fake.identifies) == 1


@pytest.mark.parametrize("failure", ["forbidden", "server error"])
async def test_a_channel_that_cannot_be_read_is_skipped(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    async with running(fake) as (_, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="g before", author=ANN)
        await fake.push_message(TOKEN, channel_id=RANDOM, content="r before", author=ANN)
        await inbox.wait(2)
        await _lose_the_session(fake)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="g gap", author=ANN)
        await fake.push_message(TOKEN, channel_id=RANDOM, content="r gap", author=ANN)
        if failure == "forbidden":
            fake.hide_channel(RANDOM)
        else:
            # RANDOM was active last, so it is read first; 503 is not retried by discord.py.
            fake.fail_next(503, route=GET_MESSAGES)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            await fake.wait_until(lambda: len(_history_reads(fake)) == 2)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="g after", author=ANN)
            messages = await inbox.wait(4)
    assert [m.text for m in messages] == ["g before", "r before", "g gap", "g after"]
    assert _history_reads(fake) == [RANDOM, GENERAL]
    assert f"cannot backfill channel {RANDOM}" in caplog.text


async def test_live_messages_wait_for_the_backfill_and_are_not_doubled(
    fake: FakeDiscord,
) -> None:
    async with running(fake) as (_, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="before", author=ANN)
        await inbox.wait(1)
        release = fake.hold_next(route=GET_MESSAGES)
        await _lose_the_session(fake)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="gap", author=ANN)
        await fake.wait_until(lambda: fake.held == 1)  # the backfill is reading
        # Live on the new session and, once the read is answered, in its history too.
        await fake.push_message(TOKEN, channel_id=GENERAL, content="live 1", author=ANN)
        await fake.push_message(TOKEN, channel_id=RANDOM, content="elsewhere", author=ANN)
        [_, elsewhere] = await inbox.wait(2)  # a channel not being backfilled flows on
        assert elsewhere.text == "elsewhere"
        release.set()
        await fake.push_message(TOKEN, channel_id=GENERAL, content="live 2", author=ANN)
        messages = await inbox.wait(5)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="marker", author=ANN)
        messages = await inbox.wait(6)
    general = [m.text for m in messages if m.chat_id == GENERAL]
    assert general == ["before", "gap", "live 1", "live 2", "marker"]
    assert len(messages) == 6


async def test_backfill_caps(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("parley.channels.discord_backfill.MAX_CHANNELS_PER_BACKFILL", 1)
    monkeypatch.setattr("parley.channels.discord_backfill.MAX_MESSAGES_PER_CHANNEL", 2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with running(fake) as (_, inbox):
            await fake.push_message(TOKEN, channel_id=RANDOM, content="r before", author=ANN)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="g before", author=ANN)
            await inbox.wait(2)
            await _lose_the_session(fake)
            await fake.push_message(TOKEN, channel_id=RANDOM, content="r gap", author=ANN)
            for n in range(3):
                await fake.push_message(TOKEN, channel_id=GENERAL, content=f"g{n}", author=ANN)
            await fake.wait_until(lambda: len(fake.identifies) == 2)
            messages = await inbox.wait(4)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="marker", author=ANN)
            messages = await inbox.wait(5)
    # Only the most recently active channel, and only its two oldest missed messages.
    assert [m.text for m in messages] == ["r before", "g before", "g0", "g1", "marker"]
    assert _history_reads(fake) == [GENERAL]
    assert "(1 less active ones not)" in caplog.text
    assert "later ones are lost" in caplog.text


def test_last_seen_is_bounded_and_keeps_the_newest_id() -> None:
    seen = LastSeen(capacity=3)
    for channel, message in [(1, 10), (2, 20), (3, 30), (1, 11), (1, 5)]:
        seen.note(channel, message)
    assert seen.get(1) == 11  # an older id never moves the mark back
    seen.note(4, 40)  # channel 2 was the least recently active
    assert seen.get(2) is None and len(seen) == 3
    assert seen.most_recent(2) == [4, 1] and seen.most_recent(10) == [4, 1, 3]
