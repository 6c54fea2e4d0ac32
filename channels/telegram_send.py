"""Delivering one reply through a ``telegram.Bot``: split, mark up, send, recover.

A reply is split at paragraph and line boundaries into parts of at most 4096 UTF-16
units (Telegram's limit and unit), each sent as HTML. Recoveries, per part:

- the HTML is refused ("can't parse entities") → that part again as plain text;
- flood control (429) up to ``max_retry_after`` → wait and resend, at most 3 times;
  longer → DeliveryError(retryable=False): the gateway should not hammer a flood;
- the group became a supergroup → resend once to the new chat id (later parts too);
- blocked by the user → RecipientBlocked; network trouble → DeliveryError, retryable
  only while nothing went out (a retry would duplicate delivered parts).

Every error carries ``delivered``: the "chat:message" ids of the parts already sent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from telegram import Bot, Message, ReplyParameters
from telegram.constants import ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    NetworkError,
    RetryAfter,
    TelegramError,
)

from parley.channels.base import DeliveryError, DeliveryResult, OutboundMessage, RecipientBlocked
from parley.channels.telegram_inbound import parse_message_ref, read_period
from parley.channels.text import markdown_to_telegram_html, split_message, strip_markdown, utf16_len

logger = logging.getLogger("parley.channels.telegram")

MAX_MESSAGE_UTF16 = 4096
MAX_FLOOD_RETRIES_PER_PART = 3

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class SendSettings:
    reply_in_groups: bool
    max_retry_after_seconds: float


def retry_after_seconds(exc: RetryAfter) -> float:
    return read_period(exc, "retry_after") or 0.0


def _is_entity_error(exc: BadRequest) -> bool:
    return "parse entities" in exc.message.lower()


class _Delivery:
    """One reply in flight: the target (which may migrate) and the parts sent so far."""

    def __init__(
        self, bot: Bot, message: OutboundMessage, settings: SendSettings, sleep: Sleep
    ) -> None:
        self.bot, self.message, self.settings, self.sleep = bot, message, settings, sleep
        self.chat_id: int | str = _chat_id(message.chat_id)
        self.thread_id = int(message.thread_id) if message.thread_id else None
        self.delivered: list[str] = []

    def fail(self, text: str, *, retryable: bool = False) -> DeliveryError:
        return DeliveryError(
            f"telegram {self.message.account} → {self.chat_id}: {text}",
            retryable=retryable,
            delivered=tuple(self.delivered),
        )

    def reply_parameters(self) -> ReplyParameters | None:
        # Quoting the triggering message keeps a busy group readable; a private chat
        # has one conversation, so a quote there is only noise.
        if self.delivered or self.message.first_part or not self.settings.reply_in_groups:
            return None
        ref = parse_message_ref(self.message.reply_to_message_id)
        if ref is None or not str(self.chat_id).startswith("-"):
            return None
        return ReplyParameters(message_id=ref[1], allow_sending_without_reply=True)

    async def send_part(self, markdown: str) -> None:
        text, parse_mode = render_part(markdown)
        floods, migrated = 0, False
        while True:
            try:
                sent: Message = await self.bot.send_message(
                    chat_id=self.chat_id,
                    text=text,
                    parse_mode=parse_mode,
                    message_thread_id=self.thread_id,
                    reply_parameters=self.reply_parameters(),
                )
            except RetryAfter as exc:
                delay = retry_after_seconds(exc)
                floods += 1
                if delay > self.settings.max_retry_after_seconds:
                    raise self.fail(
                        f"flood control asks to wait {delay:g} s, more than the"
                        f" {self.settings.max_retry_after_seconds:g} s allowed"
                    ) from exc
                if floods > MAX_FLOOD_RETRIES_PER_PART:
                    raise self.fail(f"still flood-limited after {floods - 1} waits") from exc
                logger.info("telegram: flood control, waiting %.1f s", delay)
                await self.sleep(delay)
                continue
            except ChatMigrated as exc:
                if migrated:
                    raise self.fail("the chat migrated twice") from exc
                logger.info("telegram: chat %s is now %s", self.chat_id, exc.new_chat_id)
                self.chat_id, migrated = exc.new_chat_id, True
                continue
            except Forbidden as exc:
                raise RecipientBlocked(
                    f"telegram {self.message.account} → {self.chat_id}: {exc.message}",
                    delivered=tuple(self.delivered),
                ) from exc
            except BadRequest as exc:  # before NetworkError: it is a subclass
                if parse_mode is not None and _is_entity_error(exc):
                    logger.info("telegram: HTML refused (%s); sending plain text", exc.message)
                    text, parse_mode = strip_markdown(markdown).strip() or markdown, None
                    continue
                raise self.fail(exc.message) from exc
            except NetworkError as exc:  # TimedOut included
                raise self.fail(f"network: {exc.message}", retryable=not self.delivered) from exc
            except TelegramError as exc:
                raise self.fail(exc.message) from exc
            self.delivered.append(f"{sent.chat.id}:{sent.message_id}")
            return


def render_part(markdown: str) -> tuple[str, ParseMode | None]:
    """A part's text as sent: HTML, or the Markdown itself where the HTML is empty (an
    empty code block: Telegram refuses empty text)."""
    text: str = markdown_to_telegram_html(markdown)
    if not text.strip():
        return markdown, None
    return text, ParseMode.HTML


def _chat_id(value: str) -> int | str:
    try:
        return int(value)
    except ValueError:
        return value  # "@channelusername"


def split_reply(text: str) -> list[str]:
    """The parts of a reply, each within Telegram's limit, none blank."""
    parts = split_message(text, MAX_MESSAGE_UTF16, measure=utf16_len)
    return [part for part in parts if part.strip()]


async def deliver(
    bot: Bot,
    message: OutboundMessage,
    settings: SendSettings,
    sleep: Sleep,
    *,
    parts: list[str] | None = None,
) -> DeliveryResult:
    """Send ``message`` as ``parts`` (by default its split), from ``first_part`` on."""
    every_part = split_reply(message.text) if parts is None else parts
    delivery = _Delivery(bot, message, settings, sleep)
    if not every_part:
        raise delivery.fail("nothing to send: the reply is empty")
    parts = every_part[message.first_part :]  # none left: all went out before a crash
    for part in parts:
        await delivery.send_part(part)
    return DeliveryResult(
        platform_message_ids=tuple(delivery.delivered),
        parts=len(parts),
        delivered_at=datetime.now(UTC),
    )
