"""Who the gateway answers: group activation, allowlists and DM pairing, end to end
through a real state.db with the recording channel (the pairing flows also with the
pairing store in PostgreSQL); plus the typing keep-alive, the group turn text, partial
deliveries and the HTTP server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import parley.gateway.cli.main as cli
from parley.channels.base import (
    ChannelCapabilities,
    ChatPolicy,
    DeliveryError,
    WebhookRoute,
)
from parley.core.transcript import Transcript
from parley.gateway.app import Gateway
from parley.gateway.errors import PairingError
from parley.gateway.storage.pairing import (
    CODE_TTL,
    MAX_PENDING_PER_CHANNEL,
    RENOTIFY_AFTER,
    normalise_code,
)
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider, echo_text
from tests.gateway.state_backends import open_backend, state_location
from tests.gateway.test_app import Clock, clock, make_config, stack

__all__ = ["clock", "stack", "state_location"]  # the shared fixtures


@pytest.fixture
async def pairing_stack(
    state_location: tuple[str, Path | str], stack: Any, clock: Clock
) -> AsyncIterator[Any]:
    """``stack`` with its pairing store on each backend in turn. The gateway does not
    choose its backend by config yet (issue 8), so the PostgreSQL store is put in the
    two places that hold it: the gateway (the operator's side) and its access gate."""
    gateway, _, _ = stack
    if state_location[0] == "sqlite":  # the gateway's own state.db
        yield stack
        return
    async with open_backend(*state_location) as backend:
        store = backend.pairing(now=clock)
        gateway.pairing = store
        gateway.access.pairing = store
        yield stack


async def deliver(gateway: Gateway, channel: RecordingChannel, text: str, **kw: Any) -> None:
    await gateway.handle_inbound(channel.inbound(text, **kw))
    await gateway.wait_idle()


def code_in(text: str) -> str:
    line = next(ln for ln in text.splitlines() if "parley pairing approve" in ln)
    return line.rsplit(" ", 1)[-1]


async def test_group_mention_rule_answers_only_when_addressed(stack: Any) -> None:
    gateway, channel, provider = stack
    channel.chat_policy = ChatPolicy(activation="mention")
    await deliver(gateway, channel, "chatter", chat_type="group", chat_id="g1")
    assert channel.sent == [] and provider.requests == []
    assert await gateway.inbox.counts() == {}  # ignored chatter leaves no trace
    await deliver(gateway, channel, "bot, hi", chat_type="group", chat_id="g1", mentions_bot=True)
    assert [m.text for m in channel.sent] == ["echo: Alice: bot, hi"]


async def test_group_always_rule_answers_everything(stack: Any) -> None:
    gateway, channel, _ = stack
    channel.chat_policy = ChatPolicy(activation="always")
    await deliver(gateway, channel, "chatter", chat_type="group", chat_id="g1")
    assert [m.text for m in channel.sent] == ["echo: Alice: chatter"]


async def test_reply_context_reaches_the_model(stack: Any) -> None:
    gateway, channel, provider = stack
    await deliver(gateway, channel, "and this?", reply_to_text="Bot: the answer is 42")
    said = echo_text(provider.requests[-1])
    assert said == "echo: [in reply to Bot: the answer is 42]\nand this?"


async def test_allowlist_lets_in_only_listed_people(stack: Any) -> None:
    gateway, channel, _ = stack
    channel.chat_policy = ChatPolicy(dm_policy="allowlist", allow_from=frozenset({"alice"}))
    await deliver(gateway, channel, "hi", sender="mallory")
    assert channel.sent == []
    await deliver(gateway, channel, "hi", sender="alice")
    assert [m.text for m in channel.sent] == ["echo: hi"]


async def test_pairing_code_then_approval_then_answers(pairing_stack: Any, clock: Clock) -> None:
    gateway, channel, provider = pairing_stack
    channel.chat_policy = ChatPolicy(dm_policy="pairing")
    await deliver(gateway, channel, "hello?", sender="bob")
    assert provider.requests == []
    assert len(channel.sent) == 1 and "pairing code" in channel.sent[0].text
    code = code_in(channel.sent[0].text)
    # Writing again soon does not spam a second code.
    clock.now += timedelta(minutes=1)
    await deliver(gateway, channel, "anyone?", sender="bob")
    assert len(channel.sent) == 1
    # ... but a reminder comes after a while, with the same code.
    clock.now += RENOTIFY_AFTER
    await deliver(gateway, channel, "still there?", sender="bob")
    assert len(channel.sent) == 2 and code_in(channel.sent[1].text) == code
    approved = await gateway.pairing.approve(code.lower())  # any case, dash or not
    assert approved.status == "approved" and approved.sender_id == "bob"
    await deliver(gateway, channel, "now?", sender="bob")
    assert channel.sent[-1].text == "echo: now?"
    with pytest.raises(PairingError, match="already approved"):
        await gateway.pairing.approve(code)


async def test_pairing_deny_silences_and_expiry_renews(pairing_stack: Any, clock: Clock) -> None:
    gateway, channel, _ = pairing_stack
    channel.chat_policy = ChatPolicy(dm_policy="pairing")
    await deliver(gateway, channel, "hi", sender="eve")
    first = code_in(channel.sent[-1].text)
    clock.now += CODE_TTL + timedelta(seconds=1)
    with pytest.raises(PairingError, match="expired"):
        await gateway.pairing.approve(first)
    await deliver(gateway, channel, "hi again", sender="eve")
    second = code_in(channel.sent[-1].text)
    assert normalise_code(second) != normalise_code(first)
    await gateway.pairing.deny(second)
    sent = len(channel.sent)
    clock.now += RENOTIFY_AFTER * 2
    await deliver(gateway, channel, "let me in", sender="eve")
    assert len(channel.sent) == sent  # denied: no answer, no new code


async def test_pairing_caps_open_codes_per_channel(pairing_stack: Any) -> None:
    gateway, channel, _ = pairing_stack
    channel.chat_policy = ChatPolicy(dm_policy="pairing")
    for n in range(MAX_PENDING_PER_CHANNEL + 1):
        await deliver(gateway, channel, "hi", sender=f"stranger{n}")
    assert len(channel.sent) == MAX_PENDING_PER_CHANNEL
    assert len(await gateway.pairing.list("pending")) == MAX_PENDING_PER_CHANNEL


async def test_allow_from_skips_pairing(stack: Any) -> None:
    gateway, channel, _ = stack
    channel.chat_policy = ChatPolicy(dm_policy="pairing", allow_from=frozenset({"alice"}))
    await deliver(gateway, channel, "hi")
    assert [m.text for m in channel.sent] == ["echo: hi"]


async def test_pairing_cli_approves_a_pending_code(
    tmp_path: Path, clock: Clock, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    channel = RecordingChannel()
    channel.chat_policy = ChatPolicy(dm_policy="pairing")
    # The CLI's own clock is the real one: give the code a real-time expiry.
    clock.now = datetime.now(UTC)
    async with Gateway(
        make_config(tmp_path), channels=[channel], provider=ScriptedProvider(), clock=clock
    ) as gateway:
        await deliver(gateway, channel, "hi", sender="carol")
    code = code_in(channel.sent[0].text)
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path))
    assert await asyncio.to_thread(cli.main, ["pairing", "list"]) == 0
    listing = capsys.readouterr().out
    assert code in listing and "pending" in listing and "carol" in listing
    assert await asyncio.to_thread(cli.main, ["pairing", "approve", code]) == 0
    assert "approved: Carol (test user carol)" in capsys.readouterr().out
    assert await asyncio.to_thread(cli.main, ["pairing", "approve", "ZZZZ-ZZZZ"]) == 1
    assert "no pairing request has the code ZZZZ-ZZZZ" in capsys.readouterr().err
    assert await asyncio.to_thread(cli.main, ["pairing", "revoke", "test", "carol"]) == 0


