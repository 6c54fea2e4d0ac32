"""After a crash, did a reply go out? The numbering behind the send mark, and the probe
through the real TelegramChannel against the fake Bot API (whose ids follow Telegram:
one counter per bot for private chats and basic groups, one per supergroup)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from parley.channels.base import OutboundMessage
from parley.channels.telegram import TelegramChannel
from parley.channels.telegram_recovery import (
    MAX_PROBE_IDS,
    PROBE_IDS,
    Numbering,
    probe_end,
    shares_bot_numbering,
)
from tests.channels.telegram_helpers import (
    TOKEN,
    Inbox,
    Sleeps,
    fake_telegram,
    loopback_only,
    running_channel,
)
from tests.fakes.telegram_api import FakeTelegram

ALICE, BOB = 42, 43
GROUP = -1001234567890


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback_only(monkeypatch)


# -- the numbering ------------------------------------------------------------------


def test_private_chats_and_basic_groups_share_the_bots_counter() -> None:
    assert shares_bot_numbering(ALICE)
    assert shares_bot_numbering(-123456)  # a basic group
    assert not shares_bot_numbering(GROUP)  # a supergroup: its own counter
    assert not shares_bot_numbering(-1_000_000_000_001)


def test_the_mark_is_the_highest_id_known_in_the_chats_numbering() -> None:
    numbering = Numbering()
    assert numbering.mark("default", ALICE) is None
    assert numbering.mark("default", ALICE, floor=7) == 7
    numbering.observe("default", ALICE, 10)
    numbering.observe("default", BOB, 14)  # the same counter: Alice's next id is above 14
    assert numbering.mark("default", ALICE) == 14
    assert numbering.mark("default", ALICE, floor=20) == 20
    numbering.observe("default", GROUP, 500)  # a supergroup's own counter
    assert numbering.mark("default", ALICE) == 14
    assert numbering.mark("default", GROUP) == 500
    assert numbering.mark("default", -555) == 14  # a basic group shares the bot's counter
    assert numbering.mark("second", ALICE) is None  # another bot, another counter
    numbering.observe("default", ALICE, 3)  # an older id (an edit) lowers nothing
    assert numbering.mark("default", ALICE) == 14


def test_the_least_recently_active_chats_are_forgotten() -> None:
    numbering = Numbering(remembered_chats=2)
    for chat in (GROUP, GROUP - 1, GROUP - 2):
        numbering.observe("default", chat, 100)
    assert numbering.mark("default", GROUP) is None
    assert numbering.mark("default", GROUP - 2) == 100


# -- the probe, through the fake ------------------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with fake_telegram() as server:
        server.add_chat(ALICE, first_name="Alice")
        server.add_chat(BOB, first_name="Bob")
        server.add_chat(GROUP, "supergroup", title="Team")
        yield server


@pytest.fixture
async def channel(fake: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    async with running_channel(fake, Inbox(), Sleeps()) as running:
        yield running


def reply(text: str, chat_id: int = ALICE) -> OutboundMessage:
    return OutboundMessage("telegram", "default", str(chat_id), text)


class Records:
    """The gateway's sent-message records, as the probe asks them."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.asked: list[str] = []

    async def __call__(self, platform_message_id: str) -> bool:
        self.asked.append(platform_message_id)
        return platform_message_id in self.ids


