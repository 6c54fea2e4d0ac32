"""What the Telegram channel tests share: the fake, a collecting handler, a channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from parley.channels.base import InboundMessage, InboundNotStored
from parley.channels.config import TelegramConfig
from parley.channels.telegram import TelegramChannel
from parley.channels.telegram_polling import Backoff
from tests.fakes.telegram_api import FakeTelegram

TOKEN = "123:AAA"
BOT_ID = 123
USERNAME = "parley_bot"
OTHER_TOKEN = "456:BBB"
OTHER_BOT_ID = 456
OTHER_USERNAME = "second_bot"
FAST_BACKOFF = Backoff(initial=0.01, maximum=0.02)
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx (under PTB) honours proxy variables, even for 127.0.0.1."""
    for name in _PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    # PTB 22 warns inside RetryAfter's constructor unless durations are timedeltas, and
    # warnings are errors in this suite; the adapter reads both forms.
    monkeypatch.setenv("PTB_TIMEDELTA", "1")


@asynccontextmanager
async def fake_telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram(length_unit="utf16") as fake:
        fake.add_bot(TOKEN, USERNAME, first_name="Parley", bot_id=BOT_ID)
        yield fake


class Inbox:
    """The inbound handler: collects messages; ``failures`` makes the next calls raise,
    ``refusals`` makes them raise ``InboundNotStored`` (storage refusing writes)."""

    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self.attempts = 0
        self.failures = 0
        self.refusals = 0
        self._changed = asyncio.Condition()

    async def __call__(self, message: InboundMessage) -> None:
        async with self._changed:
            self.attempts += 1
            self._changed.notify_all()
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("the inbox is down")
        if self.refusals > 0:
            self.refusals -= 1
            raise InboundNotStored("state.db: database or disk is full")
        async with self._changed:
            self.messages.append(message)
            self._changed.notify_all()

    async def wait(self, count: int, limit_s: float = 5.0) -> list[InboundMessage]:
        async with asyncio.timeout(limit_s), self._changed:
            await self._changed.wait_for(lambda: len(self.messages) >= count)
        return self.messages

    async def wait_attempts(self, count: int, limit_s: float = 5.0) -> None:
        async with asyncio.timeout(limit_s), self._changed:
            await self._changed.wait_for(lambda: self.attempts >= count)


class Sleeps:
    """Stands in for asyncio.sleep in flood waits: records, returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def make_config(fake: FakeTelegram, **overrides: Any) -> TelegramConfig:
    accounts = overrides.pop(
        "accounts", {"default": {"token": TOKEN, "api_base_url": fake.base_url}}
    )
    settings: dict[str, Any] = {"poll_timeout_seconds": 1, "accounts": accounts}
    settings.update(overrides)
    return TelegramConfig.model_validate(settings)


@asynccontextmanager
async def running_channel(
    fake: FakeTelegram, inbox: Inbox, sleeps: Sleeps | None = None, **overrides: Any
) -> AsyncIterator[TelegramChannel]:
    channel = TelegramChannel(
        make_config(fake, **overrides), sleep=sleeps or Sleeps(), backoff=FAST_BACKOFF
    )
    await channel.start(inbox)
    try:
        yield channel
    finally:
        await channel.stop()
