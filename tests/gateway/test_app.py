"""The gateway end to end at its seams: a scripted provider, a recording channel,
a real state.db, real transcripts and the real lanes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from parley.channels.base import DeliveryError, RecipientBlocked
from parley.core.errors import OverloadedError
from parley.core.messages import TextBlock, ToolUseBlock, Usage
from parley.core.providers.base import STOP_END, STOP_TOOL_USE, ProviderResponse
from parley.core.transcript import Transcript
from parley.gateway.app import Gateway
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.runtime.user_errors import BUSY_TEXT
from parley.gateway.storage.sqlite.database import Database
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def make_config(home: Path, **env: str) -> LoadedConfig:
    base = {"PARLEY_HOME": str(home), "PARLEY_SESSION__TIMEZONE": "UTC"}
    base["PARLEY_HTTP__PORT"] = "0"  # the admin server on a free port
    # Retries on the scripted provider would only slow tests down.
    base["PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS"] = "1"
    return load_config(env={**base, **env})


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))


@pytest.fixture
async def stack(
    tmp_path: Path, clock: Clock
) -> AsyncIterator[tuple[Gateway, RecordingChannel, ScriptedProvider]]:
    channel = RecordingChannel()
    provider = ScriptedProvider()
    gateway = Gateway(make_config(tmp_path), channels=[channel], provider=provider, clock=clock)
    async with gateway:
        yield gateway, channel, provider


async def say(gateway: Gateway, channel: RecordingChannel, text: str, **kw: Any) -> str:
    before = len(channel.sent)
    await gateway.handle_inbound(channel.inbound(text, **kw))
    await gateway.wait_idle()
    sent = await channel.wait_sent(before + 1)
    return sent[before].text


async def test_message_is_answered_and_recorded(stack: Any, tmp_path: Path) -> None:
    gateway, channel, provider = stack
    assert await say(gateway, channel, "hello") == "echo: hello"
    record = await gateway.registry.get_active("agent:main:test:direct:alice")
    assert record is not None
    assert record.turn_count == 1 and record.usage == Usage(10, 5)
    transcript = Transcript.open(tmp_path / "sessions" / f"{record.session_id}.jsonl")
    kinds = [
        (e.type, e.message.role if e.type == "message" else e.payload.get("custom_type"))
        for e in transcript.entries()
    ]
    assert kinds == [("message", "user"), ("message", "assistant"), ("custom", "delivery")]
    assert record.entry_count == transcript.entry_count == 3
    assert record.last_entry_id == transcript.last_entry.id
    # The volatile turn context rides at the tail of the user message, never in the
    # system prompt, so everything before it stays byte-stable for the prompt cache.
    user = provider.requests[0].messages[0]
    assert user.content[0].text == "hello" and "<turn-context>" in user.content[-1].text
    assert "<turn-context>" not in provider.requests[0].system
    assert "<turn-context>" not in provider.requests[0].system
    assert channel.sent[0].reply_to_message_id is not None


async def test_concurrent_first_opens_of_a_transcript_share_one_object(
    tmp_path: Path, clock: Clock
) -> None:
    """After a restart, /context or the admin API may open a session's transcript while
    its lane does: one object, or two writers would disagree on where the file ends."""
    config = make_config(tmp_path)
    channel = RecordingChannel()
    async with Gateway(config, channels=[channel], provider=ScriptedProvider(), clock=clock) as g:
        await say(g, channel, "hello")
    async with Gateway(config, channels=[channel], provider=ScriptedProvider(), clock=clock) as g:
        record = await g.registry.get_active("agent:main:test:direct:alice")
        assert record is not None
        opened = await asyncio.gather(*(g.transcript(record) for _ in range(5)))
        assert all(t is opened[0] for t in opened)
        assert await g.transcript(record) is opened[0]  # cached afterwards


async def test_context_while_the_lane_creates_the_transcript(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/context answers from outside the lane. Asked while the lane is still creating
    a new session's transcript, it reads no transcript (never creates one, never trips
    on a half-made file), and the lane's turn then completes normally."""
    gateway, channel, _ = stack
    store = gateway.state.transcripts
    real_create = store.create
    entered, release = threading.Event(), threading.Event()

    def slow_create(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(10)
        return real_create(*args, **kwargs)

    monkeypatch.setattr(store, "create", slow_create)
    await gateway.handle_inbound(channel.inbound("hello", message_id="m1"))
    assert await asyncio.to_thread(entered.wait, 10)
    await gateway.handle_inbound(channel.inbound("/context", message_id="m2"))
    [context] = await channel.wait_sent(1)
    assert "History: 0 messages" in context.text
    release.set()
    await gateway.wait_idle()
    sent = await channel.wait_sent(2)
    assert sent[1].text == "echo: hello"


async def test_system_prompt_is_byte_stable_across_turns(stack: Any) -> None:
    gateway, channel, provider = stack
    await say(gateway, channel, "one")
    await say(gateway, channel, "two")
    first, second = provider.requests
    assert first.system == second.system
    assert second.messages[: len(first.messages)] == first.messages
    assert "AGENTS.md" in first.system and "Red Lines" in first.system


async def test_same_platform_message_twice_is_answered_once(stack: Any) -> None:
    gateway, channel, provider = stack
    message = channel.inbound("once", message_id="dup-1")
    await gateway.handle_inbound(message)
    await gateway.handle_inbound(message)
    await gateway.wait_idle()
    assert [m.text for m in channel.sent] == ["echo: once"]
    assert len(provider.requests) == 1


async def test_people_do_not_share_sessions(stack: Any) -> None:
    gateway, channel, provider = stack
    await say(gateway, channel, "I am Alice", sender="alice")
    await say(gateway, channel, "I am Bob", sender="bob")
    bob_view = provider.requests[1].messages
    assert all(
        "Alice" not in b.text for m in bob_view for b in m.content if isinstance(b, TextBlock)
    )


async def test_status_help_and_new(stack: Any) -> None:
    gateway, channel, provider = stack
    await say(gateway, channel, "first")
    status = await say(gateway, channel, "/status")
    assert "agent:main:test:direct:alice" in status and "compactions: 0" in status
    assert "/new" in await say(gateway, channel, "/help")
    old = await gateway.registry.get_active("agent:main:test:direct:alice")
    assert "new session" in (await say(gateway, channel, "/NEW")).lower()
    new = await gateway.registry.get_active("agent:main:test:direct:alice")
    assert new is not None and old is not None and new.session_id != old.session_id
    archived = await gateway.registry.get(old.session_id)
    assert archived is not None and archived.status == "archived"
    assert len(provider.requests) == 1  # commands never reached the model
    assert await say(gateway, channel, "/reset tell me a joke") == "echo: tell me a joke"
    newest = await gateway.registry.get_active("agent:main:test:direct:alice")
    assert newest is not None and newest.session_id != new.session_id
    # The new session's history starts with the text after the trigger.
    assert len(provider.requests[-1].messages) == 1


async def test_daily_reset_archives_and_automated_events_never_reset(
    stack: Any, clock: Clock
) -> None:
    gateway, channel, _ = stack
    key = "agent:main:test:direct:alice"
    await say(gateway, channel, "before")
    first = await gateway.registry.get_active(key)
    clock.now += timedelta(hours=17)  # 05:00 next day: past the 04:00 boundary
    await say(gateway, channel, "heartbeat", automated=True)
    assert (await gateway.registry.get_active(key)).session_id == first.session_id
    clock.now += timedelta(days=1)
    await say(gateway, channel, "after")
    second = await gateway.registry.get_active(key)
    assert second.session_id != first.session_id
    assert (await gateway.registry.get(first.session_id)).archived_reason == "daily"


async def test_provider_error_tells_user_and_session_keeps_working(stack: Any) -> None:
    gateway, channel, provider = stack
    provider.push(OverloadedError("Overloaded", provider="scripted", status=529))
    reply = await say(gateway, channel, "are you there?")
    assert "overloaded" in reply.lower() and "saved" in reply
    assert await say(gateway, channel, "again") == "echo: again"
    # The failed message stayed in the history (merged into the next user turn).
    texts = [
        b.text
        for m in provider.requests[-1].messages
        for b in m.content
        if isinstance(b, TextBlock)
    ]
    assert "are you there?" in texts and "again" in texts


async def test_tool_loop_runs_tools_and_records_results(stack: Any) -> None:
    gateway, channel, provider = stack
    provider.push(
        ProviderResponse(
            (ToolUseBlock("t1", "current_time", {"timezone": "UTC"}),), STOP_TOOL_USE, Usage(5, 5)
        ),
        ProviderResponse((TextBlock("It is noon."),), STOP_END, Usage(7, 3)),
    )
    assert await say(gateway, channel, "what time is it?") == "It is noon."
    second = provider.requests[1].messages
    result = second[-1].content[0]
    assert second[-1].role == "tool_result" and "2026" in result.content
    assert {t.name for t in provider.requests[0].tools} >= {"current_time", "read_file"}


async def test_silent_reply_sends_nothing(stack: Any) -> None:
    gateway, channel, provider = stack
    provider.push(ProviderResponse((TextBlock("NO_REPLY"),), STOP_END, Usage(1, 1)))
    await gateway.handle_inbound(channel.inbound("psst", message_id="quiet"))
    await gateway.wait_idle()
    assert channel.sent == []
    counts = await gateway.inbox.counts()
    assert counts == {"delivered": 1}


async def test_blocked_recipient_is_recorded_not_retried(stack: Any) -> None:
    gateway, channel, _ = stack
    channel.fail_next.append(RecipientBlocked("bot was blocked by the user"))
    await gateway.handle_inbound(channel.inbound("hi"))
    await gateway.wait_idle()
    record = await gateway.registry.get_active("agent:main:test:direct:alice")
    assert record is not None and "blocked" in (record.delivery_error or "")
    assert await gateway.inbox.counts() == {"failed": 1}


async def test_full_queue_answers_busy_and_loses_nothing(tmp_path: Path, clock: Clock) -> None:
    channel = RecordingChannel()
    gate = asyncio.Event()
    provider = ScriptedProvider(gate=gate)
    config = make_config(tmp_path, PARLEY_LANES__QUEUE_CAP="1")
    async with Gateway(config, channels=[channel], provider=provider, clock=clock) as gateway:
        for i in range(3):
            await gateway.handle_inbound(channel.inbound(f"m{i}", message_id=f"id{i}"))
        # m0 runs (held by the gate), m1 waits, m2 finds the queue full.
        sent = await channel.wait_sent(1)
        assert sent[0].text == BUSY_TEXT
        gate.set()
        await gateway.wait_idle()
        assert [m.text for m in channel.sent[1:]] == ["echo: m0", "echo: m1"]
        counts = await gateway.inbox.counts()
        assert counts == {"delivered": 2, "rejected": 1}


async def test_messages_recorded_before_a_crash_are_answered_on_restart(
    tmp_path: Path, clock: Clock
) -> None:
    config = make_config(tmp_path)
    channel = RecordingChannel()
    # A process that died right after recording two messages, before answering them.
    async with Database(config.state_db) as db:
        inbox = SqliteInbox(db)
        await inbox.record(channel.inbound("lost one", message_id="c1"))
        await inbox.record(channel.inbound("lost two", message_id="c2"))
    provider = ScriptedProvider()
    async with Gateway(config, channels=[channel], provider=provider, clock=clock) as gateway:
        await gateway.wait_idle()
        assert [m.text for m in channel.sent] == ["echo: lost one", "echo: lost two"]
        # Delivered again by the platform after the restart: not answered twice.
        await gateway.handle_inbound(channel.inbound("lost one", message_id="c1"))
        await gateway.wait_idle()
        assert len(channel.sent) == 2


async def test_reply_written_before_a_crash_is_delivered_without_a_model_call(
    tmp_path: Path, clock: Clock
) -> None:
    config = make_config(tmp_path)
    channel = RecordingChannel()
    provider = ScriptedProvider()
    async with Gateway(config, channels=[channel], provider=provider, clock=clock) as gateway:
        await say(gateway, channel, "warm up")
        record = await gateway.registry.get_active("agent:main:test:direct:alice")
    # Simulate a kill after the reply reached the transcript but before delivery:
    # the inbox row is still "received" and the transcript holds user + assistant.
    async with Database(config.state_db) as db:
        inbox = SqliteInbox(db)
        recorded = await inbox.record(channel.inbound("late", message_id="k1"))
    transcript = Transcript.open(config.sessions_dir / f"{record.session_id}.jsonl")
    from parley.core.messages import Message

    transcript.append_message(Message.user("late"), meta={"inbox_ids": [recorded.item.id]})
    transcript.append_message(Message.assistant("already answered"), usage=Usage(1, 1))
    transcript.close()
    channel2 = RecordingChannel()
    provider2 = ScriptedProvider()
    async with Gateway(config, channels=[channel2], provider=provider2, clock=clock) as gateway:
        await gateway.wait_idle()
        assert [m.text for m in channel2.sent] == ["already answered"]
        assert provider2.requests == []


async def test_thousand_messages_over_fifty_sessions(tmp_path: Path, clock: Clock) -> None:
    channel = RecordingChannel()
    provider = ScriptedProvider()
    config = make_config(tmp_path, PARLEY_LANES__QUEUE_CAP="1000", PARLEY_LANES__MODE="queue")
    async with Gateway(config, channels=[channel], provider=provider, clock=clock) as gateway:
        messages = [
            channel.inbound(f"{s}:{i}", sender=f"user{s}", message_id=f"{s}-{i}")
            for i in range(20)
            for s in range(50)
        ]
        await asyncio.gather(*(gateway.handle_inbound(m) for m in messages))
        await gateway.wait_idle()
        await channel.wait_sent(1000)
        by_chat: dict[str, list[str]] = {}
        for out in channel.sent:
            by_chat.setdefault(out.chat_id, []).append(out.text)
        assert len(channel.sent) == 1000
        for s in range(50):
            assert by_chat[f"user{s}"] == [f"echo: {s}:{i}" for i in range(20)]
        assert await gateway.inbox.counts() == {"delivered": 1000}


async def test_a_reply_the_platform_could_not_take_is_sent_again_later(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channel, _ = stack
    monkeypatch.setattr("parley.gateway.runtime.delivery.DELIVERY_BACKOFF_SECONDS", (0.0, 0.0))
    down = DeliveryError("the platform is unreachable", retryable=True)
    channel.fail_next.extend([down] * 3)  # every attempt of the first delivery
    await gateway.handle_inbound(channel.inbound("are you there?"))
    await gateway.wait_idle()
    assert channel.sent == []
    [item] = await gateway.inbox.open_items()
    assert item.status == "replied" and "unreachable" in (item.error or "")
    channel.fail_next.extend([down] * 3)  # still down at the first resend
    assert await gateway.redeliver_now() == 1
    await gateway.wait_idle()
    assert channel.sent == []
    # The background loop waits out a backoff per reply; an explicit call does not.
    assert await gateway.redeliver_now(due_only=True) == 0
    assert await gateway.redeliver_now() == 1
    await gateway.wait_idle()
    assert [m.text for m in await channel.wait_sent(1)] == ["echo: are you there?"]
    assert await gateway.inbox.open_items() == []
    assert (await gateway.inbox.counts()) == {"delivered": 1}
    assert await gateway.redeliver_now() == 0  # nothing is sent twice

    # A reply still undeliverable a day later is given up on, and says so.
    channel.fail_next.extend([down] * 3)
    await gateway.handle_inbound(channel.inbound("and now?"))
    await gateway.wait_idle()
    monkeypatch.setattr("parley.gateway.runtime.redelivery.REDELIVERY_GIVE_UP", timedelta(0))
    assert await gateway.redeliver_now() == 0
    counts = await gateway.inbox.counts()
    assert counts == {"delivered": 1, "failed": 1}
    assert len(channel.sent) == 1


async def test_a_refused_reply_is_not_sent_again(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channel, _ = stack
    channel.fail_next.append(DeliveryError("message is too long", retryable=False))
    await gateway.handle_inbound(channel.inbound("hello"))
    await gateway.wait_idle()
    assert await gateway.inbox.open_items() == []
    assert await gateway.redeliver_now() == 0
    assert channel.sent == []


async def test_the_warm_window_budget_is_worked_out_at_start(stack: Any) -> None:
    # "auto" asks /proc and /sys how much memory there is: in start, off the event loop.
    gateway, _, _ = stack
    budget = gateway.config.storage.warm_transcripts_bytes()
    assert budget > 0 and gateway.transcripts.warm_bytes == budget