async def test_a_reply_sent_after_the_mark_is_found_and_one_recorded_is_not(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    outbound = reply("the answer")
    mark = await channel.send_mark(outbound)
    assert mark is None  # nothing seen in this chat yet: no mark, nothing to look for
    await channel.send(reply("a first reply"))  # now the numbering is known
    mark = await channel.send_mark(outbound)
    assert mark is not None
    result = await channel.send(outbound)
    records = Records()
    assert await channel.reconcile(outbound, mark, records) == result.platform_message_ids
    # Recorded for another reply: not this one's.
    records.ids.update(result.platform_message_ids)
    assert await channel.reconcile(outbound, mark, records) == ()
    # Nothing was changed by asking.
    assert [m.visible_text for m in fake.sent] == ["a first reply", "the answer"]


async def test_the_probe_skips_other_peoples_messages_and_other_chats(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    await channel.send(reply("hello Alice"))
    outbound = reply("the answer")
    mark = await channel.send_mark(outbound)
    assert mark is not None
    # After the mark: Alice writes, Bob gets a reply (the same counter), then ours.
    fake.push_message(TOKEN, chat_id=ALICE, text="one more thing")
    await channel.send(reply("hello Bob", BOB))
    result = await channel.send(outbound)
    assert await channel.reconcile(outbound, mark, Records()) == result.platform_message_ids
    # A reply never sent is not found (the ids above the mark are others' or no one's).
    never = reply("never sent")
    later = await channel.send_mark(never)
    assert later is not None
    assert await channel.reconcile(never, later, Records()) == ()


async def test_a_long_reply_cut_off_after_its_first_part_is_found_part_by_part(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    text = "\n\n".join(f"paragraph {n} " + "word " * 200 for n in range(14))
    outbound = reply(text, GROUP)
    fake.push_message(TOKEN, chat_id=GROUP, text="a long one please", chat_type="supergroup")
    await channel.send(reply("thinking", GROUP))
    mark = await channel.send_mark(outbound)
    assert mark is not None
    full = await channel.send(outbound)
    assert full.parts >= 3
    found = await channel.reconcile(outbound, mark, Records())
    assert found == full.platform_message_ids  # every part, and no more
    # The parts after the first found go out again, the first does not.
    rest = await channel.send(dataclasses.replace(outbound, first_part=1))
    assert rest.parts == full.parts - 1
    assert [m.visible_text for m in fake.sent[-rest.parts :]] == [
        m.visible_text for m in fake.sent[2 : 2 + rest.parts]
    ]
    # All parts out: sending from past the last sends nothing.
    done = await channel.send(dataclasses.replace(outbound, first_part=full.parts))
    assert done.platform_message_ids == ()


async def read_up_to(channel: TelegramChannel, chat: int, message_id: int) -> None:
    """Until the poller has read the updates up to ``message_id`` (the chat's mark says)."""
    for _ in range(500):
        mark = await channel.send_mark(reply("?", chat))
        if mark is not None and int(mark) >= message_id:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the poller never read message {message_id}")


def probes(fake: FakeTelegram, since: int) -> int:
    return sum(c.method == "editMessageReplyMarkup" for c in fake.calls[since:])


def test_how_far_the_probe_looks() -> None:
    assert probe_end(100, None) == probe_end(100, 90) == 100 + PROBE_IDS
    assert probe_end(100, 150) == 150 + PROBE_IDS  # the numbering moved on meanwhile
    assert probe_end(100, 10_000) == 100 + MAX_PROBE_IDS


async def test_a_reply_far_above_its_mark_is_found_when_the_chat_moved_on(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    # A busy bot (bench/crash_soak.py, 50 chats at once): between the mark and the
    # send, other chats took more ids than the first look covers.
    await channel.send(reply("hello"))
    outbound = reply("far away")
    mark = await channel.send_mark(outbound)
    assert mark is not None
    pushed = [fake.push_message(TOKEN, chat_id=BOB, text=f"bob {n}") for n in range(40)]
    await read_up_to(channel, BOB, pushed[-1]["message"]["message_id"])
    result = await channel.send(outbound)
    assert int(result.platform_message_ids[0].split(":")[1]) > int(mark) + PROBE_IDS
    assert await channel.reconcile(outbound, mark, Records()) == result.platform_message_ids


async def test_the_probe_asks_about_a_bounded_number_of_ids(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    await channel.send(reply("hello"))
    never = reply("never sent")
    mark = await channel.send_mark(never)
    assert mark is not None
    before = len(fake.calls)
    assert await channel.reconcile(never, mark, Records()) == ()
    assert probes(fake, before) == PROBE_IDS  # a quiet chat: the first look only
    pushed = [fake.push_message(TOKEN, chat_id=BOB, text=f"b{n}") for n in range(2 * MAX_PROBE_IDS)]
    await read_up_to(channel, BOB, pushed[-1]["message"]["message_id"])
    before = len(fake.calls)
    assert await channel.reconcile(never, mark, Records()) == ()
    assert probes(fake, before) == MAX_PROBE_IDS  # however far the chat moved on


async def test_when_telegram_will_not_answer_the_probe_says_it_cannot_tell(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    await channel.send(reply("hello"))
    outbound = reply("the answer")
    mark = await channel.send_mark(outbound)
    assert mark is not None
    await channel.send(outbound)
    fake.fail_next(
        "editMessageReplyMarkup", 429, "Too Many Requests: retry after 5", {"retry_after": 5}
    )
    assert await channel.reconcile(outbound, mark, Records()) is None
    assert await channel.reconcile(outbound, "not a number", Records()) is None


async def test_after_a_start_the_mark_waits_for_what_waited_at_telegram(
    fake: FakeTelegram,
) -> None:
    """Messages sent to the bot while it was down took ids of its counter: a reply
    resent at start must get its mark above them, or a look after another kill would
    start too low to reach it. So the mark waits until the poller has read the queue
    to its end: more than one batch (getUpdates gives at most 100)."""
    asked = fake.push_message(TOKEN, chat_id=ALICE, text="hello")
    waiting = [fake.push_message(TOKEN, chat_id=BOB, text=f"bob {n}") for n in range(130)]
    fake.hold("getUpdates")
    async with running_channel(fake, Inbox(), Sleeps()) as channel:
        ref = f"{ALICE}:{asked['message']['message_id']}"
        outbound = OutboundMessage("telegram", "default", str(ALICE), "hi", reply_to_message_id=ref)
        marking = asyncio.create_task(channel.send_mark(outbound))
        await fake.wait_calls("getUpdates")
        assert not marking.done()  # the first poll is out, unanswered: the mark waits
        fake.release("getUpdates")
        mark = await marking
    assert mark == str(waiting[-1]["message"]["message_id"])
