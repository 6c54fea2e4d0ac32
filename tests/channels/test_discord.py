"""The Discord adapter, inbound: the real discord.py against the fake Discord."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest

from parley.channels.base import AttachmentUnavailable, ChatPolicy, InboundMessage
from parley.channels.config import DEFAULT_GROUP_CONTEXT_MESSAGES
from tests.channels.discord_support import (
    ANN,
    BOB,
    BOT_ID,
    BOT_ROLE,
    GENERAL,
    GUILD_ID,
    ME,
    MODS,
    RANDOM,
    THREAD,
    TOKEN,
    Inbox,
    fake_discord,
    reply,
    running,
)
from tests.fakes.discord_api import FakeDiscord


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    async with fake_discord(monkeypatch) as server:
        yield server


async def test_dm_is_direct_and_answered_without_a_quote(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    async with running(fake) as (channel, inbox):
        pushed = await fake.push_message(TOKEN, channel_id=dm, content="hello there", author=BOB)
        [message] = await inbox.wait(1)
        assert message.channel == "discord" and message.account == "default"
        assert (message.chat_type, message.chat_id, message.thread_id) == ("direct", dm, None)
        assert (message.sender_id, message.sender_name) == (BOB["id"], "Bob")
        assert message.text == "hello there" and message.message_id == pushed["id"]
        assert message.mentions_bot and message.guild_id is None and not message.edited
        assert message.timestamp.tzinfo is not None

        result = await channel.send(reply(message, "hi Bob"))
        [sent] = fake.sent
        assert result.platform_message_ids == (sent.id,) and result.parts == 1
        assert result.delivered_at is not None
        assert (sent.channel_id, sent.content, sent.bot_id) == (dm, "hi Bob", BOT_ID)
        assert sent.message_reference is None  # one conversation: no quote needed
        assert sent.allowed_mentions == {"parse": [], "replied_user": True}


@pytest.mark.parametrize(
    ("content", "pings", "text"),
    [
        ("just chatting", {}, "just chatting"),
        (f"<@{BOT_ID}> what time is it?", {"mentions": [ME]}, "what time is it?"),
        (f"hey <@!{BOT_ID}>, look", {"mentions": [ME]}, "hey, look"),
        (f"thanks <@&{BOT_ROLE}>!", {"mention_roles": [BOT_ROLE]}, "thanks!"),
        (f"<@{BOT_ID}>", {"mentions": [ME]}, "@parley"),  # a bare ping still says hello
    ],
    ids=["plain", "asked", "inline", "by-role", "bare"],
)
async def test_guild_messages_with_and_without_the_mention(
    fake: FakeDiscord, content: str, pings: dict[str, list[Any]], text: str
) -> None:
    async with running(fake) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content=content, author=ANN, **pings)
        [message] = await inbox.wait(1)
        assert (message.chat_type, message.chat_id) == ("group", GENERAL)
        assert message.guild_id == GUILD_ID and message.sender_name == "Annie"
        assert message.text == text
        assert message.mentions_bot == bool(pings)  # mentioned exactly when pinged
        # Where the bot waits to be addressed, the rest is kept as group context.
        assert channel.policy(message) == ChatPolicy(
            activation="mention", group_context_messages=DEFAULT_GROUP_CONTEXT_MESSAGES
        )


async def test_a_guild_not_yet_cached_is_still_a_group(fake: FakeDiscord) -> None:
    # discord.py gives a PartialMessageable before the guild's GUILD_CREATE arrives.
    async with running(fake) as (_, inbox):
        await fake.push_message(
            TOKEN,
            channel_id="480000000000000001",
            guild_id="380000000000000001",
            content="early",
            author=ANN,
        )
        [message] = await inbox.wait(1)
    assert (message.chat_type, message.chat_id) == ("group", "480000000000000001")
    assert message.guild_id == "380000000000000001" and not message.mentions_bot


async def test_reply_to_the_bot_counts_as_a_mention(fake: FakeDiscord) -> None:
    async with running(fake) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="first", author=ANN)
        [first] = await inbox.wait(1)
        result = await channel.send(reply(first, "the bot's answer"))
        answer = fake.message(result.platform_message_ids[0])
        assert answer is not None
        await fake.push_message(
            TOKEN, channel_id=GENERAL, content="why?", author=ANN, referenced_message=answer
        )
        other = await fake.push_message(TOKEN, channel_id=GENERAL, content="x" * 600, author=BOB)
        await fake.push_message(
            TOKEN, channel_id=GENERAL, content="agreed", author=ANN, referenced_message=other
        )
        _, to_bot, _, to_bob = await inbox.wait(4)
        assert to_bot.mentions_bot and to_bot.reply_to_text == "parley: the bot's answer"
        assert not to_bob.mentions_bot
        assert to_bob.reply_to_text is not None and to_bob.reply_to_text.startswith("Bob: xxx")
        assert len(to_bob.reply_to_text) == 500 and to_bob.reply_to_text.endswith("…")


async def test_thread_messages_carry_parent_and_thread(fake: FakeDiscord) -> None:
    async with running(fake) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=THREAD, content="in the thread", author=ANN)
        [message] = await inbox.wait(1)
        assert (message.chat_type, message.chat_id, message.thread_id) == (
            "thread",
            GENERAL,
            THREAD,
        )
        assert message.guild_id == GUILD_ID
        await channel.send(reply(message, "threaded answer"))
        [sent] = fake.sent
        assert sent.channel_id == THREAD
        assert sent.message_reference is not None
        assert str(sent.message_reference["message_id"]) == message.message_id
        assert str(sent.message_reference["channel_id"]) == THREAD


async def test_markup_becomes_readable_text(fake: FakeDiscord) -> None:
    content = (
        f"<@{ANN['id']}> and <@!{BOB['id']}>: ask <@&{MODS}> in <#{RANDOM}> or <#{THREAD}> "
        "<:blob:123456789012345678> <a:dance:123456789012345679> "
        "<@799999999999999999> <@&599999999999999999> <#499999999999999999> </deploy:1234567>"
    )
    async with running(fake) as (_, inbox):
        await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            content=content,
            author=ANN,
            mentions=[ANN, BOB],
            mention_roles=[MODS],
        )
        [message] = await inbox.wait(1)
    assert message.text == (
        "@Annie and @Bob: ask @mods in #random or #plans :blob: :dance: "
        "@unknown-user @unknown-role #unknown-channel /deploy"
    )
    assert not message.mentions_bot


async def test_attachments_and_stickers_become_placeholders(fake: FakeDiscord) -> None:
    async with running(fake) as (_, inbox):
        await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            content="see these",
            author=ANN,
            attachments=[
                {"filename": "cat.png", "size": 52_000, "content_type": "image/png"},
                {"filename": "report.pdf", "size": 12_288, "content_type": "application/pdf"},
                {
                    "filename": "voice-message.ogg",
                    "size": 8_000,
                    "content_type": "audio/ogg",
                    "duration_secs": 4.2,
                    "waveform": "AAAA",
                },
            ],
            stickers=[{"name": "wave"}],
        )
        await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            author=ANN,
            attachments=[{"filename": "notes.txt", "size": 300, "content_type": "text/plain"}],
        )
        described, bare = await inbox.wait(2)
    assert described.text == (
        "see these\n[image: cat.png]\n[file: report.pdf, 12 KB]\n[voice message, 4 s]\n"
        "[sticker: wave]"
    )
    assert bare.text == "[file: notes.txt, 300 B]"
    # Each file is also described for the gateway, by its URL (fetched in the turn).
    kinds = [(a.kind, a.name, a.mime_type, a.size) for a in described.attachments]
    assert kinds == [
        ("image", "cat.png", "image/png", 52_000),
        ("document", "report.pdf", "application/pdf", 12_288),
        ("voice", "voice-message.ogg", "audio/ogg", 8_000),
    ]
    assert described.attachments[2].duration == 4.2
    assert described.attachments[0].ref.endswith("/cat.png")
    assert [a.kind for a in bare.attachments] == ["document"]


async def test_an_attachment_is_fetched_through_its_url(fake: FakeDiscord) -> None:
    async with running(fake) as (channel, inbox):
        await fake.push_message(
            TOKEN, channel_id=GENERAL, content=f"<@{BOT_ID}> file", author=ANN,
            attachments=[{"filename": "a.txt", "content_type": "text/plain", "data": b"abc"}],
        )  # fmt: skip
        [message] = await inbox.wait(1)
        [attachment] = message.attachments
        assert await channel.fetch_attachment(message, attachment, 100) == b"abc"
        with pytest.raises(AttachmentUnavailable) as too_big:
            await channel.fetch_attachment(message, attachment, 2)
        assert too_big.value.too_large
        gone = dataclasses.replace(attachment, ref=attachment.ref + "-gone")
        with pytest.raises(AttachmentUnavailable, match="Discord"):
            await channel.fetch_attachment(message, gone, 100)


async def test_own_messages_bots_and_system_messages_are_ignored(fake: FakeDiscord) -> None:
    robot = {"id": "720000000000000009", "username": "robot", "bot": True}
    async with running(fake) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="start", author=ANN)
        [start] = await inbox.wait(1)
        await channel.send(reply(start, "from the bot itself"))  # echoed by the gateway
        await fake.push_message(TOKEN, channel_id=GENERAL, content="beep", author=robot)
        await fake.push_message(
            TOKEN, channel_id=GENERAL, content="", author=ANN, message_type=7
        )  # a member joined
        await fake.push_message(TOKEN, channel_id=GENERAL, content="   ", author=ANN)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="marker", author=ANN)
        # Per-channel order is kept, so once the marker is in, the others were dropped.
        messages = await inbox.wait(2)
        assert [m.text for m in messages] == ["start", "marker"]

    async with running(fake, allow_bots=True) as (_, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="beep", author=robot)
        [beep] = await inbox.wait(1)
        assert beep.sender_name == "robot"


@pytest.mark.parametrize("rule", ["ignore", "answer"])
async def test_edits_follow_the_edit_rule(fake: FakeDiscord, rule: str) -> None:
    async with running(fake, edited_messages=rule) as (_, inbox):
        original = await fake.push_message(TOKEN, channel_id=GENERAL, content="v1", author=ANN)
        await inbox.wait(1)
        # An "edit" that leaves the text alone (an unfurl) is never answered.
        await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            content="v1",
            author=ANN,
            edited=True,
            message_id=original["id"],
        )
        edit = await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            content="v2",
            author=ANN,
            edited=True,
            message_id=original["id"],
        )
        await fake.push_message(TOKEN, channel_id=GENERAL, content="marker", author=ANN)
        messages = await inbox.wait(2 if rule == "ignore" else 3)
    if rule == "ignore":
        assert [m.text for m in messages] == ["v1", "marker"]
        return
    first, edited, _ = messages
    assert edited.edited and edited.text == "(edited) v2"
    stamp = datetime.fromisoformat(edit["edited_timestamp"])
    assert edited.message_id == f"{original['id']}:edit:{int(stamp.timestamp() * 1000)}"
    assert edited.message_id != first.message_id and edited.timestamp == stamp


async def test_reconnect_resumes_and_messages_keep_flowing(fake: FakeDiscord) -> None:
    async with running(fake) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="before", author=ANN)
        await inbox.wait(1)
        assert await fake.request_reconnect(TOKEN) == 1
        await fake.push_message(TOKEN, channel_id=GENERAL, content="during", author=ANN)
        await fake.wait_until(lambda: len(fake.resumes) == 1)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="after", author=ANN)
        messages = await inbox.wait(3)
        assert [m.text for m in messages] == ["before", "during", "after"]
        assert len(fake.identifies) == 1  # resumed, not a new session
        assert channel.connected()  # up again after the resume (what /health reports)
        await channel.send(reply(messages[-1], "still here"))
    assert [s.content for s in fake.sent] == ["still here"]


async def test_order_is_kept_per_channel_under_a_burst(fake: FakeDiscord) -> None:
    async def uneven(message: InboundMessage) -> None:
        # Handlers that take different numbers of turns would reorder tasks, not a queue.
        for _ in range(int(message.text.split()[-1]) % 4):
            await asyncio.sleep(0)

    async with running(fake, Inbox(uneven)) as (_, inbox):
        for n in range(50):
            channel_id = GENERAL if n % 2 else RANDOM
            await fake.push_message(TOKEN, channel_id=channel_id, content=f"m {n}", author=ANN)
        messages = await inbox.wait(50)
    assert [m.text for m in messages] == [f"m {n}" for n in range(50)]
    for channel_id in (GENERAL, RANDOM):
        ids = [int(m.message_id) for m in messages if m.chat_id == channel_id]
        assert ids == sorted(ids) and len(ids) == 25


async def test_a_failing_handler_does_not_stop_the_inbox(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    async def explode_once(message: InboundMessage) -> None:
        if message.text == "boom":
            raise RuntimeError("handler bug")

    with caplog.at_level(logging.ERROR, logger="parley.channels.discord"):
        async with running(fake, Inbox(explode_once)) as (_, inbox):
            await fake.push_message(TOKEN, channel_id=GENERAL, content="boom", author=ANN)
            await fake.push_message(TOKEN, channel_id=GENERAL, content="fine", author=ANN)
            [message] = await inbox.wait(1)
    assert message.text == "fine"
    assert "inbound handler failed" in caplog.text


async def test_an_event_the_library_cannot_parse_is_skipped(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(fake) as (channel, inbox):
        good = await fake.push_message(TOKEN, channel_id=GENERAL, content="first", author=ANN)
        await inbox.wait(1)
        bad = {k: v for k, v in good.items() if k != "content"}
        bad.update(id=str(int(good["id"]) + 1), timestamp="not a time")
        with caplog.at_level(logging.ERROR, logger="parley.channels.discord"):
            await fake.gateway.dispatch(TOKEN, "MESSAGE_CREATE", bad)
            await fake.gateway.dispatch(TOKEN, "MESSAGE_CREATE", {**good, "id": "not-a-number"})
            await fake.push_message(TOKEN, channel_id=GENERAL, content="second", author=ANN)
            messages = await inbox.wait(2)
        assert [m.text for m in messages] == ["first", "second"]
        assert "cannot parse a MESSAGE_CREATE event" in caplog.text
        assert channel.connected() and channel._accounts["default"].restarts == 0
        assert len(fake.identifies) == 1  # the same session all along


async def test_a_client_that_stops_unexpectedly_is_restarted(
    fake: FakeDiscord, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("parley.channels.discord_adapter.RESTART_INITIAL_SECONDS", 0.01)

    def broken(data: Any) -> None:
        raise RuntimeError("a library bug")

    async with running(fake) as (channel, inbox):
        account = channel._accounts["default"]
        first = account.client
        # Unguarded, as if a parser escaped the guard: Client.start ends with the error.
        first._connection.parsers["TYPING_START"] = broken
        with caplog.at_level(logging.ERROR, logger="parley.channels.discord"):
            await fake.gateway.dispatch(TOKEN, "TYPING_START", {"channel_id": GENERAL})
            await fake.wait_until(lambda: len(fake.identifies) == 2)
        assert "stopped unexpectedly" in caplog.text and "a library bug" in caplog.text
        assert account.restarts == 1 and account.client is not first and first.is_closed()
        async with asyncio.timeout(10):
            await account._connected.wait()  # READY on the new session
        assert channel.connected()
        await fake.push_message(TOKEN, channel_id=GENERAL, content="after", author=ANN)
        [message] = await inbox.wait(1)
        assert message.text == "after"
        await channel.send(reply(message, "back"))
    assert [s.content for s in fake.sent] == ["back"]
