"""The fake Discord against the real discord.py client (and raw HTTP/websocket where the
client would hide what the fake answered)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import aiohttp
import discord
import pytest
import yarl
from discord.gateway import DiscordWebSocket

from tests.fakes.discord_api import DELETE_MESSAGE, EDIT_MESSAGE, SEND_MESSAGE, FakeDiscord
from tests.fakes.discord_gateway import INTENT_MESSAGE_CONTENT

TOKEN = "bot-token-one"
OTHER_TOKEN = "bot-token-two"
BOT_ID = "200000000000000001"
OTHER_BOT_ID = "200000000000000002"
GUILD_ID = "300000000000000001"
GENERAL = "400000000000000001"
SECRET = "400000000000000002"
THREAD = "600000000000000001"
ROLE = "500000000000000001"
ANN = {"id": "700000000000000001", "username": "ann", "global_name": "Ann", "nick": "Annie"}
BOB = {"id": "700000000000000002", "username": "bob"}
LIMIT = 5.0
ClientT = TypeVar("ClientT", bound=discord.Client)


class RecordingClient(discord.Client):
    """A discord.Client that keeps what it receives and lets a test wait on it."""

    def __init__(self, *, message_content: bool = True, **options: Any) -> None:
        intents = discord.Intents.default()
        intents.message_content = message_content
        super().__init__(intents=intents, guild_ready_timeout=0.01, **options)
        self.messages: list[discord.Message] = []
        self.edits: list[tuple[discord.Message, discord.Message]] = []
        self.deleted: list[int] = []  # ids, from MESSAGE_DELETE
        self.resumed = 0
        self.changed = asyncio.Condition()

    async def _bump(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def on_message(self, message: discord.Message) -> None:
        self.messages.append(message)
        await self._bump()

    async def on_message_edit(self, before: discord.Message, after: discord.Message) -> None:
        self.edits.append((before, after))
        await self._bump()

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        self.deleted.append(payload.message_id)
        await self._bump()

    async def on_resumed(self) -> None:
        self.resumed += 1
        await self._bump()

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(LIMIT), self.changed:
            await self.changed.wait_for(predicate)

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        # discord.py waits 5 s before each re-IDENTIFY (Discord's identify rate limit);
        # the fake has no such limit.
        return None

    def from_others(self) -> list[discord.Message]:
        assert self.user is not None
        return [m for m in self.messages if m.author.id != self.user.id]


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as server:
        monkeypatch.setattr(discord.http.Route, "BASE", server.api_base)
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(server.gateway_url))
        bot = server.add_bot(TOKEN, BOT_ID, "parley")
        server.add_bot(OTHER_TOKEN, OTHER_BOT_ID, "other")
        server.add_guild(
            GUILD_ID,
            "Guild",
            bots=[TOKEN],
            channels=[{"id": GENERAL, "name": "general"}, {"id": SECRET, "name": "secret"}],
            roles=[{"id": ROLE, "name": "mods"}],
            threads=[{"id": THREAD, "name": "plans", "parent_id": GENERAL}],
            members=[ANN],
        )
        assert bot["bot"] is True
        yield server


@asynccontextmanager
async def running(token: str = TOKEN, **options: Any) -> AsyncIterator[RecordingClient]:
    async with started(RecordingClient(**options), token) as client:
        yield client


@asynccontextmanager
async def started(client: ClientT, token: str = TOKEN) -> AsyncIterator[ClientT]:
    async with client:
        task = asyncio.create_task(client.start(token))
        try:
            async with asyncio.timeout(LIMIT):
                await client.wait_until_ready()
            yield client
        finally:
            await client.close()
            await task


async def test_login_ready_and_guild_model(fake: FakeDiscord) -> None:
    async with running() as client:
        assert client.user is not None and str(client.user.id) == BOT_ID
        guild = client.get_guild(int(GUILD_ID))
        assert guild is not None and guild.name == "Guild"
        assert isinstance(guild.get_channel(int(GENERAL)), discord.TextChannel)
        thread = guild.get_thread(int(THREAD))
        assert thread is not None and thread.parent_id == int(GENERAL)
        role = guild.get_role(int(ROLE))
        assert role is not None and role.name == "mods"
        # Without the members intent only the bot's own member is cached (as for real).
        assert guild.me is not None and guild.get_member(int(ANN["id"])) is None
    [identify] = fake.identifies
    assert identify.token == TOKEN and identify.intents & INTENT_MESSAGE_CONTENT
    routes = [r.route for r in fake.requests]
    assert routes[:2] == ["GET /users/@me", "GET /oauth2/applications/@me"]


async def test_bad_token_is_a_login_failure(fake: FakeDiscord) -> None:
    client = RecordingClient()
    async with client:
        with pytest.raises(discord.LoginFailure):
            await client.start("not-a-token")
    assert fake.requests[0].status == 401


async def test_raw_http_answers_are_exact(fake: FakeDiscord) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{fake.api_base}/users/@me") as response:
            assert response.status == 401
            assert response.headers["Content-Type"] == "application/json"
            assert await response.json() == {"message": "401: Unauthorized", "code": 0}
        headers = {"Authorization": f"Bot {TOKEN}"}
        async with http.get(f"{fake.api_base}/nowhere", headers=headers) as response:
            assert response.status == 404
            assert (await response.json())["code"] == 0
        async with http.get(f"{fake.api_base}/gateway") as response:
            assert (await response.json()) == {"url": fake.gateway_url}
        async with http.get(f"{fake.api_base}/gateway/bot", headers=headers) as response:
            assert response.headers["X-RateLimit-Remaining"] != "0"
            assert (await response.json())["shards"] == 1


async def test_guild_dm_and_thread_messages_and_replies(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    async with running() as client:
        await fake.push_message(TOKEN, channel_id=dm, content="hello", author=BOB)
        await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            content=f"hi <@{BOT_ID}>",
            author=ANN,
            mentions=[{"id": BOT_ID, "username": "parley", "bot": True}],
        )
        await fake.push_message(TOKEN, channel_id=THREAD, content="in thread", author=ANN)
        await client.until(lambda: len(client.messages) == 3)
        direct, guild_message, threaded = client.messages
        assert isinstance(direct.channel, discord.DMChannel) and direct.guild is None
        assert isinstance(guild_message.channel, discord.TextChannel)
        assert client.user is not None and client.user.mentioned_in(guild_message)
        assert guild_message.author.display_name == "Annie"
        assert isinstance(threaded.channel, discord.Thread)

        reply = await guild_message.channel.send(
            "answer", reference=guild_message, allowed_mentions=discord.AllowedMentions.none()
        )
        [sent] = await fake.wait_sent(1)
        assert sent.channel_id == GENERAL and sent.bot_id == BOT_ID and sent.content == "answer"
        assert sent.message_reference is not None
        assert str(sent.message_reference["message_id"]) == str(guild_message.id)
        assert sent.allowed_mentions == {"parse": []}
        assert reply.reference is not None and reply.reference.message_id == guild_message.id
        # The gateway echoes the bot's own message back to it.
        await client.until(lambda: any(m.id == reply.id for m in client.messages))
        assert fake.sent_to(GENERAL) == [sent] and fake.sent_to(dm) == []

        await direct.channel.typing()
        assert [(t.bot_id, t.channel_id) for t in fake.typing] == [(BOT_ID, dm)]
        fetched = await guild_message.channel.fetch_message(guild_message.id)
        assert fetched.content == guild_message.content


async def test_reply_referencing_the_bot_resolves(fake: FakeDiscord) -> None:
    async with running() as client:
        channel = client.get_partial_messageable(int(GENERAL))
        mine = await channel.send("from the bot")
        original = fake.message(mine.id)
        assert original is not None
        await fake.push_message(
            TOKEN, channel_id=GENERAL, content="replying", author=ANN, referenced_message=original
        )
        await client.until(lambda: len(client.from_others()) == 1)
        [reply] = client.from_others()
        assert reply.type is discord.MessageType.reply
        assert reply.reference is not None
        resolved = reply.reference.resolved
        assert isinstance(resolved, discord.Message) and resolved.author == client.user


async def test_strict_errors(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    fake.block_dm(BOB["id"])
    fake.forbid(SECRET)
    async with running() as client:
        general = client.get_partial_messageable(int(GENERAL))
        with pytest.raises(discord.HTTPException) as too_long:
            await general.send("x" * 2001)
        assert too_long.value.status == 400 and too_long.value.code == 50035
        assert (
            too_long.value.text == "Invalid Form Body\nIn content: Must be 2000 or fewer in length."
        )
        await general.send("x" * 2000)
        with pytest.raises(discord.HTTPException) as empty:
            await general.send("")
        assert empty.value.code == 50006
        with pytest.raises(discord.NotFound) as unknown:
            await client.get_partial_messageable(999999999999999999).send("hi")
        assert unknown.value.code == 10003 and unknown.value.text == "Unknown Channel"
        with pytest.raises(discord.Forbidden) as forbidden:
            await client.get_partial_messageable(int(SECRET)).send("hi")
        assert forbidden.value.code == 50013
        with pytest.raises(discord.Forbidden) as blocked:
            await client.get_partial_messageable(int(dm)).send("hi")
        assert blocked.value.code == 50007
        assert blocked.value.text == "Cannot send messages to this user"
        dangling = 123456789012345678
        with pytest.raises(discord.HTTPException) as unknown_reference:
            await general.send(
                "re",
                reference=discord.MessageReference(message_id=dangling, channel_id=int(GENERAL)),
            )
        assert unknown_reference.value.code == 50035
        lenient = discord.MessageReference(
            message_id=dangling, channel_id=int(GENERAL), fail_if_not_exists=False
        )
        await general.send("re", reference=lenient)
        assert fake.sent[-1].payload["type"] == 0  # the dangling reference was dropped
    assert len(fake.sent) == 2


async def test_429_with_via_is_retried_by_the_library(fake: FakeDiscord) -> None:
    fake.rate_limit_next(times=2, retry_after=0.01, route=SEND_MESSAGE)
    async with running() as client:
        message = await client.get_partial_messageable(int(GENERAL)).send("eventually")
    statuses = [r.status for r in fake.requests if r.route == SEND_MESSAGE]
    assert statuses == [429, 429, 200]
    assert [m.id for m in fake.sent] == [str(message.id)]


async def test_fail_next_injects_any_answer(fake: FakeDiscord) -> None:
    fake.fail_next(503, {"message": "Service Unavailable", "code": 0}, route=SEND_MESSAGE)
    fake.fail_next(400, {"message": "Bad", "code": 12345}, route=SEND_MESSAGE)
    async with running() as client:
        channel = client.get_partial_messageable(int(GENERAL))
        with pytest.raises(discord.DiscordServerError):
            await channel.send("one")
        with pytest.raises(discord.HTTPException) as bad:
            await channel.send("two")
        assert bad.value.code == 12345
        await channel.send("three")
    assert [m.content for m in fake.sent] == ["three"]


async def test_reconnect_resumes_and_replays_the_gap(fake: FakeDiscord) -> None:
    async with running() as client:
        assert await fake.request_reconnect(TOKEN) == 1
        for n in range(3):
            await fake.push_message(TOKEN, channel_id=GENERAL, content=f"gap {n}", author=ANN)
        await client.until(lambda: len(client.messages) == 3 and client.resumed == 1)
        assert [m.content for m in client.messages] == ["gap 0", "gap 1", "gap 2"]
        [resume] = fake.resumes
        assert resume.replayed == 3 and len(fake.identifies) == 1

        assert await fake.drop_connection(TOKEN, code=4000) == 1
        await fake.push_message(TOKEN, channel_id=GENERAL, content="after drop", author=ANN)
        await client.until(lambda: len(client.messages) == 4 and client.resumed == 2)
        assert client.messages[-1].content == "after drop"
        # A session-ending close makes the client identify afresh.
        await fake.drop_connection(TOKEN, code=4009)
        await fake.wait_until(lambda: len(fake.identifies) == 2)
        await fake.wait_until(lambda: fake.gateway.connected(TOKEN))
        await fake.push_message(TOKEN, channel_id=GENERAL, content="new session", author=ANN)
        await client.until(lambda: len(client.messages) == 5)


async def test_without_the_content_intent_guild_text_is_blank(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    me = {"id": BOT_ID, "username": "parley", "bot": True}
    async with running(message_content=False) as client:
        await fake.push_message(TOKEN, channel_id=GENERAL, content="not for you", author=ANN)
        await fake.push_message(
            TOKEN, channel_id=GENERAL, content=f"<@{BOT_ID}> yes", author=ANN, mentions=[me]
        )
        await fake.push_message(TOKEN, channel_id=dm, content="dm text", author=BOB)
        await client.until(lambda: len(client.messages) == 3)
        assert [m.content for m in client.messages] == ["", f"<@{BOT_ID}> yes", "dm text"]
    assert not fake.identifies[0].intents & INTENT_MESSAGE_CONTENT


async def test_edits_arrive_as_message_update(fake: FakeDiscord) -> None:
    async with running() as client:
        original = await fake.push_message(TOKEN, channel_id=GENERAL, content="v1", author=ANN)
        await client.until(lambda: len(client.messages) == 1)
        await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            content="v2",
            author=ANN,
            edited=True,
            message_id=original["id"],
        )
        await client.until(lambda: len(client.edits) == 1)
        [(before, after)] = client.edits
        assert (before.content, after.content) == ("v1", "v2")
        assert after.edited_at is not None and after.id == before.id


async def test_events_reach_only_the_addressed_bot(fake: FakeDiscord) -> None:
    dm = fake.add_dm(OTHER_TOKEN, BOB)
    async with running() as first, running(OTHER_TOKEN) as second:
        await fake.push_message(OTHER_TOKEN, channel_id=dm, content="for two", author=BOB)
        await second.until(lambda: len(second.messages) == 1)
        await fake.push_message(TOKEN, channel_id=GENERAL, content="for one", author=ANN)
        await first.until(lambda: len(first.messages) == 1)
        assert [m.content for m in first.messages] == ["for one"]
        assert [m.content for m in second.messages] == ["for two"]
        # The second bot is not in the guild.
        with pytest.raises(discord.Forbidden) as missing:
            await second.get_partial_messageable(int(GENERAL)).send("hi")
        assert missing.value.code == 50001


async def test_attachments_stickers_and_dm_opening(fake: FakeDiscord) -> None:
    async with running() as client:
        await fake.push_message(
            TOKEN,
            channel_id=GENERAL,
            author=ANN,
            attachments=[
                {"filename": "cat.png", "size": 2048, "content_type": "image/png"},
                {
                    "filename": "voice-message.ogg",
                    "size": 9000,
                    "content_type": "audio/ogg",
                    "duration_secs": 4.2,
                    "waveform": "AAAA",
                },
            ],
            stickers=[{"name": "wave"}],
        )
        await client.until(lambda: len(client.messages) == 1)
        [message] = client.messages
        assert [a.filename for a in message.attachments] == ["cat.png", "voice-message.ogg"]
        assert message.attachments[1].is_voice_message() and message.flags.voice
        assert [s.name for s in message.stickers] == ["wave"]
        # POST /users/@me/channels opens (or finds) the DM with a known user.
        dm = await client.create_dm(discord.Object(id=int(ANN["id"])))
        assert str(dm.id) == fake.add_dm(TOKEN, ANN)


async def test_gateway_protocol_edges(fake: FakeDiscord) -> None:
    async with aiohttp.ClientSession() as http:

        async def frames(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
            message = await ws.receive(timeout=LIMIT)
            assert message.type is aiohttp.WSMsgType.TEXT
            return json.loads(message.data)

        async with http.ws_connect(f"{fake.gateway_url}?v=10&encoding=json") as ws:
            hello = await frames(ws)
            assert hello["op"] == 10 and hello["d"]["heartbeat_interval"] == 41250
            await ws.send_json({"op": 1, "d": None})
            assert (await frames(ws))["op"] == 11
            await ws.send_json({"op": 2, "d": {"token": "nope", "intents": 0}})
            closing = await ws.receive(timeout=LIMIT)
            assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 4004

        async with http.ws_connect(fake.gateway_url) as ws:
            await frames(ws)
            await ws.send_json({"op": 6, "d": {"token": TOKEN, "session_id": "x", "seq": 3}})
            assert await frames(ws) == {"op": 9, "d": False, "s": None, "t": None}

        async with http.ws_connect(fake.gateway_url) as ws:
            await frames(ws)
            await ws.send_json({"op": 2, "d": {"token": TOKEN, "intents": 513}})
            ready = await frames(ws)
            assert ready["t"] == "READY" and ready["s"] == 1
            assert ready["d"]["resume_gateway_url"] == fake.gateway_url
            assert ready["d"]["guilds"] == [{"id": GUILD_ID, "unavailable": True}]
            guild = await frames(ws)
            assert guild["t"] == "GUILD_CREATE" and guild["s"] == 2
            await ws.send_json({"op": 2, "d": {"token": TOKEN, "intents": 513}})
            closing = await ws.receive(timeout=LIMIT)
            assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == 4005


# -- shards -----------------------------------------------------------------------------

# Guilds on shard 0 and shard 1 of 2: Discord routes by (guild_id >> 22) % num_shards.
EVEN_GUILD = str(900 << 22)
ODD_GUILD = str(901 << 22)
EVEN_CHANNEL = "400000000000000010"
ODD_CHANNEL = "400000000000000011"


def add_sharded_guilds(fake: FakeDiscord) -> None:
    fake.add_guild(EVEN_GUILD, "Even", bots=[TOKEN], channels=[{"id": EVEN_CHANNEL, "name": "e"}])
    fake.add_guild(ODD_GUILD, "Odd", bots=[TOKEN], channels=[{"id": ODD_CHANNEL, "name": "o"}])


async def _identify_closes(fake: FakeDiscord, shard: Any) -> int | None:
    """IDENTIFY over a raw websocket; the close code, or None when READY came."""
    payload: dict[str, Any] = {"token": TOKEN, "intents": 513}
    if shard is not None:
        payload["shard"] = shard
    async with aiohttp.ClientSession() as http, http.ws_connect(fake.gateway_url) as ws:
        await ws.receive(timeout=LIMIT)  # HELLO
        await ws.send_json({"op": 2, "d": payload})
        answer = await ws.receive(timeout=LIMIT)
        if answer.type is aiohttp.WSMsgType.CLOSE:
            return int(answer.data)
        ready = json.loads(answer.data)
        assert ready["t"] == "READY"
        assert ready["d"].get("shard") == shard
        return None


async def test_identify_shard_is_validated(fake: FakeDiscord) -> None:
    for bad in ([2, 2], [-1, 2], [0, 0], [0], [True, 2], "0,1", [0, 1, 2]):
        assert await _identify_closes(fake, bad) == 4010, bad
    assert await _identify_closes(fake, [1, 2]) is None
    assert await _identify_closes(fake, None) is None


async def test_sharding_required_and_recommended_count(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeDiscord(recommended_shards=3, require_sharding=True) as server:
        server.add_bot(TOKEN, BOT_ID, "parley")
        async with aiohttp.ClientSession() as http:
            headers = {"Authorization": f"Bot {TOKEN}"}
            async with http.get(f"{server.api_base}/gateway/bot", headers=headers) as response:
                assert (await response.json())["shards"] == 3
        assert await _identify_closes(server, None) == 4011
        assert await _identify_closes(server, [0, 2]) == 4011
        assert await _identify_closes(server, [2, 3]) is None
        # discord.py asks /gateway/bot when no shard_count is given and follows it.
        monkeypatch.setattr(discord.http.Route, "BASE", server.api_base)
        monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(server.gateway_url))
        monkeypatch.setattr(discord.Client, "before_identify_hook", _identify_at_once)
        client = discord.AutoShardedClient(
            intents=discord.Intents.default(), guild_ready_timeout=0.01
        )
        async with client:
            task = asyncio.create_task(client.start(TOKEN))
            try:
                async with asyncio.timeout(LIMIT):
                    await client.wait_until_ready()
                assert client.shard_count == 3 and sorted(client.shards) == [0, 1, 2]
                assert {r.shard for r in server.identifies[-3:]} == {(0, 3), (1, 3), (2, 3)}
            finally:
                await client.close()
                await task


async def _identify_at_once(
    self: discord.Client, shard_id: int | None, *, initial: bool = False
) -> None:
    return None  # discord.py waits 5 s between IDENTIFYs; the fake has no such limit


async def test_events_reach_only_the_guilds_shard(fake: FakeDiscord) -> None:
    add_sharded_guilds(fake)
    dm = fake.add_dm(TOKEN, BOB)
    async with (
        running(shard_id=0, shard_count=2) as zero,
        running(shard_id=1, shard_count=2) as one,
    ):
        # READY and GUILD_CREATE carry only the shard's guilds.
        assert {g.id for g in zero.guilds} == {int(EVEN_GUILD)} | _on_shard(0)
        assert {g.id for g in one.guilds} == {int(ODD_GUILD)} | _on_shard(1)
        await fake.push_message(TOKEN, channel_id=ODD_CHANNEL, content="odd", author=ANN)
        await fake.push_message(TOKEN, channel_id=EVEN_CHANNEL, content="even", author=ANN)
        await fake.push_message(TOKEN, channel_id=dm, content="dm", author=BOB)
        await zero.until(lambda: len(zero.messages) == 2)
        await one.until(lambda: len(one.messages) == 1)
        assert [m.content for m in zero.messages] == ["even", "dm"]
        assert [m.content for m in one.messages] == ["odd"]
        # A reply goes out over REST; its echo comes back on the guild's shard only.
        await one.messages[0].channel.send("back")
        await one.until(lambda: len(one.messages) == 2)
        assert len(zero.messages) == 2
        assert {r.shard for r in fake.identifies} == {(0, 2), (1, 2)}


def _on_shard(shard: int) -> set[int]:
    """The fixture's own guild, when it lands on ``shard`` of 2."""
    return {int(GUILD_ID)} if (int(GUILD_ID) >> 22) % 2 == shard else set()


