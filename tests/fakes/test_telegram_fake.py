"""The fake Telegram Bot API, driven by the real python-telegram-bot ``Bot``."""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import warnings
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from aiohttp import web
from telegram import (
    Bot,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    ReplyKeyboardMarkup,
    ReplyParameters,
)
from telegram.constants import ParseMode
from telegram.error import (
    BadRequest,
    Conflict,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    RetryAfter,
)
from telegram.request import HTTPXRequest
from telegram.warnings import PTBDeprecationWarning

from tests.fakes.telegram_api import NOT_MODIFIED, FakeTelegram, auto_entities, html_entities
from tests.fakes.telegram_html import EntityParseError, visible_text

TOKEN = "111:AAA"
OTHER_TOKEN = "222:BBB"


@pytest.fixture(autouse=True)
def ptb_timedelta(monkeypatch: pytest.MonkeyPatch) -> None:
    # PTB 22 warns inside RetryAfter's constructor unless durations are opted in to
    # timedelta; warnings are errors here.
    monkeypatch.setenv("PTB_TIMEDELTA", "1")


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        server.add_bot(TOKEN, "parley_bot", bot_id=111)
        yield server


@functools.cache
def _tls() -> ssl.SSLContext:
    return httpx.create_ssl_context()  # built once: each costs ~40 ms


def make_bot(fake: FakeTelegram, token: str = TOKEN) -> Bot:
    # Plain http to the fake; TLS settings are shared only to keep construction cheap.
    return Bot(
        token,
        base_url=f"{fake.base_url}/bot",
        base_file_url=f"{fake.base_url}/file/bot",
        request=HTTPXRequest(httpx_kwargs={"verify": _tls()}),
        get_updates_request=HTTPXRequest(connection_pool_size=1, httpx_kwargs={"verify": _tls()}),
    )


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    async with make_bot(fake) as client:
        yield client


def retry_seconds(exc: RetryAfter) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


async def test_get_me_and_unknown_token(fake: FakeTelegram, bot: Bot) -> None:
    assert bot.username == "parley_bot"
    assert bot.id == 111
    stranger = make_bot(fake, "999:ZZZ")
    with pytest.raises(InvalidToken, match="rejected"):
        await stranger.initialize()
    await stranger.shutdown()


async def test_unknown_method_is_not_found(fake: FakeTelegram, bot: Bot) -> None:
    with pytest.raises(EndPointNotFound, match="noSuchMethod"):
        await bot.do_api_request("noSuchMethod")