class TypingChannel(RecordingChannel):
    capabilities = ChannelCapabilities(typing_refresh_seconds=0.01)

    def __init__(self) -> None:
        super().__init__()
        self.refreshed = asyncio.Event()  # set on the third indicator

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        await super().typing(chat_id, thread_id, account)
        if len(self.typing_calls) >= 3:
            self.refreshed.set()


async def test_typing_indicator_is_refreshed_while_the_agent_works(tmp_path: Path) -> None:
    channel = TypingChannel()
    gate = asyncio.Event()
    provider = ScriptedProvider(gate=gate)
    async with Gateway(make_config(tmp_path), channels=[channel], provider=provider) as gateway:
        await gateway.handle_inbound(channel.inbound("slow one"))
        async with asyncio.timeout(10):
            await channel.refreshed.wait()  # refreshed, not sent once
        gate.set()
        await gateway.wait_idle()
        calls = len(channel.typing_calls)
        await channel.wait_sent(1)
    assert channel.typing_calls[0] == ("alice", None, "default")
    assert len(channel.typing_calls) == calls  # and it stopped with the turn


class PatientTypingChannel(RecordingChannel):
    # A grace no test outlasts: an indicator could only come from ignoring it.
    capabilities = ChannelCapabilities(typing_refresh_seconds=0.01, typing_delay_seconds=3600)


