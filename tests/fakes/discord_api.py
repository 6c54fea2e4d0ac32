"""A strict fake of Discord's REST API and gateway for the real discord.py.

``async with FakeDiscord() as fake:`` then point discord.py at it (both are process
globals: patch them with ``monkeypatch``)::

    discord.http.Route.BASE = fake.api_base                 # http://127.0.0.1:PORT/api/v10
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)

What it checks, like the real service: ``Authorization: Bot <token>`` on every call
but ``GET /gateway`` (401); content over 2000 characters (400 50035) or a message with
nothing in it (400 50006); unknown channels (404 10003), channels of guilds the bot is
not in (403 50001), channels marked with ``forbid`` (403 50013), DMs to users marked
with ``block_dm`` (403 50007); replies to unknown messages unless
``fail_if_not_exists`` is false (400 50035); channels hidden with ``hide_channel`` (403
50001 on every call, and no events from them). A ``nonce`` must be a string or an
integer of at most 25 characters (else 400 50035); with ``enforce_nonce: true`` (what
discord.py sends with every ``nonce=``) a create whose author (the token's bot) already
made a message with the same nonce in the last 5 minutes of ``fake.clock`` answers that
message again (200, same JSON) and creates, records and echoes nothing
(``fake.deduplicated`` counts those); without it nonces are never compared.
``GET /channels/{id}/messages`` reads the history (every message pushed or sent, edits
in place) as Discord does: ``limit`` 1..100 (default 50, else 400 50035), at most one
of ``before``/``after`` (``around`` is not modelled: 400), newest first in every case
(with ``after``: the ``limit`` oldest messages after it, newest first), without the
gateway-only ``guild_id`` and ``member`` fields. Every JSON answer has the exact
``Content-Type: application/json`` discord.py compares against and rate-limit headers
that never make it wait. ``rate_limit_next`` answers 429 with ``Via`` (discord.py then
sleeps ``retry_after`` and retries by itself); ``fail_next`` answers anything;
``hold_next`` keeps matching requests waiting until the test releases them; each takes
a ``route`` such as ``SEND_MESSAGE``, ``EDIT_MESSAGE`` or ``DELETE_MESSAGE``.
``call_counts`` counts requests per route (answered or not), ``requests`` lists them.

``PATCH /channels/{id}/messages/{id}`` (``EDIT_MESSAGE``) edits a message of the bot's
own: the channel checks of a create, then unknown message (404 10008), another
author's (403 50005), content over 2000 characters (400 50035), nothing left in it
(400 50006). The stored message changes in place (``edited_timestamp`` set, history
shows it), the answer is the message (200), ``edits`` records it and the bot's sessions
get MESSAGE_UPDATE. ``DELETE`` on it (``DELETE_MESSAGE``): unknown (404 10008), another
author's in a DM (403 50003) or, without ``grant_manage_messages`` on the channel, in a
guild (403 50013); else 204, the message leaves the history, ``deletions`` records it
and the bot's sessions get MESSAGE_DELETE (both events only with ``echo_own_messages``).

Events are addressed to one bot: ``push_message(token, ...)`` reaches that bot's
sessions only (a guild message is not fanned out to every bot in the guild), and of
those only the ones on the guild's shard (DMs: shard 0). ``GET /gateway/bot`` reports
``recommended_shards``; with ``require_sharding`` a session that asks for fewer is
closed 4011 (the shard rules are in ``tests.fakes.discord_gateway``). What a
bot sends comes back to its own sessions as MESSAGE_CREATE, as on the real gateway.
The websocket side lives in ``tests.fakes.discord_gateway``.

Attachments: a ``push_message`` attachment spec with ``data`` (bytes) is served, like
Discord's CDN, at its ``url`` on this fake (``GET /cdn/attachments/{channel}/{id}/
{name}``, no token needed; 404 for an unknown one); its ``size`` is the data's length
unless the spec says otherwise. Every CDN fetch is in ``cdn_fetches``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

from aiohttp import web

from tests.fakes.discord_gateway import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    GatewayHub,
    IdentifyRecord,
    Identity,
    ResumeRecord,
)

API_PREFIX = "/api/v10"
# Route names for ``fail_next``/``rate_limit_next(route=...)``: method + path template.
SEND_MESSAGE = "POST /channels/{channel_id}/messages"
TRIGGER_TYPING = "POST /channels/{channel_id}/typing"
GET_MESSAGES = "GET /channels/{channel_id}/messages"
EDIT_MESSAGE = "PATCH /channels/{channel_id}/messages/{message_id}"
DELETE_MESSAGE = "DELETE /channels/{channel_id}/messages/{message_id}"
DEFAULT_HISTORY_LIMIT = 50
MAX_HISTORY_LIMIT = 100
MAX_CONTENT_CHARS = 2000
MAX_NONCE_CHARS = 25
NONCE_WINDOW_SECONDS = 300.0  # enforce_nonce: "the past few minutes"
DISCORD_EPOCH_MS = 1_420_070_400_000
DM_CHANNEL = 1
GUILD_TEXT = 0
PUBLIC_THREAD = 11
THREAD_TYPES = frozenset({10, 11, 12})
_PUBLIC_ROUTES = frozenset({"GET /gateway"})
_VOICE_MESSAGE_FLAG = 1 << 13
_REPLY_TYPE = 19

Json = dict[str, Any]


class ApiError(Exception):
    """An error answer; the middleware turns it into the JSON response."""

    def __init__(self, status: int, message: str, code: int, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body: Json = {"message": message, "code": code, **extra}


def _form_error(field_name: str, code: str, message: str) -> ApiError:
    errors = {field_name: {"_errors": [{"code": code, "message": message}]}}
    return ApiError(400, "Invalid Form Body", 50035, errors=errors)


@dataclass(slots=True)
class Bot:
    token: str
    user: Json


@dataclass(slots=True)
class Guild:
    id: str
    name: str
    bots: set[str]  # tokens
    roles: list[Json]
    members: dict[str, Json]  # user id -> member payload
    channel_ids: list[str] = field(default_factory=list)
    joined_at: str = ""


@dataclass(slots=True)
class Channel:
    id: str
    type: int
    name: str = ""
    guild_id: str | None = None
    parent_id: str | None = None
    recipient: Json | None = None  # DMs: the user
    owner_token: str | None = None  # DMs: the bot
    payload: Json = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SentMessage:
    bot_id: str
    channel_id: str
    content: str
    message_reference: Json | None
    allowed_mentions: Json | None
    id: str
    guild_id: str | None
    payload: Json  # the message object the fake answered with
    # time.perf_counter() when the fake accepted it (benchmarks measure latency with it)
    received_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class EditedMessage:
    """A successful edit (``EDIT_MESSAGE``)."""

    bot_id: str
    channel_id: str
    id: str
    content: str  # the message's content after the edit
    payload: Json  # the message object the fake answered with
    received_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class DeletedMessage:
    """A successful delete (``DELETE_MESSAGE``)."""

    bot_id: str
    channel_id: str
    id: str
    payload: Json  # the message as it was when deleted
    received_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class TypingRecord:
    bot_id: str
    channel_id: str


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    route: str  # "POST /channels/{channel_id}/messages"
    path: str
    status: int
    bot_id: str | None


@dataclass(slots=True)
class _Injection:
    route: str | None
    remaining: int
    respond: Callable[[], web.Response]
    skip: int = 0  # matching requests to let through first


@dataclass(slots=True)
class _Hold:
    route: str | None
    remaining: int
    release: asyncio.Event


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body, separators=(",", ":")).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def _bucket_headers(route: str) -> dict[str, str]:
    # Remaining stays above 0 and resets are tiny: discord.py never waits on the fake.
    return {
        "X-RateLimit-Limit": "50",
        "X-RateLimit-Remaining": "49",
        "X-RateLimit-Reset": f"{time.time() + 0.01:.3f}",
        "X-RateLimit-Reset-After": "0.010",
        "X-RateLimit-Bucket": hashlib.sha1(route.encode()).hexdigest()[:16],
    }


_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII only: str.isdigit takes other scripts' digits


def _history_query(query: Mapping[str, str]) -> tuple[int, int | None, int | None]:
    """(limit, before, after) of a history request, validated as Discord does."""
    raw = query.get("limit", str(DEFAULT_HISTORY_LIMIT))
    if not _DIGITS.fullmatch(raw):
        raise _form_error("limit", "NUMBER_TYPE_COERCE", f'Value "{raw}" is not int.')
    limit = int(raw)
    if not 1 <= limit <= MAX_HISTORY_LIMIT:
        raise _form_error("limit", "NUMBER_TYPE_MAX" if limit else "NUMBER_TYPE_MIN",
                          f"int value should be between 1 and {MAX_HISTORY_LIMIT}.")  # fmt: skip
    if "around" in query:
        raise _form_error("around", "UNSUPPORTED", "around is not modelled by the fake.")
    anchors = {}
    for name in ("before", "after"):
        if name in query:
            value = query[name]
            if not _DIGITS.fullmatch(value):
                raise _form_error(name, "NUMBER_TYPE_COERCE", f'Value "{value}" is not snowflake.')
            anchors[name] = int(value)
    if len(anchors) > 1:
        raise _form_error("before", "BASE_TYPE_BAD_COMBINATION", "Only one of before, after.")
    return limit, anchors.get("before"), anchors.get("after")


def _nonce_fields(body: Mapping[str, Any]) -> tuple[str | int | None, bool]:
    """(nonce, enforce_nonce) of a Create Message body, validated as Discord does."""
    nonce = body.get("nonce")
    if nonce is not None:
        if isinstance(nonce, bool) or not isinstance(nonce, str | int):
            raise _form_error("nonce", "BASE_TYPE_BAD_TYPE", "Must be a string or integer.")
        if len(str(nonce)) > MAX_NONCE_CHARS:
            raise _form_error("nonce", "BASE_TYPE_MAX_LENGTH",
                              f"Must be {MAX_NONCE_CHARS} or fewer in length.")  # fmt: skip
    enforce = body.get("enforce_nonce", False)
    if enforce is None:
        enforce = False
    if not isinstance(enforce, bool):
        raise _form_error("enforce_nonce", "BOOLEAN_TYPE_COERCE", f'Value "{enforce}" is not bool.')
    return nonce, enforce


def _rest_message(message: Mapping[str, Any]) -> Json:
    """A stored message as REST returns it: ``guild_id`` and ``member`` (on the message
    and on each mention) come with gateway events only."""
    payload = {k: v for k, v in message.items() if k not in ("guild_id", "member")}
    payload["mentions"] = [
        {k: v for k, v in m.items() if k != "member"} for m in message.get("mentions", ())
    ]
    return payload


def user_payload(user: Mapping[str, Any]) -> Json:
    """A full user object from ``{id, username, global_name?, bot?}`` (extra keys kept,
    the fake's own ``nick``/``roles`` dropped)."""
    base: Json = {
        "id": str(user["id"]),
        "username": str(user.get("username") or f"user{user['id']}"),
        "discriminator": "0",
        "global_name": None,
        "avatar": None,
        "bot": False,
        "public_flags": 0,
    }
    base.update({k: v for k, v in user.items() if k not in ("nick", "roles")})
    base["id"] = str(base["id"])
    return base


class FakeDiscord:
    def __init__(
        self,
        *,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        max_content_chars: int = MAX_CONTENT_CHARS,
        echo_own_messages: bool = True,
        recommended_shards: int = 1,
        require_sharding: bool = False,
    ) -> None:
        if recommended_shards < 1:
            raise ValueError("recommended_shards must be 1 or more")
        self.max_content_chars = max_content_chars
        self.echo_own_messages = echo_own_messages
        self.sent: list[SentMessage] = []
        self.typing: list[TypingRecord] = []
        self.requests: list[RecordedRequest] = []
        self.call_counts: Counter[str] = Counter()  # route ("PATCH /channels/...") -> calls
        self.edits: list[EditedMessage] = []
        self.deletions: list[DeletedMessage] = []
        # Read for the enforce_nonce window; tests swap in a virtual clock to move time.
        self.clock: Callable[[], float] = time.monotonic
        self.deduplicated = 0  # creates answered with an earlier message (enforce_nonce)
        self._bots: dict[str, Bot] = {}
        self._guilds: dict[str, Guild] = {}
        self._channels: dict[str, Channel] = {}
        self._users: dict[str, Json] = {}
        self._messages: dict[str, Json] = {}
        self._cdn: dict[str, bytes] = {}  # attachment files by path
        self.cdn_fetches: list[str] = []
        # (author id, str(nonce)) -> (clock() at creation, the message created), oldest
        # first; every nonce sent is kept, with or without enforce_nonce.
        self._nonces: dict[tuple[str, str], tuple[float, Json]] = {}
        self._blocked_users: set[str] = set()
        self._forbidden: set[str] = set()
        self._managed: set[str] = set()  # channels where the bots have Manage Messages
        self._injections: list[_Injection] = []
        self._holds: list[_Hold] = []
        self._hidden: set[str] = set()
        self.held = 0  # requests waiting on a ``hold_next`` release right now
        self._last_snowflake = 0
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self.gateway = GatewayHub(
            self._identity,
            self._changed,
            lambda: self.gateway_url,
            heartbeat_interval_ms=heartbeat_interval_ms,
            recommended_shards=recommended_shards,
            require_sharding=require_sharding,
        )

    # -- lifecycle -------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        api = API_PREFIX
        app.router.add_get("/gateway", self.gateway.handle)
        app.router.add_get("/cdn/attachments/{channel_id}/{attachment_id}/{name}", self._cdn_get)
        app.router.add_get(f"{api}/users/@me", self._get_me)
        app.router.add_get(f"{api}/oauth2/applications/@me", self._get_application)
        app.router.add_get(f"{api}/gateway", self._get_gateway)
        app.router.add_get(f"{api}/gateway/bot", self._get_gateway_bot)
        app.router.add_post(f"{api}/users/@me/channels", self._open_dm)
        app.router.add_get(f"{api}/channels/{{channel_id}}", self._get_channel)
        app.router.add_post(f"{api}/channels/{{channel_id}}/messages", self._create_message)
        app.router.add_get(f"{api}/channels/{{channel_id}}/messages", self._get_messages)
        app.router.add_get(
            f"{api}/channels/{{channel_id}}/messages/{{message_id}}", self._get_message
        )
        app.router.add_patch(
            f"{api}/channels/{{channel_id}}/messages/{{message_id}}", self._edit_message
        )
        app.router.add_delete(
            f"{api}/channels/{{channel_id}}/messages/{{message_id}}", self._delete_message
        )
        app.router.add_post(f"{api}/channels/{{channel_id}}/typing", self._trigger_typing)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.make_app(), handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        # Open websockets would hold the runner's cleanup until its timeout.
        await self.gateway.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._port}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self._port}/gateway"

    # -- the model ---------------------------------------------------------------------

    def snowflake(self) -> str:
        """A fresh id shaped like Discord's (time-ordered, 18-19 digits)."""
        stamp = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        self._last_snowflake = max(stamp, self._last_snowflake + 1)
        return str(self._last_snowflake)

    def add_bot(self, token: str, user_id: str | int, username: str) -> Json:
        user = user_payload({"id": user_id, "username": username, "bot": True})
        user.update({"verified": True, "mfa_enabled": False, "flags": 0})
        self._bots[token] = Bot(token, user)
        self._users[user["id"]] = user
        return user

    def _remember(self, user: Mapping[str, Any]) -> Json:
        payload = user_payload(user)
        self._users[payload["id"]] = payload
        return payload

    def _member(self, user: Mapping[str, Any], joined_at: str) -> Json:
        return {
            "user": user_payload(user),
            "nick": user.get("nick"),
            "roles": [str(r) for r in user.get("roles", ())],
            "joined_at": joined_at,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "pending": False,
        }

    def add_guild(
        self,
        guild_id: str | int,
        name: str,
        *,
        bots: Sequence[str] = (),
        channels: Sequence[Mapping[str, Any]] = (),
        roles: Sequence[Mapping[str, Any]] = (),
        threads: Sequence[Mapping[str, Any]] = (),
        members: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """``channels``: {id, name, type=0}; ``roles``: {id, name, ...};
        ``threads``: {id, name, parent_id, type=11}; ``members``: user dicts with an
        optional ``nick`` and ``roles``. The bots become members too."""
        gid = str(guild_id)
        joined = _now_iso()
        everyone = {"id": gid, "name": "@everyone"}
        guild = Guild(gid, name, set(bots), [], {}, joined_at=joined)
        for position, role in enumerate([everyone, *roles]):
            guild.roles.append({
                "permissions": "0", "position": position, "color": 0,
                "colors": {"primary_color": 0}, "hoist": False, "managed": False,
                "mentionable": False, "flags": 0, "icon": None, "unicode_emoji": None,
                **role, "id": str(role["id"]),
            })  # fmt: skip
        for user in [*(self._bots[t].user for t in bots), *members]:
            self._remember(user)
            guild.members[str(user["id"])] = self._member(user, joined)
        owner = self._bots[bots[0]].user["id"] if bots else "0"
        for position, spec in enumerate(channels):
            self._add_guild_channel(guild, spec, position, owner)
        for spec in threads:
            self._add_guild_channel(guild, {"type": PUBLIC_THREAD, **spec}, 0, owner)
        self._guilds[gid] = guild

    def _add_guild_channel(
        self, guild: Guild, spec: Mapping[str, Any], position: int, owner_id: str
    ) -> None:
        cid, kind = str(spec["id"]), int(spec.get("type", GUILD_TEXT))
        payload: Json = {
            "id": cid, "type": kind, "name": spec["name"], "guild_id": guild.id,
            "position": position, "permission_overwrites": [], "parent_id": None,
            "topic": None, "nsfw": False, "rate_limit_per_user": 0, "last_message_id": None,
            "flags": 0,
        }  # fmt: skip
        parent = spec.get("parent_id")
        if kind in THREAD_TYPES:
            payload.update({
                "parent_id": str(parent), "owner_id": owner_id, "message_count": 0,
                "member_count": 0, "total_message_sent": 0,
                "thread_metadata": {
                    "archived": False, "auto_archive_duration": 1440,
                    "archive_timestamp": _now_iso(), "locked": False,
                    "create_timestamp": _now_iso(),
                },
            })  # fmt: skip
            for key in ("permission_overwrites", "position", "topic", "nsfw"):
                del payload[key]
        elif parent is not None:
            payload["parent_id"] = str(parent)  # a category
        self._channels[cid] = Channel(
            cid, kind, spec["name"], guild.id, payload["parent_id"], payload=payload
        )
        guild.channel_ids.append(cid)

    def add_dm(self, token: str, user: Mapping[str, Any]) -> str:
        """The DM channel between a bot and a user (made once); returns its id."""
        recipient = self._remember(user)
        for channel in self._channels.values():
            if (
                channel.owner_token == token
                and (channel.recipient or {}).get("id") == recipient["id"]
            ):
                return channel.id
        cid = self.snowflake()
        self._channels[cid] = Channel(cid, DM_CHANNEL, recipient=recipient, owner_token=token)
        return cid

    def block_dm(self, user_id: str | int) -> None:
        """The user blocked the bots (or closed DMs): DMs to them get 403 50007."""
        self._blocked_users.add(str(user_id))

    def forbid(self, channel_id: str | int) -> None:
        """The bots lack permission to post in the channel: 403 50013."""
        self._forbidden.add(str(channel_id))

    def grant_manage_messages(self, channel_id: str | int) -> None:
        """The bots get Manage Messages in the channel: they may delete others' messages."""
        self._managed.add(str(channel_id))

    def hide_channel(self, channel_id: str | int) -> None:
        """The bots lost View Channel there: every call about it answers 403 50001, and
        messages pushed to it are kept in its history but reach no bot."""
        self._hidden.add(str(channel_id))

    def history(self, channel_id: str | int) -> list[Json]:
        """Every message of the channel, oldest first (as stored, gateway fields too)."""
        cid = str(channel_id)
        return sorted(
            (m for m in self._messages.values() if m["channel_id"] == cid),
            key=lambda m: int(m["id"]),
        )

    def message(self, message_id: str | int) -> Json | None:
        return self._messages.get(str(message_id))

    def _identity(self, token: str) -> Identity | None:
        bot = self._bots.get(token)
        if bot is None:
            return None
        application = {"id": bot.user["id"], "flags": 0}
        guilds = [self._guild_create(g) for g in self._guilds.values() if token in g.bots]
        return Identity(bot.user, application, guilds)

    def _guild_create(self, guild: Guild) -> Json:
        channels = [self._channels[c] for c in guild.channel_ids]
        return {
            "id": guild.id, "name": guild.name, "unavailable": False, "icon": None,
            "owner_id": "0", "joined_at": guild.joined_at, "large": False,
            "member_count": len(guild.members), "roles": guild.roles,
            "members": list(guild.members.values()),
            "channels": [c.payload for c in channels if c.type not in THREAD_TYPES],
            "threads": [c.payload for c in channels if c.type in THREAD_TYPES],
            "emojis": [], "stickers": [], "features": [], "presences": [], "voice_states": [],
            "stage_instances": [], "guild_scheduled_events": [], "soundboard_sounds": [],
            "verification_level": 0, "default_message_notifications": 0,
            "explicit_content_filter": 0, "mfa_level": 0, "nsfw_level": 0, "premium_tier": 0,
            "afk_timeout": 300, "system_channel_id": None, "preferred_locale": "en-US",
            "description": None, "lazy": True,
        }  # fmt: skip

    async def push_message(
        self,
        token: str,
        *,
        channel_id: str | int,
        content: str = "",
        author: Mapping[str, Any],
        guild_id: str | int | None = None,
        mentions: Sequence[Mapping[str, Any]] = (),
        mention_roles: Sequence[str | int] = (),
        attachments: Sequence[Mapping[str, Any]] = (),
        referenced_message: Mapping[str, Any] | None = None,
        stickers: Sequence[Mapping[str, Any]] = (),
        edited: bool = False,
        message_id: str | int | None = None,
        mention_everyone: bool = False,
        message_type: int | None = None,
    ) -> Json:
        """A user's message, sent to the bot's sessions as MESSAGE_CREATE (MESSAGE_UPDATE
        when ``edited``; pass the original ``message_id``). ``guild_id`` defaults to the
        channel's guild. ``author``/``mentions``: user dicts, ``nick`` for a member nick.
        Returns the message object (as the bot would see it with the content intent)."""
        if token not in self._bots:
            raise ValueError(f"unknown bot token {token!r}")
        cid = str(channel_id)
        channel = self._channels.get(cid)
        gid = str(guild_id) if guild_id is not None else (channel.guild_id if channel else None)
        guild = self._guilds.get(gid or "")
        mid = str(message_id) if message_id is not None else self.snowflake()
        previous = self._messages.get(mid)
        message: Json = {
            "id": mid, "channel_id": cid, "author": self._remember(author),
            "content": content,
            "timestamp": previous["timestamp"] if previous else _now_iso(),
            "edited_timestamp": _now_iso() if edited else None,
            "tts": False, "mention_everyone": mention_everyone,
            "mentions": [self._mention(m, guild) for m in mentions],
            "mention_roles": [str(r) for r in mention_roles],
            "attachments": [self._attachment(cid, a) for a in attachments],
            "embeds": [], "pinned": False, "components": [], "flags": 0,
            "type": message_type if message_type is not None else 0,
            "sticker_items": [
                {"format_type": 1, **s, "id": str(s.get("id") or self.snowflake())}
                for s in stickers
            ],
        }  # fmt: skip
        if any("waveform" in a for a in attachments):
            message["flags"] |= _VOICE_MESSAGE_FLAG
        if gid is not None:
            message["guild_id"] = gid
            message["member"] = self._partial_member(author, guild)
        if referenced_message is not None:
            message["type"] = message_type if message_type is not None else _REPLY_TYPE
            message["message_reference"] = self._reference_to(referenced_message)
            message["referenced_message"] = dict(referenced_message)
        self._messages[mid] = message
        if cid not in self._hidden:
            await self.gateway.dispatch(
                token, "MESSAGE_UPDATE" if edited else "MESSAGE_CREATE", message
            )
        return message

    def _partial_member(self, user: Mapping[str, Any], guild: Guild | None) -> Json:
        """The ``member`` object messages carry (no ``user`` key): the registered member,
        with a ``nick`` given in ``user`` taking precedence."""
        known = guild.members.get(str(user["id"])) if guild else None
        member = dict(known or self._member(user, guild.joined_at if guild else _now_iso()))
        del member["user"]
        if user.get("nick"):
            member["nick"] = user["nick"]
        return member

    def _mention(self, user: Mapping[str, Any], guild: Guild | None) -> Json:
        payload = dict(self._remember(user))
        if guild is not None:
            payload["member"] = self._partial_member(user, guild)
        return payload

    def _attachment(self, channel_id: str, spec: Mapping[str, Any]) -> Json:
        aid = str(spec.get("id") or self.snowflake())
        name = str(spec.get("filename") or "file")
        spec = dict(spec)
        data = spec.pop("data", None)
        if data is None:
            url = f"https://cdn.discordapp.com/attachments/{channel_id}/{aid}/{name}"
            return {"size": 0, "url": url, "proxy_url": url, **spec, "id": aid, "filename": name}
        path = f"/cdn/attachments/{channel_id}/{aid}/{name}"
        self._cdn[path] = bytes(data)
        url = f"http://127.0.0.1:{self._port}{path}"
        return {"size": len(data), "url": url, "proxy_url": url, **spec, "id": aid,
                "filename": name}  # fmt: skip

    async def _cdn_get(self, request: web.Request) -> web.Response:
        data = self._cdn.get(request.path)
        if data is None:
            return web.Response(status=404, text="Not Found")
        self.cdn_fetches.append(request.path)
        return web.Response(body=data, content_type="application/octet-stream")

    @staticmethod
    def _reference_to(message: Mapping[str, Any]) -> Json:
        reference: Json = {"type": 0, "message_id": message["id"]}
        reference["channel_id"] = message["channel_id"]
        if message.get("guild_id"):
            reference["guild_id"] = message["guild_id"]
        return reference

    # -- faults ------------------------------------------------------------------------

    def rate_limit_next(
        self,
        times: int = 1,
        retry_after: float = 0.05,
        global_: bool = False,
        *,
        route: str | None = None,
        after: int = 0,
    ) -> None:
        """The next ``times`` authenticated calls (to ``route`` only, when given, e.g.
        ``SEND_MESSAGE``; after letting ``after`` of them through) answer 429 with
        ``Via``, so discord.py retries by itself."""

        def respond() -> web.Response:
            headers = {
                "Via": "1.1 google",
                "Retry-After": str(max(1, math.ceil(retry_after))),
                "X-RateLimit-Scope": "global" if global_ else "user",
            }
            if global_:
                headers["X-RateLimit-Global"] = "true"
            body = {"message": "You are being rate limited.", "retry_after": retry_after}
            return _json(429, {**body, "global": global_}, headers)

        self._injections.append(_Injection(route, times, respond, after))

    def fail_next(
        self,
        status: int,
        body: Mapping[str, Any] | None = None,
        times: int = 1,
        *,
        route: str | None = None,
        after: int = 0,
    ) -> None:
        """The next ``times`` authenticated calls (to ``route``, when given, after letting
        ``after`` of them through) answer ``status`` with ``body``. Beware: discord.py
        retries 500/502/504/524 for ~25 s; 503 is not retried."""
        payload = dict(body) if body is not None else {"message": f"{status}: Error", "code": 0}
        self._injections.append(_Injection(route, times, lambda: _json(status, payload), after))

    def hold_next(self, times: int = 1, *, route: str | None = None) -> asyncio.Event:
        """The next ``times`` authenticated calls (to ``route``, when given) wait until
        the returned event is set, then are answered from the state at that moment."""
        release = asyncio.Event()
        self._holds.append(_Hold(route, times, release))
        return release

    # ``shard``: only the bot's connection(s) on that shard; None: all of them.

    async def request_reconnect(self, token: str, *, shard: int | None = None) -> int:
        return await self.gateway.request_reconnect(token, shard=shard)

    async def drop_connection(
        self, token: str, code: int = 4000, *, shard: int | None = None
    ) -> int:
        return await self.gateway.drop_connection(token, code, shard=shard)

    async def sever_connection(self, token: str, *, shard: int | None = None) -> int:
        return await self.gateway.sever_connection(token, shard=shard)

    async def invalidate_session(
        self, token: str, *, resumable: bool, shard: int | None = None
    ) -> int:
        return await self.gateway.invalidate_session(token, resumable=resumable, shard=shard)

    def replay_seen_on_resume(self, count: int) -> None:
        self.gateway.replay_seen_on_resume(count)

    # -- records -----------------------------------------------------------------------

    @property
    def identifies(self) -> list[IdentifyRecord]:
        return self.gateway.identifies

    @property
    def resumes(self) -> list[ResumeRecord]:
        return self.gateway.resumes

    def sent_to(self, channel_id: str | int) -> list[SentMessage]:
        return [m for m in self.sent if m.channel_id == str(channel_id)]

    # ``timeout`` parameters (ASYNC109): a bounded wait is the whole point of these helpers,
    # and tests read better with the bound at the call than wrapped around it.
    async def wait_until(
        self,
        predicate: Callable[[], bool],
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> None:
        """Wait (no polling) until ``predicate()`` holds after some request or event."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_sent(self, count: int, timeout: float = 10.0) -> list[SentMessage]:  # noqa: ASYNC109
        await self.wait_until(lambda: len(self.sent) >= count, timeout)
        return list(self.sent)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- HTTP plumbing -----------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if not request.path.startswith(API_PREFIX + "/"):
            return await handler(request)  # the gateway websocket authenticates itself
        resource = request.match_info.route.resource
        template = resource.canonical if resource is not None else request.path
        route = f"{request.method} {template.removeprefix(API_PREFIX)}"
        bot = self._authenticate(request)
        response: web.StreamResponse
        if bot is None and route not in _PUBLIC_ROUTES:
            response = _json(401, {"message": "401: Unauthorized", "code": 0})
        else:
            await self._wait_if_held(route)
            response = self._injected(route) or await self._answer(request, handler, route)
        bot_id = bot.user["id"] if bot else None
        self.call_counts[route] += 1
        self.requests.append(RecordedRequest(request.method, route, request.path,
                                             response.status, bot_id))  # fmt: skip
        await self._notify()
        return response

    async def _answer(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        route: str,
    ) -> web.StreamResponse:
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _json(exc.status, exc.body)
        except web.HTTPException as exc:  # no such route, wrong method
            response = _json(exc.status, {"message": f"{exc.status}: {exc.reason}", "code": 0})
        response.headers.update(_bucket_headers(route))
        return response

    def _authenticate(self, request: web.Request) -> Bot | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return self._bots.get(token) if scheme == "Bot" else None

    async def _wait_if_held(self, route: str) -> None:
        hold = next((h for h in self._holds if h.route in (None, route)), None)
        if hold is None:
            return
        hold.remaining -= 1
        if hold.remaining <= 0:
            self._holds.remove(hold)
        self.held += 1
        await self._notify()
        try:
            await hold.release.wait()
        finally:
            self.held -= 1

    def _injected(self, route: str) -> web.Response | None:
        for injection in self._injections:
            if injection.route in (None, route):
                if injection.skip > 0:
                    injection.skip -= 1
                    return None
                injection.remaining -= 1
                if injection.remaining <= 0:
                    self._injections.remove(injection)
                return injection.respond()
        return None

    def _bot(self, request: web.Request) -> Bot:
        bot = self._authenticate(request)
        assert bot is not None  # the middleware answered 401 otherwise
        return bot

    def _visible_channel(self, bot: Bot, channel_id: str) -> Channel:
        channel = self._channels.get(channel_id)
        if channel is None:
            raise ApiError(404, "Unknown Channel", 10003)
        if channel.id in self._hidden:
            raise ApiError(403, "Missing Access", 50001)
        if channel.type == DM_CHANNEL:
            visible = channel.owner_token == bot.token
        else:
            guild = self._guilds.get(channel.guild_id or "")
            visible = guild is not None and bot.token in guild.bots
        if not visible:
            raise ApiError(403, "Missing Access", 50001)
        return channel

    def _check_can_post(self, channel: Channel) -> None:
        if channel.id in self._forbidden:
            raise ApiError(403, "Missing Permissions", 50013)
        if channel.recipient is not None and channel.recipient["id"] in self._blocked_users:
            raise ApiError(403, "Cannot send messages to this user", 50007)

    @staticmethod
    def _channel_payload(channel: Channel) -> Json:
        if channel.type == DM_CHANNEL:
            recipients = [channel.recipient] if channel.recipient else []
            return {"id": channel.id, "type": DM_CHANNEL, "recipients": recipients,
                    "last_message_id": None, "flags": 0}  # fmt: skip
        return dict(channel.payload)

    # -- REST handlers -----------------------------------------------------------------

    async def _get_me(self, request: web.Request) -> web.Response:
        return _json(200, self._bot(request).user)

    async def _get_application(self, request: web.Request) -> web.Response:
        user = self._bot(request).user
        owner = user_payload({"id": "100000000000000001", "username": "owner"})
        return _json(200, {
            "id": user["id"], "name": user["username"], "description": "", "icon": None,
            "bot_public": True, "bot_require_code_grant": False, "owner": owner,
            "verify_key": "0" * 64, "flags": 0, "team": None, "bot": user,
            "summary": "", "rpc_origins": [], "redirect_uris": [],
        })  # fmt: skip

    async def _get_gateway(self, request: web.Request) -> web.Response:
        return _json(200, {"url": self.gateway_url})

    async def _get_gateway_bot(self, request: web.Request) -> web.Response:
        limit = {"total": 1000, "remaining": 999, "reset_after": 86_400_000, "max_concurrency": 1}
        shards = self.gateway.recommended_shards
        return _json(200, {"url": self.gateway_url, "shards": shards, "session_start_limit": limit})

    async def _get_channel(self, request: web.Request) -> web.Response:
        channel = self._visible_channel(self._bot(request), request.match_info["channel_id"])
        return _json(200, self._channel_payload(channel))

    async def _open_dm(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        user = self._users.get(str(body.get("recipient_id")))
        if user is None:
            raise ApiError(404, "Unknown User", 10013)
        cid = self.add_dm(self._bot(request).token, user)
        return _json(200, self._channel_payload(self._channels[cid]))

    async def _get_message(self, request: web.Request) -> web.Response:
        channel = self._visible_channel(self._bot(request), request.match_info["channel_id"])
        message = self._messages.get(request.match_info["message_id"])
        if message is None or message["channel_id"] != channel.id:
            raise ApiError(404, "Unknown Message", 10008)
        return _json(200, message)

    async def _get_messages(self, request: web.Request) -> web.Response:
        channel = self._visible_channel(self._bot(request), request.match_info["channel_id"])
        limit, before, after = _history_query(request.query)
        older_first = self.history(channel.id)
        if after is not None:
            page = [m for m in older_first if int(m["id"]) > after][:limit]
        else:
            if before is not None:
                older_first = [m for m in older_first if int(m["id"]) < before]
            page = older_first[-limit:]
        return _json(200, [_rest_message(m) for m in reversed(page)])

    async def _trigger_typing(self, request: web.Request) -> web.Response:
        bot = self._bot(request)
        channel = self._visible_channel(bot, request.match_info["channel_id"])
        self._check_can_post(channel)
        self.typing.append(TypingRecord(bot.user["id"], channel.id))
        return web.Response(status=204)

    @staticmethod
    async def _read_body(request: web.Request) -> Json:
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            raw = form.get("payload_json")
            text = raw if isinstance(raw, str) else "{}"
        else:
            text = await request.text()
        try:
            body = json.loads(text) if text.strip() else {}
        except ValueError:
            raise ApiError(400, "The request body contains invalid JSON.", 50109) from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body contains invalid JSON.", 50109)
        return body

    def _content(self, body: Json) -> str:
        content = body.get("content") or ""
        if not isinstance(content, str):
            raise _form_error("content", "STRING_TYPE_CONVERT", "Could not interpret as string.")
        if len(content) > self.max_content_chars:
            raise _form_error("content", "BASE_TYPE_MAX_LENGTH",
                              f"Must be {self.max_content_chars} or fewer in length.")  # fmt: skip
        return content

    async def _create_message(self, request: web.Request) -> web.Response:
        bot = self._bot(request)
        channel = self._visible_channel(bot, request.match_info["channel_id"])
        body = await self._read_body(request)
        content = self._content(body)
        files = request.content_type.startswith("multipart/")
        if not content.strip() and not (body.get("embeds") or body.get("sticker_ids") or files):
            raise ApiError(400, "Cannot send an empty message", 50006)
        nonce, enforce = _nonce_fields(body)
        self._check_can_post(channel)
        # No await from this lookup until the nonce is recorded below: a concurrent
        # retry with the same nonce sees either nothing or the finished message.
        nonce_key = (bot.user["id"], str(nonce)) if nonce is not None else None
        if enforce and nonce_key is not None:
            earlier = self._recent_nonce(nonce_key)
            if earlier is not None:
                self.deduplicated += 1
                return _json(200, earlier)
        reference, referenced = self._resolve_reference(channel, body.get("message_reference"))
        message: Json = {
            "id": self.snowflake(), "channel_id": channel.id, "author": bot.user,
            "content": content, "timestamp": _now_iso(), "edited_timestamp": None,
            "tts": bool(body.get("tts")), "mention_everyone": False, "mentions": [],
            "mention_roles": [], "attachments": [], "embeds": body.get("embeds") or [],
            "pinned": False, "type": _REPLY_TYPE if reference else 0, "flags": 0,
            "components": [], "sticker_items": [], "nonce": nonce,
        }  # fmt: skip
        if channel.guild_id:
            message["guild_id"] = channel.guild_id
        if reference is not None:
            message["message_reference"] = reference
            message["referenced_message"] = referenced
        self._messages[message["id"]] = message
        if nonce_key is not None:
            self._nonces.pop(nonce_key, None)  # re-inserted last: the dict stays time-ordered
            self._nonces[nonce_key] = (self.clock(), message)
        self.sent.append(SentMessage(
            bot.user["id"], channel.id, content, body.get("message_reference"),
            body.get("allowed_mentions"), message["id"], channel.guild_id, message,
        ))  # fmt: skip
        if self.echo_own_messages:
            await self.gateway.dispatch(bot.token, "MESSAGE_CREATE", message)
        return _json(200, message)

    def _channel_message(self, channel: Channel, message_id: str) -> Json:
        message = self._messages.get(message_id)
        if message is None or message["channel_id"] != channel.id:
            raise ApiError(404, "Unknown Message", 10008)
        return message

    async def _edit_message(self, request: web.Request) -> web.Response:
        bot = self._bot(request)
        channel = self._visible_channel(bot, request.match_info["channel_id"])
        body = await self._read_body(request)
        content = self._content(body) if "content" in body else None  # absent: kept
        original = self._channel_message(channel, request.match_info["message_id"])
        if original["author"]["id"] != bot.user["id"]:
            raise ApiError(403, "Cannot edit a message authored by another user", 50005)
        self._check_can_post(channel)
        edited: Json = {**original, "edited_timestamp": _now_iso()}
        if content is not None:
            edited["content"] = content
        for key in ("embeds", "components"):
            if key in body:
                edited[key] = body[key] or []
        if "attachments" in body:  # the ones to keep, by id
            keep = {str(a.get("id")) for a in body["attachments"] or () if isinstance(a, dict)}
            edited["attachments"] = [a for a in original["attachments"] if a["id"] in keep]
        files = request.content_type.startswith("multipart/")
        if not edited["content"].strip() and not (
            edited["embeds"] or edited["attachments"] or edited["sticker_items"] or files
        ):
            raise ApiError(400, "Cannot send an empty message", 50006)
        self._messages[edited["id"]] = edited
        for nonce_key, (at, message) in self._nonces.items():
            if message["id"] == edited["id"]:
                self._nonces[nonce_key] = (at, edited)  # a deduplicated create answers it as now
        self.edits.append(
            EditedMessage(bot.user["id"], channel.id, edited["id"], edited["content"], edited)
        )
        if self.echo_own_messages:
            await self.gateway.dispatch(bot.token, "MESSAGE_UPDATE", edited)
        return _json(200, edited)

    async def _delete_message(self, request: web.Request) -> web.Response:
        bot = self._bot(request)
        channel = self._visible_channel(bot, request.match_info["channel_id"])
        message = self._channel_message(channel, request.match_info["message_id"])
        if message["author"]["id"] != bot.user["id"]:
            if channel.type == DM_CHANNEL:
                raise ApiError(403, "Cannot execute action on a DM channel", 50003)
            if channel.id not in self._managed:
                raise ApiError(403, "Missing Permissions", 50013)
        del self._messages[message["id"]]
        for key in [k for k, (_, m) in self._nonces.items() if m["id"] == message["id"]]:
            del self._nonces[key]
        self.deletions.append(DeletedMessage(bot.user["id"], channel.id, message["id"], message))
        if self.echo_own_messages:
            event: Json = {"id": message["id"], "channel_id": channel.id}
            if channel.guild_id:
                event["guild_id"] = channel.guild_id
            await self.gateway.dispatch(bot.token, "MESSAGE_DELETE", event)
        return web.Response(status=204)

    def _recent_nonce(self, key: tuple[str, str]) -> Json | None:
        """The message this author created with this nonce within the window, if any."""
        now = self.clock()
        while self._nonces:
            oldest = next(iter(self._nonces))
            if now - self._nonces[oldest][0] < NONCE_WINDOW_SECONDS:
                break
            del self._nonces[oldest]
        found = self._nonces.get(key)
        return found[1] if found is not None else None

    def _resolve_reference(
        self, channel: Channel, requested: Any
    ) -> tuple[Json | None, Json | None]:
        """(message_reference, referenced_message) for the answer; a reference to a
        message that is not in this channel fails unless fail_if_not_exists is false."""
        if not requested:
            return None, None
        if not isinstance(requested, dict):
            raise _form_error("message_reference", "MODEL_TYPE_CONVERT", "Invalid reference.")
        target = self._messages.get(str(requested.get("message_id")))
        if target is None or target["channel_id"] != channel.id:
            if requested.get("fail_if_not_exists", True) is False:
                return None, None
            raise _form_error("message_reference", "MESSAGE_REFERENCE_UNKNOWN_MESSAGE",
                              "Unknown message")  # fmt: skip
        return self._reference_to(target), target
