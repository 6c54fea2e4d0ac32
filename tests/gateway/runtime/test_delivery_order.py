"""A chat's replies reach the platform in the order of its messages, also when a send
fails and its reply is kept for later (gateway/runtime/delivery.py, dispatch.py).

A reply the platform could not take (a timeout under load, an outage) stays in the
inbox for ``redelivery``. Before, the lane went on to the chat's next message and
sent its reply at once, so the earlier reply arrived after it. Now the next run sends
the kept reply first; if the platform still refuses it, the later reply is kept too,
and the redelivery sends both, in order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from parley.channels.base import DeliveryError
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider

DOWN = DeliveryError("network: timed out", retryable=True)


@pytest.fixture
async def stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, RecordingChannel]]:
    # The three quick attempts of one delivery without their backoff.
    monkeypatch.setattr("parley.gateway.runtime.delivery.DELIVERY_BACKOFF_SECONDS", (0.0, 0.0))
    channel = RecordingChannel()
    config = load_config(
        env={
            "PARLEY_HOME": str(tmp_path),
            "PARLEY_SESSION__TIMEZONE": "UTC",
            "PARLEY_HTTP__ENABLED": "false",
            "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
            "PARLEY_LANES__MODE": "queue",
        }
    )
    gateway = Gateway(config, channels=[channel], provider=ScriptedProvider())
    async with gateway:
        yield gateway, channel


async def say(
    gateway: Gateway, channel: RecordingChannel, text: str, sender: str = "alice"
) -> None:
    await gateway.handle_inbound(channel.inbound(text, message_id=text, sender=sender))
    await gateway.wait_idle()


def texts(channel: RecordingChannel, chat: str = "alice") -> list[str]:
    return [m.text for m in channel.sent if m.chat_id == chat]


async def test_a_kept_reply_goes_out_before_the_next_messages_reply(
    stack: tuple[Gateway, RecordingChannel],
) -> None:
    gateway, channel = stack
    channel.fail_next.extend([DOWN] * 3)  # every attempt of m0's delivery
    await say(gateway, channel, "m0")
    assert channel.sent == []
    # The platform is back when the chat's next message is answered: the kept reply
    # goes first, in the same run (before: m1, then m0 when the redelivery came).
    await say(gateway, channel, "m1")
    assert texts(channel) == ["echo: m0", "echo: m1"]
    assert await gateway.inbox.open_items() == []
    assert await gateway.redeliver_now() == 0  # nothing is sent twice
    assert texts(channel) == ["echo: m0", "echo: m1"]


async def test_a_later_reply_waits_while_the_earlier_one_still_fails(
    stack: tuple[Gateway, RecordingChannel],
) -> None:
    gateway, channel = stack
    channel.fail_next.extend([DOWN] * 3)
    await say(gateway, channel, "m0")
    # Still down for m0's second try: m1's reply must not overtake it.
    channel.fail_next.extend([DOWN] * 3)
    await say(gateway, channel, "m1")
    assert channel.sent == []
    open_items = await gateway.inbox.open_items()
    assert [(i.message.text, i.status) for i in open_items] == [
        ("m0", "replied"),
        ("m1", "replied"),
    ]
    # Both kept for the redelivery; m1's without a try of its own (it would have gone
    # out first had the platform come back just then).
    assert "waiting for the reply to inbox 1" in (open_items[1].error or "")
    # Another chat is not held up by this one's kept replies.
    await say(gateway, channel, "b0", sender="bob")
    assert texts(channel, "bob") == ["echo: b0"]
    # The redelivery sends both, the earlier first; each once.
    assert await gateway.redeliver_now() == 2
    await gateway.wait_idle()
    assert texts(channel) == ["echo: m0", "echo: m1"]
    assert await gateway.inbox.open_items() == []
    assert await gateway.redeliver_now() == 0
    await say(gateway, channel, "m2")
    assert texts(channel) == ["echo: m0", "echo: m1", "echo: m2"]


async def test_only_the_later_reply_due_still_waits_for_the_earlier_one(
    stack: tuple[Gateway, RecordingChannel],
) -> None:
    # The redelivery's backoff is per reply: when only the later one is due, its run
    # sends the earlier one first rather than overtaking it.
    gateway, channel = stack
    channel.fail_next.extend([DOWN] * 3)
    await say(gateway, channel, "m0")
    channel.fail_next.extend([DOWN] * 3)  # m0 again: m1 is kept behind it
    await say(gateway, channel, "m1")
    [m0, _] = await gateway.inbox.open_items()
    gateway.redelivery._schedule[m0.id] = (5, float("inf"))  # m0 not due for long
    assert await gateway.redeliver_now(due_only=True) == 1  # m1 only
    await gateway.wait_idle()
    assert texts(channel) == ["echo: m0", "echo: m1"]
    assert await gateway.inbox.open_items() == []


async def test_a_reply_given_up_on_no_longer_holds_the_chat(
    stack: tuple[Gateway, RecordingChannel], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channel = stack
    channel.fail_next.extend([DOWN] * 3)
    await say(gateway, channel, "m0")
    monkeypatch.setattr("parley.gateway.runtime.redelivery.REDELIVERY_GIVE_UP", timedelta(0))
    assert await gateway.redeliver_now() == 0  # m0 given up: failed, saying so
    monkeypatch.undo()
    await say(gateway, channel, "m1")
    assert texts(channel) == ["echo: m1"]
    assert await gateway.inbox.counts() == {"failed": 1, "delivered": 1}


async def test_an_unreadable_kept_reply_keeps_the_next_reply_behind_it_and_loses_nothing(
    stack: tuple[Gateway, RecordingChannel], monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channel = stack
    channel.fail_next.extend([DOWN] * 3)
    await say(gateway, channel, "m0")  # m0's reply kept (the platform is down)
    real_get = gateway.inbox.get

    async def unreadable(item_id: int) -> object:
        raise sqlite3.OperationalError("database is locked")  # a transient failure

    monkeypatch.setattr(gateway.inbox, "get", unreadable)
    await say(gateway, channel, "m1")
    monkeypatch.setattr(gateway.inbox, "get", real_get)
    # Not sent over m0's head, not dropped either: stored and kept behind it.
    assert channel.sent == []
    open_items = await gateway.inbox.open_items()
    assert [(i.message.text, i.status) for i in open_items] == [
        ("m0", "replied"),
        ("m1", "replied"),
    ]
    assert await gateway.redeliver_now() == 2
    await gateway.wait_idle()
    assert texts(channel) == ["echo: m0", "echo: m1"]
    assert await gateway.inbox.open_items() == []
