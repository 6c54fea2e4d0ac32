"""What the Discord adapter tests share: the fake's world, an inbox, a running channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket

from parley.channels.base import InboundMessage, OutboundMessage
from parley.channels.config import DiscordConfig
from parley.channels.discord_adapter import DiscordChannel
from tests.fakes.discord_api import FakeDiscord

TOKEN = "token-main"
SECOND_TOKEN = "token-second"
BOT_ID = "210000000000000001"
SECOND_BOT_ID = "210000000000000002"
GUILD_ID = "310000000000000001"
GENERAL = "410000000000000001"
RANDOM = "410000000000000002"
LOCKED = "410000000000000003"
THREAD = "610000000000000001"
MODS = "510000000000000001"
BOT_ROLE = "510000000000000002"
ANN = {"id": "710000000000000001", "username": "ann", "global_name": "Ann", "nick": "Annie"}
BOB = {"id": "710000000000000002", "username": "bob", "global_name": "Bob"}
ME = {"id": BOT_ID, "username": "parley", "bot": True}
LIMIT = 5.0


class Inbox:
    """The inbound handler: keeps every message and lets a test wait for a count."""

    def __init__(self, before: Callable[[InboundMessage], Awaitable[None]] | None = None) -> None:
        self.messages: list[InboundMessage] = []
        self._before = before
        self._changed = asyncio.Condition()

    async def handle(self, message: InboundMessage) -> None:
        if self._before is not None:
            await self._before(message)
        self.messages.append(message)
        async with self._changed:
            self._changed.notify_all()

    async def wait(self, count: int) -> list[InboundMessage]:
        async with asyncio.timeout(LIMIT), self._changed:
            await self._changed.wait_for(lambda: len(self.messages) >= count)
        return self.messages


@asynccontextmanager
async def fake_discord(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    """Two bots in one guild (channels, a locked one, a thread, roles incl. the bot's)."""
    async with FakeDiscord() as server:
        # The adapter sets these process-wide globals itself; monkeypatch restores them.
        monkeypatch.setattr(discord.http.Route, "BASE", server.api_base)
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(server.gateway_url))
        server.add_bot(TOKEN, BOT_ID, "parley")
        server.add_bot(SECOND_TOKEN, SECOND_BOT_ID, "helper")
        server.add_guild(
            GUILD_ID,
            "Guild",
            bots=[TOKEN, SECOND_TOKEN],
            channels=[
                {"id": GENERAL, "name": "general"},
                {"id": RANDOM, "name": "random"},
                {"id": LOCKED, "name": "locked"},
            ],
            roles=[
                {"id": MODS, "name": "mods"},
                {"id": BOT_ROLE, "name": "parley", "managed": True, "tags": {"bot_id": BOT_ID}},
            ],
            threads=[{"id": THREAD, "name": "plans", "parent_id": GENERAL}],
        )
        yield server


def make_config(fake: FakeDiscord, **fields: Any) -> DiscordConfig:
    accounts = fields.pop("accounts", {"default": {"token": TOKEN}})
    return DiscordConfig.model_validate(
        {
            "accounts": accounts,
            "api_base_url": fake.api_base,
            "gateway_url": fake.gateway_url,
            **fields,
        }
    )


@asynccontextmanager
async def running(
    fake: FakeDiscord, inbox: Inbox | None = None, **fields: Any
) -> AsyncIterator[tuple[DiscordChannel, Inbox]]:
    inbox = inbox or Inbox()
    channel = DiscordChannel(make_config(fake, **fields), ready_timeout=LIMIT)
    await channel.start(inbox.handle)
    try:
        yield channel, inbox
    finally:
        await channel.stop()


def reply(to: InboundMessage, text: str, account: str = "default") -> OutboundMessage:
    return OutboundMessage(
        channel="discord",
        account=account,
        chat_id=to.chat_id,
        text=text,
        thread_id=to.thread_id,
        reply_to_message_id=to.message_id,
    )
