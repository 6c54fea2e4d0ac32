"""The web chat channel: a real aiohttp server on 127.0.0.1 and real client websockets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from pydantic import ValidationError

from parley.channels.base import (
    Channel,
    ChannelStartError,
    DeliveryError,
    InboundMessage,
    LiveDrafts,
    OutboundMessage,
    ReplyDraft,
)
from parley.channels.config import ChannelsConfig, WebConfig
from parley.channels.web import PROTOCOL, WebChannel
from parley.gateway.channel_factory import build_channels

PROTOCOLS = (PROTOCOL, "bearer.x")


class Recorder:
    """The inbound handler: records messages; can hold them at a gate or fail."""

    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self.entered = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.failures = 0

    async def __call__(self, message: InboundMessage) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the inbox is down")
        self.messages.append(message)


@dataclass
class Chat:
    channel: WebChannel
    inbox: Recorder
    url: str
    session: aiohttp.ClientSession
    sockets: list[aiohttp.ClientWebSocketResponse] = field(default_factory=list)

    async def open(self, protocols: tuple[str, ...] = PROTOCOLS) -> aiohttp.ClientWebSocketResponse:
        ws = await self.session.ws_connect(self.url, protocols=protocols)
        self.sockets.append(ws)
        return ws

    async def connect(
        self, client_id: str = "tab-1", name: str | None = "Ada", *, history: bool = True
    ) -> Any:
        ws = await self.open()
        hello = {"type": "hello", "client_id": client_id, "name": name, "history": history}
        await ws.send_json(hello)
        assert await ws.receive_json(timeout=5) == {"type": "ready", "client_id": client_id}
        return ws


async def serve(config: WebConfig, **kwargs: Any) -> AsyncIterator[Chat]:
    channel = WebChannel(config, **kwargs)
    app = web.Application()
    for route in channel.webhook_routes():
        app.router.add_route(route.method, route.path, route.handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    inbox = Recorder()
    await channel.start(inbox)
    session = aiohttp.ClientSession()
    chat = Chat(channel, inbox, f"http://127.0.0.1:{port}/chat/ws", session)
    try:
        yield chat
    finally:
        for ws in chat.sockets:
            await ws.close()
        await channel.stop()
        await session.close()
        await runner.cleanup()


@pytest.fixture
async def chat() -> AsyncIterator[Chat]:
    async for c in serve(WebConfig()):
        yield c


def reply(text: str, client: str = "tab-1", reply_to: str | None = None) -> OutboundMessage:
    return OutboundMessage(
        channel="web", account="default", chat_id=client, text=text, reply_to_message_id=reply_to
    )


async def expect_close(ws: aiohttp.ClientWebSocketResponse, code: int) -> None:
    msg = await ws.receive(timeout=5)
    assert msg.type == WSMsgType.CLOSE, msg
    assert msg.data == code


# -- the conversation ------------------------------------------------------------------


async def test_it_is_a_channel_with_one_authenticated_route(chat: Chat) -> None:
    channel = chat.channel
    assert isinstance(channel, Channel)
    assert channel.name == "web"
    caps = channel.capabilities
    assert (caps.markdown, caps.typing_indicator, caps.threads) == (True, True, False)
    assert caps.live_drafts and isinstance(channel, LiveDrafts)
    # Repeated, so the page keeps showing "working" through a long tool or compaction.
    assert caps.max_message_chars is None and caps.typing_refresh_seconds == 10.0
    [route] = channel.webhook_routes()
    assert (route.method, route.path, route.public) == ("GET", "/chat/ws", False)
    assert channel.connected()


async def test_hello_gets_ready_and_the_protocol_is_selected(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    assert ws.protocol == PROTOCOL


async def test_client_ids_are_case_insensitive(chat: Chat) -> None:
    # Routing lowercases session keys: "Tab-X" and "tab-x" must be one client, or two
    # browsers would share a session while each got only its own replies.
    upper = await chat.open()
    await upper.send_json({"type": "hello", "client_id": "Tab-X"})
    assert await upper.receive_json(timeout=5) == {"type": "ready", "client_id": "tab-x"}
    lower = await chat.connect("tab-x")
    await upper.send_json({"type": "message", "id": "m-1", "text": "hi"})
    assert await upper.receive_json(timeout=5) == {"type": "ack", "id": "m-1"}
    [message] = chat.inbox.messages
    assert message.chat_id == message.sender_id == "tab-x"
    await chat.channel.send(reply("to both", client="tab-x"))
    for ws in (upper, lower):
        assert (await ws.receive_json(timeout=5))["text"] == "to both"


async def test_a_message_reaches_the_handler_before_it_is_acked(chat: Chat) -> None:
    ws = await chat.connect("tab-1", name="  Ada   Lovelace ")
    chat.inbox.gate = asyncio.Event()
    await ws.send_json({"type": "message", "id": "m-1", "text": "hello there"})
    await asyncio.wait_for(chat.inbox.entered.wait(), 5)
    # Frames on one socket keep their order: had the ack gone out before the handler
    # returned, it would arrive before this typing frame.
    await chat.channel.typing("tab-1")
    assert await ws.receive_json(timeout=5) == {"type": "typing"}
    assert chat.inbox.messages == []
    chat.inbox.gate.set()
    assert await ws.receive_json(timeout=5) == {"type": "ack", "id": "m-1"}
    [message] = chat.inbox.messages
    assert message.channel == "web" and message.account == "default"
    assert message.chat_type == "direct"
    assert message.chat_id == message.sender_id == "tab-1"
    assert message.sender_name == "Ada Lovelace"
    assert message.text == "hello there"
    assert message.message_id == "tab-1:m-1"
    assert message.mentions_bot is True
    assert message.timestamp.utcoffset() is not None


async def test_messages_of_one_socket_are_handled_in_order(chat: Chat) -> None:
    ws = await chat.connect("tab-1", name=None)
    for i in range(5):
        await ws.send_json({"type": "message", "id": f"m{i}", "text": f"text {i}"})
    acks = [await ws.receive_json(timeout=5) for _ in range(5)]
    assert [a["id"] for a in acks] == [f"m{i}" for i in range(5)]
    assert [m.text for m in chat.inbox.messages] == [f"text {i}" for i in range(5)]
    assert chat.inbox.messages[0].sender_name == "web user"


async def test_a_reply_arrives_with_the_client_message_id(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    result = await chat.channel.send(reply("**hi**", reply_to="tab-1:m-1"))
    frame = await ws.receive_json(timeout=5)
    bold = [{"t": "p", "c": [{"t": "strong", "c": ["hi"]}]}]
    assert frame == {"type": "reply", "id": result.platform_message_ids[0], "reply_to": "m-1",
                     "text": "**hi**", "blocks": bold}  # fmt: skip
    assert result.parts == 1 and result.delivered_at is not None
    await chat.channel.send(reply("unprompted"))
    assert (await ws.receive_json(timeout=5))["reply_to"] is None


async def test_every_tab_of_a_client_gets_the_reply_and_no_other_client_does(chat: Chat) -> None:
    first, second = await chat.connect("tab-1"), await chat.connect("tab-1")
    other = await chat.connect("someone-else")
    await chat.channel.send(reply("to both"))
    assert (await first.receive_json(timeout=5))["text"] == "to both"
    assert (await second.receive_json(timeout=5))["text"] == "to both"
    await chat.channel.send(reply("for the other", client="someone-else"))
    assert (await other.receive_json(timeout=5))["text"] == "for the other"


async def test_replies_wait_for_the_next_hello_in_order(chat: Chat) -> None:
    results = [await chat.channel.send(reply(f"r{i}")) for i in range(3)]
    ws = await chat.connect("tab-1")  # ready comes first (checked in connect)
    frames = [await ws.receive_json(timeout=5) for _ in range(3)]
    assert [f["text"] for f in frames] == ["r0", "r1", "r2"]
    assert [f["id"] for f in frames] == [r.platform_message_ids[0] for r in results]
    # Flushed once: a second tab does not get them again, only in the history.
    again = await chat.connect("tab-1")
    history = await again.receive_json(timeout=5)
    assert history["type"] == "history"
    assert [m["text"] for m in history["messages"]] == ["r0", "r1", "r2"]
    await chat.channel.send(reply("fresh"))
    assert (await again.receive_json(timeout=5))["text"] == "fresh"
    assert (await ws.receive_json(timeout=5))["text"] == "fresh"


async def test_replies_after_the_last_tab_closed_are_kept(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    await ws.send_json({"type": "message", "id": "m1", "text": "hi"})
    assert (await ws.receive_json(timeout=5))["type"] == "ack"
    await ws.close()
    # The server unregisters the socket when its handler sees the close; a reply sent
    # meanwhile goes to the closing socket or the backlog, never nowhere.
    await chat.channel.send(reply("while away", reply_to="tab-1:m1"))
    back = await chat.connect("tab-1")
    frame = await back.receive_json(timeout=5)
    if frame["type"] == "history":  # the reply reached the closing socket: it is seen
        assert frame["messages"][0]["text"] == "hi"
        if len(frame["messages"]) == 1:
            frame = await back.receive_json(timeout=5)
        else:
            frame = frame["messages"][1]
    assert (frame["text"], frame["reply_to"]) == ("while away", "m1")


async def test_a_full_backlog_drops_the_oldest(caplog: pytest.LogCaptureFixture) -> None:
    async for chat in serve(WebConfig(backlog=2)):
        with caplog.at_level(logging.WARNING, "parley.channels.web"):
            for i in range(4):
                await chat.channel.send(reply(f"r{i}"))
        assert "dropped the 1 oldest" in caplog.text
        ws = await chat.connect("tab-1")
        assert [(await ws.receive_json(timeout=5))["text"] for _ in range(2)] == ["r2", "r3"]
        await chat.channel.typing("tab-1")  # the next frame: nothing else was kept
        assert await ws.receive_json(timeout=5) == {"type": "typing"}


# -- bad frames ------------------------------------------------------------------------


async def test_bad_frames_get_errors_and_the_socket_stays_open() -> None:
    async for chat in serve(WebConfig(max_text_chars=10)):
        ws = await chat.connect("tab-1")
        bad: list[tuple[Any, str | None]] = [
            ("{not json", None),
            ("[1, 2]", None),
            ({"type": "shout"}, None),
            ({"type": "hello", "client_id": "tab-1"}, None),
            ({"type": "message", "id": "bad id!", "text": "x"}, None),
            ({"type": "message", "id": "x" * 65, "text": "x"}, None),
            ({"type": "message", "text": "x"}, None),
            ({"type": "message", "id": "m1", "text": ""}, "m1"),
            ({"type": "message", "id": "m2", "text": "   \n"}, "m2"),
            ({"type": "message", "id": "m3", "text": 42}, "m3"),
            ({"type": "message", "id": "m4", "text": "x" * 11}, "m4"),
        ]
        for frame, error_id in bad:
            if isinstance(frame, str):
                await ws.send_str(frame)
            else:
                await ws.send_json(frame)
            answer = await ws.receive_json(timeout=5)
            assert answer["type"] == "error", frame
            assert answer["id"] == error_id, frame
            assert answer["message"]
        await ws.send_bytes(b"\x00\x01")
        answer = await ws.receive_json(timeout=5)
        assert answer["type"] == "error" and "binary" in answer["message"]
        await ws.send_json({"type": "message", "id": "ok", "text": "x" * 10})
        assert await ws.receive_json(timeout=5) == {"type": "ack", "id": "ok"}
        assert [m.text for m in chat.inbox.messages] == ["x" * 10]


@pytest.mark.parametrize(
    "first",
    [
        {"type": "message", "id": "m1", "text": "hi"},
        {"type": "hello"},
        {"type": "hello", "client_id": ""},
        {"type": "hello", "client_id": "a/b"},
        {"type": "hello", "client_id": "x" * 65},
        {"type": "hello", "client_id": "ok", "name": 5},
        "not json",
    ],
)
async def test_a_wrong_first_frame_closes_with_4400(chat: Chat, first: Any) -> None:
    ws = await chat.open()
    if isinstance(first, str):
        await ws.send_str(first)
    else:
        await ws.send_json(first)
    answer = await ws.receive_json(timeout=5)
    assert answer["type"] == "error" and answer["id"] is None
    await expect_close(ws, 4400)
    assert chat.inbox.messages == []


async def test_a_binary_first_frame_closes_with_4400(chat: Chat) -> None:
    ws = await chat.open()
    await ws.send_bytes(b"hello")
    assert (await ws.receive_json(timeout=5))["type"] == "error"
    await expect_close(ws, 4400)


async def test_no_hello_in_time_closes_with_4400() -> None:
    async for chat in serve(WebConfig(), hello_timeout=0.05):
        ws = await chat.open()
        answer = await ws.receive_json(timeout=5)
        assert answer["type"] == "error" and "hello" in answer["message"]
        await expect_close(ws, 4400)


async def test_a_socket_without_the_subprotocol_is_refused(chat: Chat) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
        await chat.open(protocols=("bearer.x",))
    assert caught.value.status == 400


async def test_a_failing_handler_gets_an_error_and_the_socket_goes_on(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    chat.inbox.failures = 1
    await ws.send_json({"type": "message", "id": "m1", "text": "lost?"})
    answer = await ws.receive_json(timeout=5)
    assert (answer["type"], answer["id"]) == ("error", "m1")
    # The browser resends under the same id; this time it is taken.
    await ws.send_json({"type": "message", "id": "m1", "text": "lost?"})
    assert await ws.receive_json(timeout=5) == {"type": "ack", "id": "m1"}
    assert [m.message_id for m in chat.inbox.messages] == ["tab-1:m1"]


# -- typing, limits, lifecycle -----------------------------------------------------------


async def test_typing_reaches_every_tab_and_never_raises(chat: Chat) -> None:
    first, second = await chat.connect("tab-1"), await chat.connect("tab-1")
    await chat.channel.typing("tab-1")
    assert await first.receive_json(timeout=5) == {"type": "typing"}
    assert await second.receive_json(timeout=5) == {"type": "typing"}
    await chat.channel.typing("nobody")
    await chat.channel.typing("not a client id!")


async def test_clients_beyond_max_clients_are_refused_with_4429() -> None:
    async for chat in serve(WebConfig(max_clients=1)):
        await chat.connect("tab-1")
        await chat.connect("tab-1")  # another tab of the same client is fine
        ws = await chat.open()
        await ws.send_json({"type": "hello", "client_id": "tab-2"})
        answer = await ws.receive_json(timeout=5)
        assert answer["type"] == "error" and "too many" in answer["message"]
        await expect_close(ws, 4429)


async def test_send_to_a_bad_client_id_fails(chat: Chat) -> None:
    with pytest.raises(DeliveryError):
        await chat.channel.send(reply("x", client="no such:id"))


async def test_stop_closes_every_socket_with_1001(chat: Chat) -> None:
    greeted = await chat.connect("tab-1")
    silent = await chat.open()  # not greeted yet
    await chat.channel.stop()
    await expect_close(greeted, 1001)
    await expect_close(silent, 1001)
    assert not chat.channel.connected()
    await chat.channel.stop()  # idempotent
    with pytest.raises(DeliveryError) as caught:
        await chat.channel.send(reply("too late"))
    assert caught.value.retryable
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await chat.open()
    assert refused.value.status == 503
    await chat.channel.typing("tab-1")  # no socket left: still no error


async def test_start_twice_is_refused_and_restart_works(chat: Chat) -> None:
    with pytest.raises(ChannelStartError):
        await chat.channel.start(chat.inbox)
    await chat.channel.stop()
    await chat.channel.start(chat.inbox)
    ws = await chat.connect("tab-1")
    await ws.send_json({"type": "message", "id": "m1", "text": "back"})
    assert await ws.receive_json(timeout=5) == {"type": "ack", "id": "m1"}


# -- config and factory --------------------------------------------------------------------

TELEGRAM = {"accounts": {"default": {"token": "123:abc"}}}
DISCORD = {"accounts": {"default": {"token": "MTEx.abc.def"}}}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, True),
        ({"telegram": TELEGRAM}, False),
        ({"discord": DISCORD}, False),
        ({"terminal": {"enabled": True}}, True),
        ({"web": {"enabled": False}}, False),
        ({"web": {"enabled": True}, "telegram": TELEGRAM}, True),
        ({"telegram": {**TELEGRAM, "enabled": False}}, True),
    ],
)
def test_web_enabled_rule(config: dict[str, Any], expected: bool) -> None:
    channels = ChannelsConfig.model_validate(config)
    assert channels.web_enabled() is expected
    assert "web" not in channels.configured()


def test_web_config_bounds() -> None:
    assert WebConfig() == WebConfig(backlog=100, max_text_chars=20_000, max_clients=1000)
    for bad in ({"backlog": 0}, {"backlog": 10_001}, {"max_clients": 0}, {"extra": 1}):
        with pytest.raises(ValidationError):
            WebConfig.model_validate(bad)


@pytest.mark.parametrize(
    ("config", "terminal_only", "names"),
    [
        ({}, False, ["terminal", "web"]),
        ({}, True, ["terminal"]),
        ({"web": {"enabled": False}}, False, ["terminal"]),
        ({"telegram": TELEGRAM}, False, ["telegram"]),
        ({"telegram": TELEGRAM, "web": {"enabled": True}}, False, ["telegram", "web"]),
        ({"web": {"enabled": True}}, True, ["terminal"]),
    ],
)
def test_the_factory_builds_the_web_chat_when_enabled(
    config: dict[str, Any], terminal_only: bool, names: list[str]
) -> None:
    channels = build_channels(ChannelsConfig.model_validate(config), terminal_only=terminal_only)
    assert [c.name for c in channels] == names
    web_chat = [c for c in channels if isinstance(c, WebChannel)]
    assert all(c.config == ChannelsConfig.model_validate(config).web for c in web_chat)


# -- drafts, history, privacy --------------------------------------------------------------


def keyed(text: str, key: str = "reply:web:default:tab-1:m1", client: str = "tab-1") -> Any:
    return OutboundMessage(
        channel="web",
        account="default",
        chat_id=client,
        text=text,
        reply_to_message_id=f"{client}:m1",
        idempotency_key=key,
    )


def draft(
    text: str, reset: str | None = None, client: str = "tab-1", status: str | None = None
) -> ReplyDraft:
    key = f"reply:web:default:{client}:m1"
    return ReplyDraft("web", "default", client, key, text, reset=reset, status=status)  # type: ignore[arg-type]


async def test_drafts_stream_and_the_reply_takes_their_place(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    await chat.channel.draft(draft("Hello *wor"))
    first = await ws.receive_json(timeout=5)
    assert first["type"] == "draft" and first["text"] == "Hello *wor" and first["reset"] is None
    assert first["blocks"] == [{"t": "p", "c": ["Hello *wor"]}]
    await chat.channel.draft(draft("Sorry", reset="retry"))
    again = await ws.receive_json(timeout=5)
    assert (again["id"], again["text"], again["reset"]) == (first["id"], "Sorry", "retry")
    await chat.channel.send(keyed("Sorry, *world*."))
    final = await ws.receive_json(timeout=5)
    assert final["type"] == "reply" and final["draft"] == first["id"]
    assert final["blocks"] == [{"t": "p", "c": ["Sorry, ", {"t": "em", "c": ["world"]}, "."]}]
    # The reply is out: a late draft for it is dropped, the next frame is the typing.
    await chat.channel.draft(draft("Sorry, *world*. And"))
    await chat.channel.typing("tab-1")
    assert await ws.receive_json(timeout=5) == {"type": "typing"}


async def test_a_draft_says_which_tool_runs(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    await chat.channel.draft(draft("Let me look", status="running web_search"))
    frame = await ws.receive_json(timeout=5)
    assert (frame["text"], frame["status"]) == ("Let me look", "running web_search")
    await chat.channel.draft(draft("Let me look. Found it"))
    assert "status" not in await ws.receive_json(timeout=5)


async def test_drafts_are_never_kept_for_a_closed_tab(chat: Chat) -> None:
    await chat.channel.draft(draft("nobody is here"))
    ws = await chat.connect("tab-1")
    await chat.channel.typing("tab-1")
    assert await ws.receive_json(timeout=5) == {"type": "typing"}  # no draft, no history


async def test_a_reload_restores_the_conversation_and_no_one_elses(chat: Chat) -> None:
    """The canary: a second client never sees the first one's words, streamed or logged."""
    mine, other = await chat.connect("tab-1"), await chat.connect("someone-else")
    await mine.send_json({"type": "message", "id": "m1", "text": "my secret plan"})
    assert await mine.receive_json(timeout=5) == {"type": "ack", "id": "m1"}
    await chat.channel.draft(draft("Your secret plan is"))
    assert (await mine.receive_json(timeout=5))["type"] == "draft"
    await chat.channel.send(keyed("Your secret plan is **safe**."))
    assert (await mine.receive_json(timeout=5))["type"] == "reply"
    await mine.close()

    reloaded = await chat.connect("tab-1")
    history = await reloaded.receive_json(timeout=5)
    assert history["type"] == "history"
    said = [(m["role"], m["id"], m["text"]) for m in history["messages"]]
    assert said[0] == ("user", "m1", "my secret plan")
    assert said[1][0] == "bot" and said[1][2] == "Your secret plan is **safe**."
    assert history["messages"][1]["reply_to"] == "m1" and "blocks" in history["messages"][1]

    # The other client: nothing of it, not on its open socket, not after a reload.
    await chat.channel.typing("someone-else")
    assert await other.receive_json(timeout=5) == {"type": "typing"}
    fresh = await chat.connect("someone-else")
    await chat.channel.typing("someone-else")
    assert await fresh.receive_json(timeout=5) == {"type": "typing"}  # no history first
    assert await other.receive_json(timeout=5) == {"type": "typing"}
    await other.send_json({"type": "message", "id": "m1", "text": "hi"})  # same id, own log
    assert await other.receive_json(timeout=5) == {"type": "ack", "id": "m1"}
    third = await chat.connect("someone-else")
    theirs = await third.receive_json(timeout=5)
    assert [m["text"] for m in theirs["messages"]] == ["hi"]
    assert "secret" not in str(theirs)


