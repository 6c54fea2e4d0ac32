"""Backfill: after a lost gateway session, fetch what the bot missed from history.

Discord replays missed events only on a RESUME. After a non-resumable invalid session
(op 9, d=false), or any other fresh IDENTIFY (a replaced client), whatever was sent
while the bot had no session is never delivered. So the adapter remembers, per channel
(text channel, DM or thread; at most ``MAX_REMEMBERED_CHANNELS``, the least recently
active forgotten first), the id of the newest message it queued for the gateway, and
on every READY but the account's first it reads each remembered channel's history after
that id (the ``MAX_CHANNELS_PER_BACKFILL`` most recently active channels, at most
``MAX_MESSAGES_PER_CHANNEL`` messages each: one history page).

A fetched message takes the live path from normalisation on: the same filters (own
messages, other bots unless allowed, system messages) and the same queue, oldest first.

Order and duplicates: from the new READY until its channel is backfilled, live events
of a backfilled channel are held back; the history goes into the queue first, then the
held events that the history did not already contain. A live message that arrives after
the release but was in the history (the gateway lagging behind REST) is dropped, so
the gateway's inbox gets each message once from here (it dedupes on id all the same).

After a restart the gateway seeds the memory (``seed``) with the newest message it
stored per recently active conversation, and the account's first READY then backfills
too: what was sent while the bot was down is answered, not lost. Messages older than
``MAX_BACKFILL_AGE`` are skipped (logged): like Telegram, which keeps undelivered
updates for 24 hours, the bot does not answer day-old messages after a long outage.

Shards: each shard of the account is its own gateway session, so a lost session loses
only its shard's events. The first READY of each shard is not a loss; a later one
backfills the channels last seen on that shard (and those whose shard is not known: the
seeded ones). History is read once the shards being backfilled have their guilds
cached (all of them for the seeded catch-up; only those: discord.py may never report
another shard ready when a shard re-identifies early), and only for channels this
replica owns (``owns``): with shards split over replicas,
another replica answers the others' guilds, and DMs belong to shard 0's.

A channel whose history cannot be read (403, 404, 5xx, network) is logged and skipped;
its held events go on and the other channels are backfilled. The memory of last-seen
ids lives in this process only: a restart forgets it, and channels the bot never
queued a message from (or, after a restart, the gateway stored none from in the last
week) are never backfilled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta

import aiohttp
import discord

from parley.channels.base import InboundMessage, SeenMark

logger = logging.getLogger("parley.channels.discord")

MAX_REMEMBERED_CHANNELS = 1000
MAX_CHANNELS_PER_BACKFILL = 50
MAX_MESSAGES_PER_CHANNEL = 100  # one history page
MAX_BACKFILL_AGE = timedelta(hours=24)
# History is read once the guilds of the new session are cached (discord.py's
# on_ready): before that a thread would read as a plain channel. Bounded, so that a
# session that never gets there still backfills.
GUILDS_READY_WAIT_SECONDS = 30.0
_FETCH_ERRORS = (discord.DiscordException, aiohttp.ClientError, TimeoutError, OSError)

Enqueue = Callable[[InboundMessage], None]
Normalise = Callable[[discord.Message], InboundMessage | None]
Messageable = Callable[[int], discord.abc.Messageable]
ShardOf = Callable[[InboundMessage], int]
Owns = Callable[[int], Awaitable[bool]]


def _shard_zero(message: InboundMessage) -> int:
    return 0


async def _owns_all(channel_id: int) -> bool:
    return True


def channel_of(message: InboundMessage) -> int | None:
    """The Discord channel the message lives in (the thread, for thread messages)."""
    where = message.thread_id or message.chat_id
    return int(where) if where.isdigit() else None


def new_message_id(message: InboundMessage) -> int | None:
    """The snowflake of a new message; None for an edit ("<id>:edit:<ms>")."""
    return int(message.message_id) if message.message_id.isdigit() else None


class LastSeen:
    """Per channel, the newest message id queued and the shard it came on (None: not
    known, e.g. seeded); bounded, least recently active out."""

    def __init__(self, capacity: int | None = None) -> None:
        self._capacity = MAX_REMEMBERED_CHANNELS if capacity is None else capacity
        self._ids: OrderedDict[int, int] = OrderedDict()
        self._shards: dict[int, int] = {}

    def note(self, channel_id: int, message_id: int, shard: int | None = None) -> None:
        newest = max(self._ids.pop(channel_id, message_id), message_id)
        self._ids[channel_id] = newest
        if shard is not None:
            self._shards[channel_id] = shard
        while len(self._ids) > self._capacity:
            forgotten, _ = self._ids.popitem(last=False)
            self._shards.pop(forgotten, None)

    def get(self, channel_id: int) -> int | None:
        return self._ids.get(channel_id)

    def most_recent(self, count: int, shard: int | None = None) -> list[int]:
        """Up to ``count`` channels, the most recently active first; with ``shard``,
        only those seen on that shard or on an unknown one."""
        recent: list[int] = []
        for channel_id in reversed(self._ids):
            if len(recent) == count:
                break
            if shard is None or self._shards.get(channel_id, shard) == shard:
                recent.append(channel_id)
        return recent

    def __len__(self) -> int:
        return len(self._ids)


class Backfill:
    """The live path's gate (``route``) and the backfill task of one account."""

    def __init__(
        self,
        account: str,
        *,
        enqueue: Enqueue,
        normalise: Normalise,
        messageable: Messageable,
        shards: Iterable[int] = (0,),
        shard_of: ShardOf = _shard_zero,
        owns: Owns = _owns_all,
    ) -> None:
        self._account = account
        self._enqueue_live = enqueue
        self._normalise = normalise
        self._messageable = messageable
        self._shard_of = shard_of
        self._owns = owns
        self.seen = LastSeen()
        self._shards = frozenset(shards)
        self._started: set[int] = set()  # shards that had their first READY
        self._ready: set[int] = set()  # shards whose guilds are cached
        self._needed: set[int] = set()  # shards whose channels a backfill waits to read
        self._seeded = False
        self._held: dict[int, list[InboundMessage]] = {}  # insertion order: fetch order
        self._refetch: set[int] = set()  # lost the session again while being fetched
        self._caught_up: dict[int, int] = {}  # channel -> newest id its history gave
        self._guilds_ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the live path ------------------------------------------------------------------

    def route(self, message: InboundMessage) -> None:
        """Queue a live message, unless it waits for a backfill or duplicates one."""
        channel = channel_of(message)
        if channel is None:
            self._enqueue_live(message)
            return
        if channel in self._held:
            self._held[channel].append(message)
            return
        upto, mid = self._caught_up.get(channel), new_message_id(message)
        if upto is not None and mid is not None:
            if mid <= upto:
                logger.debug("discord %s: %s came by backfill already", self._account, mid)
                return
            del self._caught_up[channel]  # the live stream is past the history now
        self._enqueue(message)

    def _enqueue(self, message: InboundMessage) -> None:
        channel, mid = channel_of(message), new_message_id(message)
        if channel is not None and mid is not None:
            self.seen.note(channel, mid, self._shard_of(message))
        self._enqueue_live(message)

    def seed(self, marks: Iterable[SeenMark]) -> None:
        """Before the first READY: the gateway's newest stored message per conversation
        (most recently active first), so the first READY backfills as well."""
        for mark in reversed(list(marks)):  # note() keeps the last noted as most recent
            channel = mark.thread_id or mark.chat_id
            head = mark.message_id.split(":", 1)[0]  # an edit: "<id>:edit:<ms>"
            if channel.isdigit() and head.isdigit():
                self.seen.note(int(channel), int(head))
                self._seeded = True

    def session_started(self, shard: int = 0) -> None:
        """A READY on ``shard``: its first starts it (and the account's first catches up
        after a restart when seeded), any later one lost that shard's events."""
        self._ready.discard(shard)
        if shard in self._started:
            self._begin(shard)
        else:
            self._started.add(shard)
            if self._seeded:
                self._seeded = False
                self._begin(None)
        self._update_ready()

    def guilds_ready(self, shard: int = 0) -> None:
        """The guilds of ``shard``'s session are cached."""
        self._ready.add(shard)
        self._update_ready()

    def _update_ready(self) -> None:
        if self._needed <= self._ready:
            self._guilds_ready.set()
        else:
            self._guilds_ready.clear()

    # -- the backfill -------------------------------------------------------------------

    def _begin(self, shard: int | None) -> None:
        """Backfill the channels of ``shard`` (None: every channel remembered)."""
        channels = self.seen.most_recent(MAX_CHANNELS_PER_BACKFILL, shard)
        if not channels:
            return
        self._needed |= self._shards if shard is None else {shard}
        for channel in channels:
            if channel in self._held:
                self._refetch.add(channel)
            else:
                self._held[channel] = []
                self._caught_up.pop(channel, None)
        left_out = len(self.seen.most_recent(len(self.seen), shard)) - len(channels)
        logger.info(
            "discord %s: a new gateway session after a lost one%s; backfilling %d channel(s)%s",
            self._account, "" if shard is None else f" (shard {shard})", len(channels),
            f" ({left_out} less active ones not)" if left_out else "",
        )  # fmt: skip
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"discord-{self._account}-backfill")

    async def _run(self) -> None:
        total = channels = 0
        try:
            while self._held:
                channel = next(iter(self._held))
                fetched = await self._fetch_settled(channel)
                total += self._release(channel, fetched)
                channels += fetched is not None
        finally:
            # Stopping (or a bug): what was held back still goes to the gateway.
            for channel in list(self._held):
                self._release(channel, None)
            self._needed.clear()
        logger.info(
            "discord %s: backfill done: %d message(s) from %d channel(s)",
            self._account, total, channels,
        )  # fmt: skip

    async def _fetch_settled(self, channel: int) -> list[discord.Message] | None:
        while True:
            self._refetch.discard(channel)
            await self._wait_guilds_ready()
            fetched = await self._fetch(channel)
            if channel not in self._refetch:
                return fetched
            # The session was lost again meanwhile: this read may predate that gap.

    async def _wait_guilds_ready(self) -> None:
        try:
            async with asyncio.timeout(GUILDS_READY_WAIT_SECONDS):
                await self._guilds_ready.wait()
        except TimeoutError:
            logger.warning(
                "discord %s: guilds not ready after %g s; backfilling anyway",
                self._account, GUILDS_READY_WAIT_SECONDS,
            )  # fmt: skip
            self._guilds_ready.set()  # once per session is enough

    async def _fetch(self, channel: int) -> list[discord.Message] | None:
        after = self.seen.get(channel)
        if after is None:
            return None  # forgotten meanwhile (more than MAX_REMEMBERED_CHANNELS active)
        try:
            if not await self._owns(channel):
                # Another replica's shard carries it; that replica backfills it.
                logger.debug("discord %s: channel %s is not on our shards", self._account, channel)
                return None
            history = self._messageable(channel).history(
                limit=MAX_MESSAGES_PER_CHANNEL, after=discord.Object(id=after), oldest_first=True
            )
            return [message async for message in history]
        except _FETCH_ERRORS as exc:
            logger.warning(
                "discord %s: cannot backfill channel %s (%r); skipping it",
                self._account, channel, exc,
            )  # fmt: skip
            return None

    def _release(self, channel: int, fetched: list[discord.Message] | None) -> int:
        """Queue the history after the mark, then the held live events it lacks."""
        live = self._held.pop(channel, [])
        mark = self.seen.get(channel) or 0
        seen_ids: set[str] = set()
        count = 0
        oldest = datetime.now(UTC) - MAX_BACKFILL_AGE
        stale = 0
        for message in fetched or ():
            seen_ids.add(str(message.id))
            if message.created_at < oldest:
                stale += 1
                continue
            inbound = self._read(message) if message.id > mark else None
            if inbound is not None:
                self._enqueue(inbound)
                count += 1
        if fetched:
            self._caught_up[channel] = max(m.id for m in fetched)
        for held in live:
            if held.message_id not in seen_ids:
                self._enqueue(held)
        if fetched is not None:
            self._log_channel(channel, count, len(fetched))
        if stale:
            logger.warning(
                "discord %s: %d missed message(s) in channel %s are over %s old; not answered",
                self._account, stale, channel, MAX_BACKFILL_AGE,
            )  # fmt: skip
        return count

    def _log_channel(self, channel: int, count: int, fetched: int) -> None:
        logger.info(
            "discord %s: backfilled %d message(s) in channel %s (%d read)",
            self._account, count, channel, fetched,
        )  # fmt: skip
        if fetched >= MAX_MESSAGES_PER_CHANNEL:
            logger.warning(
                "discord %s: channel %s had %d or more missed messages; later ones are lost",
                self._account, channel, MAX_MESSAGES_PER_CHANNEL,
            )  # fmt: skip

    def _read(self, message: discord.Message) -> InboundMessage | None:
        try:
            return self._normalise(message)
        except Exception:
            logger.exception("discord %s: cannot read backfilled message %s",
                             self._account, message.id)  # fmt: skip
            return None

    async def stop(self) -> None:
        """End a running backfill; held live events are queued, not lost."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})
        for channel in list(self._held):
            self._release(channel, None)
