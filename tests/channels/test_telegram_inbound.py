"""Inbound: the real TelegramChannel polling the fake Bot API, updates normalised."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC
from typing import Any

import pytest

from parley.channels.base import Attachment, InboundMessage, OutboundMessage
from parley.channels.telegram import TelegramChannel
from tests.channels.telegram_helpers import (
    BOT_ID,
    TOKEN,
    Inbox,
    fake_telegram,
    loopback_only,
    running_channel,
)
from tests.fakes.telegram_api import FakeTelegram

GROUP = -100123


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback_only(monkeypatch)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with fake_telegram() as server:
        yield server


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
async def channel(fake: FakeTelegram, inbox: Inbox) -> AsyncIterator[TelegramChannel]:
    async with running_channel(fake, inbox) as running:
        yield running


def group_message(fake: FakeTelegram, text: str, **extra: Any) -> dict[str, Any]:
    return fake.push_message(
        TOKEN, chat_id=GROUP, chat_type="supergroup", sender_id=7, sender_first_name="Bob",
        text=text, **extra,
    )  # fmt: skip


async def only(inbox: Inbox, fake: FakeTelegram, chat_id: int = GROUP) -> InboundMessage:
    """The one message that arrived before a sentinel pushed after the one under test."""
    fake.push_message(TOKEN, chat_id=chat_id, chat_type="supergroup", text="sentinel")
    messages = await inbox.wait(1)
    while messages[-1].text != "sentinel":
        messages = await inbox.wait(len(messages) + 1)
    assert len(messages) == 2, [m.text for m in messages]
    return messages[0]


async def dropped(inbox: Inbox, fake: FakeTelegram) -> None:
    fake.push_message(TOKEN, chat_id=GROUP, chat_type="supergroup", text="sentinel")
    messages = await inbox.wait(1)
    assert [m.text for m in messages] == ["sentinel"]


async def test_direct_text(fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel) -> None:
    fake.push_message(
        TOKEN, chat_id=42, text="  hello there ", sender_first_name="Alice",
        sender_last_name="Smith",
    )  # fmt: skip
    [message] = await inbox.wait(1)
    assert message.channel == "telegram"
    assert message.account == "default"
    assert (message.chat_type, message.chat_id, message.sender_id) == ("direct", "42", "42")
    assert message.sender_name == "Alice Smith"
    assert message.text == "hello there"
    assert message.message_id == "42:1"
    assert message.timestamp.tzinfo is not None
    assert message.timestamp.utcoffset() == UTC.utcoffset(None)
    assert message.mentions_bot is True
    assert (message.thread_id, message.reply_to_text, message.edited) == (None, None, False)


async def test_command_for_us_is_stripped_of_our_name(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    group_message(fake, "/ask@Parley_Bot what time is it")
    message = await only(inbox, fake)
    assert message.text == "/ask what time is it"
    assert message.mentions_bot is True
    assert message.chat_type == "group"


async def test_bare_command_counts_as_addressing_the_bot(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    group_message(fake, "/new")
    message = await only(inbox, fake)
    assert (message.text, message.mentions_bot) == ("/new", True)


async def test_command_for_another_bot_is_dropped_in_groups(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    group_message(fake, "/start@other_bot")
    await dropped(inbox, fake)


async def test_mention_is_removed_and_flagged(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    group_message(fake, "hey @parley_bot, what's up with @someone_else?")
    group_message(fake, "@PARLEY_BOT summarise 😀 this")
    group_message(fake, "just chatting")
    messages = await inbox.wait(3)
    assert [(m.text, m.mentions_bot) for m in messages] == [
        ("hey, what's up with @someone_else?", True),
        ("summarise 😀 this", True),
        ("just chatting", False),
    ]


async def test_text_mention_of_the_bot(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    entity = {
        "type": "text_mention", "offset": 3, "length": 6,
        "user": {"id": BOT_ID, "is_bot": True, "first_name": "Parley"},
    }  # fmt: skip
    group_message(fake, "hi Parley, ping", entities=[entity])
    message = await only(inbox, fake)
    assert (message.text, message.mentions_bot) == ("hi, ping", True)


async def test_reply_to_the_bot(fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel) -> None:
    group_message(fake, "@parley_bot tell me a joke")
    [asked] = await inbox.wait(1)
    answer = "Why did the **chicken**…"
    await channel.send(
        OutboundMessage(
            "telegram", "default", str(GROUP), answer, reply_to_message_id=asked.message_id
        )
    )
    group_message(fake, "why?", reply_to=fake.sent[0].message)
    messages = await inbox.wait(2)
    assert messages[1].mentions_bot is True
    assert messages[1].reply_to_text == "Parley: Why did the chicken…"


async def test_quote_wins_over_the_whole_replied_message(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    first = fake.push_message(
        TOKEN, chat_id=GROUP, chat_type="supergroup", sender_id=8, sender_first_name="Carol",
        text="one two three " * 100,
    )  # fmt: skip
    group_message(fake, "and this?", reply_to=first["message"], quote_text="two three")
    group_message(fake, "long", reply_to=first["message"])
    messages = await inbox.wait(3)
    assert messages[1].reply_to_text == "Carol: two three"
    assert messages[1].mentions_bot is False  # a reply to Carol, not to us
    assert messages[2].reply_to_text is not None
    assert messages[2].reply_to_text.startswith("Carol: one two three")
    assert len(messages[2].reply_to_text) == 500


async def test_forum_topic_is_a_thread(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    group_message(fake, "in a topic", is_forum=True, message_thread_id=9, is_topic_message=True)
    message = await only(inbox, fake)
    assert (message.chat_type, message.thread_id) == ("thread", "9")
    # The topic's creation message Telegram attaches as reply_to_message is not a reply.
    assert (message.reply_to_text, message.mentions_bot) == (None, False)


async def test_reply_chain_in_a_plain_group_is_not_a_thread(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    first = group_message(fake, "root")
    group_message(fake, "reply", reply_to=first["message"], message_thread_id=1)
    messages = await inbox.wait(2)
    assert (messages[1].chat_type, messages[1].thread_id) == ("group", None)
    assert messages[1].reply_to_text == "Bob: root"


async def test_private_chat_topic_keeps_its_thread(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    fake.push_message(TOKEN, chat_id=42, text="hi", message_thread_id=3, is_topic_message=True)
    [message] = await inbox.wait(1)
    assert (message.chat_type, message.thread_id) == ("direct", "3")


async def test_media_become_placeholders(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    fake.push_message(TOKEN, chat_id=42, photo=True, caption="look at @parley_bot this")
    fake.push_message(TOKEN, chat_id=42, voice=5)
    fake.push_message(TOKEN, chat_id=42, document="report.pdf", caption="Q3")
    fake.push_message(TOKEN, chat_id=42, sticker="😀")
    fake.push_message(TOKEN, chat_id=42, location=(52.52, 13.405))
    fake.push_message(TOKEN, chat_id=42, video=12)
    fake.push_message(
        TOKEN, chat_id=42, extra={"contact": {"phone_number": "+100", "first_name": "Dan"}}
    )
    messages = await inbox.wait(7)
    assert [m.text for m in messages] == [
        "[photo] look at this",
        "[voice note, 5 s]",
        "[document: report.pdf] Q3",
        "[sticker 😀]",
        "[location: 52.52000, 13.40500]",
        "[video, 12 s]",
        "[contact: Dan]",
    ]


async def test_photos_documents_and_voice_notes_are_described_as_attachments(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    fake.push_message(TOKEN, chat_id=42, photo=True)  # three sizes, no caption: still taken
    fake.push_message(TOKEN, chat_id=42, voice=5)
    picture = {"document": {"file_id": "DOC1", "file_unique_id": "U1", "file_size": 900,
                            "file_name": "scan.png", "mime_type": "image/png"}}  # fmt: skip
    fake.push_message(TOKEN, chat_id=42, extra=picture, caption="scanned")
    fake.push_message(TOKEN, chat_id=42, document="notes.md")
    fake.push_message(TOKEN, chat_id=42, sticker="😀")
    messages = await inbox.wait(5)
    photo, voice, scan, notes, sticker = (m.attachments for m in messages)
    assert photo == (Attachment("image", "AgACAgIAAxk", name="photo.jpg", mime_type="image/jpeg",
                                size=1280 * 960 // 10, width=1280, height=960),)  # fmt: skip
    assert voice == (Attachment("voice", "AgACAgIAAxk", name="voice.ogg", mime_type="audio/ogg",
                                duration=5.0),)  # fmt: skip
    assert scan == (Attachment("image", "DOC1", name="scan.png", mime_type="image/png", size=900),)
    assert [(a.kind, a.name) for a in notes] == [("document", "notes.md")]
    assert sticker == ()  # a sticker stays a placeholder
    assert messages[0].text == "[photo]"


async def test_nothing_usable_is_dropped(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    joined = {"new_chat_members": [{"id": 9, "is_bot": False, "first_name": "Eve"}]}
    fake.push_message(TOKEN, chat_id=GROUP, chat_type="supergroup", extra=joined)
    group_message(fake, "from a bot", sender_is_bot=True)
    fake.push_update(TOKEN, {"channel_post": {
        "message_id": 1, "date": 0, "chat": {"id": -100999, "type": "channel"}, "text": "news",
    }})  # fmt: skip
    await dropped(inbox, fake)


async def test_edits_are_ignored_by_default(
    fake: FakeTelegram, inbox: Inbox, channel: TelegramChannel
) -> None:
    group_message(fake, "first")
    group_message(fake, "first, edited", edit=True)
    message = await only(inbox, fake)
    assert message.text == "first"


async def test_edits_answered_when_configured(fake: FakeTelegram, inbox: Inbox) -> None:
    async with running_channel(fake, inbox, edited_messages="answer"):
        fake.push_message(TOKEN, chat_id=42, text="helo")
        update = fake.push_message(TOKEN, chat_id=42, text="hello", edit=True)
        messages = await inbox.wait(2)
    edit = messages[1]
    edit_date = update["edited_message"]["edit_date"]
    assert edit.edited is True
    assert edit.text == "(edited) hello"
    assert edit.message_id == f"42:1:edit:{edit_date}"
    assert messages[0].message_id == "42:1"


async def test_each_update_is_handled_once_and_acknowledged(
    fake: FakeTelegram, inbox: Inbox
) -> None:
    async with running_channel(fake, inbox):
        fake.push_message(TOKEN, chat_id=42, text="one")
        last = fake.push_message(TOKEN, chat_id=42, text="two")
        await inbox.wait(2)
        await fake.wait_polled(TOKEN, last["update_id"] + 1)
        fake.push_message(TOKEN, chat_id=42, text="three")
        await inbox.wait(3)
    assert [m.text for m in inbox.messages] == ["one", "two", "three"]
    assert fake.pending_updates(TOKEN) == []  # stop() acknowledged "three"
    offsets = [c.params.get("offset") for c in fake.calls if c.method == "getUpdates"]
    assert offsets.count(str(last["update_id"] + 1)) >= 1
    assert inbox.attempts == 3


async def test_handler_failure_retries_the_same_update(fake: FakeTelegram, inbox: Inbox) -> None:
    inbox.failures = 2
    async with running_channel(fake, inbox):
        fake.push_message(TOKEN, chat_id=42, text="precious")
        fake.push_message(TOKEN, chat_id=42, text="next")
        messages = await inbox.wait(2)
    assert [m.text for m in messages] == ["precious", "next"]
    assert inbox.attempts == 4


async def test_poisoned_update_is_skipped_after_five_attempts(
    fake: FakeTelegram, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    inbox.failures = 5
    async with running_channel(fake, inbox):
        fake.push_message(TOKEN, chat_id=42, text="poison")
        fake.push_message(TOKEN, chat_id=42, text="next")
        messages = await inbox.wait(1)
    assert [m.text for m in messages] == ["next"]
    assert inbox.attempts == 6
    assert "skipping update" in caplog.text


async def test_update_not_stored_is_retried_past_the_poison_limit(
    fake: FakeTelegram, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    # Storage refusing writes is not the update's fault: it must outlast the five
    # attempts a poisoned update gets, and arrive once, before what came after it.
    inbox.refusals = 12
    caplog.set_level(logging.INFO, logger="parley")
    async with running_channel(fake, inbox):
        fake.push_message(TOKEN, chat_id=42, text="precious")
        fake.push_message(TOKEN, chat_id=42, text="next")
        messages = await inbox.wait(2)
    assert [m.text for m in messages] == ["precious", "next"]
    assert inbox.attempts == 14
    assert "skipping update" not in caplog.text
    assert "stored after 12 refusals" in caplog.text


async def test_update_not_stored_stays_with_telegram_when_stopped(
    fake: FakeTelegram, inbox: Inbox
) -> None:
    inbox.refusals = 10**6  # storage never comes back before the stop
    async with running_channel(fake, inbox):
        update = fake.push_message(TOKEN, chat_id=42, text="kept")
        await inbox.wait_attempts(3)  # a few refusals went by
    assert inbox.messages == []
    # Never acknowledged: Telegram hands it over again after a restart.
    assert [u["update_id"] for u in fake.pending_updates(TOKEN)] == [update["update_id"]]


async def test_conflict_and_network_errors_back_off_and_recover(
    fake: FakeTelegram, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail_next("getUpdates", 409, "Conflict: terminated by other getUpdates request")
    fake.fail_next("getUpdates", 503, "Service Unavailable")
    async with running_channel(fake, inbox):
        fake.push_message(TOKEN, chat_id=42, text="still here")
        await inbox.wait(1)
    assert "another process polls this bot" in caplog.text
