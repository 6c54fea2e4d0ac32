"""The Discord channel: one discord.py client per bot account.

(Named ``discord_adapter`` because a ``channels/discord.py`` would shadow the library.)

Inbound order: each client hands its events over in order (``channels.discord_client``);
they are normalised there (no await) into a per-account queue, and one consumer task
per account awaits the inbound handler for each in turn.

Outbound: a reply is split at Markdown boundaries into parts of at most 2000
characters and sent part by part (``channels.discord_send``: quotes, nonces, errors).

Hostile events: every parser of the client is guarded (``channels.discord_client``).
As a second line of defence, a client whose ``start`` ends while the account is
running is logged and replaced by a fresh one, with backoff.

A message the gateway could not store (the handler raises ``InboundNotStored``: state
storage refuses writes) is not dropped, since Discord never redelivers: the consumer
hands the same message over again after a backoff (``STORE_RETRY_INITIAL_SECONDS``
doubling to ``STORE_RETRY_MAX_SECONDS``), the queue waiting behind it so that order
is kept, until the handler takes it or the account stops (stop ends the wait at once;
the message is then lost, and logged). Any other handler error is logged and the
message dropped: a poisoned message must not wedge the account.

Lost sessions: every READY after the account's first (a non-resumable invalid session,
a replaced client) starts a backfill of the channels' history since the last message
seen (``channels.discord_backfill``); a RESUMED needs none, Discord replays the gap.
After a restart, ``catch_up`` (called by the gateway before ``start``) seeds those
marks from what the gateway stored, and the first READY backfills too.

Shards: an account connects the shards its config names (``shard_ids`` of
``shard_count``), so that replicas sharing one database split a bot between them;
Discord then sends each replica only its shards' guilds (DMs: shard 0). Each shard has
its own gateway session: connect, READY, RESUMED and disconnects are tracked per shard,
the account is ``up`` when all of its shards are, and a lost session backfills only
that shard's channels. 4010 (invalid shard) and 4011 (sharding required) are
configuration errors: the account stops rather than retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import discord

from parley.channels.base import (
    TYPING_DELAY_SECONDS,
    Attachment,
    AttachmentUnavailable,
    ChannelCapabilities,
    ChannelStartError,
    ChatPolicy,
    DeliveryError,
    DeliveryResult,
    InboundHandler,
    InboundMessage,
    InboundNotStored,
    OutboundMessage,
    ReplyDraft,
    SeenMark,
    StreamMode,
    WebhookRoute,
)
from parley.channels.config import DiscordConfig
from parley.channels.discord_backfill import Backfill
from parley.channels.discord_client import (
    is_fatal,
    new_client,
    point_library_at,
    session_event,
    why_stopped,
)
from parley.channels.discord_inbound import normalise_edit, normalise_message
from parley.channels.discord_send import MAX_MESSAGE_CHARS, NETWORK_ERRORS, deliver
from parley.channels.discord_stream import DRAFT_INTERVAL_SECONDS, DiscordSlots, message_order
from parley.channels.preview import Previews, split_blocks, streaming_capabilities
from parley.channels.text import split_message

logger = logging.getLogger("parley.channels.discord")

DEFAULT_READY_TIMEOUT_SECONDS = 30.0
# How long stop() lets the consumer finish messages already received.
STOP_GRACE_SECONDS = 2.0
CLOSE_TIMEOUT_SECONDS = 5.0
# Restarting a client whose ``start`` ended: waits of RESTART_INITIAL_SECONDS, doubling,
# capped at RESTART_MAX_SECONDS; a client that ran RESTART_RESET_SECONDS resets the count.
RESTART_INITIAL_SECONDS = 1.0
RESTART_MAX_SECONDS = 60.0
RESTART_RESET_SECONDS = 60.0
# Handing over again a message the gateway could not store: waits of
# STORE_RETRY_INITIAL_SECONDS, doubling, capped at STORE_RETRY_MAX_SECONDS.
STORE_RETRY_INITIAL_SECONDS = 1.0
STORE_RETRY_MAX_SECONDS = 60.0


def shard_of_guild(guild_id: int | str | None, shard_count: int) -> int:
    """The shard Discord sends a guild's events on; DMs come on shard 0."""
    return 0 if guild_id is None else (int(guild_id) >> 22) % shard_count


