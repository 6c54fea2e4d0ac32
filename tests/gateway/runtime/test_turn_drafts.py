"""Replies shown while they are written: ``DraftStream``'s throttling and resets on a fake
clock (no sleeping), and the whole gateway with a channel that shows drafts: the draft
comes first, the reply replaces it under the same key, nothing lands after the reply,
and a channel without drafts runs its turns without ``on_text`` at all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from parley.channels.base import ChannelCapabilities, OutboundMessage, ReplyDraft
from parley.core.errors import OverloadedError
from parley.core.messages import TextBlock, ToolUseBlock, Usage
from parley.core.providers.base import (
    STOP_END,
    STOP_TOOL_USE,
    ProviderRequest,
    ProviderResponse,
    TextCallback,
)
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from parley.gateway.runtime.delivery import reply_key
from parley.gateway.runtime.drafts import DRAFT_INTERVAL_SECONDS, DraftStream
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider

BASE = ReplyDraft(channel="test", account="default", chat_id="alice", key="k1", text="")


class FakeTime:
    """A clock that moves only when a sleeper is let go, so every wait is observable."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        future = asyncio.get_running_loop().create_future()
        self._sleepers.append((seconds, future))
        await future

    async def release(self) -> None:
        """Advance past the pending sleep and let the sleeper run on."""
        seconds, future = self._sleepers.pop(0)
        self.now += seconds
        future.set_result(None)
        await settle()


class Screen:
    """A channel's draft method: records each draft; can fail or hold a push open."""

    def __init__(self) -> None:
        self.drafts: list[ReplyDraft] = []
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def draft(self, draft: ReplyDraft) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionResetError("the socket went away")
        self.drafts.append(draft)

    @property
    def seen(self) -> list[tuple[str | None, str]]:
        return [(d.reset, d.text) for d in self.drafts]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def stream(screen: Screen, time: FakeTime, calls: list[int] | None = None) -> DraftStream:
    counter = calls if calls is not None else [0]
    return DraftStream(screen, BASE, lambda: counter[0], clock=time.clock, sleep=time.sleep)


async def test_the_first_draft_goes_at_once_and_the_rest_are_throttled() -> None:
    screen, time = Screen(), FakeTime()
    drafts = stream(screen, time)
    await drafts.on_text("Hel")
    await settle()
    assert screen.seen == [(None, "Hel")]  # no wait for the first words
    for delta in ("lo", ", wor", "ld"):
        await drafts.on_text(delta)
    await settle()
    assert screen.seen == [(None, "Hel")]  # held back within the interval
    assert time.waits == [pytest.approx(DRAFT_INTERVAL_SECONDS)]
    await time.release()
    # Three deltas, one draft: the whole text so far, not a delta.
    assert screen.seen == [(None, "Hel"), (None, "Hello, world")]
    await drafts.close()
    assert len(screen.drafts) == 2


async def test_many_deltas_cost_one_draft_per_interval() -> None:
    screen, time = Screen(), FakeTime()
    drafts = stream(screen, time)
    for i in range(200):
        await drafts.on_text(f"{i} ")
        await settle()  # the model's stream yields between deltas
        if i % 20 == 19:
            await time.release()  # one interval passes every 20 deltas
    # The first at once, then one per interval: 11 drafts for 200 deltas.
    assert len(screen.drafts) == 11
    assert screen.drafts[-1].text == "".join(f"{i} " for i in range(200))
    await drafts.close()


async def test_a_retry_resets_what_was_shown() -> None:
    screen, time = Screen(), FakeTime()
    drafts = stream(screen, time)
    await drafts.on_text("The answer is")
    await settle()
    drafts.reset("retry")
    await drafts.on_text("Sorry, the answer")
    await settle()
    await time.release()
    # The reset rides on the next draft, with the new attempt's text from its start.
    assert screen.seen == [(None, "The answer is"), ("retry", "Sorry, the answer")]
    assert all(d.key == "k1" and d.chat_id == "alice" for d in screen.drafts)
    await drafts.close()