async def test_send_message_records_and_returns_a_message(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(42, first_name="Alice")
    first = await bot.send_message(42, "<b>hi</b> &amp; bye", parse_mode=ParseMode.HTML)
    second = await bot.send_message(42, "plain")
    assert (first.text, first.message_id, second.message_id) == ("hi & bye", 1, 2)
    assert first.from_user is not None and first.from_user.username == "parley_bot"
    sent = await fake.wait_sent(2)
    assert sent[0].text == "<b>hi</b> &amp; bye"
    assert sent[0].visible_text == "hi & bye"
    assert sent[0].parse_mode == "HTML"
    assert fake.sent_to(42) == sent


async def test_send_message_errors(fake: FakeTelegram, bot: Bot) -> None:
    with pytest.raises(BadRequest, match="Chat not found"):
        await bot.send_message(7, "hi")
    fake.add_chat(7)
    with pytest.raises(BadRequest, match="Message text is empty"):
        await bot.send_message(7, "<b> </b>", parse_mode=ParseMode.HTML)
    with pytest.raises(BadRequest, match="Message is too long"):
        await bot.send_message(7, "x" * 4097)
    await bot.send_message(7, "<i>" + "x" * 4096 + "</i>", parse_mode=ParseMode.HTML)
    fake.block(7)
    with pytest.raises(Forbidden, match="blocked by the user"):
        await bot.send_message(7, "hi")
    assert len(fake.sent) == 1


async def test_length_in_utf16_units(fake: FakeTelegram, bot: Bot) -> None:
    fake.length_unit = "utf16"
    fake.add_chat(7)
    await bot.send_message(7, "😀" * 2048)  # 4096 units
    with pytest.raises(BadRequest, match="too long"):
        await bot.send_message(7, "😀" * 2049)


@pytest.mark.parametrize(
    ("html", "reason"),
    [
        ("<x>a</x>", 'Unsupported start tag "x" at byte offset 0'),
        ("é<b>a", 'Can\'t find end tag corresponding to start tag "b" at byte offset 2'),
        ("<b><i>a</b></i>", 'Unmatched end tag, expected "</i>", found "</b>" at byte offset 7'),
        ("a < b", 'Unsupported start tag "" at byte offset 2'),
        ("fish & chips", "Unsupported HTML entity: '&' must be escaped as &amp; at byte offset 5"),
        ("&nbsp;", 'Unsupported HTML entity "&nbsp;" at byte offset 0'),
        ('<span class="x">a</span>', 'Tag "span" must have class "tg-spoiler" at byte offset 0'),
        ("a</b>", 'Unexpected end tag "b" at byte offset 1'),
        ("<b", 'Unclosed start tag "b" at byte offset 0'),
    ],
)
def test_html_parse_errors(html: str, reason: str) -> None:
    with pytest.raises(EntityParseError) as caught:
        visible_text(html)
    assert str(caught.value) == reason


def test_html_supported_markup() -> None:
    html = (
        '<b>b</b><strong>s</strong><i>i</i><u>u</u><s>x</s><span class="tg-spoiler">p</span>'
        '<tg-spoiler>q</tg-spoiler><a href="https://e.com/?a=1&amp;b=2">link</a>'
        '<pre><code class="language-python">x &lt; 1</code></pre><blockquote expandable>'
        'quote</blockquote><tg-emoji emoji-id="5368324170671202286">👍</tg-emoji>'
        "&#128512;&#x1F600;&quot;&gt;"
    )
    assert visible_text(html) == 'bsiuxpqlinkx < 1quote👍😀😀">'


async def test_parse_error_reaches_the_client(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(7)
    with pytest.raises(BadRequest, match="Can't parse entities: unsupported start tag"):
        await bot.send_message(7, "<p>x</p>", parse_mode=ParseMode.HTML)
    fake.refuse_entities = True
    with pytest.raises(BadRequest, match="parse entities"):
        await bot.send_message(7, "<b>x</b>", parse_mode=ParseMode.HTML)
    await bot.send_message(7, "<b>x</b>")  # no parse_mode: sent as is
    assert fake.sent[0].visible_text == "<b>x</b>"


async def test_replies_and_threads(fake: FakeTelegram, bot: Bot) -> None:
    update = fake.push_message(
        TOKEN, chat_id=-1001, chat_type="supergroup", is_forum=True, text="hi",
        message_thread_id=5, is_topic_message=True,
    )  # fmt: skip
    mid = update["message"]["message_id"]
    reply = await bot.send_message(
        -1001, "ok", message_thread_id=5, reply_parameters=ReplyParameters(mid)
    )
    assert reply.reply_to_message is not None and reply.reply_to_message.message_id == mid
    assert reply.message_thread_id == 5
    assert fake.sent[0].reply_to_message_id == mid
    with pytest.raises(BadRequest, match="Message thread not found"):
        await bot.send_message(-1001, "ok", message_thread_id=77)
    with pytest.raises(BadRequest, match="Message to be replied not found"):
        await bot.send_message(-1001, "ok", reply_parameters=ReplyParameters(999))
    lenient = ReplyParameters(999, allow_sending_without_reply=True)
    await bot.send_message(-1001, "ok", reply_parameters=lenient)
    assert fake.sent[-1].reply_to_message_id is None


async def test_scripted_failures_and_flood(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(7)
    fake.flood("sendMessage", 3, times=2)
    for _ in range(2):
        with pytest.raises(RetryAfter) as caught:
            await bot.send_message(7, "x")
        assert retry_seconds(caught.value) == 3
    fake.fail_next("sendMessage", 400, "Bad Request: something odd")
    with pytest.raises(BadRequest, match="Something odd"):
        await bot.send_message(7, "x")
    await bot.send_message(7, "x")
    assert len(fake.sent) == 1


async def test_per_chat_flood_control(fake: FakeTelegram, bot: Bot) -> None:
    now = [100.0]
    fake.clock = lambda: now[0]
    fake.chat_flood_limit, fake.chat_flood_window = 2, 3.0
    fake.add_chat(7)
    await bot.send_message(7, "a")
    await bot.send_message(7, "b")
    with pytest.raises(RetryAfter) as caught:
        await bot.send_message(7, "c")
    assert retry_seconds(caught.value) == 3
    now[0] += 3.0
    await bot.send_message(7, "c")


async def test_chat_action(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(7)
    assert await bot.send_chat_action(7, "typing") is True
    actions = await fake.wait_actions(1)
    assert (actions[0].chat_id, actions[0].action, actions[0].message_thread_id) == (
        7, "typing", None,
    )  # fmt: skip


def test_auto_entities_count_utf16() -> None:
    text = "/ask@parley_bot 😀 hi @parley_bot and @someone_else"
    entities = auto_entities(text)
    assert entities[0] == {"type": "bot_command", "offset": 0, "length": 15}
    # "😀" is two UTF-16 units, so the mention starts at 21, not 20.
    assert entities[1] == {"type": "mention", "offset": 22, "length": 11}
    assert entities[2]["offset"] == 38


async def test_long_poll_waits_for_a_push_and_confirms_by_offset(
    fake: FakeTelegram, bot: Bot
) -> None:
    poll = asyncio.create_task(bot.get_updates(timeout=5))
    await fake.wait_calls("getUpdates")  # the poll is out and must wait for the push
    pushed = fake.push_message(TOKEN, chat_id=42, text="hello")
    updates = await poll
    assert [u.update_id for u in updates] == [pushed["update_id"]]
    assert updates[0].message is not None and updates[0].message.text == "hello"
    again = await bot.get_updates(timeout=0)
    assert len(again) == 1  # not confirmed yet
    assert await bot.get_updates(offset=pushed["update_id"] + 1, timeout=0) == ()
    assert fake.pending_updates(TOKEN) == []


async def test_edit_and_media_updates(fake: FakeTelegram, bot: Bot) -> None:
    fake.push_message(TOKEN, chat_id=42, text="first")
    fake.push_message(TOKEN, chat_id=42, text="first!", edit=True)
    fake.push_message(TOKEN, chat_id=42, caption="look", photo=True, voice=3)
    updates = await bot.get_updates(timeout=0)
    original, edit = updates[0].message, updates[1].edited_message
    assert original is not None and edit is not None
    assert edit.message_id == original.message_id
    assert edit.edit_date is not None
    media = updates[2].message
    assert media is not None and media.photo and media.voice and media.caption == "look"


async def test_allowed_updates_filter(fake: FakeTelegram, bot: Bot) -> None:
    fake.push_message(TOKEN, chat_id=42, text="a", edit=True)
    fake.push_message(TOKEN, chat_id=42, text="b")
    updates = await bot.get_updates(timeout=0, allowed_updates=["message"])
    assert [u.message.text for u in updates if u.message] == ["b"]
    assert len(updates) == 1


async def test_second_poll_terminates_the_first(fake: FakeTelegram) -> None:
    async with make_bot(fake) as first, make_bot(fake) as second:
        pending = asyncio.create_task(first.get_updates(timeout=5))
        await fake.wait_calls("getUpdates")
        await second.get_updates(timeout=0)
        with pytest.raises(Conflict, match="terminated by other getUpdates"):
            await pending


async def test_webhook_blocks_polling(fake: FakeTelegram, bot: Bot) -> None:
    await bot.set_webhook("http://127.0.0.1:9/hook", secret_token="s3cret")
    with pytest.raises(Conflict, match="webhook is active"):
        await bot.get_updates(timeout=0)
    info = await bot.get_webhook_info()
    assert info.url == "http://127.0.0.1:9/hook"
    await bot.delete_webhook()
    assert await bot.get_updates(timeout=0) == ()


async def test_stop_releases_a_pending_long_poll(fake: FakeTelegram) -> None:
    client = make_bot(fake)
    await client.initialize()
    poll = asyncio.create_task(client.get_updates(timeout=30))
    await fake.wait_calls("getUpdates")
    async with asyncio.timeout(2):
        await fake.stop()
        assert await poll == ()
    await client.shutdown()


async def test_webhook_delivery_with_secret_and_redelivery(fake: FakeTelegram, bot: Bot) -> None:
    received: list[tuple[str | None, dict[str, Any]]] = []
    statuses = [500, 200, 200]

    async def hook(request: web.Request) -> web.Response:
        received.append((request.headers.get("X-Telegram-Bot-Api-Secret-Token"),
                         json.loads(await request.read())))  # fmt: skip
        return web.Response(status=statuses[len(received) - 1])

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        await bot.set_webhook(f"http://127.0.0.1:{port}/hook", secret_token="s3cret")
        first = fake.push_message(TOKEN, chat_id=42, text="one")
        fake.push_message(TOKEN, chat_id=42, text="two")
        deliveries = await fake.wait_webhook(1)
        assert deliveries[0].status == 500
        assert len(fake.pending_updates(TOKEN)) == 2  # kept for redelivery, in order
        fake.redeliver()
        deliveries = await fake.wait_webhook(3)
        assert [d.status for d in deliveries] == [500, 200, 200]
        assert [body["message"]["text"] for _, body in received] == ["one", "one", "two"]
        assert {secret for secret, _ in received} == {"s3cret"}
        assert received[0][1]["update_id"] == first["update_id"]
        assert fake.pending_updates(TOKEN) == []
    finally:
        await runner.cleanup()


async def test_bots_do_not_share_chats(fake: FakeTelegram) -> None:
    fake.add_bot(OTHER_TOKEN, "other_bot")
    fake.push_message(TOKEN, chat_id=42, text="hi")
    async with make_bot(fake, OTHER_TOKEN) as other:
        with pytest.raises(BadRequest, match="Chat not found"):
            await other.send_message(42, "hello")


def mid_of(update: dict[str, Any]) -> int:
    return int(next(v for k, v in update.items() if k != "update_id")["message_id"])


async def test_private_and_group_ids_come_from_each_bots_own_counter(fake: FakeTelegram) -> None:
    fake.add_bot(OTHER_TOKEN, "other_bot", bot_id=222)
    async with make_bot(fake) as one, make_bot(fake, OTHER_TOKEN) as two:
        # One bot: its private chats and basic groups share its counter.
        assert mid_of(fake.push_message(TOKEN, chat_id=42, text="a")) == 1
        assert mid_of(fake.push_message(TOKEN, chat_id=43, text="b")) == 2
        assert (await one.send_message(42, "to a")).message_id == 3
        group = fake.push_message(TOKEN, chat_id=-5, chat_type="group", text="c")
        assert mid_of(group) == 4
        assert (await one.send_message(-5, "to c")).message_id == 5
        # Another bot has a counter of its own, in the same user's chat too.
        assert mid_of(fake.push_message(OTHER_TOKEN, chat_id=42, text="d")) == 1
        assert (await two.send_message(42, "to d")).message_id == 2
        assert (await one.send_message(43, "to b")).message_id == 6
        # An explicit id moves the bot's counter past it, in all its chats.
        assert mid_of(fake.push_message(TOKEN, chat_id=43, text="e", message_id=20)) == 20
        assert (await one.send_message(42, "next")).message_id == 21
        assert mid_of(fake.push_message(OTHER_TOKEN, chat_id=42, text="f")) == 3
        # Each bot finds its own messages by id: the same id is a different message.
        quoted = await one.send_message(42, "q", reply_parameters=ReplyParameters(3))
        assert quoted.reply_to_message is not None
        assert quoted.reply_to_message.text == "to a"
        with pytest.raises(BadRequest, match="Message to be replied not found"):
            await two.send_message(42, "q", reply_parameters=ReplyParameters(21))
        # An edit without an id edits the last message of that chat as the bot sees it.
        edit = fake.push_message(TOKEN, chat_id=43, text="e!", edit=True)
        assert mid_of(edit) == 20
        other_edit = fake.push_message(OTHER_TOKEN, chat_id=42, text="f!", edit=True)
        assert mid_of(other_edit) == 3


async def test_supergroup_and_channel_ids_belong_to_the_chat(fake: FakeTelegram) -> None:
    fake.add_bot(OTHER_TOKEN, "other_bot", bot_id=222)
    fake.add_chat(-1001, "supergroup")  # known to every bot: both are members
    async with make_bot(fake) as one, make_bot(fake, OTHER_TOKEN) as two:
        assert mid_of(fake.push_message(TOKEN, chat_id=-1001, chat_type="supergroup")) == 1
        assert mid_of(fake.push_message(TOKEN, chat_id=-1002, chat_type="supergroup")) == 1
        assert (await one.send_message(-1001, "one")).message_id == 2
        # Every member sees the same ids: the other bot's send is the chat's next.
        sent = await two.send_message(-1001, "two", reply_parameters=ReplyParameters(2))
        assert sent.message_id == 3
        assert sent.reply_to_message is not None and sent.reply_to_message.text == "one"
        assert (await one.send_message(-1002, "three")).message_id == 2
        fake.add_chat(-1003, "channel")
        assert (await one.send_message(-1003, "news")).message_id == 1
        # None of this touched the bot's own counter for private chats.
        assert mid_of(fake.push_message(TOKEN, chat_id=42, text="hi")) == 1
        # Explicit ids move the chat's counter, not the bot's.
        fake.push_message(TOKEN, chat_id=-1001, chat_type="supergroup", message_id=50)
        assert (await two.send_message(-1001, "after")).message_id == 51
        assert (await one.send_message(42, "hello")).message_id == 2


def keyboard(*labels: str) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup([[InlineKeyboardButton(x, callback_data=x) for x in labels]])


async def test_edit_reply_markup_outcomes(fake: FakeTelegram, bot: Bot) -> None:
    user = fake.push_message(TOKEN, chat_id=42, text="hi")
    own = await bot.send_message(42, "hello")
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_reply_markup(chat_id=42)
    assert caught.value.message == "Message identifier is not specified"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_reply_markup(chat_id=7, message_id=own.message_id)
    assert caught.value.message == "Chat not found"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_reply_markup(chat_id=42, message_id=99)
    assert caught.value.message == "Message to edit not found"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_reply_markup(chat_id=42, message_id=mid_of(user))
    assert caught.value.message == "Message can't be edited"
    # No markup asked for, none there: nothing to change.
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_reply_markup(chat_id=42, message_id=own.message_id)
    assert caught.value.message == NOT_MODIFIED.capitalize()
    assert caught.value.message.startswith("Message is not modified: specified new message")
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_reply_markup(
            chat_id=42, message_id=own.message_id,
            # A reply keyboard on purpose (the method's type refuses it too: the ignore).
            reply_markup=ReplyKeyboardMarkup([["a"]]),  # type: ignore[arg-type]
        )  # fmt: skip
    assert caught.value.message == "Inline keyboard expected"
    assert fake.edits == []

    # Setting a keyboard: the message returned carries it, and the fake keeps it.
    edited = await bot.edit_message_reply_markup(
        chat_id=42, message_id=own.message_id, reply_markup=keyboard("yes", "no")
    )
    assert not isinstance(edited, bool)
    assert edited.message_id == own.message_id and edited.text == "hello"
    assert edited.reply_markup == keyboard("yes", "no")
    [record] = fake.edits
    assert (record.token, record.chat_id, record.message_id) == (TOKEN, 42, own.message_id)
    assert record.reply_markup == keyboard("yes", "no").to_dict()
    assert record.message["reply_markup"] == record.reply_markup
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_reply_markup(
            chat_id=42, message_id=own.message_id, reply_markup=keyboard("yes", "no")
        )
    changed = await bot.edit_message_reply_markup(
        chat_id=42, message_id=own.message_id, reply_markup=keyboard("maybe")
    )
    assert not isinstance(changed, bool) and changed.reply_markup == keyboard("maybe")
    # Removing it (no markup given); then there is nothing left to remove.
    removed = await bot.edit_message_reply_markup(chat_id=42, message_id=own.message_id)
    assert not isinstance(removed, bool) and removed.reply_markup is None
    assert "reply_markup" not in fake.edits[-1].message
    assert fake.edits[-1].reply_markup is None
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_reply_markup(chat_id=42, message_id=own.message_id)
    assert len(fake.edits) == 3
    # What sendMessage returned then is not rewritten by later edits.
    assert "reply_markup" not in fake.sent[0].message


async def test_edit_reply_markup_of_a_message_sent_with_one(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(-1001, "supergroup")
    sent = await bot.send_message(-1001, "pick", reply_markup=keyboard("a", "b"))
    assert sent.reply_markup == keyboard("a", "b")
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_reply_markup(-1001, sent.message_id, reply_markup=keyboard("a", "b"))
    # A reply keyboard is not part of the message: nothing of it to edit.
    plain = await bot.send_message(-1001, "type", reply_markup=ReplyKeyboardMarkup([["x"]]))
    assert plain.reply_markup is None
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_reply_markup(-1001, plain.message_id)
    removed = await bot.edit_message_reply_markup(-1001, sent.message_id)
    assert not isinstance(removed, bool) and removed.reply_markup is None


async def test_edit_reply_markup_sees_only_the_bots_own_numbering(fake: FakeTelegram) -> None:
    fake.add_bot(OTHER_TOKEN, "other_bot", bot_id=222)
    async with make_bot(fake) as one, make_bot(fake, OTHER_TOKEN) as two:
        fake.push_message(TOKEN, chat_id=42, text="to one")  # id 1 for bot one
        fake.push_message(OTHER_TOKEN, chat_id=42, text="to two")  # id 1 for bot two
        mine = await one.send_message(42, "from one")  # id 2 for bot one
        assert mine.message_id == 2
        # Id 2 means nothing yet in the other bot's numbering...
        with pytest.raises(BadRequest) as caught:
            await two.edit_message_reply_markup(42, 2, reply_markup=keyboard("x"))
        assert caught.value.message == "Message to edit not found"
        # ...and once it does, it is the other bot's own message, not bot one's.
        theirs = await two.send_message(42, "from two")
        assert theirs.message_id == 2
        await two.edit_message_reply_markup(42, 2, reply_markup=keyboard("x"))
        with pytest.raises(BadRequest, match="Message is not modified"):
            await one.edit_message_reply_markup(42, 2)  # its own, still without keyboard
        # The same id-1 message is the user's in both numberings.
        for client in (one, two):
            with pytest.raises(BadRequest, match="Message can't be edited"):
                await client.edit_message_reply_markup(42, 1)
        assert [(e.token, e.message["text"]) for e in fake.edits] == [(OTHER_TOKEN, "from two")]


async def test_edit_reply_markup_blocked_and_scripted_failures(
    fake: FakeTelegram, bot: Bot
) -> None:
    fake.add_chat(42)
    own = await bot.send_message(42, "hello")
    fake.fail_next("editMessageReplyMarkup", 400, "Bad Request: message to edit not found")
    with pytest.raises(BadRequest, match="Message to edit not found"):
        await bot.edit_message_reply_markup(42, own.message_id, reply_markup=keyboard("a"))
    fake.flood("editMessageReplyMarkup", 2)
    with pytest.raises(RetryAfter):
        await bot.edit_message_reply_markup(42, own.message_id, reply_markup=keyboard("a"))
    assert fake.edits == []
    fake.block(42)
    with pytest.raises(Forbidden, match="blocked by the user"):
        await bot.edit_message_reply_markup(42, own.message_id, reply_markup=keyboard("a"))
    fake.unblock(42)
    await bot.edit_message_reply_markup(42, own.message_id, reply_markup=keyboard("a"))
    assert len(fake.edits) == 1


def test_html_entities_as_telegram_makes_them() -> None:
    html = (
        '😀<b>a<i>b</i></b><a href="https://e.com">c</a><b></b>'
        "<blockquote expandable>q</blockquote>"
    )
    assert html_entities(html) == [
        {"type": "bold", "offset": 2, "length": 2},
        {"type": "italic", "offset": 3, "length": 1},
        {"type": "text_link", "offset": 4, "length": 1, "url": "https://e.com"},
        {"type": "expandable_blockquote", "offset": 5, "length": 1},
    ]


async def test_edit_message_text_changes_the_message_in_place(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(42)
    sent = await bot.send_message(42, "<b>draft</b>", parse_mode=ParseMode.HTML)
    assert sent.entities and sent.entities[0].type == "bold"
    edited = await bot.edit_message_text("draft, longer", chat_id=42, message_id=sent.message_id)
    assert not isinstance(edited, bool)
    assert (edited.message_id, edited.text, edited.entities) == (
        sent.message_id,
        "draft, longer",
        (),
    )
    assert edited.edit_date is not None and edited.from_user is not None
    assert fake.message_text(42, sent.message_id) == "draft, longer"
    [record] = fake.text_edits
    assert (record.token, record.chat_id, record.message_id) == (TOKEN, 42, sent.message_id)
    assert (record.text, record.visible_text, record.parse_mode) == (
        "draft, longer", "draft, longer", None,
    )  # fmt: skip
    # What sendMessage returned stays as it was; the stored message is the edited one.
    assert fake.sent[0].visible_text == "draft" and fake.sent[0].message["text"] == "draft"
    stored = fake.message(42, sent.message_id)
    assert stored is not None and stored["edit_date"] >= stored["date"]
    assert fake.call_counts["editMessageText"] == 1 and fake.call_counts["sendMessage"] == 1

    # Same text, no entities, no keyboard: not modified. Bold is a change; <strong> is
    # the same bold.
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("draft, longer", chat_id=42, message_id=sent.message_id)
    assert caught.value.message == NOT_MODIFIED.capitalize()
    await bot.edit_message_text(
        "<b>draft, longer</b>", chat_id=42, message_id=sent.message_id, parse_mode="HTML"
    )
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_text(
            "<strong>draft, longer</strong>", chat_id=42, message_id=sent.message_id,
            parse_mode=ParseMode.HTML,
        )  # fmt: skip
    assert fake.call_counts["editMessageText"] == 4 and len(fake.text_edits) == 2
    assert fake.message_text(42, sent.message_id) == "draft, longer"


async def test_edit_message_text_and_the_keyboard(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(42)
    sent = await bot.send_message(42, "pick", reply_markup=keyboard("a"))
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_text("pick", 42, sent.message_id, reply_markup=keyboard("a"))
    # A new keyboard is a change; no reply_markup removes the keyboard, as for real.
    changed = await bot.edit_message_text("pick", 42, sent.message_id, reply_markup=keyboard("b"))
    assert not isinstance(changed, bool) and changed.reply_markup == keyboard("b")
    removed = await bot.edit_message_text("pick", 42, sent.message_id)
    assert not isinstance(removed, bool) and removed.reply_markup is None
    stored = fake.message(42, sent.message_id)
    assert stored is not None and "reply_markup" not in stored
    with pytest.raises(BadRequest, match="Inline keyboard expected"):
        await bot.edit_message_text(
            "x", 42, sent.message_id,
            # A reply keyboard on purpose (the method's type refuses it too: the ignore).
            reply_markup=ReplyKeyboardMarkup([["a"]]),  # type: ignore[arg-type]
        )  # fmt: skip


async def test_edit_message_text_errors(fake: FakeTelegram, bot: Bot) -> None:
    user = fake.push_message(TOKEN, chat_id=42, text="hi")
    own = await bot.send_message(42, "hello")
    mid = own.message_id
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("x", chat_id=42, message_id=99)
    assert caught.value.message == "Message to edit not found"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("x", chat_id=42, message_id=mid_of(user))
    assert caught.value.message == "Message can't be edited"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("x", chat_id=43, message_id=mid)
    assert caught.value.message == "Chat not found"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("", chat_id=42, message_id=mid)
    assert caught.value.message == "Message text is empty"
    with pytest.raises(BadRequest, match="Message text is empty"):
        await bot.edit_message_text("<b> </b>", 42, mid, parse_mode=ParseMode.HTML)
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("a < b", 42, mid, parse_mode=ParseMode.HTML)
    assert caught.value.message == (
        'Can\'t parse entities: unsupported start tag "" at byte offset 2'
    )
    with pytest.raises(BadRequest, match="Message is too long"):
        await bot.edit_message_text("x" * 4097, 42, mid)
    fake.length_unit = "utf16"
    with pytest.raises(BadRequest, match="Message is too long"):
        await bot.edit_message_text("😀" * 2049, 42, mid)
    await bot.edit_message_text("<i>" + "😀" * 2048 + "</i>", 42, mid, parse_mode="HTML")
    fake.block(42)
    with pytest.raises(Forbidden, match="blocked by the user"):
        await bot.edit_message_text("y", 42, mid)
    assert [e.visible_text for e in fake.text_edits] == ["😀" * 2048]
    assert fake.message_text(42, mid_of(user)) == "hi"


async def test_edit_and_delete_take_scripted_flood(fake: FakeTelegram, bot: Bot) -> None:
    fake.add_chat(7)
    sent = await bot.send_message(7, "a")
    fake.flood("editMessageText", 3)
    with pytest.raises(RetryAfter) as caught:
        await bot.edit_message_text("b", 7, sent.message_id)
    assert retry_seconds(caught.value) == 3
    assert fake.message_text(7, sent.message_id) == "a" and fake.text_edits == []
    await bot.edit_message_text("b", 7, sent.message_id)
    fake.flood("deleteMessage", 2)
    with pytest.raises(RetryAfter) as caught:
        await bot.delete_message(7, sent.message_id)
    assert retry_seconds(caught.value) == 2
    assert fake.message_text(7, sent.message_id) == "b" and fake.deletions == []
    assert await bot.delete_message(7, sent.message_id) is True
    assert fake.call_counts["editMessageText"] == 2 and fake.call_counts["deleteMessage"] == 2


async def test_edits_count_in_the_per_chat_flood_window(fake: FakeTelegram, bot: Bot) -> None:
    now = [100.0]
    fake.clock = lambda: now[0]
    fake.chat_flood_limit, fake.chat_flood_window = 2, 3.0
    fake.add_chat(7)
    sent = await bot.send_message(7, "a")
    await bot.edit_message_text("ab", 7, sent.message_id)
    with pytest.raises(RetryAfter) as caught:
        await bot.edit_message_text("abc", 7, sent.message_id)
    assert retry_seconds(caught.value) == 3
    now[0] += 3.0
    await bot.edit_message_text("abc", 7, sent.message_id)
    assert fake.message_text(7, sent.message_id) == "abc"


async def test_delete_message(fake: FakeTelegram, bot: Bot) -> None:
    user = fake.push_message(TOKEN, chat_id=42, text="hi")
    own = await bot.send_message(42, "hello")
    assert await bot.delete_message(42, own.message_id) is True
    [record] = fake.deletions
    assert (record.token, record.chat_id, record.message_id) == (TOKEN, 42, own.message_id)
    assert record.message["text"] == "hello"
    assert fake.message(42, own.message_id) is None
    assert fake.message_text(42, own.message_id) is None
    # Gone for every later call about it.
    with pytest.raises(BadRequest) as caught:
        await bot.delete_message(42, own.message_id)
    assert caught.value.message == "Message to delete not found"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_text("x", 42, own.message_id)
    assert caught.value.message == "Message to edit not found"
    with pytest.raises(BadRequest) as caught:
        await bot.edit_message_reply_markup(42, own.message_id, reply_markup=keyboard("a"))
    assert caught.value.message == "Message to edit not found"
    with pytest.raises(BadRequest, match="Message to be replied not found"):
        await bot.send_message(42, "re", reply_parameters=ReplyParameters(own.message_id))
    # Bots may delete incoming messages in private chats, within 48 hours.
    assert await bot.delete_message(42, mid_of(user)) is True
    old = fake.push_message(TOKEN, chat_id=42, text="old", extra={"date": 1_000_000})
    with pytest.raises(BadRequest) as caught:
        await bot.delete_message(42, mid_of(old))
    assert caught.value.message == "Message can't be deleted for everyone"
    assert fake.message_text(42, mid_of(old)) == "old"
    assert [d.message_id for d in fake.deletions] == [own.message_id, mid_of(user)]


async def test_delete_in_groups_needs_the_right(fake: FakeTelegram, bot: Bot) -> None:
    user = fake.push_message(TOKEN, chat_id=-1001, chat_type="supergroup", text="spam")
    own = await bot.send_message(-1001, "mine")
    with pytest.raises(BadRequest) as caught:
        await bot.delete_message(-1001, mid_of(user))
    assert caught.value.message == "Message can't be deleted"
    assert await bot.delete_message(-1001, own.message_id) is True
    fake.grant_delete(-1001, TOKEN)
    assert await bot.delete_message(-1001, mid_of(user)) is True
    assert fake.message(-1001, mid_of(user)) is None


async def test_message_inspection_needs_the_bot_where_ids_are_per_bot(
    fake: FakeTelegram, bot: Bot
) -> None:
    fake.add_bot(OTHER_TOKEN, "other_bot", bot_id=222)
    fake.push_message(TOKEN, chat_id=42, text="to one")
    fake.push_message(OTHER_TOKEN, chat_id=42, text="to two")
    with pytest.raises(ValueError, match="token="):
        fake.message_text(42, 1)
    assert fake.message_text(42, 1, TOKEN) == "to one"
    assert fake.message_text(42, 1, OTHER_TOKEN) == "to two"
    assert fake.message_text(99, 1, TOKEN) is None