async def test_a_message_sent_again_is_logged_once(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    for _ in range(2):  # a resend after a reconnect: the same id
        await ws.send_json({"type": "message", "id": "m1", "text": "once"})
        assert (await ws.receive_json(timeout=5))["type"] == "ack"
    again = await chat.connect("tab-1")
    history = await again.receive_json(timeout=5)
    assert [m["text"] for m in history["messages"]] == ["once"]


async def test_history_comes_only_when_asked_for(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    await ws.send_json({"type": "message", "id": "m1", "text": "logged"})
    assert (await ws.receive_json(timeout=5))["type"] == "ack"
    quiet = await chat.connect("tab-1", history=False)  # a client keeping its own copy
    await chat.channel.typing("tab-1")
    assert await quiet.receive_json(timeout=5) == {"type": "typing"}


async def test_a_command_answered_inside_the_handler_replays_after_its_question(
    chat: Chat,
) -> None:
    """/status is answered before the handler returns: the history keeps the order."""
    ws = await chat.connect("tab-1")
    recorder = chat.inbox

    async def answer_at_once(message: InboundMessage) -> None:
        await recorder(message)
        await chat.channel.send(reply("status: fine", reply_to=message.message_id))

    chat.channel._handler = answer_at_once
    await ws.send_json({"type": "message", "id": "m1", "text": "/status"})
    frames = [await ws.receive_json(timeout=5) for _ in range(2)]
    assert sorted(f["type"] for f in frames) == ["ack", "reply"]
    history = await (await chat.connect("tab-1")).receive_json(timeout=5)
    said = [(m["role"], m["text"]) for m in history["messages"]]
    assert said == [("user", "/status"), ("bot", "status: fine")]


async def test_a_message_not_taken_is_not_in_the_history(chat: Chat) -> None:
    ws = await chat.connect("tab-1")
    await ws.send_json({"type": "message", "id": "m1", "text": "kept"})
    assert (await ws.receive_json(timeout=5))["type"] == "ack"
    chat.inbox.failures = 1
    await ws.send_json({"type": "message", "id": "m2", "text": "refused"})
    assert (await ws.receive_json(timeout=5))["type"] == "error"
    # A resend of a taken message that fails now keeps the one logged before.
    chat.inbox.failures = 1
    await ws.send_json({"type": "message", "id": "m1", "text": "kept"})
    assert (await ws.receive_json(timeout=5))["type"] == "error"
    history = await (await chat.connect("tab-1")).receive_json(timeout=5)
    assert [m["text"] for m in history["messages"]] == ["kept"]
