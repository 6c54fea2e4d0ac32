"""Replies shown while they are written on Telegram and Discord, end to end: the whole
gateway, the real python-telegram-bot and discord.py, the fake platforms and the fake
Anthropic API streaming its reply. A streamed reply ends as exactly the messages a
reply sent at once would be (same split, same text), and a kill in the middle of one
leaves no half reply behind: the restart edits the draft into the whole reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from parley.channels.discord_adapter import DiscordChannel
from parley.channels.preview import split_blocks
from parley.channels.telegram import TelegramChannel
from parley.channels.telegram_send import split_reply
from parley.gateway.app import Gateway
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.storage.sqlite.database import Database
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from tests.channels.discord_support import ANN, BOT_ID, LIMIT, fake_discord
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.telegram_helpers import FAST_BACKOFF, TOKEN, Sleeps, loopback_only
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.discord_api import EDIT_MESSAGE
from tests.fakes.llm_common import Hang, Reply
from tests.fakes.telegram_api import FakeTelegram
from tests.gateway.runtime.test_delivery_doubt import answer_lost
from tests.gateway.test_discord_e2e import discord_settings
from tests.gateway.test_send_recovery import BOB, Crash, CrashOnCreate, dm, sent_rows
from tests.gateway.test_telegram_e2e import ALICE, said, telegram_settings

# Over Telegram's 4,096 and Discord's 2,000: several parts, a code block among them.
LONG = (
    "\n\n".join(f"Paragraph {n}: " + "words that go on " * 40 for n in range(6))
    + "\n\n```python\n"
    + "".join(f"print({n})\n" for n in range(300))
    + "```\n\nThe end."
)


def kill_drafts() -> None:
    """What a kill does to the drafts in flight too (the crash helpers stop the lanes)."""
    for task in asyncio.all_tasks():
        if task.get_name() == "reply-drafts":
            task.cancel()


class DraftCrash(Crash):
    """``Crash`` at a draft's ``sendMessage``: Telegram takes it, nobody hears back."""

    def __call__(self, call: Any) -> None:
        fired = self.done.is_set()
        super().__call__(call)
        if self.done.is_set() and not fired:
            kill_drafts()


class DraftCrashOnCreate(CrashOnCreate):
    def append(self, item: Any) -> None:
        fired = self.done.is_set()
        super().append(item)
        if self.done.is_set() and not fired:
            kill_drafts()


def drafts_recorded(gateway: Gateway) -> asyncio.Event:
    """Set once the gateway recorded a draft message in the inbox."""
    recorded = asyncio.Event()
    inbox: Any = gateway.inbox
    note = inbox.note_preview

    async def noting(ids: Any, mark: Any, sent: Any = None) -> None:
        await note(ids, mark, sent)
        if sent is not None:
            recorded.set()

    inbox.note_preview = noting
    return recorded


def streaming(mode: str, channel: str = "TELEGRAM") -> dict[str, str]:
    return {f"PARLEY_CHANNELS__{channel}__STREAMING": mode, "PARLEY_LANES__MODE": "queue"}


@asynccontextmanager
async def telegram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> AsyncIterator[tuple[FakeTelegram, FakeAnthropic, LoadedConfig]]:
    loopback_only(monkeypatch)
    async with FakeTelegram(length_unit="utf16") as fake, FakeAnthropic() as llm:
        env = {**telegram_settings(tmp_path, fake, llm), **streaming(mode)}
        yield fake, llm, load_config(env=env)


@asynccontextmanager
async def telegram_gateway(
    loaded: LoadedConfig, sleeps: Sleeps | None = None
) -> AsyncIterator[Gateway]:
    channel = TelegramChannel(
        loaded.config.channels.telegram, sleep=sleeps or Sleeps(), backoff=FAST_BACKOFF
    )
    async with Gateway(loaded, channels=[channel]) as gateway:
        yield gateway


def chat_now(fake: FakeTelegram) -> list[str]:
    """The bot's messages in Alice's chat as she sees them now (deleted ones gone)."""
    texts = [fake.message_text(ALICE, m.message_id) for m in fake.sent_to(ALICE)]
    return [t for t in texts if t is not None]


def answer_with(
    llm: FakeAnthropic, text: str, chunk_chars: int = 40, pause: int | None = None
) -> asyncio.Event:
    """Every reply is ``text``; with ``pause``, the stream stops after that many deltas
    until the event returned is set (the reply is then being written, slowly)."""
    resume = asyncio.Event()
    held = (pause, resume) if pause is not None else None
    llm.responder = lambda body: Reply(text=text, chunk_chars=chunk_chars, pause=held)
    return resume


