"""The Telegram channel: one ``telegram.Bot`` per account, polling or a webhook.

Polling (our own ``getUpdates`` loop, acknowledging an update only once the gateway
stored it) lives in ``telegram_polling``.

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
from telegram.error import InvalidToken, TelegramError

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
    OutboundMessage,
    RecordedCheck,
    ReplyDraft,
    StreamMode,
    WebhookRoute,
)
from parley.channels.config import TelegramAccountConfig, TelegramConfig
from parley.channels.preview import Previews, split_blocks, streaming_capabilities
from parley.channels.telegram_files import fetch_file
from parley.channels.telegram_http import AiohttpRequest
from parley.channels.telegram_inbound import normalise_update, parse_message_ref
from parley.channels.telegram_polling import (
    ALLOWED_UPDATES,
    DEFAULT_BACKOFF,
    Backoff,
    Poller,
    acknowledge,
)
from parley.channels.telegram_recovery import Numbering, probe, probe_end
from parley.channels.telegram_send import (
    MAX_MESSAGE_UTF16,
    SendSettings,
    Sleep,
    deliver,
    split_reply,
)
from parley.channels.telegram_stream import (
    DRAFT_GROUP_INTERVAL_SECONDS,
    DRAFT_INTERVAL_SECONDS,
    TelegramSlots,
    message_order,
)

logger = logging.getLogger("parley.channels.telegram")

MAX_WEBHOOK_BODY_BYTES = 1024 * 1024
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# How long stop() lets a running handler finish before cancelling it.
STOP_GRACE_SECONDS = 5.0
SEND_POOL_SIZE = 16
SEND_POOL_TIMEOUT_SECONDS = 10.0
# How long a send mark waits after start for the poller to read the queue to its end
# (see ``telegram_polling.Poller._fetch``).
CATCH_UP_WAIT_SECONDS = 5.0


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Building one costs ~40 ms (the CA bundle is parsed), and every bot has two
    # clients; an SSLContext is safe to share. httpx's: certifi's bundle, or the one
    # SSL_CERT_FILE / SSL_CERT_DIR name, as before the clients moved to aiohttp.
    return httpx.create_ssl_context()


def _make_bot(account: TelegramAccountConfig) -> Bot:
    tls = _tls_context()
    return Bot(
        account.token.get_secret_value().strip(),
        base_url=f"{account.api_base_url}/bot",
        base_file_url=f"{account.api_base_url}/file/bot",
        # PTB's default pool is one connection with a 1 s pool timeout: replies, typing
        # actions and retries to many chats at once would queue behind each other and
        # fail with PoolTimeout under load.
        # On aiohttp, not PTB's httpx (telegram_http.py: why).
        request=AiohttpRequest(
            SEND_POOL_SIZE, pool_timeout=SEND_POOL_TIMEOUT_SECONDS, ssl_context=tls
        ),
        # One connection is all a long poll needs (PTB's own choice for getUpdates).
        get_updates_request=AiohttpRequest(1, ssl_context=tls),
    )


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
        typing_delay_seconds=TYPING_DELAY_SECONDS,
    )

    def __init__(
        self,
        config: TelegramConfig,
        *,
        sleep: Sleep = asyncio.sleep,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        """``sleep`` waits out flood control, ``backoff`` paces retries (tests shrink both)."""
        self.config = config
        self._sleep = sleep
        self._backoff = backoff
        self._send_settings = SendSettings(config.reply_in_groups, config.max_retry_after_seconds)
        self._streaming: StreamMode = config.streaming
        self.capabilities = streaming_capabilities(
            type(self).capabilities,
            config.streaming,
            DRAFT_INTERVAL_SECONDS,
            DRAFT_GROUP_INTERVAL_SECONDS,
        )
        self._previews = Previews(
            TelegramSlots(self._bot_of, self._send_settings, sleep),
            split_reply,
            order=message_order,
        )
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
        poller = Poller(
            handler,
            poll_seconds=self.config.poll_timeout_seconds,
            sleep=self._sleep,
            backoff=self._backoff,
            observe=self._observe_raw,
            read=self._read,
        )
        for account in started:
            if self.config.mode != "polling":
                account.caught_up.set()  # updates come to the webhook as they happen
            else:
                account.task = asyncio.create_task(
                    poller.run(account), name=f"telegram-poll-{account.id}"
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
            await acknowledge(account)
            with contextlib.suppress(TelegramError):
                await account.bot.shutdown()
        self._handler = None

    # -- inbound, polled or pushed to the webhook ----------------------------------------

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

    def _read(self, account: str, bot: Bot, update: Update) -> InboundMessage | None:
        """The update as a message for the gateway; None when it is not for us or cannot be
        read. A shape we did not foresee is logged and skipped, never retried: it would wedge
        the account's queue (polling) or be redelivered forever (webhook)."""
        try:
            return normalise_update(
                update,
                account=account,
                bot=bot.bot,
                edited_messages=self.config.edited_messages,
            )
        except Exception:
            logger.exception("telegram %s: cannot read update %s", account, update.update_id)
            return None

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
            self._observe_raw(account.id, data)  # polling notes its batches in ``Poller._fetch``
        except Exception as exc:
            logger.warning(
                "telegram %s: unreadable webhook update (%s: %.200s)",
                name, type(exc).__name__, exc,
            )  # fmt: skip
            return web.Response(status=400)
        message = self._read(account.id, account.bot, update)
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
        parts = self._parts(message.text)
        try:
            result = await self._previews.finish(message, parts)
            if result is None:
                result = await deliver(
                    account.bot, message, self._send_settings, self._sleep, parts=parts
                )
        except DeliveryError as exc:
            self._observe_sent(message.account, exc.delivered)
            raise
        self._observe_sent(message.account, result.platform_message_ids)
        return result

    def _parts(self, text: str) -> list[str]:
        """A reply's messages: its split, or in block mode its paragraph-sized blocks."""
        if self._streaming == "block":
            return split_blocks(text, split_reply)
        return split_reply(text)

    async def draft(self, draft: ReplyDraft) -> tuple[str, ...]:
        """Show a reply while it is written: its messages so far, by edits in place."""
        shown = await self._previews.draft(draft, self._streaming)
        self._observe_sent(draft.account, shown)
        return shown

    def _bot_of(self, account: str) -> Bot | None:
        running = self._accounts.get(account)
        return running.bot if running is not None else None

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
        # The highest id known now: ``send_mark``, which a resumed reply asks first, has
        # waited for the queue that built up during the restart to be read.
        end = probe_end(after, self._numbering.mark(message.account, chat_id))
        return await probe(account.bot, chat_id, after, parts, recorded, end)

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

    async def fetch_attachment(
        self, message: InboundMessage, attachment: Attachment, max_bytes: int
    ) -> bytes:
        """``AttachmentSource``: through the receiving account's bot (its file ids)."""
        account = self._accounts.get(message.account)
        if account is None:
            raise AttachmentUnavailable(f"account {message.account!r} is not running")
        return await fetch_file(account.bot, attachment, max_bytes)


def _secret_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of the secret header with the configured secret.

    aiohttp decodes header bytes that are not UTF-8 with ``surrogateescape``; such a
    header (or any that cannot be encoded back) is simply not the secret."""
    try:
        given_bytes = given.encode("utf-8", "surrogateescape")
    except UnicodeError:
        return False
    return hmac.compare_digest(given_bytes, expected.encode())
