"""Delivering one reply to a Discord channel: quote, nonce, send part by part, map errors.

A reply is split at Markdown boundaries into parts of at most 2000 characters (by the
caller, ``DiscordChannel.send``); the first part quotes the triggering message (not in
DMs, where there is only one conversation), and no part may ping @everyone, roles or
users. Errors:

- Forbidden in a DM, or code 50007 → RecipientBlocked; other Forbidden or NotFound →
  DeliveryError(retryable=False);
- a 5xx or a network error → DeliveryError, retryable only while no part went out
  (a retry would duplicate the delivered parts); other HTTP errors → not retryable.

429s never surface: discord.py sleeps for ``retry_after`` and retries by itself.
Every DeliveryError carries ``delivered``, the ids of the parts already sent.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from typing import TypedDict

import aiohttp
import discord

from parley.channels.base import DeliveryError, DeliveryResult, OutboundMessage, RecipientBlocked

MAX_MESSAGE_CHARS = 2000
NONCE_CHARS = 25
DM_BLOCKED_CODE = 50007
# A reply may notify the person it answers, and nobody else.
REPLY_MENTIONS = discord.AllowedMentions(
    everyone=False, roles=False, users=False, replied_user=True
)
NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


async def deliver(
    channel: discord.abc.Messageable,
    message: OutboundMessage,
    parts: list[str],
    *,
    target: str,
    is_dm: bool,
) -> DeliveryResult:
    """Send ``parts`` of ``message`` (from ``message.first_part`` on) to ``channel``, the
    channel or thread ``target`` (a channel id, digits only)."""
    reference = None if is_dm else quote_of(message, int(target))
    delivered: list[str] = []
    for index in range(message.first_part, len(parts)):
        quote = reference if index == 0 else None
        nonce = part_nonce(message.idempotency_key, index)
        try:
            sent = await _send_part(channel, parts[index], quote, nonce)
            if sent.content != parts[index]:
                # The nonce found this part's earlier message: a draft that showed the
                # reply while it was written, its id lost to a kill. It becomes the part.
                await sent.edit(content=parts[index])
        except Exception as exc:
            raise delivery_error(exc, target, is_dm, delivered) from exc
        delivered.append(str(sent.id))
    return DeliveryResult(tuple(delivered), len(delivered), datetime.now(UTC))


def quote_of(message: OutboundMessage, channel_id: int) -> discord.MessageReference | None:
    # Inbound ids are "<id>" or "<id>:edit:<ms>"; either way the head is the message.
    head = (message.reply_to_message_id or "").split(":", 1)[0]
    if not head.isdigit():
        return None
    return discord.MessageReference(
        message_id=int(head), channel_id=channel_id, fail_if_not_exists=False
    )


class _SendOptions(TypedDict, total=False):
    reference: discord.MessageReference
    nonce: str


async def _send_part(
    channel: discord.abc.Messageable,
    text: str,
    reference: discord.MessageReference | None,
    nonce: str | None,
) -> discord.Message:
    # Only the options that are set: discord.py's ``send`` overloads take neither as
    # None (left out, it quotes nothing and makes a random nonce, as None does).
    options: _SendOptions = {}
    if reference is not None:
        options["reference"] = reference
    if nonce is not None:
        options["nonce"] = nonce
    return await channel.send(text, allowed_mentions=REPLY_MENTIONS, **options)


def part_nonce(key: str | None, part: int) -> str | None:
    """The nonce of one part of a reply: the same for every send of that reply, so
    Discord (discord.py sets ``enforce_nonce``) returns the message a crash kept us
    from recording instead of posting it again. At most 25 characters, Discord's limit."""
    if key is None:
        return None
    return hashlib.sha256(f"{key}#{part}".encode()).hexdigest()[:NONCE_CHARS]


def delivery_error(exc: Exception, target: str, is_dm: bool, delivered: list[str]) -> DeliveryError:
    sent = tuple(delivered)
    where = f"discord → {target}"
    if isinstance(exc, discord.Forbidden):
        if is_dm or exc.code == DM_BLOCKED_CODE:
            return RecipientBlocked(f"{where}: {exc.text}", delivered=sent)
        return DeliveryError(f"{where}: forbidden: {exc.text}", retryable=False, delivered=sent)
    if isinstance(exc, discord.NotFound):
        return DeliveryError(f"{where}: not found: {exc.text}", retryable=False, delivered=sent)
    if isinstance(exc, discord.HTTPException):
        retryable = exc.status >= 500 and not sent
        return DeliveryError(
            f"{where}: HTTP {exc.status}: {exc.text}", retryable=retryable, delivered=sent
        )
    if isinstance(exc, (*NETWORK_ERRORS, discord.RateLimited, discord.ConnectionClosed)):
        return DeliveryError(f"{where}: {exc!r}", retryable=not sent, delivered=sent)
    return DeliveryError(f"{where}: unexpected {exc!r}", retryable=False, delivered=sent)
