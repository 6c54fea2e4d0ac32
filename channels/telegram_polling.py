"""Polling a Telegram account: our own ``getUpdates`` loop, its catch-up after start,
and handing each update to the gateway with retries.

We run our own ``getUpdates`` loop rather than PTB's Updater so that an update is
acknowledged (the next poll's ``offset`` moves past it) only after the inbound handler
returned, i.e. after the gateway stored it durably. If the handler raises, the same
update is retried with backoff; after ``MAX_HANDLER_ATTEMPTS`` it is logged and
skipped so one poisoned update cannot wedge the account. A handler that says the
message could not be stored (``InboundNotStored``: state storage refuses writes) is
retried without limit instead: the update stays with Telegram until storage is back.

The loop fetches the raw update dicts and parses them one at a time: PTB's
``Bot.get_updates`` parses the whole batch at once, so one update it cannot read
(a wrong type, a missing field) would fail every poll at the same offset for ever.
An update that does not parse is logged and acknowledged (skipped); the others are
handled in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from telegram import Bot, Update
from telegram.error import Conflict, InvalidToken, RetryAfter, TelegramError

from parley.channels.base import InboundHandler, InboundMessage, InboundNotStored
from parley.channels.telegram_send import Sleep, retry_after_seconds

logger = logging.getLogger("parley.channels.telegram")

ALLOWED_UPDATES = ["message", "edited_message"]
MAX_HANDLER_ATTEMPTS = 5
# With poll_timeout_seconds = 0 every getUpdates returns at once: pause between them.
IDLE_POLL_PAUSE_SECONDS = 1.0
# The batch size of getUpdates (Telegram's maximum); a shorter batch after start means
# the queue has been read to its end (see ``Poller._fetch``).
UPDATES_PER_FETCH = 100
# getUpdates may take the long-poll timeout plus this long (PTB's default read timeout,
# which ``Bot.get_updates`` adds the same way).
POLL_READ_SLACK_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential waits after failures: initial, initial*factor, ... capped at maximum."""

    initial: float = 1.0
    maximum: float = 30.0
    factor: float = 2.0

    def delay(self, failures: int) -> float:
        return min(self.maximum, self.initial * self.factor ** max(failures - 1, 0))


DEFAULT_BACKOFF = Backoff()


class PolledAccount(Protocol):
    """What polling reads and moves of an account (``telegram._Account``)."""

    id: str
    bot: Bot
    offset: int | None  # the next update id we have not handled
    acked: int | None  # the offset Telegram last heard from us
    handling: bool  # inside the inbound handler: stop() lets it finish
    stopping: asyncio.Event
    # Set once getUpdates has read the queue to its end after start (or failed).
    caught_up: asyncio.Event


async def fetch_updates(
    bot: Bot, *, offset: int | None, poll_seconds: float, limit: int | None = None
) -> list[Any]:
    """``getUpdates`` without parsing: the raw update dicts, in Telegram's order.

    PTB's ``get_updates`` would parse them all at once (one bad update fails the batch)
    and ``do_api_request`` warns for an endpoint Bot has a method for, so this goes one
    level down, to the same call ``get_updates`` makes (its request pool, its error
    mapping: RetryAfter, Conflict, InvalidToken, NetworkError ...)."""
    result = await bot._post(
        "getUpdates",
        {
            "offset": offset,
            "limit": limit,
            "timeout": poll_seconds,
            "allowed_updates": ALLOWED_UPDATES,
        },
        read_timeout=POLL_READ_SLACK_SECONDS + poll_seconds,
    )
    if not isinstance(result, list):
        raise TelegramError(f"getUpdates answered {type(result).__name__}, not a list")
    return result


async def acknowledge(account: PolledAccount) -> None:
    """Tell Telegram what we handled since the last poll, so a restart skips it."""
    if account.offset is None or account.offset == account.acked:
        return
    with contextlib.suppress(TelegramError, TimeoutError):
        async with asyncio.timeout(2.0):
            # Raw: the update at the new offset is not ours to parse (it may not).
            await fetch_updates(account.bot, offset=account.offset, poll_seconds=0, limit=1)


@dataclass(frozen=True, slots=True)
class _Fetched:
    """One fetched update: its id and the parsed update (None: it cannot be parsed)."""

    update_id: int
    update: Update | None


