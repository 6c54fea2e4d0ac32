"""After a crash: which parts of a stored reply are already on the platform?

A reply is stored before it is sent and its delivery recorded after. A kill between
the platform accepting it and that record leaves an open item whose reply may or may
not be out; sending it again shows it twice, not sending it may lose it. Two ways out,
by platform:

- Discord checks duplicates itself: every part carries a nonce derived from the item
  (``OutboundMessage.idempotency_key``), so a second send within a few minutes
  returns the first message. Nothing to do here.
- Telegram does not. A channel that can look (``channels.base.SendRecovery``) gets the
  reply's *send mark* (stored with the reply, before the send) and names the bot's
  messages in the chat above it; those this gateway recorded for other replies are
  not ours. What is left is this reply's parts, but only when nothing else could have
  sent an unrecorded message to that chat: no other item there may be between its
  stored reply and its record. That is checked before asking (no point otherwise) and
  again after, followed by a last look at the records: another reply's send that
  finished meanwhile is then either still open or recorded, and either way seen.

Whenever it cannot tell, the answer is "nothing found" and the reply is sent again:
a reply twice beats a reply lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from parley.channels.base import Channel, OutboundMessage, SendRecovery
from parley.gateway.storage.inbox import UNKNOWN_SEND_MARK, InboxItem

log = logging.getLogger("parley.gateway.send_recovery")


class SentRecords(Protocol):
    """The inbox as this module reads it (``Inbox`` and ``PgInbox``)."""

    async def open_replies(self, channel: str, account: str) -> list[InboxItem]: ...

    async def is_recorded(self, channel: str, account: str, platform_message_id: str) -> bool: ...

    async def forget_send_marks(self, item_ids: Sequence[int]) -> None: ...


def recovery_of(channel: Channel) -> SendRecovery | None:
    """The channel's send recovery, when it has one."""
    return channel if isinstance(channel, SendRecovery) else None


async def send_mark(channel: Channel, message: OutboundMessage) -> str | None:
    recovery = recovery_of(channel)
    return await recovery.send_mark(message) if recovery is not None else None


async def parts_already_sent(
    channel: Channel, inbox: SentRecords, item: InboxItem, message: OutboundMessage
) -> tuple[str, ...]:
    """The platform ids of the parts of ``item``'s stored reply (``message``) that a
    send before the crash delivered, in order; empty when none or when unsure."""
    recovery = recovery_of(channel)
    if recovery is None or item.send_mark in (None, UNKNOWN_SEND_MARK):
        return ()
    assert item.send_mark is not None
    answered = set(item.reply_for) | {item.id}
    if await _doubt_shared(inbox, item, answered):
        return ()

    async def recorded(platform_message_id: str) -> bool:
        return await inbox.is_recorded(message.channel, message.account, platform_message_id)

    try:
        found = await recovery.reconcile(message, item.send_mark, recorded)
    except Exception:  # the lookup is a courtesy: a failure means "send it again"
        log.exception("looking for inbox %s's reply on %s failed", item.id, message.channel)
        return ()
    if not found:
        return ()
    if await _doubt_shared(inbox, item, answered):
        return ()
    for platform_message_id in found:
        if await recorded(platform_message_id):
            # Another reply's, recorded while we looked: what else is here is unclear.
            await inbox.forget_send_marks(sorted(answered))
            return ()
    # A warning: a crash cut a send from its record (rare, and worth an operator's eye).
    log.warning(
        "inbox %s: %d part(s) of its reply were delivered before the restart (%s)",
        item.id,
        len(found),
        ", ".join(found),
    )
    return found


async def _doubt_shared(inbox: SentRecords, item: InboxItem, answered: set[int]) -> bool:
    """Is another reply to the same chat stored but not recorded as sent (so it may
    have sent a message we cannot tell from ours)? Then none of them is looked for,
    now or after a later crash: each one's mark is forgotten, and each is resent. (A
    reply resent leaves its first message, if there was one, unrecorded in the chat:
    the next to look would take it for its own.)"""
    target = item.message
    others = [
        other.id
        for other in await inbox.open_replies(target.channel, target.account)
        if other.id not in answered and other.message.chat_id == target.chat_id
    ]
    if not others:
        return False
    log.warning(
        "inbox %s: %s to the same chat open too; sending each reply again",
        item.id,
        ", ".join(f"inbox {other}" for other in others),
    )
    await inbox.forget_send_marks(sorted({*answered, *others}))
    return True
