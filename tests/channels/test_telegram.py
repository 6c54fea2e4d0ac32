"""Outbound and lifecycle: the real TelegramChannel against the fake Bot API."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from telegram.error import RetryAfter

from parley.channels.base import (
    ChannelStartError,
    ChatPolicy,
    DeliveryError,
    InboundMessage,
    OutboundMessage,
    RecipientBlocked,
)
from parley.channels.telegram import TelegramChannel
from parley.channels.telegram_polling import acknowledge
from parley.channels.telegram_send import retry_after_seconds
from parley.channels.text import utf16_len
from tests.channels.telegram_helpers import (
    OTHER_BOT_ID,
    OTHER_TOKEN,
    OTHER_USERNAME,
    TOKEN,
    USERNAME,
    Inbox,
    Sleeps,
    fake_telegram,
    loopback_only,
    make_config,
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
        server.add_chat(42, first_name="Alice")
        server.add_chat(GROUP, "supergroup", title="Team")
        yield server


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def channel(fake: FakeTelegram, sleeps: Sleeps) -> AsyncIterator[TelegramChannel]:
    async with running_channel(fake, Inbox(), sleeps, max_retry_after_seconds=5) as running:
        yield running


def reply(text: str, chat_id: int = 42, **extra: str | None) -> OutboundMessage:
    return OutboundMessage("telegram", "default", str(chat_id), text, **extra)


async def test_reply_is_html_and_result_names_the_message(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    result = await channel.send(reply("Hello **Alice** & co"))
    [sent] = fake.sent
    assert sent.parse_mode == "HTML"
    assert sent.visible_text == "Hello Alice & co"
    assert result.platform_message_ids == (f"42:{sent.message_id}",)
    assert result.parts == 1
    assert result.delivered_at is not None
    assert sent.reply_to_message_id is None


async def test_group_reply_quotes_the_trigger_but_private_does_not(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    trigger = fake.push_message(TOKEN, chat_id=GROUP, chat_type="supergroup", text="q")
    mid = trigger["message"]["message_id"]
    await channel.send(reply("a", GROUP, reply_to_message_id=f"{GROUP}:{mid}:edit:99"))
    await channel.send(reply("b", 42, reply_to_message_id="42:1"))
    await channel.send(reply("c", GROUP, reply_to_message_id=f"{GROUP}:9999"))  # gone
    assert [m.reply_to_message_id for m in fake.sent] == [mid, None, None]
    assert [m.visible_text for m in fake.sent] == ["a", "b", "c"]


async def test_thread_reply_goes_to_the_topic(fake: FakeTelegram, channel: TelegramChannel) -> None:
    fake.add_chat(-100555, "supergroup", is_forum=True, topics=(9,))
    await channel.send(reply("in topic", -100555, thread_id="9"))
    assert fake.sent[0].message_thread_id == 9


async def test_long_reply_is_split_within_utf16_limit(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    code_lines = [f"print({i})  # 🐍 x < y & z" for i in range(120)]
    code = "```python\n" + "\n".join(code_lines) + "\n```"
    paragraphs = [f"Paragraph {i}: " + "words and 😀 emoji " * 25 for i in range(16)]
    text = "\n\n".join([*paragraphs[:7], code, *paragraphs[7:]])
    assert len(text) > 10_000
    assert 3000 < utf16_len(code) < 4096
    result = await channel.send(reply(text))
    assert result.parts == len(fake.sent) > 2
    assert result.platform_message_ids == tuple(f"42:{m.message_id}" for m in fake.sent)
    for sent in fake.sent:
        assert utf16_len(sent.visible_text) <= 4096
        assert sent.text.count("<pre") == sent.text.count("</pre>")
    # The code block is never cut: one message carries all of it.
    assert sum("\n".join(code_lines) in m.visible_text for m in fake.sent) == 1
    visible = "".join(m.visible_text for m in fake.sent)
    source = text.replace("```python", "").replace("```", "")
    assert re.sub(r"\s+", "", visible) == re.sub(r"\s+", "", source)


async def test_code_block_longer_than_a_message_is_reopened_in_each_part(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    code_lines = [f"print({i})  # 🐍 x < y & z" for i in range(300)]
    result = await channel.send(reply("```python\n" + "\n".join(code_lines) + "\n```"))
    assert result.parts == len(fake.sent) == 2
    for sent in fake.sent:
        assert sent.text.startswith("<pre>") and sent.text.endswith("</pre>")
        assert utf16_len(sent.visible_text) <= 4096
    visible_lines = "\n".join(m.visible_text.strip("\n") for m in fake.sent).split("\n")
    assert visible_lines == code_lines


async def test_refused_markup_falls_back_to_plain_text(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    fake.refuse_entities = True
    await channel.send(reply("**bold** and `code`"))
    [sent] = fake.sent
    assert sent.parse_mode is None
    assert sent.visible_text == "bold and code"


async def test_a_part_that_renders_to_nothing_goes_out_as_written(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    await channel.send(reply("```\n```"))  # an empty code block renders as no text at all
    [sent] = fake.sent
    assert sent.parse_mode is None and sent.visible_text == "```\n```"


async def test_flood_control_waits_and_resends(
    fake: FakeTelegram, channel: TelegramChannel, sleeps: Sleeps
) -> None:
    fake.flood("sendMessage", retry_after=1, times=2)
    result = await channel.send(reply("after the flood"))
    assert sleeps.delays == [1.0, 1.0]
    assert len(result.platform_message_ids) == 1
    assert [m.visible_text for m in fake.sent] == ["after the flood"]


async def test_flood_longer_than_allowed_fails_without_retry(
    fake: FakeTelegram, channel: TelegramChannel, sleeps: Sleeps
) -> None:
    fake.flood("sendMessage", retry_after=60)
    with pytest.raises(DeliveryError, match="60 s") as caught:
        await channel.send(reply("x"))
    assert caught.value.retryable is False
    assert caught.value.delivered == ()
    assert sleeps.delays == []


async def test_persistent_flood_mid_reply_reports_what_went_out(
    fake: FakeTelegram, channel: TelegramChannel, sleeps: Sleeps
) -> None:
    fake.clock = lambda: 1000.0  # frozen: the per-chat limit never clears
    fake.chat_flood_limit = 1
    text = "first part " * 300 + "\n\n" + "second part " * 300
    with pytest.raises(DeliveryError, match="flood") as caught:
        await channel.send(reply(text))
    [first] = fake.sent
    assert caught.value.delivered == (f"42:{first.message_id}",)
    assert caught.value.retryable is False
    assert sleeps.delays == [1.0, 1.0, 1.0]


async def test_blocked_user(fake: FakeTelegram, channel: TelegramChannel) -> None:
    fake.block(42)
    with pytest.raises(RecipientBlocked, match="blocked"):
        await channel.send(reply("hi"))


async def test_network_failure_is_retryable_until_something_went_out(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    fake.fail_next("sendMessage", 502, "Bad Gateway")
    with pytest.raises(DeliveryError) as caught:
        await channel.send(reply("x"))
    assert caught.value.retryable is True


async def test_other_bad_request_is_final(fake: FakeTelegram, channel: TelegramChannel) -> None:
    with pytest.raises(DeliveryError, match="Chat not found") as caught:
        await channel.send(reply("x", chat_id=777))
    assert caught.value.retryable is False
    assert not isinstance(caught.value, RecipientBlocked)


async def test_migrated_group_is_followed(fake: FakeTelegram, channel: TelegramChannel) -> None:
    fake.add_chat(-100777, "supergroup")
    fake.fail_next(
        "sendMessage", 400, "Bad Request: group chat was upgraded to a supergroup chat",
        {"migrate_to_chat_id": -100777},
    )  # fmt: skip
    result = await channel.send(reply("moved", chat_id=-555))
    assert result.platform_message_ids == ("-100777:1",)


async def test_empty_reply_and_unknown_account(channel: TelegramChannel) -> None:
    with pytest.raises(DeliveryError, match="empty"):
        await channel.send(reply("  \n "))
    with pytest.raises(DeliveryError, match="no running account"):
        await channel.send(OutboundMessage("telegram", "nope", "42", "x"))


async def test_typing_is_best_effort(fake: FakeTelegram, channel: TelegramChannel) -> None:
    fake.add_chat(-100555, "supergroup", is_forum=True, topics=(9,))
    await channel.typing("-100555", "9")
    fake.block(42)
    await channel.typing("42")  # refused: swallowed
    await channel.typing("42", account="nope")
    [action] = fake.actions
    assert (action.chat_id, action.action, action.message_thread_id) == (-100555, "typing", 9)


def test_retry_after_reads_seconds_and_timedeltas(monkeypatch: pytest.MonkeyPatch) -> None:
    assert retry_after_seconds(RetryAfter(timedelta(seconds=3))) == 3.0
    monkeypatch.delenv("PTB_TIMEDELTA")
    with pytest.warns(DeprecationWarning):  # PTB's constructor itself warns
        exc = RetryAfter(7)
    assert retry_after_seconds(exc) == 7.0  # and reading it here does not


async def test_policy_comes_from_config(fake: FakeTelegram) -> None:
    config = make_config(fake, dm_policy="allowlist", allow_from=["42"], group_activation="always")
    channel = TelegramChannel(config)
    now = datetime.now(UTC)
    dm = InboundMessage("telegram", "default", "direct", "42", "42", "A", "hi", "42:1", now)
    group = InboundMessage("telegram", "default", "group", str(GROUP), "7", "B", "hi", "x:1", now)
    assert channel.policy(dm).dm_policy == "allowlist"
    assert channel.policy(dm).allow_from == frozenset({"42"})
    assert channel.policy(group).activation == "always"
    assert channel.policy(group).group_context_messages == 0  # every message is a turn
    assert channel.webhook_routes() == []
    keeping = TelegramChannel(make_config(fake, group_context_messages=7))
    assert keeping.policy(group) == ChatPolicy(activation="mention", group_context_messages=7)


async def test_two_accounts_each_with_its_own_bot(fake: FakeTelegram) -> None:
    fake.add_bot(OTHER_TOKEN, OTHER_USERNAME, bot_id=OTHER_BOT_ID)
    inbox = Inbox()
    accounts = {
        "main": {"token": TOKEN, "api_base_url": fake.base_url},
        "side": {"token": OTHER_TOKEN, "api_base_url": fake.base_url},
        "off": {"token": "789:CCC", "api_base_url": fake.base_url, "enabled": False},
    }
    async with running_channel(fake, inbox, accounts=accounts) as channel:
        fake.push_message(TOKEN, chat_id=42, text="to main")
        fake.push_message(OTHER_TOKEN, chat_id=43, text="to side")
        messages = await inbox.wait(2)
        by_account = {m.account: m for m in messages}
        assert by_account["main"].text == "to main"
        assert by_account["side"].text == "to side"
        for message in messages:
            await channel.send(
                OutboundMessage("telegram", message.account, message.chat_id, f"re {message.text}")
            )
    senders = {(m.bot_username, m.chat_id, m.visible_text) for m in fake.sent}
    assert senders == {(USERNAME, 42, "re to main"), (OTHER_USERNAME, 43, "re to side")}


async def test_bad_token_fails_start_naming_the_account(fake: FakeTelegram) -> None:
    accounts = {"default": {"token": TOKEN, "api_base_url": fake.base_url},
                "broken": {"token": "999:NOPE", "api_base_url": fake.base_url}}  # fmt: skip
    channel = TelegramChannel(make_config(fake, accounts=accounts))
    with pytest.raises(ChannelStartError, match="'broken'") as caught:
        await channel.start(Inbox())
    assert "NOPE" not in str(caught.value)
    await channel.stop()  # nothing running: still fine


async def test_stop_is_quick_and_idempotent(fake: FakeTelegram) -> None:
    inbox = Inbox()
    channel = TelegramChannel(make_config(fake, poll_timeout_seconds=30))
    await channel.start(inbox)
    await fake.wait_calls("getUpdates")  # a 30 s long poll is pending
    # Bounded far below the poll's 30 s: stop must not wait for it.
    async with asyncio.timeout(5):
        await channel.stop()
        await channel.stop()
    with pytest.raises(DeliveryError):
        await channel.send(reply("after stop"))


async def test_revoked_token_stops_polling(
    fake: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail_next("getUpdates", 401, "Unauthorized")
    async with running_channel(fake, Inbox()) as channel:
        poller = channel._accounts["default"].task  # the account's polling loop
        assert poller is not None
        async with asyncio.timeout(5):
            await poller  # ends by itself: no retrying with a revoked token
        fake.push_message(TOKEN, chat_id=42, text="unheard")
        assert len(fake.pending_updates(TOKEN)) == 1
    assert "token was revoked" in caplog.text


@pytest.mark.parametrize(
    "bad",
    [{"date": "x"}, {"entities": "x"}, {"date": 10**30}, {"from": "x"}],
    ids=["date-type", "entities-type", "date-overflow", "from-type"],
)
async def test_an_update_ptb_cannot_parse_is_skipped_not_retried_for_ever(
    fake: FakeTelegram, caplog: pytest.LogCaptureFixture, bad: dict[str, object]
) -> None:
    def update(update_id: int, text: str, **patch: object) -> dict[str, object]:
        message = {"message_id": update_id, "date": 1_700_000_000, "text": text,
                   "chat": {"id": 42, "type": "private"},
                   "from": {"id": 42, "is_bot": False, "first_name": "Alice"}}  # fmt: skip
        return {"update_id": update_id, "message": {**message, **patch}}

    inbox = Inbox()
    # One batch: the good updates on both sides of the bad one are handled, in order.
    for item in (update(10, "one"), update(11, "bad", **bad), update(12, "two")):
        fake.push_update(TOKEN, item)
    async with running_channel(fake, inbox):
        messages = await inbox.wait(2)
        assert [m.text for m in messages] == ["one", "two"]
        fake.push_update(TOKEN, update(13, "three"))
        await inbox.wait(3)
    assert [m.text for m in inbox.messages] == ["one", "two", "three"]
    assert fake.pending_updates(TOKEN) == []  # all acknowledged, the bad one too
    assert "cannot parse update 11" in caplog.text
    assert "bad" not in caplog.text.replace("bad_", "")  # the text is not logged


async def test_acknowledging_does_not_parse_the_next_update(fake: FakeTelegram) -> None:
    inbox = Inbox()
    async with running_channel(fake, inbox) as channel:
        fake.push_message(TOKEN, chat_id=42, text="hello")
        await inbox.wait(1)
        account = channel._accounts["default"]
        assert account.task is not None
        account.task.cancel()  # the poller is out of the way
        await asyncio.gather(account.task, return_exceptions=True)
        bad = {"message_id": 7, "date": "x", "chat": {"id": 42, "type": "private"}}
        pushed = fake.push_update(TOKEN, {"message": bad})
        account.acked = None  # as if nothing was acknowledged since the last poll
        async with asyncio.timeout(5):
            await acknowledge(account)  # PTB could not parse what comes back
        assert account.offset is not None and pushed["update_id"] >= account.offset
    assert [u["update_id"] for u in fake.pending_updates(TOKEN)] == [pushed["update_id"]]
