"""Did a reply go out before the crash? Telegram has no duplicate check of its own.

A kill that lands after Telegram accepted a reply but before the gateway recorded
the delivery leaves the reply's fate unknown; sending it again would show it twice.
So before each send the gateway stores a *mark* with the reply: the highest message
id known to exist in the chat's numbering. Anything the bot sends afterwards has a
higher id. After a restart ``probe`` looks at the ids just above the mark and asks
Telegram, message by message, whether each is the bot's own message in that chat.

The question is an ``editMessageReplyMarkup`` that changes nothing (no markup on a
message that has none); its answer tells the three cases apart without altering any
message parley sends, since those carry no keyboard:

- "message is not modified" — the bot's own message, in this chat;
- "message can't be edited" — someone else's message;
- "message to edit not found" — no message with that id here (deleted, or an id
  from another chat: see the numbering below).

Numbering: in private chats and basic groups a bot's message ids come from the
bot's one counter, shared by all those chats; supergroups and channels number
their own messages. ``Numbering`` keeps the highest id seen per chat and, for the
shared counter, per account: the mark is the higher of the two, so the reply is
usually the next id or one of the next few. The channel notes every getUpdates batch
as it arrives, and after a start takes no mark before the poller has read the queue
that built up meanwhile to its end (``TelegramChannel._fetch``): else a reply resent
at start would get a mark below all of it.

How far to look: ``PROBE_IDS`` ids above the mark, or above the highest id known in
the chat's numbering now, whichever is higher, and never more than ``MAX_PROBE_IDS``.
A mark far below what is known now means many messages took ids between the mark and
the send (a busy bot: with 50 chats answered at once, ``bench/crash_soak.py`` resent
four replies that a 24-id look missed); a quiet bot
looks at 24 ids as before. A reply further away than that is not found and is sent
again, the answer a reply sent twice always gets rather than a lost one.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from telegram import Bot
from telegram.error import BadRequest, TelegramError

from parley.channels.base import RecordedCheck

logger = logging.getLogger("parley.channels.telegram")

# Ids above the mark (or above the highest id known now) asked about per reply; each
# is one Bot API call, and only replies whose delivery a crash left unknown are probed.
PROBE_IDS = 24
MAX_PROBE_IDS = 96  # a not-found reply costs at most this many calls
# Chats whose highest id is remembered (the least recently active are forgotten:
# a chat without a known id still gets a mark from the message it answers).
REMEMBERED_CHATS = 50_000
# Telegram's dialog ids for supergroups and channels are -100… with the channel id
# (at or below -10^12); users are positive and basic groups lie above it.
_CHANNEL_IDS_BELOW = -1_000_000_000_000


def shares_bot_numbering(chat_id: int) -> bool:
    """Do this chat's message ids come from the bot's own counter (private chats and
    basic groups) rather than the chat's (supergroups and channels)?"""
    return chat_id > _CHANNEL_IDS_BELOW


class Numbering:
    """The highest message id seen per chat, and per account's shared counter."""

    def __init__(self, remembered_chats: int = REMEMBERED_CHATS) -> None:
        self._per_chat: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._per_account: dict[str, int] = {}
        self._limit = remembered_chats

    def observe(self, account: str, chat_id: int, message_id: int) -> None:
        key = (account, chat_id)
        self._per_chat[key] = max(self._per_chat.get(key, 0), message_id)
        self._per_chat.move_to_end(key)
        while len(self._per_chat) > self._limit:
            self._per_chat.popitem(last=False)
        if shares_bot_numbering(chat_id):
            self._per_account[account] = max(self._per_account.get(account, 0), message_id)

    def mark(self, account: str, chat_id: int, floor: int = 0) -> int | None:
        """The highest id known to exist in this chat's numbering, at least ``floor``
        (the id of the message being answered); None when nothing is known."""
        known = max(floor, self._per_chat.get((account, chat_id), 0))
        if shares_bot_numbering(chat_id):
            known = max(known, self._per_account.get(account, 0))
        return known or None


class ProbeError(Exception):
    """Telegram would not say (flood control, network, a chat it no longer knows)."""


async def _is_own_message(bot: Bot, chat_id: int, message_id: int) -> bool:
    try:
        await bot.edit_message_reply_markup(chat_id=chat_id, message_id=message_id)
    except BadRequest as exc:
        reason = exc.message.lower()
        if "not modified" in reason:
            return True
        if "can't be edited" in reason or "to edit not found" in reason:
            return False
        raise ProbeError(exc.message) from exc
    except TelegramError as exc:
        raise ProbeError(f"{type(exc).__name__}: {exc.message}") from exc
    # It had a keyboard (which is now gone): a bot message all the same.
    logger.warning("telegram: probing %s:%s removed a keyboard", chat_id, message_id)
    return True


def probe_end(mark: int, known: int | None) -> int:
    """The last id to ask about for a reply marked ``mark``, the highest id known in the
    chat's numbering being ``known`` (module docstring)."""
    return min(mark + MAX_PROBE_IDS, max(mark, known or 0) + PROBE_IDS)


async def probe(
    bot: Bot, chat_id: int, mark: int, parts: int, recorded: RecordedCheck, end: int
) -> tuple[str, ...] | None:
    """The bot's messages in ``chat_id`` above ``mark`` up to ``end`` (``probe_end``)
    that ``recorded`` does not claim, as ``"chat:message"`` ids in order, at most
    ``parts``; None when Telegram would not answer."""
    found: list[str] = []
    for message_id in range(mark + 1, end + 1):
        try:
            own = await _is_own_message(bot, chat_id, message_id)
        except ProbeError as exc:
            logger.warning("telegram: cannot tell whether %s got a reply: %s", chat_id, exc)
            return None
        ref = f"{chat_id}:{message_id}"
        if own and not await recorded(ref):
            found.append(ref)
            if len(found) == parts:
                break
    return tuple(found)