async def test_a_reply_within_the_typing_grace_sends_no_indicator(tmp_path: Path) -> None:
    channel = PatientTypingChannel()
    async with Gateway(
        make_config(tmp_path), channels=[channel], provider=ScriptedProvider()
    ) as gw:
        await gw.handle_inbound(channel.inbound("quick one"))
        await channel.wait_sent(1)
        await gw.wait_idle()
    assert channel.typing_calls == []


async def test_a_partial_delivery_is_recorded_and_not_resent(stack: Any, tmp_path: Path) -> None:
    gateway, channel, _ = stack
    channel.fail_next.append(DeliveryError("part 2 refused", retryable=True, delivered=("p1",)))
    await deliver(gateway, channel, "long one")
    assert channel.sent == []  # no retry: part 1 would have gone out twice
    record = await gateway.registry.get_active("agent:main:test:direct:alice")
    assert record is not None and record.delivery_error == "part 2 refused"
    assert record.last_message_ids == ["p1"]
    transcript = Transcript.open(tmp_path / "sessions" / f"{record.session_id}.jsonl")
    delivery = [e.payload for e in transcript.entries() if e.type == "custom"][-1]["data"]
    assert delivery["ok"] is False and delivery["platform_message_ids"] == ["p1"]
    assert delivery["parts"] == 1


class WebhookChannel(RecordingChannel):
    def __init__(self) -> None:
        super().__init__("hooked")
        self.posted: list[bytes] = []

    def webhook_routes(self) -> list[WebhookRoute]:
        async def hook(request: web.Request) -> web.Response:
            self.posted.append(await request.read())
            return web.Response(text="ok")

        return [WebhookRoute("POST", "/hooked/default", hook)]


async def test_http_server_serves_channel_webhooks_and_health(tmp_path: Path) -> None:
    channel = WebhookChannel()
    config = make_config(tmp_path, PARLEY_HTTP__PORT="0", PARLEY_HTTP__MAX_BODY_BYTES="2048")
    async with Gateway(config, channels=[channel], provider=ScriptedProvider()) as gateway:
        assert gateway.http is not None
        base = f"http://127.0.0.1:{gateway.http.port}"
        auth = {"Authorization": f"Bearer {gateway.http.token.value}"}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/health") as response:
                assert response.status == 200 and (await response.json())["ready"] is True
            async with session.post(f"{base}/hooked/default", data=b"update") as response:
                assert response.status == 401  # a channel route is the admin's unless public
            async with session.post(
                f"{base}/hooked/default", data=b"update", headers=auth
            ) as response:
                assert response.status == 200
            async with session.post(
                f"{base}/hooked/default", data=b"x" * 4096, headers=auth
            ) as response:
                assert response.status == 413
    assert channel.posted == [b"update"]


async def test_http_server_off_unless_enabled_or_a_channel_needs_it(tmp_path: Path) -> None:
    config = make_config(tmp_path, PARLEY_HTTP__ENABLED="false")
    async with Gateway(config, channels=[RecordingChannel()], provider=ScriptedProvider()) as gw:
        assert gw.http is None
    async with Gateway(config, channels=[WebhookChannel()], provider=ScriptedProvider()) as gw:
        assert gw.http is not None  # Telegram webhooks need it whatever the setting


async def test_a_folded_turn_never_spans_two_reply_routes(tmp_path: Path) -> None:
    # One person, one session (dm_scope "per-channel-peer"), two chats with the bot
    # (two bot accounts, say): what queued up is folded per chat, each chat answered.
    channel = RecordingChannel()
    gate = asyncio.Event()
    provider = ScriptedProvider(gate=gate)
    async with Gateway(make_config(tmp_path), channels=[channel], provider=provider) as gateway:
        await gateway.handle_inbound(channel.inbound("first", chat_id="chat-a"))
        await gateway.handle_inbound(channel.inbound("second", chat_id="chat-a"))
        await gateway.handle_inbound(channel.inbound("third", chat_id="chat-b"))
        gate.set()
        await gateway.wait_idle()
        sent = await channel.wait_sent(3)
    assert [(m.chat_id, m.text) for m in sent] == [
        ("chat-a", "echo: first"),
        ("chat-a", "echo: second"),
        ("chat-b", "echo: third"),
    ]
