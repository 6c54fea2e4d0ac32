"""The Telegram channel: one ``telegram.Bot`` per account, polling or a webhook.

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

In webhook mode the gateway's HTTP server mounts ``webhook_routes()``; the route
answers 200 only after the handler returned (500 makes Telegram redeliver, so it is
kept for "not stored"), 400 for a body that cannot be read (redelivering it would not
help) and 401 for a wrong secret. Stopping leaves the webhook registered: another
replica may be serving it, and deleting it would make Telegram queue updates nobody
fetches.

Normalising updates lives in ``telegram_inbound``, sending in ``telegram_send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import web
from telegram import Bot, Update
from telegram.constants import ChatAction
from telegram.error import Conflict, InvalidToken, RetryAfter, TelegramError
from telegram.request import HTTPXRequest

from channels.base import (
    ChannelCapabilities,
    ChannelStartError,
    ChatPolicy,
    DeliveryError,
    DeliveryResult,
    InboundHandler,
    InboundMessage,
    InboundNotStored,
    OutboundMessage,
    RecordedCheck,
    WebhookRoute,
)
from channels.config import TelegramAccountConfig, TelegramConfig
from channels.telegram_inbound import normalise_update, parse_message_ref
from channels.telegram_recovery import Numbering, probe
from channels.telegram_send import (
    MAX_MESSAGE_UTF16,
    SendSettings,
    Sleep,
    deliver,
    retry_after_seconds,
    split_reply,
)

logger = logging.getLogger("parley.channels.telegram")

ALLOWED_UPDATES = ["message", "edited_message"]
MAX_HANDLER_ATTEMPTS = 5
MAX_WEBHOOK_BODY_BYTES = 1024 * 1024
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# How long stop() lets a running handler finish before cancelling it.
STOP_GRACE_SECONDS = 5.0
SEND_POOL_SIZE = 16
SEND_POOL_TIMEOUT_SECONDS = 10.0
# With poll_timeout_seconds = 0 every getUpdates returns at once: pause between them.
IDLE_POLL_PAUSE_SECONDS = 1.0
# How long a send mark waits after start for the poller to read the queue to its end
# (see ``_fetch``), and the batch size of getUpdates (Telegram's maximum).
CATCH_UP_WAIT_SECONDS = 5.0
UPDATES_PER_FETCH = 100
# getUpdates may take the long-poll timeout plus this long (PTB's default read timeout,
# which ``Bot.get_updates`` adds the same way).
POLL_READ_SLACK_SECONDS = 5.0


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Building one costs ~40 ms (the CA bundle is parsed); httpx would build one per
    # client, and every bot has two. An SSLContext is safe to share.
    return httpx.create_ssl_context()


def _make_bot(account: TelegramAccountConfig) -> Bot:
    tls = {"verify": _tls_context()}
    return Bot(
        account.token.get_secret_value().strip(),
        base_url=f"{account.api_base_url}/bot",
        base_file_url=f"{account.api_base_url}/file/bot",
        # PTB's default pool is one connection with a 1 s pool timeout: replies, typing
        # actions and retries to many chats at once would queue behind each other and
        # fail with PoolTimeout under load.
        request=HTTPXRequest(
            connection_pool_size=SEND_POOL_SIZE,
            pool_timeout=SEND_POOL_TIMEOUT_SECONDS,
            httpx_kwargs=tls,
        ),
        # One connection is all a long poll needs (PTB's own choice for getUpdates).
        get_updates_request=HTTPXRequest(connection_pool_size=1, httpx_kwargs=tls),
    )


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential waits after failures: initial, initial*factor, ... capped at maximum."""

    initial: float = 1.0
    maximum: float = 30.0
    factor: float = 2.0

    def delay(self, failures: int) -> float:
        return min(self.maximum, self.initial * self.factor ** max(failures - 1, 0))


async def _fetch_updates(
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


@dataclass(slots=True)
class _Account:
    id: str
    config: TelegramAccountConfig
    bot: Bot
    task: asyncio.Task[None] | None = None
    offset: int | None = None  # the next update id we have not handled
    acked: int | None = None  # the offset Telegram last heard from us
    handling: bool = False  # inside the inbound handler: stop() lets it finish
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Set once getUpdates has read the queue to its end after start (or failed); at
    # once in webhook mode.
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)