async def test_a_retry_followed_by_another_call_stays_a_retry() -> None:
    screen, time, calls = Screen(), FakeTime(), [1]
    drafts = stream(screen, time, calls)
    await drafts.on_text("Half of it")
    await settle()
    drafts.reset("retry")  # the window overflowed: compacted, then the reply restarts
    calls[0] = 2
    await drafts.on_text("All of it")
    await settle()
    await time.release()
    assert screen.seen == [(None, "Half of it"), ("retry", "All of it")]
    await drafts.close()


async def test_a_reset_before_anything_was_shown_sends_nothing() -> None:
    screen, time = Screen(), FakeTime()
    drafts = stream(screen, time)
    drafts.reset("retry")
    await settle()
    await drafts.on_text("fresh")
    await settle()
    assert screen.seen == [(None, "fresh")]
    await drafts.close()


async def test_a_later_model_call_replaces_the_text_of_the_one_before() -> None:
    screen, time, calls = Screen(), FakeTime(), [3]
    drafts = stream(screen, time, calls)
    await drafts.on_text("Let me look that up.")
    await settle()
    calls[0] = 5  # the runner appended the call's message and the tool result
    await drafts.on_text("It is 42.")
    await settle()
    await time.release()
    assert screen.seen == [(None, "Let me look that up."), ("next_call", "It is 42.")]
    await drafts.close()


async def test_no_draft_lands_after_close() -> None:
    screen, time = Screen(), FakeTime()
    drafts = stream(screen, time)
    await drafts.on_text("one")
    await settle()
    await drafts.on_text(" two")  # waits for the interval
    await settle()
    await drafts.close()
    await drafts.on_text(" three")
    await settle()
    assert screen.seen == [(None, "one")]
    assert time._sleepers  # the pending push was cancelled in its wait, never resumed


async def test_close_lets_a_draft_in_flight_land_first() -> None:
    screen, time = Screen(), FakeTime()
    screen.gate = asyncio.Event()
    drafts = stream(screen, time)
    await drafts.on_text("in flight")
    await settle()
    closing = asyncio.create_task(drafts.close())
    await settle()
    assert not closing.done()  # waits for the write rather than cutting it in half
    screen.gate.set()
    await closing
    assert screen.seen == [(None, "in flight")]


async def test_a_failing_channel_never_fails_the_stream() -> None:
    screen, time = Screen(), FakeTime()
    screen.fail = True
    drafts = stream(screen, time)
    await drafts.on_text("lost")
    await settle()
    await drafts.on_text(" too")
    await settle()
    await time.release()
    await drafts.close(withdraw=True)
    assert screen.drafts == []


async def test_a_silent_reply_is_never_shown_and_a_shown_draft_is_withdrawn() -> None:
    screen, time = Screen(), FakeTime()
    drafts = stream(screen, time)
    await drafts.on_text("NO_")
    await drafts.on_text("REPLY")
    await settle()
    await drafts.close(withdraw=True)
    # Never shown; the withdrawal still tells the channel that no reply is coming.
    assert screen.seen == [("withdrawn", "")]

    screen, time, calls = Screen(), FakeTime(), [0]
    drafts = stream(screen, time, calls)
    await drafts.on_text("Checking.")
    await settle()
    await drafts.close(withdraw=True)
    assert screen.seen == [(None, "Checking."), ("withdrawn", "")]


# -- through the gateway ---------------------------------------------------------------


class DraftingChannel(RecordingChannel):
    """A recording channel that shows drafts; ``log`` keeps drafts and sends in order."""

    capabilities = ChannelCapabilities(live_drafts=True)

    def __init__(self) -> None:
        super().__init__()
        self.log: list[ReplyDraft | OutboundMessage] = []
        self.fail_drafts = False

    async def draft(self, draft: ReplyDraft) -> None:
        if self.fail_drafts:
            raise RuntimeError("the draft broke")
        self.log.append(draft)

    async def send(self, message: OutboundMessage) -> Any:
        self.log.append(message)
        return await super().send(message)


