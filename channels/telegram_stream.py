"""Telegram's side of replies shown while they are written (``channels.preview``):
a draft is a message of the bot's, edited in place with ``editMessageText``.

Drafts never wait: flood control on a draft (429) pauses the reply's drafts for the
time Telegram asks (``DraftPaused``), and the reply itself waits it out as a send
does (``MAX_FLOOD_RETRIES_PER_PART`` times, at most ``max_retry_after_seconds``).
"Message is not modified" is no error (the message already says it). An edit whose
HTML Telegram refuses is sent as plain text, as a send is.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from telegram import Bot
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError

from parley.channels.base import (
    ChannelError,
    DeliveryError,
    OutboundMessage,
    RecipientBlocked,
)
from parley.channels.preview import DraftPaused, GoneMessage
from parley.channels.telegram_inbound import parse_message_ref
from parley.channels.telegram_send import (
    MAX_FLOOD_RETRIES_PER_PART,
    SendSettings,
    Sleep,
    _Delivery,
    _is_entity_error,
    render_part,
    retry_after_seconds,
)
from parley.channels.text import strip_markdown

logger = logging.getLogger("parley.channels.telegram")

# Drafts go out at most this often: Telegram asks bots for about one message a second
# per chat, and twenty a minute per group (an edit counts as one).
DRAFT_INTERVAL_SECONDS = 1.0
DRAFT_GROUP_INTERVAL_SECONDS = 3.0


def message_order(ref: str) -> int:
    """A "chat:message" id's place in its chat."""
    parsed = parse_message_ref(ref)
    return parsed[1] if parsed is not None else 0


class TelegramSlots:
    """``SlotOps`` on the Bot API, one bot per account."""

    def __init__(
        self, bot_for: Callable[[str], Bot | None], settings: SendSettings, sleep: Sleep
    ) -> None:
        self._bot_for = bot_for
        self._settings = settings
        self._sleep = sleep

    def _bot(self, route: OutboundMessage) -> Bot:
        bot = self._bot_for(route.account)
        if bot is None:
            raise DeliveryError(f"telegram: no running account {route.account!r}", retryable=True)
        return bot

    async def create(self, route: OutboundMessage, index: int, text: str, *, draft: bool) -> str:
        # The first part quotes what it answers (in groups), as a reply sent at once does.
        delivery = _Delivery(
            self._bot(route),
            dataclasses.replace(route, first_part=index),
            self._settings,
            self._sleep,
        )
        if draft:
            delivery.settings = dataclasses.replace(self._settings, max_retry_after_seconds=0.0)
        try:
            await delivery.send_part(text)
        except DeliveryError as exc:
            if draft and isinstance(exc.__cause__, RetryAfter):
                raise DraftPaused(retry_after_seconds(exc.__cause__)) from exc
            raise
        return delivery.delivered[-1]

    async def edit(
        self, route: OutboundMessage, message_id: str, text: str, *, draft: bool
    ) -> None:
        ref = parse_message_ref(message_id)
        if ref is None:
            raise GoneMessage(f"telegram: {message_id!r} is not a message id")
        bot = self._bot(route)
        body, parse_mode = render_part(text)
        floods = 0
        while True:
            try:
                await bot.edit_message_text(
                    chat_id=ref[0], message_id=ref[1], text=body, parse_mode=parse_mode
                )
                return
            except RetryAfter as exc:
                delay = retry_after_seconds(exc)
                if draft:
                    raise DraftPaused(delay) from exc
                floods += 1
                if delay > self._settings.max_retry_after_seconds or (
                    floods > MAX_FLOOD_RETRIES_PER_PART
                ):
                    raise DeliveryError(
                        f"telegram {route.account} → {ref[0]}: flood control on an edit"
                        f" ({delay:g} s)"
                    ) from exc
                await self._sleep(delay)
            except BadRequest as exc:
                reason = exc.message.lower()
                if "not modified" in reason:
                    return  # it shows this text already
                if "to edit not found" in reason or "can't be edited" in reason:
                    raise GoneMessage(f"telegram: {message_id}: {exc.message}") from exc
                if parse_mode is not None and _is_entity_error(exc):
                    body, parse_mode = strip_markdown(text).strip() or text, None
                    continue
                raise DeliveryError(f"telegram {route.account} → {ref[0]}: {exc.message}") from exc
            except Forbidden as exc:
                raise RecipientBlocked(
                    f"telegram {route.account} → {ref[0]}: {exc.message}"
                ) from exc
            except NetworkError as exc:
                if draft:
                    raise ChannelError(f"telegram draft: network: {exc.message}") from exc
                raise DeliveryError(
                    f"telegram {route.account} → {ref[0]}: network: {exc.message}", retryable=True
                ) from exc
            except TelegramError as exc:
                raise DeliveryError(f"telegram {route.account} → {ref[0]}: {exc.message}") from exc

    async def delete(self, route: OutboundMessage, message_id: str) -> None:
        ref = parse_message_ref(message_id)
        if ref is None:
            return
        try:
            await self._bot(route).delete_message(chat_id=ref[0], message_id=ref[1])
        except BadRequest as exc:
            if "not found" not in exc.message.lower():
                raise