def _backoff(failures: int, initial: float, maximum: float) -> float:
    """The wait after the ``failures``-th failure in a row: initial, doubling, capped."""
    return min(maximum, initial * 2 ** max(failures - 1, 0))


async def _finish(task: asyncio.Task[Any], grace: float) -> None:
    """Let ``task`` end within ``grace`` seconds, then cancel it; never raises."""
    done, _ = await asyncio.wait({task}, timeout=grace)
    if not done:
        task.cancel()
        await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        logger.debug("discord: %s ended with %r", task.get_name(), task.exception())


class _Account:
    """One bot account: its client, its inbound queue and the consumer of that queue."""

    def __init__(
        self,
        name: str,
        token: str,
        config: DiscordConfig,
        handler: InboundHandler,
        *,
        shards: Sequence[int] = (0,),
        shard_count: int = 1,
    ) -> None:
        self.name = name
        self._token = token
        self._config = config
        self._handler = handler
        self.shards = tuple(shards)
        self.shard_count = shard_count
        self.client = new_client(self)
        self.queue: asyncio.Queue[InboundMessage | None] = asyncio.Queue()
        self.dm_channels: set[int] = set()  # learnt from inbound DMs
        self.backfill = Backfill(
            name,
            enqueue=self._enqueue,
            normalise=self._read,
            messageable=self.messageable,
            shards=self.shards,
            shard_of=lambda m: shard_of_guild(m.guild_id, shard_count),
            owns=self.owns,
        )
        self._live: set[int] = set()  # shards whose gateway websocket is up
        self._connected = asyncio.Event()  # set while any shard's websocket is up
        self._runner: asyncio.Task[None] | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._stopped = False
        self._stopping = asyncio.Event()
        self.restarts = 0  # clients replaced after an unexpected end (for tests, logs)

    async def start(self, ready_within: float) -> None:
        runner = asyncio.create_task(self.client.start(self._token), name=f"discord-{self.name}")
        self._runner = runner
        connected = asyncio.create_task(self._connected.wait())
        await asyncio.wait(
            {runner, connected}, timeout=ready_within, return_when=asyncio.FIRST_COMPLETED
        )
        connected.cancel()
        if runner.done():
            raise ChannelStartError(f"discord account {self.name!r}: {why_stopped(runner)}")
        if not self._connected.is_set():
            raise ChannelStartError(
                f"discord account {self.name!r}: not connected after {ready_within:g} s"
            )
        self._runner = asyncio.create_task(
            self._supervise(runner), name=f"discord-{self.name}-supervisor"
        )
        self._consumer = asyncio.create_task(self._consume(), name=f"discord-{self.name}-inbox")

    async def _supervise(self, runner: asyncio.Task[None]) -> None:
        """Wait on the client; if its ``start`` ends while the account runs, log it and
        start a fresh client after a backoff (a failed login ends the account)."""
        loop = asyncio.get_running_loop()
        failures = 0
        started = loop.time()
        try:
            while True:
                await asyncio.wait({runner})
                if self._stopped:
                    return
                exc = None if runner.cancelled() else runner.exception()
                self._live.clear()
                self._connected.clear()
                if is_fatal(exc):
                    logger.error("discord %s: the client stopped: %s", self.name,
                                 why_stopped(runner))  # fmt: skip
                    return
                failures = 1 if loop.time() - started >= RESTART_RESET_SECONDS else failures + 1
                delay = _backoff(failures, RESTART_INITIAL_SECONDS, RESTART_MAX_SECONDS)
                logger.error(
                    "discord %s: the client stopped unexpectedly (%s); restarting in %g s",
                    self.name, "no error" if exc is None else repr(exc), delay,
                    exc_info=exc,
                )  # fmt: skip
                await self._close_client(self.client)
                if await self._stopped_within(delay):
                    return
                self.client = new_client(self)
                self.restarts += 1
                started = loop.time()
                runner = asyncio.create_task(
                    self.client.start(self._token), name=f"discord-{self.name}"
                )
        finally:
            if not runner.done():  # cancelled by stop(): the client goes with it
                runner.cancel()
                await asyncio.wait({runner})

    async def _stopped_within(self, delay: float) -> bool:
        """Wait ``delay`` seconds, or less if the account stops; True if it did."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._stopping.wait()
        return self._stopped

    async def _close_client(self, client: discord.Client) -> None:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS):
                await client.close()
        except (TimeoutError, *NETWORK_ERRORS, discord.DiscordException) as exc:
            logger.warning("discord %s: closing the client failed: %r", self.name, exc)

    def on_event(self, event: str, args: tuple[Any, ...]) -> None:
        try:
            message = self._normalise(event, args)
        except Exception:
            # A malformed event must not break discord.py's read loop.
            logger.exception("discord %s: could not read a %s event", self.name, event)
            return
        if message is not None:
            self.backfill.route(message)

    def _enqueue(self, message: InboundMessage) -> None:
        if message.chat_type == "direct":
            self.dm_channels.add(int(message.chat_id))
        self.queue.put_nowait(message)

    def _on_session(self, event: str, shard: int) -> None:
        if event == "connect":  # READY: a new gateway session
            self._live.add(shard)
            self._connected.set()
            self.backfill.session_started(shard)
        elif event == "ready":  # the new session's guilds are cached
            self.backfill.guilds_ready(shard)
        elif event == "disconnect":
            self._live.discard(shard)
            if not self._live:
                self._connected.clear()
        elif event == "resumed":  # RESUMED: the same session, back after a drop
            self._live.add(shard)
            self._connected.set()
            logger.info("discord %s: gateway session of shard %d resumed", self.name, shard)

    def _normalise(self, event: str, args: tuple[Any, ...]) -> InboundMessage | None:
        session = session_event(self.client, self.shards, event, args)
        if session is not None:
            self._on_session(*session)
            return None
        if event == "message":
            return self._read(args[0])
        if event != "raw_message_edit":
            return None
        me = self.client.user
        if me is None:
            return None
        lookup, allow_bots = self.client.get_channel, self._config.allow_bots
        return normalise_edit(
            args[0],
            account=self.name,
            me=me,
            lookup=lookup,
            rule=self._config.edited_messages,
            allow_bots=allow_bots,
        )

    def _read(self, message: discord.Message) -> InboundMessage | None:
        """A new message (live or backfilled) for the gateway, or None."""
        me = self.client.user
        if me is None:
            return None
        return normalise_message(
            message,
            account=self.name,
            me=me,
            lookup=self.client.get_channel,
            allow_bots=self._config.allow_bots,
        )

    async def _consume(self) -> None:
        while (message := await self.queue.get()) is not None:
            if not await self._hand_over(message):
                logger.warning(
                    "discord %s: stopping with message %s not stored; %d more left unhandled",
                    self.name, message.message_id, self.queue.qsize(),
                )  # fmt: skip
                return

    async def _hand_over(self, message: InboundMessage) -> bool:
        """Give ``message`` to the handler until it is taken or dropped (True), or the
        account stops while the gateway cannot store it (False)."""
        failures = 0
        while True:
            try:
                await self._handler(message)
            except InboundNotStored as exc:
                failures += 1
                delay = _backoff(failures, STORE_RETRY_INITIAL_SECONDS, STORE_RETRY_MAX_SECONDS)
                logger.warning(
                    "discord %s: message %s not stored (attempt %d: %s); again in %g s",
                    self.name, message.message_id, failures, exc, delay,
                )  # fmt: skip
                if await self._stopped_within(delay):
                    return False
                continue
            except Exception:
                logger.exception(
                    "discord %s: the inbound handler failed on message %s",
                    self.name, message.message_id,
                )  # fmt: skip
                return True
            if failures:
                logger.info("discord %s: message %s stored after %d failed attempt(s)",
                            self.name, message.message_id, failures)  # fmt: skip
            return True

    @property
    def up(self) -> bool:
        """Every shard's gateway websocket is connected (not while one is reconnecting)."""
        return self._live.issuperset(self.shards) and not self.client.is_closed()

    async def owns(self, channel_id: int) -> bool:
        """The channel's events come to this replica: its guild is on one of our
        shards, or it is a DM and we have shard 0."""
        if len(self.shards) == self.shard_count:
            return True  # every shard is here
        channel = self.client.get_channel(channel_id)
        guild = getattr(channel, "guild", None)
        if guild is not None:
            return shard_of_guild(guild.id, self.shard_count) in self.shards
        if channel is None:
            # Not cached: a DM, or a channel of a guild on another replica's shards;
            # Discord says which (the caller handles a failed call).
            data: Any = await self.client.http.get_channel(channel_id)
            guild_id = data.get("guild_id") if isinstance(data, dict) else None
            return shard_of_guild(guild_id, self.shard_count) in self.shards
        return 0 in self.shards  # a cached DM

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        await self._close_client(self.client)
        if self._runner is not None:
            await _finish(self._runner, CLOSE_TIMEOUT_SECONDS)
        await self.backfill.stop()  # queues what it held back
        if self._consumer is not None:
            # Messages already received are handed over before the channel goes quiet.
            self.queue.put_nowait(None)
            await _finish(self._consumer, STOP_GRACE_SECONDS)

    def is_dm(self, channel_id: int, channel: discord.abc.Messageable) -> bool:
        # ``channel`` comes from ``messageable``: a DM is cached as a DMChannel only
        # sometimes, so the DMs seen inbound count too.
        return channel_id in self.dm_channels or isinstance(channel, discord.DMChannel)

    def messageable(self, channel_id: int) -> discord.abc.Messageable:
        cached = self.client.get_channel(channel_id)
        if isinstance(cached, discord.abc.Messageable):
            return cached
        return self.client.get_partial_messageable(channel_id)


