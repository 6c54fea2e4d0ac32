"""Discord's side of replies shown while they are written (``channels.preview``): a
draft is a message of the bot's, edited in place.

Each slot is created with the nonce its part of the reply carries
(``discord_send.part_nonce``), so a slot whose id a kill kept the gateway from
recording is returned again, not duplicated, when that part is sent after a restart;
``discord_send.deliver`` then edits it to the part's text. discord.py waits out a 429
by itself, drafts included (Discord allows five edits per five seconds in a channel:
``DRAFT_INTERVAL_SECONDS`` stays under that).
"""

from __future__ import annotations

from collections.abc import Callable

import discord

from parley.channels.base import OutboundMessage
from parley.channels.discord_send import (
    REPLY_MENTIONS,
    delivery_error,
    part_nonce,
    quote_of,
)
from parley.channels.preview import GoneMessage

DRAFT_INTERVAL_SECONDS = 1.2
UNKNOWN_MESSAGE_CODE = 10008

# (messageable, target channel id, is it a DM) for a route's chat or thread.
Resolve = Callable[[OutboundMessage], tuple[discord.abc.Messageable, str, bool]]
# A partial messageable of a channel id, for edits and deletes by id.
Partial = Callable[[OutboundMessage, int], discord.PartialMessageable]


def message_order(message_id: str) -> int:
    """A snowflake's place in time (slots are created in order)."""
    return int(message_id) if message_id.isdigit() else 0


class DiscordSlots:
    """``SlotOps`` on discord.py."""

    def __init__(self, resolve: Resolve, partial: Partial) -> None:
        self._resolve = resolve
        self._partial = partial

    async def create(self, route: OutboundMessage, index: int, text: str, *, draft: bool) -> str:
        channel, target, is_dm = self._resolve(route)
        reference = None if is_dm or index else quote_of(route, int(target))
        options: dict[str, object] = {"allowed_mentions": REPLY_MENTIONS}
        if reference is not None:
            options["reference"] = reference
        if (nonce := part_nonce(route.idempotency_key, index)) is not None:
            options["nonce"] = nonce
        try:
            sent = await channel.send(text, **options)  # type: ignore[call-overload]
            if sent.content != text:  # the nonce found this part's earlier message
                await sent.edit(content=text)
        except Exception as exc:
            raise delivery_error(exc, target, is_dm, []) from exc
        return str(sent.id)

    async def edit(
        self, route: OutboundMessage, message_id: str, text: str, *, draft: bool
    ) -> None:
        _, target, is_dm = self._resolve(route)
        message = self._partial(route, int(target)).get_partial_message(int(message_id))
        try:
            await message.edit(content=text)
        except discord.NotFound as exc:
            raise GoneMessage(f"discord: message {message_id} is gone") from exc
        except Exception as exc:
            raise delivery_error(exc, target, is_dm, []) from exc

    async def delete(self, route: OutboundMessage, message_id: str) -> None:
        _, target, _ = self._resolve(route)
        message = self._partial(route, int(target)).get_partial_message(int(message_id))
        try:
            await message.delete()
        except discord.NotFound:
            return
