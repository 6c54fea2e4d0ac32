"""A reply being sent holds no run slot (gateway/runtime/dispatch.py, gateway/lanes.py).

``max_concurrent_runs`` bounds model work. A send to a platform that is slow or has
the bot wait out a rate limit used to keep its slot until the platform answered, and
every other session's turn waited behind it. Now the slot goes back for the send; the
session's own next message still waits for it, so its replies keep their order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from parley.channels.base import DeliveryResult, OutboundMessage
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider

WAIT = 10.0


class SlowChat(RecordingChannel):
    """Sends to ``slow_chat`` wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.slow_chat = "alice"
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        if message.chat_id == self.slow_chat:
            self.waiting.set()
            await self.gate.wait()
        return await super().send(message)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[Gateway, SlowChat]]:
    channel = SlowChat()
    config = load_config(
        env={
            "PARLEY_HOME": str(tmp_path),
            "PARLEY_SESSION__TIMEZONE": "UTC",
            "PARLEY_HTTP__ENABLED": "false",
            "PARLEY_LANES__MAX_CONCURRENT_RUNS": "1",
            "PARLEY_LANES__MODE": "queue",
        }
    )
    gateway = Gateway(config, channels=[channel], provider=ScriptedProvider())
    async with gateway:
        yield gateway, channel


def texts(channel: RecordingChannel, chat: str) -> list[str]:
    return [m.text for m in channel.sent if m.chat_id == chat]


async def test_a_send_that_waits_on_the_platform_does_not_hold_up_other_sessions(
    stack: tuple[Gateway, SlowChat],
) -> None:
    gateway, channel = stack
    await gateway.handle_inbound(channel.inbound("a0", message_id="a0", sender="alice"))
    async with asyncio.timeout(WAIT):
        await channel.waiting.wait()
    await gateway.handle_inbound(channel.inbound("a1", message_id="a1", sender="alice"))
    assert gateway.lanes.stats().active_runs == 0  # the one slot is free while a0 sends

    # One slot, alice's send still waiting: bob is answered all the same.
    await gateway.handle_inbound(channel.inbound("b0", message_id="b0", sender="bob"))
    await channel.wait_sent(1, WAIT)
    assert texts(channel, "bob") == ["echo: b0"]
    assert texts(channel, "alice") == []

    channel.gate.set()
    async with asyncio.timeout(WAIT):
        await gateway.wait_idle()
    assert texts(channel, "alice") == ["echo: a0", "echo: a1"]  # in order, each once
    assert await gateway.inbox.open_items() == []


async def test_the_bookkeeping_after_the_model_does_not_hold_the_slot(
    stack: tuple[Gateway, SlowChat], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply is in the transcript; the registry's counters that follow are not
    model work either."""
    gateway, channel = stack
    channel.slow_chat = "nobody"
    registry = gateway.registry
    record_turn = registry.record_turn
    held = asyncio.Event()
    go_on = asyncio.Event()
    alice_session = ""

    async def slow_record_turn(session_id: str, **kwargs: object) -> None:
        if session_id == alice_session:
            held.set()
            await go_on.wait()
        await record_turn(session_id, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(registry, "record_turn", slow_record_turn)
    await gateway.handle_inbound(channel.inbound("warm up", message_id="w", sender="alice"))
    await channel.wait_sent(1, WAIT)
    [alice] = [r for r in (await registry.list()).sessions if "alice" in r.key]
    alice_session = alice.session_id

    await gateway.handle_inbound(channel.inbound("a1", message_id="a1", sender="alice"))
    async with asyncio.timeout(WAIT):
        await held.wait()
    await gateway.handle_inbound(channel.inbound("b0", message_id="b0", sender="bob"))
    await channel.wait_sent(2, WAIT)
    assert texts(channel, "bob") == ["echo: b0"]

    go_on.set()
    async with asyncio.timeout(WAIT):
        await gateway.wait_idle()
    assert texts(channel, "alice") == ["echo: warm up", "echo: a1"]