async def test_auto_sharded_client_gets_every_shard(
    fake: FakeDiscord, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_sharded_guilds(fake)
    dm = fake.add_dm(TOKEN, BOB)
    monkeypatch.setattr(discord.Client, "before_identify_hook", _identify_at_once)
    seen: list[str] = []
    got = asyncio.Event()
    intents = discord.Intents.default()
    intents.message_content = True
    client = discord.AutoShardedClient(
        intents=intents, shard_ids=[0, 1], shard_count=2, guild_ready_timeout=0.01
    )

    @client.event
    async def on_message(message: discord.Message) -> None:
        seen.append(message.content)
        if len(seen) == 3:
            got.set()

    async with started(client):
        assert fake.gateway.connected_shards(TOKEN) == {0, 1}
        for channel, text in ((ODD_CHANNEL, "odd"), (EVEN_CHANNEL, "even"), (dm, "dm")):
            await fake.push_message(TOKEN, channel_id=channel, content=text, author=ANN)
        async with asyncio.timeout(LIMIT):
            await got.wait()
        assert sorted(seen) == ["dm", "even", "odd"]
        # A fault can target one shard: only shard 1 resumes.
        assert await fake.request_reconnect(TOKEN, shard=1) == 1
        await fake.wait_until(lambda: len(fake.resumes) == 1)
        assert fake.gateway.sessions[fake.resumes[0].session_id].shard == (1, 2)


# -- message nonces ---------------------------------------------------------------------

SHARED_GUILD = "300000000000000002"
SHARED = "400000000000000003"


class VirtualClock:
    """``fake.clock`` that a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_enforced_nonce_answers_the_first_message_for_five_minutes(
    fake: FakeDiscord,
) -> None:
    clock = VirtualClock()
    fake.clock = clock
    async with running() as client:
        general = client.get_partial_messageable(int(GENERAL))
        first = await general.send("once", nonce="retry-1")  # discord.py adds enforce_nonce
        clock.now += 299
        again = await general.send("once", nonce="retry-1")
        assert again.id == first.id and again.content == "once" and again.nonce == "retry-1"
        assert [m.id for m in fake.sent] == [str(first.id)] and fake.deduplicated == 1
        assert [m["id"] for m in fake.history(GENERAL)] == [str(first.id)]
        assert [r.status for r in fake.requests if r.route == SEND_MESSAGE] == [200, 200]
        # One MESSAGE_CREATE only: a message pushed now arrives after any second echo.
        await fake.push_message(TOKEN, channel_id=GENERAL, content="marker", author=ANN)
        await client.until(lambda: len(client.from_others()) == 1)
        assert [m.id for m in client.messages if m.author == client.user] == [first.id]

        clock.now += 2  # 301 s after the first: the nonce is free again
        later = await general.send("once", nonce="retry-1")
        assert later.id != first.id and len(fake.sent) == 2
        assert (await general.send("once", nonce="retry-1")).id == later.id
        assert len(fake.sent) == 2 and fake.deduplicated == 2


async def test_nonces_are_compared_per_author(fake: FakeDiscord) -> None:
    fake.add_guild(
        SHARED_GUILD, "Shared", bots=[TOKEN, OTHER_TOKEN], channels=[{"id": SHARED, "name": "s"}]
    )
    async with running() as first, running(OTHER_TOKEN) as second:
        mine = await first.get_partial_messageable(int(SHARED)).send("same", nonce="n-1")
        theirs = await second.get_partial_messageable(int(SHARED)).send("same", nonce="n-1")
        assert mine.id != theirs.id
        assert mine.author.id == int(BOT_ID) and theirs.author.id == int(OTHER_BOT_ID)
    assert [(m.bot_id, m.id) for m in fake.sent] == [
        (BOT_ID, str(mine.id)),
        (OTHER_BOT_ID, str(theirs.id)),
    ]
    assert fake.deduplicated == 0


async def test_nonces_without_enforce_nonce_are_not_compared(fake: FakeDiscord) -> None:
    url = f"{fake.api_base}/channels/{GENERAL}/messages"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bot {TOKEN}"}) as http:

        async def create(**fields: Any) -> dict[str, Any]:
            async with http.post(url, json={"content": "hi", **fields}) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        plain = [await create(nonce="n-1"), await create(nonce="n-1", enforce_nonce=False)]
        assert plain[0]["id"] != plain[1]["id"]
        assert [m["nonce"] for m in plain] == ["n-1", "n-1"]
        # Enforced, a nonce sent without enforcement still counts as taken.
        assert await create(nonce="n-1", enforce_nonce=True) in plain
        # Integer nonces work the same; the answer is the message as it was created.
        number = await create(nonce=12345, enforce_nonce=True)
        assert number["nonce"] == 12345
        assert await create(nonce=12345, enforce_nonce=True) == number
    assert len(fake.sent) == 3 and fake.deduplicated == 2


async def test_nonce_over_25_characters_is_refused(fake: FakeDiscord) -> None:
    async with running() as client:
        general = client.get_partial_messageable(int(GENERAL))
        with pytest.raises(discord.HTTPException) as too_long:
            await general.send("hi", nonce="n" * 26)
        assert too_long.value.status == 400 and too_long.value.code == 50035
        assert too_long.value.text == "Invalid Form Body\nIn nonce: Must be 25 or fewer in length."
        await general.send("hi", nonce="n" * 25)
    url = f"{fake.api_base}/channels/{GENERAL}/messages"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bot {TOKEN}"}) as http:
        for fields in (
            {"nonce": 10**25},
            {"nonce": ["n"]},
            {"nonce": True},
            {"nonce": "n", "enforce_nonce": "yes"},
        ):
            async with http.post(url, json={"content": "hi", **fields}) as response:
                assert response.status == 400, fields
                body = await response.json()
                assert body["code"] == 50035 and set(body["errors"]) <= set(fields), fields
    assert len(fake.sent) == 1


async def test_edit_changes_the_stored_message_and_echoes_an_update(fake: FakeDiscord) -> None:
    async with running() as client:
        channel = client.get_partial_messageable(int(GENERAL))
        mine = await channel.send("draft")
        await client.until(lambda: any(m.id == mine.id for m in client.messages))
        edited = await mine.edit(content="draft, then more")
        assert edited.content == "draft, then more" and edited.edited_at is not None
        stored = fake.message(mine.id)
        assert stored is not None and stored["content"] == "draft, then more"
        assert stored["edited_timestamp"] is not None
        [record] = fake.edits
        assert (record.bot_id, record.channel_id, record.id) == (BOT_ID, GENERAL, str(mine.id))
        assert record.content == "draft, then more"
        # What the create answered is kept as it was.
        assert fake.sent[0].content == "draft" and fake.sent[0].payload["content"] == "draft"
        # The gateway sends MESSAGE_UPDATE; discord.py pairs it with its cached copy.
        await client.until(lambda: len(client.edits) == 1)
        [(before, after)] = client.edits
        assert (before.content, after.content) == ("draft", "draft, then more")
        # A partial message edits the same way; history reads the edited content.
        await channel.get_partial_message(mine.id).edit(content="final")
        history = [m async for m in channel.history(limit=5)]
        assert [(m.id, m.content) for m in history] == [(mine.id, "final")]
        assert history[0].edited_at is not None
    assert fake.call_counts[EDIT_MESSAGE] == 2 and fake.call_counts[SEND_MESSAGE] == 1
    assert [e.content for e in fake.edits] == ["draft, then more", "final"]


async def test_edit_errors(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    theirs = await fake.push_message(TOKEN, channel_id=GENERAL, content="ann's", author=ANN)
    async with running() as client:
        general = client.get_partial_messageable(int(GENERAL))
        mine = await general.send("mine")
        with pytest.raises(discord.HTTPException) as too_long:
            await mine.edit(content="x" * 2001)
        assert too_long.value.status == 400 and too_long.value.code == 50035
        assert too_long.value.text == (
            "Invalid Form Body\nIn content: Must be 2000 or fewer in length."
        )
        await mine.edit(content="x" * 2000)
        with pytest.raises(discord.HTTPException) as empty:
            await mine.edit(content="")
        assert empty.value.status == 400 and empty.value.code == 50006
        with pytest.raises(discord.NotFound) as unknown:
            await general.get_partial_message(123456789012345678).edit(content="x")
        assert unknown.value.code == 10008 and unknown.value.text == "Unknown Message"
        with pytest.raises(discord.Forbidden) as other_author:
            await general.get_partial_message(int(theirs["id"])).edit(content="x")
        assert other_author.value.code == 50005
        assert other_author.value.text == "Cannot edit a message authored by another user"
        # A message id of another channel is unknown here.
        with pytest.raises(discord.NotFound) as elsewhere:
            await (
                client.get_partial_messageable(int(SECRET))
                .get_partial_message(mine.id)
                .edit(content="x")
            )
        assert elsewhere.value.code == 10008
        with pytest.raises(discord.NotFound) as no_channel:
            await (
                client.get_partial_messageable(999999999999999999)
                .get_partial_message(mine.id)
                .edit(content="x")
            )
        assert no_channel.value.code == 10003
        in_dm = await client.get_partial_messageable(int(dm)).send("to bob")
        fake.block_dm(BOB["id"])
        with pytest.raises(discord.Forbidden) as blocked:
            await in_dm.edit(content="x")
        assert blocked.value.code == 50007
        fake.forbid(GENERAL)
        with pytest.raises(discord.Forbidden) as forbidden:
            await mine.edit(content="y")
        assert forbidden.value.code == 50013
    assert [e.content for e in fake.edits] == ["x" * 2000]
    assert fake.message(theirs["id"]) == theirs
    stored = fake.message(mine.id)
    assert stored is not None and stored["content"] == "x" * 2000


async def test_delete_removes_the_message_and_echoes_it(fake: FakeDiscord) -> None:
    async with running() as client:
        channel = client.get_partial_messageable(int(GENERAL))
        mine = await channel.send("oops")
        kept = await channel.send("kept")
        await mine.delete()
        assert fake.message(mine.id) is None
        assert [m["id"] for m in fake.history(GENERAL)] == [str(kept.id)]
        assert [m.id async for m in channel.history(limit=5)] == [kept.id]
        [record] = fake.deletions
        assert (record.bot_id, record.channel_id, record.id) == (BOT_ID, GENERAL, str(mine.id))
        assert record.payload["content"] == "oops"
        await client.until(lambda: client.deleted == [mine.id])
        # Gone for every later call about it.
        with pytest.raises(discord.NotFound) as again:
            await mine.delete()
        assert again.value.code == 10008
        with pytest.raises(discord.NotFound) as edit:
            await mine.edit(content="x")
        assert edit.value.code == 10008
        with pytest.raises(discord.NotFound):
            await channel.fetch_message(mine.id)
        with pytest.raises(discord.HTTPException) as reply:
            await channel.send("re", reference=mine)
        assert reply.value.code == 50035
        # The events were taken without trouble: the session is the first one, still live.
        await fake.push_message(TOKEN, channel_id=GENERAL, content="after", author=ANN)
        await client.until(lambda: [m.content for m in client.from_others()] == ["after"])
    assert len(fake.identifies) == 1 and fake.resumes == []
    assert fake.call_counts[DELETE_MESSAGE] == 2


async def test_delete_of_others_messages_needs_manage_messages(fake: FakeDiscord) -> None:
    dm = fake.add_dm(TOKEN, BOB)
    theirs = await fake.push_message(TOKEN, channel_id=GENERAL, content="spam", author=ANN)
    from_bob = await fake.push_message(TOKEN, channel_id=dm, content="hi", author=BOB)
    async with running() as client:
        general = client.get_partial_messageable(int(GENERAL))
        with pytest.raises(discord.Forbidden) as missing:
            await general.get_partial_message(int(theirs["id"])).delete()
        assert missing.value.code == 50013 and missing.value.text == "Missing Permissions"
        with pytest.raises(discord.Forbidden) as in_dm:
            await (
                client.get_partial_messageable(int(dm))
                .get_partial_message(int(from_bob["id"]))
                .delete()
            )
        assert in_dm.value.code == 50003
        assert fake.message(theirs["id"]) is not None and fake.deletions == []
        fake.grant_manage_messages(GENERAL)
        await general.get_partial_message(int(theirs["id"])).delete()
    assert fake.message(theirs["id"]) is None
    assert [d.id for d in fake.deletions] == [theirs["id"]]


async def test_edit_and_delete_429_are_retried_by_the_library(fake: FakeDiscord) -> None:
    fake.rate_limit_next(times=2, retry_after=0.01, route=EDIT_MESSAGE)
    fake.rate_limit_next(times=1, retry_after=0.01, route=DELETE_MESSAGE)
    async with running() as client:
        mine = await client.get_partial_messageable(int(GENERAL)).send("a")
        edited = await mine.edit(content="b")
        assert edited.content == "b"
        await mine.delete()
    by_route = lambda route: [r.status for r in fake.requests if r.route == route]  # noqa: E731
    assert by_route(EDIT_MESSAGE) == [429, 429, 200]
    assert by_route(DELETE_MESSAGE) == [429, 204]
    assert fake.call_counts[EDIT_MESSAGE] == 3 and fake.call_counts[DELETE_MESSAGE] == 2
    assert [e.content for e in fake.edits] == ["b"] and [d.id for d in fake.deletions] == [
        str(mine.id)
    ]


async def test_edit_and_delete_take_scripted_failures_and_holds(fake: FakeDiscord) -> None:
    fake.fail_next(404, {"message": "Unknown Message", "code": 10008}, route=EDIT_MESSAGE)
    async with running() as client:
        mine = await client.get_partial_messageable(int(GENERAL)).send("a")
        with pytest.raises(discord.NotFound):
            await mine.edit(content="b")
        release = fake.hold_next(route=DELETE_MESSAGE)
        deleting = asyncio.create_task(mine.delete())
        await fake.wait_until(lambda: fake.held == 1)
        assert fake.message(mine.id) is not None
        release.set()
        await deleting
    assert fake.message(mine.id) is None and fake.edits == []