class StreamingProvider(ScriptedProvider):
    """Streams each reply in small deltas; ``fail_once`` breaks the first attempt mid-way.
    Records whether each call was given ``on_text``."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_once = False
        self.streamed: list[bool] = []

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        self.streamed.append(on_text is not None)
        response = await super().complete(request, None)
        text = response.message.text
        if on_text is not None:
            for i in range(0, len(text), 4):
                await on_text(text[i : i + 4])
                await asyncio.sleep(0)  # a real stream yields to the loop between chunks
                if self.fail_once and i >= 4:
                    self.fail_once = False
                    raise OverloadedError("overloaded mid-stream", provider=self.name)
        return response


def config(home: Path, attempts: int = 1) -> Any:
    return load_config(
        env={
            "PARLEY_HOME": str(home),
            "PARLEY_SESSION__TIMEZONE": "UTC",
            "PARLEY_HTTP__PORT": "0",
            "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": str(attempts),
            "PARLEY_PROVIDERS__RETRY__BASE_DELAY_SECONDS": "0",
            "PARLEY_PROVIDERS__RETRY__MAX_DELAY_SECONDS": "0",
        }
    )


World = tuple[Gateway, DraftingChannel, StreamingProvider]


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    # No throttle: every draft the stream would make goes out, so what these tests see
    # does not depend on how fast the machine is (the throttle is tested above).
    def unthrottled(*args: Any, **kwargs: Any) -> DraftStream:
        return DraftStream(*args, **{**kwargs, "interval": 0})

    monkeypatch.setattr("parley.gateway.runtime.turn.DraftStream", unthrottled)
    channel, provider = DraftingChannel(), StreamingProvider()
    async with Gateway(config(tmp_path, attempts=2), channels=[channel], provider=provider) as gw:
        yield gw, channel, provider


async def say(gateway: Gateway, channel: RecordingChannel, text: str) -> None:
    message = channel.inbound(text)
    await gateway.handle_inbound(message)
    await gateway.wait_idle()


async def test_the_draft_comes_first_and_the_reply_replaces_it(world: Any) -> None:
    gateway, channel, provider = world
    message = channel.inbound("hello there")
    await gateway.handle_inbound(message)
    await gateway.wait_idle()
    (sent,) = channel.sent
    assert sent.text == "echo: hello there"
    drafts = [d for d in channel.log if isinstance(d, ReplyDraft)]
    assert drafts and channel.log[-1] is sent  # nothing after the reply
    # Whole texts, growing, all under the key the reply carries.
    assert drafts[0].text and "echo: hello there".startswith(drafts[-1].text)
    assert {d.key for d in drafts} == {sent.idempotency_key} == {reply_key(message)}
    assert all((d.chat_id, d.reply_to_message_id) == ("alice", message.message_id) for d in drafts)
    assert provider.streamed == [True]


async def test_a_retried_call_resets_the_draft(world: Any) -> None:
    gateway, channel, provider = world
    provider.fail_once = True
    await say(gateway, channel, "wobbly")
    (sent,) = channel.sent
    assert sent.text == "echo: wobbly"
    drafts = [d for d in channel.log if isinstance(d, ReplyDraft)]
    resets = [d for d in drafts if d.reset is not None]
    assert [d.reset for d in resets] == ["retry"]
    after = drafts[drafts.index(resets[0]) :]
    assert all("echo: wobbly".startswith(d.text) for d in after)


async def test_a_tool_call_text_is_replaced_by_the_final_call(world: Any) -> None:
    gateway, channel, provider = world
    provider.push(
        ProviderResponse(
            (TextBlock("Let me check."), ToolUseBlock("c1", "no_such_tool", {})),
            STOP_TOOL_USE,
            Usage(5, 5),
        ),
        ProviderResponse((TextBlock("All done."),), STOP_END, Usage(5, 5)),
    )
    await say(gateway, channel, "do it")
    (sent,) = channel.sent
    assert sent.text == "All done."
    drafts = [d for d in channel.log if isinstance(d, ReplyDraft)]
    assert [d.reset for d in drafts if d.reset] == ["next_call"]
    assert drafts[-1].text == "All done."[: len(drafts[-1].text)]


async def test_a_silent_reply_withdraws_the_draft_and_sends_nothing(world: Any) -> None:
    gateway, channel, provider = world
    provider.push(
        ProviderResponse(
            (TextBlock("Checking."), ToolUseBlock("c1", "no_such_tool", {})),
            STOP_TOOL_USE,
            Usage(5, 5),
        ),
        ProviderResponse((TextBlock("NO_REPLY"),), STOP_END, Usage(5, 5)),
    )
    await say(gateway, channel, "psst")
    assert channel.sent == []
    last = channel.log[-1]
    # The tool call's text is taken back, and the channel told that nothing follows.
    assert isinstance(last, ReplyDraft) and (last.reset, last.text) == ("withdrawn", "")
    assert not any(isinstance(d, ReplyDraft) and "NO_" in d.text for d in channel.log)


async def test_failing_drafts_never_cost_the_reply(world: Any) -> None:
    gateway, channel, _ = world
    channel.fail_drafts = True
    await say(gateway, channel, "still answered")
    assert [m.text for m in channel.sent] == ["echo: still answered"]


async def test_a_channel_without_drafts_is_not_streamed_to(tmp_path: Path) -> None:
    channel, provider = RecordingChannel(), StreamingProvider()
    async with Gateway(config(tmp_path), channels=[channel], provider=provider) as gateway:
        await say(gateway, channel, "plain")
        assert [m.text for m in channel.sent] == ["echo: plain"]
    assert provider.streamed == [False]


async def test_a_broken_draft_is_warned_about_once_per_turn(
    world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, channel, _ = world

    async def broken(draft: ReplyDraft) -> None:
        raise TypeError("a bug in the channel's draft")

    channel.draft = broken
    with caplog.at_level(logging.DEBUG, logger="parley.gateway"):
        await say(gateway, channel, "answered anyway, with many drafts")
    assert [m.text for m in channel.sent] == ["echo: answered anyway, with many drafts"]
    failed = [r for r in caplog.records if r.getMessage().startswith("draft on")]
    assert len(failed) > 1  # every push failed ...
    warned = [r for r in failed if r.levelno == logging.WARNING]
    assert len(warned) == 1  # ... one warning, with the trace
    assert warned[0].exc_info is not None and warned[0].exc_info[0] is TypeError


async def test_a_transport_failure_of_a_draft_stays_quiet(caplog: pytest.LogCaptureFixture) -> None:
    screen, time = Screen(), FakeTime()
    screen.fail = True  # ConnectionResetError
    drafts = stream(screen, time)
    with caplog.at_level(logging.DEBUG, logger="parley.gateway"):
        await drafts.on_text("lost")
        await settle()
        await drafts.close(withdraw=True)
    failed = [r for r in caplog.records if r.getMessage().startswith("draft on")]
    assert failed and all(r.levelno == logging.DEBUG for r in failed)


async def test_one_persons_streamed_words_reach_only_their_own_chat(world: Any) -> None:
    """The canary: two people talk at once; every draft of Alice's turn goes to Alice's
    chat, and nothing of hers is ever drafted into Bob's."""
    gateway, channel, _ = world
    canary = "CANARY-ALICE-4471"
    await gateway.handle_inbound(channel.inbound(f"my secret is {canary}", sender="alice"))
    await gateway.handle_inbound(channel.inbound("hello from bob", sender="bob"))
    await gateway.wait_idle()
    drafts = [d for d in channel.log if isinstance(d, ReplyDraft)]
    assert {d.chat_id for d in drafts} == {"alice", "bob"}
    assert any(canary in d.text for d in drafts)  # Alice's words were streamed
    assert all(d.chat_id == "alice" for d in drafts if canary in d.text)
    assert not any(canary in d.text for d in drafts if d.chat_id == "bob")
    sent = {m.chat_id: m.text for m in channel.sent}
    assert canary in sent["alice"] and canary not in sent["bob"]


async def test_a_status_line_shows_while_a_tool_runs_and_goes_when_it_is_done() -> None:
    screen, time = Screen(), FakeTime()
    drafts = stream(screen, time)
    drafts.status("running current_time")  # before any text: the status alone
    await settle()
    assert [(d.text, d.status) for d in screen.drafts] == [("", "running current_time")]
    drafts.status("running current_time")  # the same status: nothing new to show
    await drafts.on_text("It is noon")
    drafts.status(None)
    await settle()  # throttled: the next draft waits out the interval
    await time.release()
    assert [(d.text, d.status) for d in screen.drafts][-1] == ("It is noon", None)
    await drafts.close()
