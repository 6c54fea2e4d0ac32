"""The Discord adapter, outbound and lifecycle: the real discord.py against the fake."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from parley.channels.base import (
    ChannelStartError,
    ChatPolicy,
    DeliveryError,
    InboundMessage,
    OutboundMessage,
    RecipientBlocked,
)
from parley.channels.config import DiscordConfig
from parley.channels.discord_adapter import DiscordChannel
from tests.channels.discord_support import (
    ANN,
    BOB,
    BOT_ID,
    GENERAL,
    GUILD_ID,
    LIMIT,
    LOCKED,
    RANDOM,
    SECOND_BOT_ID,
    SECOND_TOKEN,
    THREAD,
    TOKEN,
    Inbox,
    fake_discord,
    make_config,
    reply,
    running,
)
from tests.fakes.discord_api import SEND_MESSAGE, FakeDiscord


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    async with fake_discord(monkeypatch) as server:
        yield server


async def test_long_reply_is_split_with_the_code_fence_intact(fake: FakeDiscord) -> None:
    code = "\n".join(f"    line_{n} = compute({n})  # step {n}" for n in range(120))
    text = f"Here is the script:\n\n```python\n{code}\n```\n\nThat is all."
    assert len(text) > 4000
    async with running(fake) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="code please", author=ANN)
        [asked] = await inbox.wait(1)
        result = await channel.send(reply(asked, text))
    parts = [s.content for s in fake.sent]
    assert result.parts == len(parts) >= 3
    assert result.platform_message_ids == tuple(s.id for s in fake.sent)
    assert all(len(p) <= 2000 for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)  # each part closes what it opens
    assert all(p.lstrip().startswith("```") for p in parts[1:-1])  # reopened
    assert parts[0].startswith("Here is the script:") and parts[-1].endswith("That is all.")
    for line in code.splitlines():
        assert sum(line in p for p in parts) == 1  # nothing lost or repeated
    # Only the first part quotes the question; no part may ping anyone but its author.
    assert fake.sent[0].message_reference == {
        "message_id": int(asked.message_id),
        "channel_id": int(GENERAL),
        "fail_if_not_exists": False,
        "type": 0,
    }
    assert all(s.message_reference is None for s in fake.sent[1:])
    for sent in fake.sent:
        assert sent.allowed_mentions is not None
        assert sent.allowed_mentions["parse"] == []
        assert not sent.allowed_mentions.get("roles") and not sent.allowed_mentions.get("users")


async def test_reply_to_an_edit_quotes_the_original_message(fake: FakeDiscord) -> None:
    async with running(fake) as (channel, _):
        message = OutboundMessage(
            channel="discord",
            account="default",
            chat_id=GENERAL,
            text="ok",
            reply_to_message_id="123456789012345678:edit:1700000000000",
        )
        await channel.send(message)  # unknown original: fail_if_not_exists=False
    [sent] = fake.sent
    assert sent.message_reference is not None
    assert sent.message_reference["message_id"] == 123456789012345678
    assert sent.payload["type"] == 0  # the fake dropped the dangling reference


async def test_429_is_retried_by_the_library(fake: FakeDiscord) -> None:
    fake.rate_limit_next(retry_after=0.02, route=SEND_MESSAGE)
    async with running(fake) as (channel, _):
        out = OutboundMessage(channel="discord", account="default", chat_id=GENERAL, text="hi")
        result = await channel.send(out)
    assert [r.status for r in fake.requests if r.route == SEND_MESSAGE] == [429, 200]
    assert result.platform_message_ids == (fake.sent[0].id,)


async def test_delivery_errors_are_mapped(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    fake.block_dm(BOB["id"])
    fake.forbid(LOCKED)

    def to(chat_id: str, text: str = "hi") -> OutboundMessage:
        return OutboundMessage(channel="discord", account="default", chat_id=chat_id, text=text)

    async with running(fake) as (channel, _):
        with pytest.raises(RecipientBlocked) as blocked:
            await channel.send(to(dm))
        assert blocked.value.delivered == () and not blocked.value.retryable
        with pytest.raises(DeliveryError) as forbidden:
            await channel.send(to(LOCKED))
        assert not isinstance(forbidden.value, RecipientBlocked)
        assert not forbidden.value.retryable
        with pytest.raises(DeliveryError) as missing:
            await channel.send(to("499999999999999999"))
        assert not missing.value.retryable
        fake.fail_next(503, {"message": "Service Unavailable", "code": 0}, route=SEND_MESSAGE)
        with pytest.raises(DeliveryError) as unavailable:
            await channel.send(to(GENERAL))
        assert unavailable.value.retryable
        fake.fail_next(400, {"message": "Bad", "code": 1}, route=SEND_MESSAGE)
        with pytest.raises(DeliveryError) as bad:
            await channel.send(to(GENERAL))
        assert not bad.value.retryable
        # The second part fails: the first went out, so a retry would duplicate it.
        fake.fail_next(503, route=SEND_MESSAGE, after=1)
        with pytest.raises(DeliveryError) as halfway:
            await channel.send(to(GENERAL, "a" * 1500 + "\n\n" + "b" * 1500))
        assert halfway.value.delivered == (fake.sent[-1].id,)
        assert not halfway.value.retryable
        with pytest.raises(DeliveryError) as unknown_account:
            await channel.send(
                OutboundMessage(channel="discord", account="nope", chat_id=GENERAL, text="x")
            )
        assert not unknown_account.value.retryable
    with pytest.raises(DeliveryError) as stopped:
        await channel.send(to(GENERAL))
    assert stopped.value.retryable  # a configured account may be back after a restart


async def test_two_accounts_at_once(fake: FakeDiscord) -> None:
    accounts = {"default": {"token": TOKEN}, "second": {"token": SECOND_TOKEN}}
    dm = fake.add_dm(SECOND_TOKEN, BOB)
    async with running(fake, accounts=accounts) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="to main", author=ANN)
        await fake.push_message(SECOND_TOKEN, channel_id=dm, content="to helper", author=BOB)
        messages = await inbox.wait(2)
        by_account = {m.account: m for m in messages}
        assert by_account["default"].text == "to main"
        assert by_account["second"].text == "to helper"
        await channel.send(reply(by_account["second"], "helper here", account="second"))
        await channel.send(reply(by_account["default"], "main here"))
    assert {(s.bot_id, s.content) for s in fake.sent} == {
        (SECOND_BOT_ID, "helper here"),
        (BOT_ID, "main here"),
    }
    assert {i.token for i in fake.identifies} == {TOKEN, SECOND_TOKEN}


async def test_typing_is_best_effort(fake: FakeDiscord) -> None:
    fake.forbid(LOCKED)
    async with running(fake) as (channel, _):
        await channel.typing(GENERAL)
        await channel.typing(GENERAL, thread_id=THREAD)
        await channel.typing(LOCKED)  # 403: swallowed
        await channel.typing(GENERAL, account="nope")  # not running: ignored
    assert [(t.bot_id, t.channel_id) for t in fake.typing] == [(BOT_ID, GENERAL), (BOT_ID, THREAD)]


async def test_bad_token_is_a_start_error_naming_the_account(fake: FakeDiscord) -> None:
    accounts = {"default": {"token": TOKEN}, "broken": {"token": "not-a-real-token"}}
    channel = DiscordChannel(make_config(fake, accounts=accounts), ready_timeout=LIMIT)
    with pytest.raises(ChannelStartError, match=r"'broken'.*login failed"):
        await channel.start(Inbox().handle)
    # The account that did log in was shut down again.
    await fake.wait_until(lambda: not fake.gateway.connected(TOKEN))
    await channel.stop()


async def test_start_needs_an_enabled_account(fake: FakeDiscord) -> None:
    config = make_config(fake, accounts={"default": {"token": TOKEN, "enabled": False}})
    with pytest.raises(ChannelStartError, match="no enabled account"):
        await DiscordChannel(config).start(Inbox().handle)


async def test_stop_is_idempotent_and_quick(fake: FakeDiscord) -> None:
    channel = DiscordChannel(make_config(fake), ready_timeout=LIMIT)
    await channel.start(Inbox().handle)
    with pytest.raises(ChannelStartError, match="already running"):
        await channel.start(Inbox().handle)
    async with asyncio.timeout(2.0):
        await channel.stop()
        await channel.stop()
    await fake.wait_until(lambda: not fake.gateway.connected(TOKEN))
    assert channel.webhook_routes() == []


def test_policy_per_guild_and_per_channel() -> None:
    config = DiscordConfig.model_validate(
        {
            "accounts": {"default": {"token": TOKEN, "allow_from": ["42"]}},
            "dm_policy": "allowlist",
            "guild_activation": "mention",
            "guilds": {
                GUILD_ID: {"activation": "always", "channels": {RANDOM: {"activation": "mention"}}},
                "320000000000000001": {
                    "channels": {"420000000000000001": {"activation": "always"}}
                },
            },
        }
    )
    channel = DiscordChannel(config)

    def policy(
        chat_type: str, chat_id: str, guild: str | None = None, thread: str | None = None
    ) -> ChatPolicy:
        message = InboundMessage(
            channel="discord",
            account="default",
            chat_type=chat_type,  # type: ignore[arg-type]
            chat_id=chat_id,
            sender_id="42",
            sender_name="x",
            text="t",
            message_id="1",
            timestamp=datetime.now(UTC),
            thread_id=thread,
            guild_id=guild,
        )
        return channel.policy(message)

    assert policy("group", GENERAL, GUILD_ID).activation == "always"  # the guild's rule
    assert policy("group", GENERAL, GUILD_ID).group_context_messages == 0  # all are turns
    assert policy("group", RANDOM, GUILD_ID).group_context_messages == 50
    assert policy("group", RANDOM, GUILD_ID).activation == "mention"  # the channel's rule
    assert policy("thread", RANDOM, GUILD_ID, THREAD).activation == "mention"  # the parent's
    assert policy("group", "420000000000000001", "320000000000000001").activation == "always"
    assert policy("group", "420000000000000002", "320000000000000001").activation == "mention"
    assert policy("group", GENERAL, "399999999999999999").activation == "mention"  # the default
    assert policy("direct", "5") == ChatPolicy(
        activation="always", dm_policy="allowlist", allow_from=frozenset({"42"})
    )


async def test_the_same_reply_sent_again_is_the_same_messages(fake: FakeDiscord) -> None:
    """A restart that cannot tell whether a reply went out sends it again: with the
    reply's idempotency key every part carries the same nonce, and Discord hands back
    the messages it already has instead of posting them twice."""
    text = "\n\n".join(f"paragraph {n} " + "word " * 60 for n in range(12))
    async with running(fake) as (channel, inbox):
        await fake.push_message(TOKEN, channel_id=GENERAL, content="long one", author=ANN)
        [asked] = await inbox.wait(1)
        outbound = dataclasses.replace(reply(asked, text), idempotency_key="discord:default:1")
        first = await channel.send(outbound)
        again = await channel.send(outbound)
        assert first.parts >= 2
        assert again.platform_message_ids == first.platform_message_ids
        assert len(fake.sent) == first.parts
        assert fake.deduplicated == first.parts
        # The parts a crash let out are not sent again; the rest keep their nonces.
        rest = await channel.send(dataclasses.replace(outbound, first_part=1))
        assert rest.platform_message_ids == first.platform_message_ids[1:]
        assert len(fake.sent) == first.parts
        # Another reply (another key) is a new message, and so is one with no key.
        other = dataclasses.replace(outbound, idempotency_key="discord:default:2", text="hi")
        await channel.send(other)
        await channel.send(dataclasses.replace(other, idempotency_key=None))
        await channel.send(dataclasses.replace(other, idempotency_key=None))
    assert len(fake.sent) == first.parts + 3