class DiscordChannel:
    name = "discord"
    capabilities = ChannelCapabilities(
        max_message_chars=MAX_MESSAGE_CHARS,
        markdown=True,
        typing_indicator=True,
        threads=True,
        typing_refresh_seconds=8.0,  # Discord shows "typing" for 10 s
        typing_delay_seconds=TYPING_DELAY_SECONDS,
    )

    def __init__(
        self, config: DiscordConfig, *, ready_timeout: float = DEFAULT_READY_TIMEOUT_SECONDS
    ) -> None:
        self.config = config
        self.ready_timeout = ready_timeout
        self._accounts: dict[str, _Account] = {}
        self._marks: list[SeenMark] = []
        self._streaming: StreamMode = config.streaming
        self.capabilities = streaming_capabilities(
            type(self).capabilities, config.streaming, DRAFT_INTERVAL_SECONDS
        )
        self._previews = Previews(
            DiscordSlots(self._resolve, self._partial), self._split, order=message_order
        )

    def catch_up(self, marks: Sequence[SeenMark]) -> None:
        """Before ``start``: where each conversation stopped, so the first READY reads
        back what was sent while the bot was down (Discord does not redeliver it)."""
        self._marks = list(marks)

    async def start(self, handler: InboundHandler) -> None:
        if self._accounts:
            raise ChannelStartError("the discord channel is already running")
        enabled = {n: a for n, a in self.config.accounts.items() if a.enabled}
        if not enabled:
            raise ChannelStartError("discord: no enabled account (set accounts.<id>.token)")
        point_library_at(self.config)
        accounts = [
            _Account(
                name,
                account.token.get_secret_value().strip(),
                self.config,
                handler,
                shards=account.shards(),
                shard_count=account.shard_count,
            )
            for name, account in enabled.items()
        ]
        for account in accounts:
            account.backfill.seed(m for m in self._marks if m.account == account.name)
        try:
            results = await asyncio.gather(
                *(a.start(self.ready_timeout) for a in accounts), return_exceptions=True
            )
        except BaseException:
            await asyncio.gather(*(a.stop() for a in accounts))
            raise
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await asyncio.gather(*(a.stop() for a in accounts))
            first = failures[0]
            if isinstance(first, ChannelStartError):
                raise first
            raise ChannelStartError(f"discord: could not start: {first!r}") from first
        self._accounts = {a.name: a for a in accounts}
        logger.info("discord: started %s", ", ".join(sorted(self._accounts)))

    async def stop(self) -> None:
        accounts, self._accounts = list(self._accounts.values()), {}
        await asyncio.gather(*(a.stop() for a in accounts))

    def connected(self) -> bool:
        """Every account's gateway session is up (for /health); False while resuming."""
        return bool(self._accounts) and all(a.up for a in self._accounts.values())

    def _running(self, account: str) -> _Account:
        running = self._accounts.get(account)
        if running is not None:
            return running
        # A configured account that is not running may be back after a restart.
        configured = account in self.config.accounts
        raise DeliveryError(f"discord account {account!r} is not running", retryable=configured)

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        account = self._running(message.account)
        target = message.thread_id or message.chat_id
        if not target.isdigit():
            raise DeliveryError(f"discord: {target!r} is not a channel id", retryable=False)
        channel_id = int(target)
        parts = self._parts(message.text)
        if not parts:
            raise DeliveryError("discord: the reply is empty", retryable=False)
        result = await self._previews.finish(message, parts)
        if result is not None:
            return result
        channel = account.messageable(channel_id)
        is_dm = account.is_dm(channel_id, channel)
        return await deliver(channel, message, parts, target=target, is_dm=is_dm)

    @staticmethod
    def _split(text: str) -> list[str]:
        return [part for part in split_message(text, MAX_MESSAGE_CHARS) if part.strip()]

    def _parts(self, text: str) -> list[str]:
        """A reply's messages: its split, or in block mode its paragraph-sized blocks."""
        if self._streaming == "block":
            return split_blocks(text, self._split)
        return split_message(text, MAX_MESSAGE_CHARS)

    async def draft(self, draft: ReplyDraft) -> tuple[str, ...]:
        """Show a reply while it is written: its messages so far, by edits in place."""
        return await self._previews.draft(draft, self._streaming)

    def _resolve(self, route: OutboundMessage) -> tuple[discord.abc.Messageable, str, bool]:
        account = self._running(route.account)
        target = route.thread_id or route.chat_id
        if not target.isdigit():
            raise DeliveryError(f"discord: {target!r} is not a channel id", retryable=False)
        channel = account.messageable(int(target))
        return channel, target, account.is_dm(int(target), channel)

    def _partial(self, route: OutboundMessage, channel_id: int) -> discord.PartialMessageable:
        return self._running(route.account).client.get_partial_messageable(channel_id)

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        running = self._accounts.get(account)
        target = thread_id or chat_id
        if running is None or not target.isdigit():
            return
        try:
            await running.client.get_partial_messageable(int(target)).typing()
        except (discord.DiscordException, *NETWORK_ERRORS) as exc:
            # Best effort: a missing indicator is not worth a failed turn.
            logger.debug("discord %s: typing in %s failed: %r", account, target, exc)

    def policy(self, message: InboundMessage) -> ChatPolicy:
        thread = message.thread_id
        return self.config.policy(
            message.account,
            message.chat_type,
            guild_id=message.guild_id,
            channel_id=thread or message.chat_id,
            parent_id=message.chat_id if thread else None,
        )

    def webhook_routes(self) -> Sequence[WebhookRoute]:
        return []  # the gateway websocket needs no inbound HTTP

    async def fetch_attachment(
        self, message: InboundMessage, attachment: Attachment, max_bytes: int
    ) -> bytes:
        """``AttachmentSource``: the attachment's URL, through the receiving account's
        discord.py HTTP client (its CDN request)."""
        running = self._accounts.get(message.account)
        if running is None:
            raise AttachmentUnavailable(f"discord account {message.account!r} is not running")
        try:
            data = await running.client.http.get_from_cdn(attachment.ref)
        except (discord.DiscordException, *NETWORK_ERRORS) as exc:
            raise AttachmentUnavailable(f"Discord: {exc}") from exc
        if len(data) > max_bytes:
            raise AttachmentUnavailable(f"{len(data)} bytes", too_large=True)
        return data
