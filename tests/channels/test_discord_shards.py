"""Discord shards split over replicas: the config, and real discord.py clients (one
shard each, or an AutoShardedClient) against the fake gateway, which routes a guild's
events to its shard and DMs to shard 0 as Discord does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest
from pydantic import ValidationError

from parley.channels.base import ChannelStartError, SeenMark
from parley.channels.config import DiscordAccountConfig, DiscordConfig
from parley.channels.discord_adapter import DiscordChannel, shard_of_guild
from tests.channels.discord_support import (
    ANN,
    BOB,
    LIMIT,
    TOKEN,
    Inbox,
    fake_discord,
    make_config,
    reply,
    running,
)
from tests.fakes.discord_api import GET_MESSAGES, FakeDiscord

# Discord's routing: (guild_id >> 22) % shard_count.
EVEN_GUILD = str(7_000 << 22)  # shard 0 of 2
ODD_GUILD = str(7_001 << 22)  # shard 1 of 2
EVEN_CHANNEL = "420000000000000010"
ODD_CHANNEL = "420000000000000011"


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    async def identify_at_once(self: Any, shard_id: int | None, *, initial: bool = False) -> None:
        """discord.py waits 5 s between IDENTIFYs (Discord's rate limit; an
        AutoShardedClient identifies its shards one by one); the fake has no limit."""

    monkeypatch.setattr(discord.Client, "before_identify_hook", identify_at_once)
    async with fake_discord(monkeypatch) as server:
        server.add_guild(
            EVEN_GUILD, "Even", bots=[TOKEN], channels=[{"id": EVEN_CHANNEL, "name": "even"}]
        )
        server.add_guild(
            ODD_GUILD, "Odd", bots=[TOKEN], channels=[{"id": ODD_CHANNEL, "name": "odd"}]
        )
        yield server


def sharded(*shard_ids: int, count: int = 2) -> dict[str, Any]:
    return {"default": {"token": TOKEN, "shard_count": count, "shard_ids": list(shard_ids)}}


def account_of(channel: DiscordChannel) -> Any:
    return channel._accounts["default"]


# -- config -----------------------------------------------------------------------------


def test_defaults_are_one_shard_of_one() -> None:
    account = DiscordAccountConfig(token="t")
    assert (account.shard_count, account.shard_ids, account.shards()) == (1, None, (0,))
    assert DiscordAccountConfig(token="t", shard_count=3).shards() == (0, 1, 2)
    assert DiscordAccountConfig(token="t", shard_count=4, shard_ids=[3, 1]).shards() == (3, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"shard_count": 0}, "greater than or equal to 1"),
        ({"shard_count": 2, "shard_ids": []}, "at least one shard"),
        ({"shard_count": 2, "shard_ids": [0, 2]}, "[2] out of range"),
        ({"shard_count": 2, "shard_ids": [-1]}, "a shard id is 0..1"),
        ({"shard_ids": [1]}, "with shard_count = 1"),
        ({"shard_count": 3, "shard_ids": [1, 2, 1]}, "lists [1] more than once"),
        ({"shard_count": 2, "shard_ids": [True]}, "valid integer"),
        ({"shard_count": "2"}, "valid integer"),
    ],
)
def test_bad_shards_are_refused_clearly(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        DiscordConfig.model_validate({"accounts": {"main": {"token": "t", **fields}}})
    assert message in str(refused.value)
    assert "accounts.main" in str(refused.value)  # where the mistake is


def test_shard_of_guild_is_discords_formula() -> None:
    assert shard_of_guild(EVEN_GUILD, 2) == 0 and shard_of_guild(ODD_GUILD, 2) == 1
    assert shard_of_guild(None, 2) == 0  # DMs ride on shard 0
    assert shard_of_guild(ODD_GUILD, 1) == 0


# -- replicas ---------------------------------------------------------------------------


async def test_each_replica_gets_only_its_shards_guilds_and_dms_go_to_shard_0(
    fake: FakeDiscord,
) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    async with (
        running(fake, accounts=sharded(0)) as (zero, zero_inbox),
        running(fake, accounts=sharded(1)) as (one, one_inbox),
    ):
        assert {r.shard for r in fake.identifies} == {(0, 2), (1, 2)}
        assert isinstance(account_of(zero).client, discord.Client)
        assert not isinstance(account_of(zero).client, discord.AutoShardedClient)
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="odd", author=ANN)
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="even", author=ANN)
        await fake.push_message(TOKEN, channel_id=dm, content="dm", author=BOB)
        # A last message per shard: each connection delivers in order, so anything
        # misrouted would have come before it.
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="end", author=ANN)
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="end", author=ANN)
        await zero_inbox.wait(3)
        await one_inbox.wait(2)
        assert [m.text for m in zero_inbox.messages] == ["even", "dm", "end"]
        assert [m.text for m in one_inbox.messages] == ["odd", "end"]
        assert [m.guild_id for m in one_inbox.messages] == [ODD_GUILD, ODD_GUILD]
        assert zero.connected() and one.connected()
        # Sending is REST: either replica answers its own conversations.
        result = await one.send(reply(one_inbox.messages[0], "odd back"))
        await zero.send(reply(zero_inbox.messages[1], "dm back"))
        assert [s.content for s in fake.sent] == ["odd back", "dm back"]
        reference = fake.sent[0].message_reference or {}
        assert str(reference["message_id"]) == one_inbox.messages[0].message_id
        assert result.platform_message_ids == (fake.sent[0].id,)


async def test_one_auto_sharded_client_gets_every_shard(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    async with running(fake, accounts=sharded(0, 1)) as (channel, inbox):
        client = account_of(channel).client
        assert isinstance(client, discord.AutoShardedClient)
        assert client.shard_ids == [0, 1] and client.shard_count == 2
        await fake.wait_until(lambda: fake.gateway.connected_shards(TOKEN) == {0, 1})
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="odd", author=ANN)
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="even", author=ANN)
        await fake.push_message(TOKEN, channel_id=dm, content="dm", author=BOB)
        messages = await inbox.wait(3)
        assert sorted(m.text for m in messages) == ["dm", "even", "odd"]
        assert channel.connected()
        await channel.send(reply(messages[0], "back"))
        assert [s.channel_id for s in fake.sent] == [messages[0].chat_id]


async def test_unsharded_default_identifies_without_a_shard(fake: FakeDiscord) -> None:
    async with running(fake) as (_, inbox):
        assert [r.shard for r in fake.identifies] == [None]  # as before sharding
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="odd", author=ANN)
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="even", author=ANN)
        assert [m.text for m in await inbox.wait(2)] == ["odd", "even"]


# -- sessions per shard -------------------------------------------------------------------


async def test_a_lost_shard_session_backfills_that_shards_channels_only(
    fake: FakeDiscord,
) -> None:
    async with running(fake, accounts=sharded(0, 1)) as (channel, inbox):
        await fake.wait_until(lambda: fake.gateway.connected_shards(TOKEN) == {0, 1})
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="odd 1", author=ANN)
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="even 1", author=ANN)
        await inbox.wait(2)
        # Op 9 (not resumable) on shard 1: what is sent before its new READY reaches
        # no session and is never replayed; shard 0 carries on.
        assert await fake.invalidate_session(TOKEN, resumable=False, shard=1) == 1
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="odd 2", author=ANN)
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="even 2", author=ANN)
        messages = await inbox.wait(4)
        assert sorted(m.text for m in messages[2:]) == ["even 2", "odd 2"]
        fetched = [r.path for r in fake.requests if r.route == GET_MESSAGES]
        assert fetched == [f"/api/v10/channels/{ODD_CHANNEL}/messages"]
        assert [r.shard for r in fake.identifies].count((1, 2)) == 2
        await fake.wait_until(lambda: fake.gateway.connected(TOKEN, shard=1))
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="odd 3", author=ANN)
        assert (await inbox.wait(5))[-1].text == "odd 3"
        assert channel.connected() and account_of(channel).restarts == 0


async def test_a_resumed_shard_needs_no_backfill(fake: FakeDiscord) -> None:
    async with running(fake, accounts=sharded(0, 1)) as (_, inbox):
        await fake.wait_until(lambda: fake.gateway.connected_shards(TOKEN) == {0, 1})
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="before", author=ANN)
        await inbox.wait(1)
        assert await fake.request_reconnect(TOKEN, shard=0) == 1
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="gap", author=ANN)
        await fake.wait_until(lambda: len(fake.resumes) == 1)
        assert [m.text for m in await inbox.wait(2)] == ["before", "gap"]
        assert not [r for r in fake.requests if r.route == GET_MESSAGES]
        assert len(fake.identifies) == 2  # one per shard, no new session


async def test_catch_up_backfills_only_what_this_replica_owns(fake: FakeDiscord) -> None:
    """After a restart each replica reads back only its shards' conversations: the
    seeded marks do not say which shard, so the guild (or DM) decides."""
    dm = fake.add_dm(TOKEN, BOB)
    marks = []
    for cid, author in ((EVEN_CHANNEL, ANN), (ODD_CHANNEL, ANN), (dm, BOB)):
        seen = await fake.push_message(TOKEN, channel_id=cid, content="seen", author=author)
        marks.append(SeenMark("default", cid, None, seen["id"]))
    for cid, author in ((EVEN_CHANNEL, ANN), (ODD_CHANNEL, ANN), (dm, BOB)):
        await fake.push_message(TOKEN, channel_id=cid, content=f"missed {cid}", author=author)
    inboxes: list[Inbox] = []
    for shard in (0, 1):
        replica = DiscordChannel(make_config(fake, accounts=sharded(shard)), ready_timeout=LIMIT)
        replica.catch_up(marks)
        inbox = Inbox()
        inboxes.append(inbox)
        await replica.start(inbox.handle)
        try:
            await inbox.wait(2 if shard == 0 else 1)
            # Its last message shows nothing else is on the way.
            gid = EVEN_GUILD if shard == 0 else ODD_GUILD
            cid = EVEN_CHANNEL if shard == 0 else ODD_CHANNEL
            await fake.push_message(TOKEN, channel_id=cid, guild_id=gid, content="end", author=ANN)
            await inbox.wait(3 if shard == 0 else 2)
        finally:
            await replica.stop()
    assert sorted(m.text for m in inboxes[0].messages) == sorted(
        [f"missed {EVEN_CHANNEL}", f"missed {dm}", "end"]
    )
    assert [m.text for m in inboxes[1].messages] == [f"missed {ODD_CHANNEL}", "end"]


async def test_an_invalid_shard_stops_the_account_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with fake_discord(monkeypatch) as server:
        server.gateway.require_sharding = True
        server.gateway.recommended_shards = 4
        config = make_config(server, accounts=sharded(1))  # 2 shards: too few
        channel = DiscordChannel(config, ready_timeout=LIMIT)
        with pytest.raises(ChannelStartError, match="raise shard_count") as refused:
            await channel.start(Inbox().handle)
        assert "4011" in str(refused.value)
        assert not channel.connected()
