"""The discord.py client of one Discord account, and how to read its ends and events.

Inbound order: discord.py runs every event handler as its own task, so two messages
from one channel could reach the gateway out of order. The client hands events over
in ``dispatch`` instead, which runs inside the websocket read loop in the order the
gateway sent them, to its account's ``on_event``.

Hostile events: discord.py parses each gateway event (``ConnectionState.parsers``)
inside its read loop, and an exception there ends ``Client.start``: one malformed
MESSAGE_CREATE would stop the account for good. Every parser is wrapped so that such
an event is logged and skipped.

Shards: one shard is a ``discord.Client(shard_id=, shard_count=)``, several a
``discord.AutoShardedClient`` (one websocket per shard), and ``shard_count = 1`` the
unsharded client of before. Session events (connect, READY, RESUMED, disconnect) are
read per shard (discord.py's ``shard_*`` events). 4010 (invalid shard) and 4011
(sharding required), like a refused login, are fatal: retrying cannot help.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import discord
import yarl
from discord.gateway import DiscordWebSocket

from parley.channels.config import DiscordConfig

logger = logging.getLogger("parley.channels.discord")

# on_ready waits this long after the last GUILD_CREATE (discord.py's default is 2 s).
# Nothing here waits for on_ready, so the value only keeps the library's own bookkeeping
# brisk; messages of a guild that arrives later are handled all the same.
GUILD_READY_TIMEOUT_SECONDS = 0.1
# A failed login cannot be fixed by trying again.
_FATAL = (discord.LoginFailure, discord.PrivilegedIntentsRequired)
# Nor can these gateway closes (Discord's "do not reconnect" codes): a bad token, bad
# shard, too few shards, a bad API version, bad or disallowed intents.
CLOSE_INVALID_SHARD = 4010
CLOSE_SHARDING_REQUIRED = 4011
_FATAL_CLOSE_CODES = frozenset(
    {4004, CLOSE_INVALID_SHARD, CLOSE_SHARDING_REQUIRED, 4012, 4013, 4014}
)
# discord.py's per-shard twins of the session events. An AutoShardedClient also sends
# the plain ones, without the shard id; a single-shard client only the plain ones.
_SHARD_EVENTS = {
    "shard_connect": "connect",
    "shard_ready": "ready",
    "shard_resumed": "resumed",
    "shard_disconnect": "disconnect",
}
_SESSION_EVENTS = frozenset(_SHARD_EVENTS.values())


class ClientOwner(Protocol):
    """The account a client belongs to (``discord_adapter._Account``)."""

    @property
    def name(self) -> str: ...
    @property
    def shards(self) -> tuple[int, ...]: ...
    @property
    def shard_count(self) -> int: ...
    def on_event(self, event: str, args: tuple[Any, ...]) -> None: ...


def is_fatal(exc: BaseException | None) -> bool:
    """A client ``start`` that ended with ``exc`` must not be restarted."""
    if isinstance(exc, discord.ConnectionClosed):
        return exc.code in _FATAL_CLOSE_CODES
    return isinstance(exc, _FATAL)


def why_stopped(runner: asyncio.Task[None]) -> str:
    """Why the task running a client's ``start`` ended, for an operator."""
    exc = None if runner.cancelled() else runner.exception()
    if isinstance(exc, discord.LoginFailure):
        return "login failed: the token was refused"
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return "enable the Message Content intent (Developer Portal → Bot)"
    if isinstance(exc, discord.ConnectionClosed) and exc.code == CLOSE_INVALID_SHARD:
        return "Discord refused the shard (4010): check shard_count and shard_ids"
    if isinstance(exc, discord.ConnectionClosed) and exc.code == CLOSE_SHARDING_REQUIRED:
        return "Discord requires more shards (4011): raise shard_count"
    return f"the client stopped while connecting: {exc!r}"


def session_event(
    client: discord.Client, shards: tuple[int, ...], event: str, args: tuple[Any, ...]
) -> tuple[str, int] | None:
    """(event, shard id) for a shard's session event, else None."""
    if isinstance(client, discord.AutoShardedClient):
        # Only the shard_* twins say which shard; the plain ones are skipped.
        plain = _SHARD_EVENTS.get(event)
        return None if plain is None or not args else (plain, int(args[0]))
    if event in _SESSION_EVENTS:
        return event, shards[0]
    return None


def _intents() -> discord.Intents:
    intents = discord.Intents.default()
    # Privileged: without it guild messages arrive blank unless they mention the bot.
    intents.message_content = True
    intents.dm_messages = True
    intents.guild_messages = True
    return intents


def point_library_at(config: DiscordConfig) -> None:
    # discord.py keeps both endpoints in class attributes, so they are process-wide:
    # every account (and any other discord.py client in this process) talks to the same
    # API and gateway. A deployment has one Discord (or one proxy), so that is fine.
    discord.http.Route.BASE = config.api_base_url
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(config.gateway_url)


def _guarded(account: str, event: str, parser: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(parser)
    def parse(data: Any) -> None:
        try:
            parser(data)
        except Exception as exc:
            # Not the payload: it may be anybody's message text.
            logger.error(
                "discord %s: cannot parse a %s event (%s: %.200s); skipping it",
                account, event, type(exc).__name__, exc, exc_info=True,
            )  # fmt: skip

    return parse


class _GatewayClient(discord.Client):
    """One gateway connection (unsharded, or one shard: ``shard_id``, ``shard_count``)."""

    def __init__(self, account: ClientOwner, **sharding: Any) -> None:
        super().__init__(
            intents=_intents(), guild_ready_timeout=GUILD_READY_TIMEOUT_SECONDS, **sharding
        )
        self._account = account
        # The websocket looks parsers up in this very dict (``ws._discord_parsers``), so
        # wrapping its entries in place guards every event, on every (re)connection.
        parsers = self._connection.parsers
        for event, parser in list(parsers.items()):
            parsers[event] = _guarded(account.name, event, parser)

    def dispatch(self, event: str, /, *args: Any, **kwargs: Any) -> None:
        super().dispatch(event, *args, **kwargs)
        # Called from the gateway read loop, in gateway order (see the module docstring).
        self._account.on_event(event, args)


class _ShardedGatewayClient(_GatewayClient, discord.AutoShardedClient):
    """Several shards of one account (``shard_ids``, ``shard_count``), a websocket each;
    the same guarded parsers and ordered dispatch as ``_GatewayClient``."""


def new_client(account: ClientOwner) -> discord.Client:
    """A fresh client for ``account``'s shards."""
    shards, count = account.shards, account.shard_count
    if count == 1:
        return _GatewayClient(account)  # no shard field in IDENTIFY, as before sharding
    if len(shards) == 1:
        return _GatewayClient(account, shard_id=shards[0], shard_count=count)
    return _ShardedGatewayClient(account, shard_ids=list(shards), shard_count=count)