async def ask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, text: str) -> list[str]:
    async with telegram(tmp_path / mode, monkeypatch, mode) as (fake, llm, loaded):
        streamed = mode != "off"
        resume = answer_with(llm, text, pause=30 if streamed else None)
        async with telegram_gateway(loaded) as gateway:
            dm(fake, "tell me")
            await fake.wait_sent(1)
            resume.set()
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        if mode != "off":
            assert fake.call_counts["sendMessage"] == len(chat_now(fake))  # no stray draft
        return chat_now(fake)


async def test_a_streamed_reply_ends_as_the_messages_of_one_sent_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_once = await ask(tmp_path, monkeypatch, "off", LONG)
    assert len(at_once) > 1
    assert await ask(tmp_path, monkeypatch, "partial", LONG) == at_once


async def test_a_reply_is_shown_in_one_message_edited_as_it_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = "The answer, written a few words at a time, " * 5
    async with telegram(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        resume = answer_with(llm, reply, chunk_chars=8, pause=3)
        async with telegram_gateway(loaded) as gateway:
            dm(fake, "hello")
            [message] = await fake.wait_sent(1)
            # The first draft: the start of the reply, while the rest is not written.
            assert reply.startswith(message.visible_text)
            assert len(message.visible_text) <= 24
            resume.set()
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        assert fake.call_counts["editMessageText"] >= 1
        assert chat_now(fake) == [reply.strip()]
        # Its id is on record as the reply's: a later look never takes it for another's.
        assert [ref for ref, _ in await sent_rows(loaded)] == [f"{ALICE}:{message.message_id}"]


async def test_block_mode_sends_paragraph_blocks_never_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = "\n\n".join(f"Step {n}. " + "do this and that " * 30 for n in range(5))
    async with telegram(tmp_path, monkeypatch, "block") as (fake, llm, loaded):
        resume = answer_with(llm, reply, pause=40)  # two blocks written, three to come
        async with telegram_gateway(loaded) as gateway:
            dm(fake, "how?")
            [first] = await fake.wait_sent(1)
            assert first.visible_text == split_blocks(reply, split_reply)[0]
            resume.set()
            await gateway.wait_idle()
        assert chat_now(fake) == split_blocks(reply, split_reply)
        assert len(chat_now(fake)) == 5
        assert fake.call_counts["editMessageText"] == 0  # a block is sent whole, once


async def test_a_kill_before_the_draft_was_recorded_leaves_one_whole_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Telegram took the first draft; the kill kept its id from the record. After the
    restart the probe above the stored mark finds it, and the reply is edited into it."""
    async with telegram(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        answer_with(llm, "echo: hello, and more words after that", chunk_chars=6, pause=2)
        crash = DraftCrash(fake, accept=True)
        async with telegram_gateway(loaded) as gateway:
            dm(fake, "hello")
            await asyncio.wait_for(crash.done.wait(), 20)
            await gateway.lanes.stop(drain=False, timeout=0)
        async with Database(loaded.state_db) as db:
            [item] = await SqliteInbox(db).open_items()
        assert item.status == "received" and item.send_mark is not None
        assert await sent_rows(loaded) == []  # the kill came before the record
        answer_with(llm, "The whole reply, after the restart.")
        async with telegram_gateway(loaded) as gateway:
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        assert chat_now(fake) == ["The whole reply, after the restart."]
        assert fake.call_counts["sendMessage"] == 1  # the draft became the reply


async def test_a_kill_mid_stream_is_finished_in_the_draft_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model stalls half way; the draft shows its start, recorded. After the kill
    and the restart the turn runs again and its reply replaces the half one."""
    async with telegram(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        llm.enqueue(Hang(partial_text="Half of a rep"))
        async with telegram_gateway(loaded) as gateway:
            recorded = drafts_recorded(gateway)
            dm(fake, "hello")
            [draft] = await fake.wait_sent(1)
            assert draft.visible_text == "Half of a rep"
            await asyncio.wait_for(recorded.wait(), 20)  # right after Telegram answers
            await gateway.lanes.stop(drain=False, timeout=0)
        async with telegram_gateway(loaded) as gateway:
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        assert chat_now(fake) == ["echo: hello"]
        assert fake.call_counts["sendMessage"] == 1
        assert fake.text_edits[-1].message_id == draft.message_id


async def test_flood_control_on_the_final_edit_is_waited_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        llm.enqueue(Hang(partial_text="Half"))
        sleeps = Sleeps()
        async with telegram_gateway(loaded, sleeps) as gateway:
            recorded = drafts_recorded(gateway)
            dm(fake, "hello")
            await asyncio.wait_for(recorded.wait(), 20)
            await gateway.lanes.stop(drain=False, timeout=0)
        # Twice: a draft of the restarted turn that meets it is paused (not waited for);
        # the final edit meets the other and waits it out.
        fake.flood("editMessageText", 7, times=2)
        async with telegram_gateway(loaded, sleeps) as gateway:
            await gateway.wait_idle()
        assert 7 in sleeps.delays
        assert chat_now(fake) == ["echo: hello"]


@asynccontextmanager
async def discord(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> AsyncIterator[tuple[Any, FakeAnthropic, LoadedConfig]]:
    async with fake_discord(monkeypatch) as fake, FakeAnthropic() as llm:
        env = {**discord_settings(tmp_path, fake, llm), **streaming(mode, "DISCORD")}
        yield fake, llm, load_config(env=env)


def discord_gateway(loaded: LoadedConfig) -> Gateway:
    channel = DiscordChannel(loaded.config.channels.discord, ready_timeout=LIMIT)
    return Gateway(loaded, channels=[channel])


def bot_history(fake: Any, channel_id: str) -> list[str]:
    return [
        m["content"]
        for m in reversed(fake.history(channel_id))
        if str(m["author"]["id"]) == str(BOT_ID)
    ]


async def test_discord_streams_by_edits_and_ends_as_a_reply_sent_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, list[str]] = {}
    for mode in ("off", "partial"):
        async with discord(tmp_path / mode, monkeypatch, mode) as (fake, llm, loaded):
            streamed = mode != "off"
            resume = answer_with(llm, LONG, chunk_chars=200, pause=4 if streamed else None)
            async with discord_gateway(loaded) as gateway:
                channel = fake.add_dm(DISCORD_TOKEN, ANN)
                await fake.push_message(DISCORD_TOKEN, channel_id=channel, content="go", author=ANN)
                await fake.wait_until(lambda c=channel: bool(bot_history(fake, c)), LIMIT)
                if streamed:  # the first draft shows while the rest is not written
                    assert LONG.startswith(bot_history(fake, channel)[0])
                resume.set()
                await gateway.wait_idle()
                assert await gateway.inbox.counts() == {"delivered": 1}
            seen[mode] = bot_history(fake, channel)
    assert len(seen["off"]) > 1
    assert seen["partial"] == seen["off"]
    assert fake.call_counts[EDIT_MESSAGE] >= 1


async def test_discord_kill_mid_stream_keeps_one_message_with_the_whole_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first draft is created and the kill keeps its id from the gateway. The
    restarted reply's first draft carries the same nonce: Discord returns that message,
    and it is edited into the reply."""
    async with discord(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        answer_with(llm, "echo: a reply long enough to stream in parts", chunk_chars=5, pause=2)
        crash = DraftCrashOnCreate()
        fake.sent = crash
        async with discord_gateway(loaded) as gateway:
            channel = fake.add_dm(DISCORD_TOKEN, ANN)
            await fake.push_message(DISCORD_TOKEN, channel_id=channel, content="hello", author=ANN)
            await asyncio.wait_for(crash.done.wait(), 20)
            await gateway.lanes.stop(drain=False, timeout=0)
        answer_with(llm, "The whole reply after the restart.")
        async with discord_gateway(loaded) as gateway:
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        assert bot_history(fake, channel) == ["The whole reply after the restart."]
        assert fake.deduplicated >= 1


async def test_a_draft_whose_answer_was_lost_becomes_the_reply_not_a_second_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Telegram took the first draft but its answer never came (a timeout under load):
    the reply looks for it above the stored mark before sending, and finishes it."""
    monkeypatch.setattr("parley.gateway.runtime.delivery.DELIVERY_BACKOFF_SECONDS", (0.0, 0.0))
    reply = "A reply long enough to be shown while it is written."
    async with telegram(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        resume = answer_with(llm, reply, chunk_chars=6, pause=2)
        taken = answer_lost(fake)
        lost = asyncio.Event()
        name, dropping = fake._methods["sendmessage"]

        async def noting(bot: Any, params: dict[str, Any]) -> Any:
            try:
                return await dropping(bot, params)
            finally:
                if taken:
                    lost.set()

        fake._methods["sendmessage"] = (name, noting)
        async with telegram_gateway(loaded) as gateway:
            dm(fake, "hello")
            await asyncio.wait_for(lost.wait(), 10)  # the draft went out, unanswered
            resume.set()
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        assert fake.message_text(ALICE, taken[0]) == reply
        assert fake.call_counts["sendMessage"] == 1  # nothing sent beside it


async def test_discord_drafts_recorded_before_a_kill_are_taken_over_after_the_nonce_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restart comes after Discord stopped matching nonces: the recorded draft is
    edited into the reply all the same, not left beside a new message."""
    async with discord(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        llm.enqueue(Hang(partial_text="Half of a rep"))
        async with discord_gateway(loaded) as gateway:
            recorded = drafts_recorded(gateway)
            channel = fake.add_dm(DISCORD_TOKEN, ANN)
            await fake.push_message(DISCORD_TOKEN, channel_id=channel, content="hello", author=ANN)
            await asyncio.wait_for(recorded.wait(), 20)
            await gateway.lanes.stop(drain=False, timeout=0)
        assert bot_history(fake, channel) == ["Half of a rep"]
        later = fake.clock() + 3600
        fake.clock = lambda: later
        async with discord_gateway(loaded) as gateway:
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        assert bot_history(fake, channel) == ["echo: hello"]
        assert fake.deduplicated == 0  # found from the record, not by the nonce


async def test_a_kill_after_the_final_edit_is_answered_not_modified_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Telegram took the edit that made the draft the whole reply; the kill came before
    the delivery was recorded. The restart edits again, Telegram says "message is not
    modified", and that is the delivery: nothing is sent again."""
    reply = "The whole reply, shown while it was written."
    async with telegram(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        resume = answer_with(llm, reply, chunk_chars=6, pause=2)
        killed = asyncio.Event()

        def kill_at_the_final_edit(call: Any) -> None:
            final = call.method == "editMessageText" and call.params.get("text") == reply
            if final and not killed.is_set():
                killed.set()
                for task in asyncio.all_tasks():
                    if task.get_name().startswith(("lane ", "telegram-poll")):
                        task.cancel()
                kill_drafts()

        fake.call_hooks.append(kill_at_the_final_edit)
        async with telegram_gateway(loaded) as gateway:
            dm(fake, "hello")
            await fake.wait_sent(1)
            resume.set()
            await asyncio.wait_for(killed.wait(), 20)
            await gateway.lanes.stop(drain=False, timeout=0)
        assert chat_now(fake) == [reply]  # Telegram has it; the gateway never heard
        edits = fake.call_counts["editMessageText"]
        async with telegram_gateway(loaded) as gateway:
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 1}
        assert chat_now(fake) == [reply]
        assert fake.call_counts["sendMessage"] == 1
        assert fake.call_counts["editMessageText"] == edits + 1  # answered "not modified"
        assert [ref for ref, _ in await sent_rows(loaded)] == [f"{ALICE}:{fake.sent[0].message_id}"]


async def test_drafts_written_at_once_for_two_people_never_cross(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary: Alice's and Bob's replies are drafted at the same time; no draft, edit
    or reply in one chat holds a word of the other's."""
    async with telegram(tmp_path, monkeypatch, "partial") as (fake, llm, loaded):
        resume = asyncio.Event()
        llm.responder = lambda body: Reply(
            # The first delta holds the person's canary: the drafts shown before the
            # pause carry it, in whichever chat they land.
            text=f"echo: {said(body)} and some more words to stream",
            chunk_chars=24,
            pause=(1, resume),
        )
        async with telegram_gateway(loaded) as gateway:
            dm(fake, "alice-canary-7f3a")
            await fake.wait_until(lambda: bool(fake.sent), 10)  # Alice's draft shows
            fake.push_message(TOKEN, chat_id=BOB, sender_id=BOB, text="bob-canary-91c2")
            # Bob's first draft, while Alice's is still open.
            await fake.wait_until(lambda: any(drafted("bob-canary", c) for c in fake.calls), 10)
            resume.set()
            await gateway.wait_idle()
            assert await gateway.inbox.counts() == {"delivered": 2}
        shown: dict[int, list[str]] = {ALICE: [], BOB: []}
        for call in fake.calls:
            if call.method in ("sendMessage", "editMessageText"):
                shown[int(call.params["chat_id"])].append(str(call.params["text"]))
        assert any("alice-canary-7f3a" in t for t in shown[ALICE])
        assert any("bob-canary-91c2" in t for t in shown[BOB])
        assert not any("bob-canary" in t for t in shown[ALICE])
        assert not any("alice-canary" in t for t in shown[BOB])
        assert len(shown[ALICE]) > 1 and len(shown[BOB]) > 1  # drafted, then edited


def drafted(words: str, call: Any) -> bool:
    """Is ``call`` a send or an edit whose text holds ``words``?"""
    text = str(call.params.get("text", ""))
    return call.method in ("sendMessage", "editMessageText") and words in text
