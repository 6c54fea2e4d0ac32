"""Webhook mode: the fake Bot API posts updates to the channel's route on our server."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from parley.channels.telegram import SECRET_HEADER, TelegramChannel
from tests.channels.telegram_helpers import (
    FAST_BACKOFF,
    TOKEN,
    Inbox,
    fake_telegram,
    loopback_only,
    make_config,
)
from tests.fakes.telegram_api import FakeTelegram

SECRET = "hook-secret_1"


@dataclass
class Hooked:
    channel: TelegramChannel
    inbox: Inbox
    url: str


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback_only(monkeypatch)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with fake_telegram() as server:
        yield server


@pytest.fixture
async def hooked(fake: FakeTelegram) -> AsyncIterator[Hooked]:
    # The webhook URL must be in the config before the server exists: bind first.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/telegram/default"
    accounts = {
        "default": {
            "token": TOKEN, "api_base_url": fake.base_url, "webhook_url": url,
            "webhook_secret": SECRET,
        }
    }  # fmt: skip
    channel = TelegramChannel(
        make_config(fake, mode="webhook", accounts=accounts), backoff=FAST_BACKOFF
    )
    app = web.Application()
    for route in channel.webhook_routes():
        app.router.add_route(route.method, route.path, route.handler)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    inbox = Inbox()
    try:
        await channel.start(inbox)
        try:
            yield Hooked(channel, inbox, url)
        finally:
            await channel.stop()
    finally:
        await runner.cleanup()


async def post(url: str, body: bytes, secret: str | None = SECRET) -> int:
    # A file-like body: aiohttp warns about large raw bytes.
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=io.BytesIO(body), headers=headers) as response,
    ):
        await response.read()
        return response.status


def update_body(update_id: int = 1, text: str = "direct") -> bytes:
    return json.dumps({"update_id": update_id, "message": {
        "message_id": 5, "date": 1_700_000_000, "chat": {"id": 42, "type": "private"},
        "from": {"id": 42, "is_bot": False, "first_name": "Alice"}, "text": text,
    }}).encode()  # fmt: skip


async def test_start_registers_the_webhook(fake: FakeTelegram, hooked: Hooked) -> None:
    hook = fake.webhook_of(TOKEN)
    assert hook == {"url": hooked.url, "secret_token": SECRET}
    assert [r.path for r in hooked.channel.webhook_routes()] == ["/telegram/default"]


async def test_pushed_update_reaches_the_handler(fake: FakeTelegram, hooked: Hooked) -> None:
    fake.push_message(TOKEN, chat_id=42, text="via webhook")
    [delivery] = await fake.wait_webhook(1)
    assert delivery.status == 200
    assert [m.text for m in hooked.inbox.messages] == ["via webhook"]
    assert fake.pending_updates(TOKEN) == []


async def test_handler_failure_answers_500_for_redelivery(
    fake: FakeTelegram, hooked: Hooked
) -> None:
    hooked.inbox.failures = 1
    fake.push_message(TOKEN, chat_id=42, text="again please")
    [failed] = await fake.wait_webhook(1)
    assert failed.status == 500
    assert len(fake.pending_updates(TOKEN)) == 1
    fake.redeliver()
    deliveries = await fake.wait_webhook(2)
    assert [d.status for d in deliveries] == [500, 200]
    assert [m.text for m in hooked.inbox.messages] == ["again please"]


async def test_wrong_or_missing_secret_is_401(hooked: Hooked) -> None:
    assert await post(hooked.url, update_body(), secret="wrong") == 401
    assert await post(hooked.url, update_body(), secret=None) == 401
    assert hooked.inbox.attempts == 0


async def test_right_secret_direct_post(hooked: Hooked) -> None:
    assert await post(hooked.url, update_body(text="posted")) == 200
    assert [m.text for m in hooked.inbox.messages] == ["posted"]


async def test_malformed_and_oversized_bodies(hooked: Hooked) -> None:
    assert await post(hooked.url, b"{not json") == 400
    assert await post(hooked.url, b"[1, 2]") == 400
    assert await post(hooked.url, b'{"no_update_id": true}') == 400
    assert await post(hooked.url, b" " * (1024 * 1024 + 1)) == 413
    assert hooked.inbox.attempts == 0


async def test_stop_leaves_the_webhook_registered(fake: FakeTelegram, hooked: Hooked) -> None:
    await hooked.channel.stop()
    assert fake.webhook_of(TOKEN) is not None