def _parse_updates(bot: Bot, raw: list[Any], account: str) -> list[_Fetched]:
    """Parse each update on its own; one that fails is logged (not its text) and kept
    as ``update=None`` so the caller can acknowledge it. An entry without an integer
    ``update_id`` cannot be acknowledged on its own: it is logged and dropped (the ids
    around it move the offset past it)."""
    fetched: list[_Fetched] = []
    for item in raw:
        update_id = item.get("update_id") if isinstance(item, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            logger.error("telegram %s: getUpdates returned an entry without an id; skipped",
                         account)  # fmt: skip
            continue
        try:
            update: Update | None = Update.de_json(item, bot)
        except Exception as exc:  # PTB raises anything on a bad shape
            logger.error(
                "telegram %s: cannot parse update %s (%s: %.200s); skipping it",
                account, update_id, type(exc).__name__, exc,
            )  # fmt: skip
            update = None
        fetched.append(_Fetched(update_id, update))
    return fetched


async def pause(account: PolledAccount, seconds: float) -> bool:
    """Wait ``seconds`` unless stopping; False when the account is stopping."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await account.stopping.wait()
    return not account.stopping.is_set()


class Poller:
    """The polling loop of a running channel's accounts (``run``: one task each).

    ``observe`` notes the message ids of each raw update as soon as it is fetched,
    ``read`` turns a parsed update into a message for ``handler`` (None: skip it)."""

    def __init__(
        self,
        handler: InboundHandler,
        *,
        poll_seconds: float,
        sleep: Sleep,
        backoff: Backoff,
        observe: Callable[[str, Any], None],
        read: Callable[[str, Bot, Update], InboundMessage | None],
    ) -> None:
        self._handler = handler
        self._poll_seconds = poll_seconds
        self._sleep = sleep
        self._backoff = backoff
        self._observe = observe
        self._read = read

    async def _wait_out(self, account: PolledAccount, seconds: float) -> bool:
        """Flood control: wait ``seconds`` with the injectable sleep unless stopping;
        False when the account is stopping."""
        sleeping = asyncio.ensure_future(self._sleep(seconds))
        stopping = asyncio.ensure_future(account.stopping.wait())
        try:
            await asyncio.wait({sleeping, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeping, stopping):
                task.cancel()
            await asyncio.gather(sleeping, stopping, return_exceptions=True)
        return not account.stopping.is_set()

    async def run(self, account: PolledAccount) -> None:
        failures = 0
        timeout = self._poll_seconds
        while not account.stopping.is_set():
            try:
                offset = account.offset
                raw = await self._fetch(account, offset, timeout)
                account.acked = offset
            except InvalidToken:
                logger.error("telegram %s: the token was revoked; polling stops", account.id)
                return
            except RetryAfter as exc:
                # Flood control on getUpdates: polling sooner than asked only extends it.
                failures += 1
                delay = max(retry_after_seconds(exc), self._backoff.delay(failures))
                logger.warning("telegram %s: getUpdates flood control, waiting %g s",
                               account.id, delay)  # fmt: skip
                await self._wait_out(account, delay)
                continue
            except Conflict:
                failures += 1
                logger.warning(
                    "telegram %s: another process polls this bot (409 Conflict); only one"
                    " instance may run per token",
                    account.id,
                )
                await pause(account, self._backoff.delay(failures))
                continue
            except TelegramError as exc:  # network trouble, timeouts, 5xx
                failures += 1
                logger.warning("telegram %s: getUpdates failed: %s", account.id, exc)
                await pause(account, self._backoff.delay(failures))
                continue
            except Exception:
                # Anything else (an answer PTB cannot read, a bug) must not end the
                # poller for good: nothing would be fetched or acknowledged again.
                failures += 1
                logger.exception("telegram %s: getUpdates failed unexpectedly", account.id)
                await pause(account, self._backoff.delay(failures))
                continue
            failures = 0
            for fetched in _parse_updates(account.bot, raw, account.id):
                # An update that cannot be parsed is skipped: retrying it cannot help.
                if fetched.update is not None and not await self._dispatch(account, fetched.update):
                    return
                account.offset = max(account.offset or 0, fetched.update_id + 1)
                if account.stopping.is_set():
                    return
            if not raw and timeout == 0:
                await pause(account, IDLE_POLL_PAUSE_SECONDS)

    async def _fetch(
        self, account: PolledAccount, offset: int | None, poll_seconds: float
    ) -> list[Any]:
        """One ``getUpdates``, its message ids noted in the numbering at once (before the
        batch is handed over one by one). After start, polls do not wait until one
        comes back with less than a full batch (the queue that built up while the bot
        was down is read to its end); until then ``send_mark`` holds back, so a reply
        resent after a restart gets a mark above every message that waited at Telegram
        meanwhile. A failed poll ends the holding too: sends must not wait on an outage."""
        catching_up = not account.caught_up.is_set()
        try:
            raw = await fetch_updates(
                account.bot,
                offset=offset,
                poll_seconds=0 if catching_up else poll_seconds,
                limit=UPDATES_PER_FETCH,
            )
        except BaseException:
            account.caught_up.set()
            raise
        for item in raw:
            self._observe(account.id, item)
        if len(raw) < UPDATES_PER_FETCH:
            account.caught_up.set()
        return raw

    async def _dispatch(self, account: PolledAccount, update: Update) -> bool:
        """Hand one update to the handler, retrying; False if stopping cut the retries.

        A handler failure counts towards ``MAX_HANDLER_ATTEMPTS`` (then the update is
        skipped), except ``InboundNotStored``: the gateway's storage refused the write,
        which is no fault of the update, so it is retried for as long as that lasts.
        The update stays unacknowledged meanwhile, so Telegram keeps it across a kill.
        """
        handler = self._handler
        message = self._read(account.id, account.bot, update)
        if message is None:
            return True
        failures = not_stored = 0
        while True:
            account.handling = True
            try:
                await handler(message)
                if not_stored:
                    logger.info("telegram %s: update %s stored after %d refusals",
                                account.id, update.update_id, not_stored)  # fmt: skip
                return True
            except InboundNotStored as exc:
                not_stored += 1
                logger.warning(
                    "telegram %s: update %s not stored (%s); retrying (attempt %d)",
                    account.id, update.update_id, exc, not_stored,
                )  # fmt: skip
                delay = self._backoff.delay(not_stored)
            except Exception:
                failures += 1
                logger.warning(
                    "telegram %s: handler failed on update %s (attempt %d of %d)",
                    account.id, update.update_id, failures, MAX_HANDLER_ATTEMPTS,
                    exc_info=True,
                )  # fmt: skip
                if failures >= MAX_HANDLER_ATTEMPTS:
                    logger.error(
                        "telegram %s: skipping update %s (%s) after %d failed attempts",
                        account.id, update.update_id, message.message_id, failures,
                    )  # fmt: skip
                    return True
                delay = self._backoff.delay(failures)
            finally:
                account.handling = False
            if not await pause(account, delay):
                return False