class TelegramChannel:
    name = "telegram"
    capabilities = ChannelCapabilities(
        max_message_chars=MAX_MESSAGE_UTF16,
        markdown=True,
        typing_indicator=True,
        threads=True,
        typing_refresh_seconds=4.0,
    )

    def __init__(
        self,
        config: TelegramConfig,
        *,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff = Backoff(),
    ) -> None:
        """``sleep`` waits out flood control, ``backoff`` paces retries (tests shrink both)."""
        self.config = config
        self._sleep = sleep
        self._backoff = backoff
        self._send_settings = SendSettings(config.reply_in_groups, config.max_retry_after_seconds)
        self._accounts: dict[str, _Account] = {}
        self._handler: InboundHandler | None = None
        self._numbering = Numbering()

    # -- lifecycle -------------------------------------------------------------------

    def _enabled_accounts(self) -> dict[str, TelegramAccountConfig]:
        return {name: acc for name, acc in self.config.accounts.items() if acc.enabled}

    async def start(self, handler: InboundHandler) -> None:
        if self._accounts:
            raise ChannelStartError("the telegram channel is already running")
        accounts = self._enabled_accounts()
        if not accounts:
            raise ChannelStartError("telegram: no enabled account has a token")
        started: list[_Account] = []
        try:
            for name, account_config in accounts.items():
                started.append(await self._connect(name, account_config))
        except BaseException:
            for account in started:
                await account.bot.shutdown()
            raise
        self._handler = handler
        self._accounts = {account.id: account for account in started}
        for account in started:
            if self.config.mode != "polling":
                account.caught_up.set()  # updates come to the webhook as they happen
            else:
                account.task = asyncio.create_task(
                    self._poll(account), name=f"telegram-poll-{account.id}"
                )
        logger.info("telegram: %d account(s) up (%s)", len(started), self.config.mode)

    def connected(self) -> bool:
        """Started, and in polling mode every account's poller is alive (for /health)."""
        if not self._accounts:
            return False
        return all(a.task is None or not a.task.done() for a in self._accounts.values())

    async def _connect(self, name: str, account_config: TelegramAccountConfig) -> _Account:
        bot = _make_bot(account_config)
        try:
            await bot.initialize()  # getMe
            if self.config.mode == "webhook":
                secret = account_config.webhook_secret
                await bot.set_webhook(
                    url=account_config.webhook_url or "",
                    secret_token=secret.get_secret_value() if secret else None,
                    allowed_updates=ALLOWED_UPDATES,
                )
            else:
                # A webhook left behind would make every getUpdates fail with 409.
                await bot.delete_webhook(drop_pending_updates=False)
        except BaseException as exc:
            await bot.shutdown()
            # PTB's own messages include the token; ours never do.
            if isinstance(exc, InvalidToken):
                raise ChannelStartError(
                    f"telegram account {name!r}: the Bot API refused the token"
                ) from None
            if isinstance(exc, TelegramError):
                raise ChannelStartError(
                    f"telegram account {name!r}: cannot start ({type(exc).__name__}: {exc})"
                ) from exc
            raise
        logger.info("telegram account %s is @%s", name, bot.username)
        return _Account(name, account_config, bot)

    async def stop(self) -> None:
        accounts, self._accounts = list(self._accounts.values()), {}
        tasks = [a.task for a in accounts if a.task is not None]
        for account in accounts:
            account.stopping.set()
            if account.task is not None and not account.handling:
                account.task.cancel()  # waiting on Telegram or a backoff: nothing to lose
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_GRACE_SECONDS)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for account in accounts:
            await self._acknowledge(account)
            with contextlib.suppress(TelegramError):
                await account.bot.shutdown()
        self._handler = None

    async def _acknowledge(self, account: _Account) -> None:
        """Tell Telegram what we handled since the last poll, so a restart skips it."""
        if account.offset is None or account.offset == account.acked:
            return
        with contextlib.suppress(TelegramError, TimeoutError):
            async with asyncio.timeout(2.0):
                # Raw: the update at the new offset is not ours to parse (it may not).
                await _fetch_updates(account.bot, offset=account.offset, poll_seconds=0, limit=1)

    # -- polling -----------------------------------------------------------------------

    async def _pause(self, account: _Account, seconds: float) -> bool:
        """Wait ``seconds`` unless stopping; False when the account is stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await account.stopping.wait()
        return not account.stopping.is_set()

    async def _wait_out(self, account: _Account, seconds: float) -> bool:
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

    async def _poll(self, account: _Account) -> None:
        failures = 0
        timeout = self.config.poll_timeout_seconds
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
                await self._pause(account, self._backoff.delay(failures))
                continue
            except TelegramError as exc:  # network trouble, timeouts, 5xx
                failures += 1
                logger.warning("telegram %s: getUpdates failed: %s", account.id, exc)
                await self._pause(account, self._backoff.delay(failures))
                continue
            except Exception:
                # Anything else (an answer PTB cannot read, a bug) must not end the
                # poller for good: nothing would be fetched or acknowledged again.
                failures += 1
                logger.exception("telegram %s: getUpdates failed unexpectedly", account.id)
                await self._pause(account, self._backoff.delay(failures))
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
                await self._pause(account, IDLE_POLL_PAUSE_SECONDS)

    async def _fetch(self, account: _Account, offset: int | None, poll_seconds: float) -> list[Any]:
        """One ``getUpdates``, its message ids noted in the numbering at once (before the
        batch is handed over one by one). After start, polls do not wait until one
        comes back with less than a full batch (the queue that built up while the bot
        was down is read to its end); until then ``send_mark`` holds back, so a reply
        resent after a restart gets a mark above every message that waited at Telegram
        meanwhile. A failed poll ends the holding too: sends must not wait on an outage."""
        catching_up = not account.caught_up.is_set()
        try:
            raw = await _fetch_updates(
                account.bot,
                offset=offset,
                poll_seconds=0 if catching_up else poll_seconds,
                limit=UPDATES_PER_FETCH,
            )
        except BaseException:
            account.caught_up.set()
            raise
        for item in raw:
            self._observe_raw(account.id, item)
        if len(raw) < UPDATES_PER_FETCH:
            account.caught_up.set()
        return raw

    def _observe_raw(self, account: str, item: Any) -> None:
        message = (
            item.get("message") or item.get("edited_message") if isinstance(item, dict) else None
        )
        if message is None:
            return  # not a message update
        try:
            chat_id, message_id = int(message["chat"]["id"]), int(message["message_id"])
        except Exception:  # noting ids is best effort; a shape we cannot read is the
            return  # parser's to report, and must never fail the poll (it would repeat)
        self._numbering.observe(account, chat_id, message_id)

    def _read(self, account: _Account, update: Update) -> InboundMessage | None:
        """The update as a message for the gateway; None when it is not for us or cannot be
        read. A shape we did not foresee is logged and skipped, never retried: it would wedge
        the account's queue (polling) or be redelivered forever (webhook)."""
        try:
            return normalise_update(
                update,
                account=account.id,
                bot=account.bot.bot,
                edited_messages=self.config.edited_messages,
            )
        except Exception:
            logger.exception("telegram %s: cannot read update %s", account.id, update.update_id)
            return None

    async def _dispatch(self, account: _Account, update: Update) -> bool:
        """Hand one update to the handler, retrying; False if stopping cut the retries.

        A handler failure counts towards ``MAX_HANDLER_ATTEMPTS`` (then the update is
        skipped), except ``InboundNotStored``: the gateway's storage refused the write,
        which is no fault of the update, so it is retried for as long as that lasts.
        The update stays unacknowledged meanwhile, so Telegram keeps it across a kill.
        """
        handler = self._handler
        message = self._read(account, update)
        if message is None or handler is None:
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
            if not await self._pause(account, delay):
                return False

    # -- webhook -----------------------------------------------------------------------

    def webhook_routes(self) -> list[WebhookRoute]:
        if self.config.mode != "webhook":
            return []
        return [
            WebhookRoute(
                "POST",
                f"/telegram/{name}",
                functools.partial(self._on_webhook, name),
                public=True,  # Telegram cannot send our token; the webhook secret is checked
            )
            for name in self._enabled_accounts()
        ]

    async def _on_webhook(self, name: str, request: web.Request) -> web.StreamResponse:
        account, handler = self._accounts.get(name), self._handler
        if account is None or handler is None:
            return web.Response(status=503)  # not started: Telegram retries later
        secret = account.config.webhook_secret
        if secret is None or not _secret_matches(
            request.headers.get(SECRET_HEADER, ""), secret.get_secret_value()
        ):
            logger.warning("telegram %s: webhook call with a wrong secret", name)
            return web.Response(status=401)
        body = bytearray()
        async for chunk in request.content.iter_chunked(64 * 1024):
            body += chunk
            if len(body) > MAX_WEBHOOK_BODY_BYTES:
                logger.warning("telegram %s: webhook body over %d bytes", name,
                               MAX_WEBHOOK_BODY_BYTES)  # fmt: skip
                return web.Response(status=413)
        try:
            # Anything may fail on a hostile body: json.loads on deep nesting
            # (RecursionError), PTB's de_json on wrong types (AttributeError, TypeError,
            # KeyError, ValueError) or huge numbers (OverflowError). Redelivering the
            # same bytes cannot help, so every such body is a 400, never a 500.
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            update = Update.de_json(data, account.bot)
            self._observe_raw(account.id, data)  # polling notes its batches in ``_fetch``
        except Exception as exc:
            logger.warning(
                "telegram %s: unreadable webhook update (%s: %.200s)",
                name, type(exc).__name__, exc,
            )  # fmt: skip
            return web.Response(status=400)
        message = self._read(account, update)
        if message is not None:
            try:
                await handler(message)
            except Exception:
                logger.warning("telegram %s: webhook update failed", name, exc_info=True)
                return web.Response(status=500)  # Telegram redelivers it later
        return web.Response(status=200)

    # -- outbound ----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        account = self._accounts.get(message.account)
        if account is None:
            raise DeliveryError(
                f"telegram: no running account {message.account!r}",
                retryable=message.account in self._enabled_accounts(),
            )
        try:
            result = await deliver(account.bot, message, self._send_settings, self._sleep)
        except DeliveryError as exc:
            self._observe_sent(message.account, exc.delivered)
            raise
        self._observe_sent(message.account, result.platform_message_ids)
        return result

    def _observe_sent(self, account: str, refs: tuple[str, ...]) -> None:
        for ref in refs:
            if (parsed := parse_message_ref(ref)) is not None:
                self._numbering.observe(account, int(parsed[0]), parsed[1])

    # -- after a crash: did a reply go out? (``channels.telegram_recovery``) -------------

    async def send_mark(self, message: OutboundMessage) -> str | None:
        """The highest message id known in the chat's numbering before this send."""
        account = self._accounts.get(message.account)
        if account is not None and not account.caught_up.is_set():
            try:
                await asyncio.wait_for(account.caught_up.wait(), CATCH_UP_WAIT_SECONDS)
            except TimeoutError:
                # A long backlog: wait once, not once per reply; marks from now on use
                # what has been read (a lookup may then fall short: a resend).
                logger.info("telegram %s: replying before the backlog is read", account.id)
                account.caught_up.set()
        try:
            chat_id = int(message.chat_id)
        except ValueError:
            return None  # "@channel": no numbering known
        answered = parse_message_ref(message.reply_to_message_id)
        floor = answered[1] if answered is not None and answered[0] == message.chat_id else 0
        mark = self._numbering.mark(message.account, chat_id, floor)
        return None if mark is None else str(mark)

    async def reconcile(
        self, message: OutboundMessage, mark: str, recorded: RecordedCheck
    ) -> tuple[str, ...] | None:
        account = self._accounts.get(message.account)
        try:
            chat_id, after = int(message.chat_id), int(mark)
        except ValueError:
            return None
        if account is None:
            return None
        parts = len(split_reply(message.text))
        return await probe(account.bot, chat_id, after, parts, recorded)

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        running = self._accounts.get(account)
        if running is None:
            return
        try:
            await running.bot.send_chat_action(
                chat_id=int(chat_id),
                action=ChatAction.TYPING,
                message_thread_id=int(thread_id) if thread_id else None,
            )
        except (TelegramError, ValueError) as exc:
            logger.debug("telegram %s: typing failed: %s", account, exc)

    def policy(self, message: InboundMessage) -> ChatPolicy:
        return self.config.policy(message.account, message.chat_type, message.chat_id)


def _secret_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of the secret header with the configured secret.

    aiohttp decodes header bytes that are not UTF-8 with ``surrogateescape``; such a
    header (or any that cannot be encoded back) is simply not the secret."""
    try:
        given_bytes = given.encode("utf-8", "surrogateescape")
    except UnicodeError:
        return False
    return hmac.compare_digest(given_bytes, expected.encode())
