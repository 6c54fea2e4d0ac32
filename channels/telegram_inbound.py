"""Turning a Telegram ``Update`` into an ``InboundMessage`` (or nothing).

Dropped, by design: updates that are not messages or edits (channel posts included),
messages from bots (anonymous group admins arrive as a bot too), service messages,
``/cmd@other_bot`` in groups, and edits unless the edit rule is "answer".

Ids: Telegram numbers messages per chat, so ``message_id`` is ``"<chat>:<message>"``
(and ``"<chat>:<message>:edit:<edit_date>"`` for an edit, so each edit is a new inbox
entry); ``parse_message_ref`` reads one back when a reply targets it.

Offsets of entities count UTF-16 units, so cuts are made on UTF-16 text. The
encoding passes lone surrogates through (JSON can carry ``"\\ud800"`` and an entity
may end inside a pair): the gateway scrubs them later, and a stray one must cost a
character, never the message.
"""

from __future__ import annotations

import logging
import re
import warnings
from datetime import timedelta

from telegram import Message, MessageEntity, Update, User
from telegram.warnings import PTBDeprecationWarning

from parley.channels.base import Attachment, AttachmentKind, ChatType, InboundMessage
from parley.channels.config import EditRule
from parley.channels.text import utf16_len

logger = logging.getLogger("parley.channels.telegram")

CHANNEL = "telegram"
REPLY_CONTEXT_CHARS = 500
EDITED_PREFIX = "(edited) "
_LEADING_PUNCTUATION = " \t,:;"
_SPACE_BEFORE_PUNCTUATION = re.compile(r"[ \t]+$")
_UTF16 = "utf-16-le"
_PASS = "surrogatepass"


def read_period(owner: object, attribute: str) -> float | None:
    """A PTB duration in seconds, whether PTB gives an int or a timedelta.

    PTB 22 warns on every read of these attributes unless PTB_TIMEDELTA opts in; the
    value itself is what we want either way.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = getattr(owner, attribute, None)
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def parse_message_ref(ref: str | None) -> tuple[str, int] | None:
    """``"<chat>:<message>[:edit:<date>]"`` → (chat id, message id); None if not ours."""
    if not ref:
        return None
    parts = ref.split(":")
    if len(parts) < 2:
        return None
    try:
        return parts[0], int(parts[1])
    except ValueError:
        return None


def display_name(user: User | None) -> str:
    if user is None:
        return "someone"
    full = " ".join(p for p in (user.first_name, user.last_name) if p).strip()
    return full or user.username or str(user.id)


def _seconds_label(owner: object) -> str:
    seconds = read_period(owner, "duration")
    return f", {round(seconds)} s" if seconds is not None else ""


def placeholder(message: Message) -> str:
    """A short stand-in for what text cannot carry ("[photo]", "[voice note, 5 s]")."""
    if message.sticker:
        return f"[sticker {message.sticker.emoji}]" if message.sticker.emoji else "[sticker]"
    if message.photo:
        return "[photo]"
    if message.voice:
        return f"[voice note{_seconds_label(message.voice)}]"
    if message.video_note:
        return f"[video note{_seconds_label(message.video_note)}]"
    if message.animation:  # checked before document: a GIF comes with both
        return "[animation]"
    if message.video:
        return f"[video{_seconds_label(message.video)}]"
    if message.audio:
        title = " – ".join(p for p in (message.audio.performer, message.audio.title) if p)
        return f"[audio{': ' + title if title else ''}{_seconds_label(message.audio)}]"
    if message.document:
        name = message.document.file_name
        return f"[document: {name}]" if name else "[document]"
    if message.venue:
        return f"[venue: {message.venue.title}]"
    if message.location:
        return f"[location: {message.location.latitude:.5f}, {message.location.longitude:.5f}]"
    if message.contact:
        name = " ".join(p for p in (message.contact.first_name, message.contact.last_name) if p)
        return f"[contact: {name}]"
    if message.poll:
        return f"[poll: {message.poll.question}]"
    if message.dice:
        return f"[dice {message.dice.emoji} {message.dice.value}]"
    return ""


def attachments_of(message: Message) -> tuple[Attachment, ...]:
    """The photo, document or voice note of ``message`` (a Telegram message has one)."""
    if message.photo:
        # Sizes come smallest first: the largest (the gateway scales it down itself).
        best = max(message.photo, key=lambda p: p.width * p.height)
        return (
            Attachment(
                "image",
                best.file_id,
                name="photo.jpg",
                mime_type="image/jpeg",
                size=best.file_size,
                width=best.width,
                height=best.height,
            ),
        )
    if message.voice:
        voice = message.voice
        return (
            Attachment(
                "voice",
                voice.file_id,
                name="voice.ogg",
                mime_type=voice.mime_type or "audio/ogg",
                size=voice.file_size,
                duration=read_period(voice, "duration"),
            ),
        )
    if message.document and not message.animation:
        document = message.document
        mime = document.mime_type or ""
        kind: AttachmentKind = "image" if mime.startswith("image/") else "document"
        return (
            Attachment(
                kind,
                document.file_id,
                name=document.file_name or "",
                mime_type=mime,
                size=document.file_size,
            ),
        )
    return ()


def _utf16_cut(data: bytes, spans: list[tuple[int, int]]) -> str:
    """The UTF-16-LE ``data`` without the [start, end) unit spans, whitespace tidied at
    each cut."""
    pieces, position = [], 0
    for start, end in sorted(spans):
        pieces.append(data[position * 2 : max(position, start) * 2].decode(_UTF16, _PASS))
        position = max(position, end)
    pieces.append(data[position * 2 :].decode(_UTF16, _PASS))
    result = pieces[0]
    for piece in pieces[1:]:
        if not result.strip():
            # "@bot, do this" → "do this"
            result, piece = "", piece.lstrip(_LEADING_PUNCTUATION)
        elif result.endswith((" ", "\t", "\n")):
            piece = piece.lstrip(" \t")
            if piece[:1] in (",", ".", "!", "?", ":", ";"):
                # "hey @bot, what" → "hey, what"
                result = _SPACE_BEFORE_PUNCTUATION.sub("", result)
        result += piece
    return result.strip()


class _Body:
    """The text of a message (or caption) with our command suffix and mentions removed."""

    def __init__(self, message: Message, bot: User) -> None:
        self.text = ""
        self.mentioned = False
        self.command = False  # a leading /command for us (bare or @ourbot)
        self.foreign_command = False  # a leading /command@other_bot
        raw = message.text if message.text is not None else message.caption
        if raw is None:
            return
        entities = message.entities if message.text is not None else message.caption_entities
        spans: list[tuple[int, int]] = []
        ours = (bot.username or "").lower()
        # Entity offsets count UTF-16 units: encode once, not once per entity and cut.
        data = raw.encode(_UTF16, _PASS)
        for entity in entities:
            end = entity.offset + entity.length
            piece = data[entity.offset * 2 : end * 2].decode(_UTF16, _PASS)
            if entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
                _, _, target = piece.partition("@")
                if not target or target.lower() == ours:
                    self.command = True
                    if target:
                        spans.append((end - utf16_len(target) - 1, end))
                else:
                    self.foreign_command = True
            elif _names_bot(entity, piece, bot, ours):
                self.mentioned = True
                spans.append((entity.offset, end))
        self.text = _utf16_cut(data, spans) if spans else raw.strip()


def _names_bot(entity: MessageEntity, piece: str, bot: User, username: str) -> bool:
    """Whether the entity names us; ``username`` is the bot's, lowercased."""
    if entity.type == MessageEntity.MENTION:
        return piece[1:].lower() == username
    return entity.type == MessageEntity.TEXT_MENTION and (
        entity.user is not None and entity.user.id == bot.id
    )


def _is_topic_header(message: Message, reply: Message) -> bool:
    # In forum topics every message "replies" to the topic's creation message; that is
    # not a reply the person made.
    return reply.forum_topic_created is not None or (
        bool(message.is_topic_message) and reply.message_id == message.message_thread_id
    )


def _replied(message: Message) -> Message | None:
    """The message ``message`` replies to, in its chat (a forum topic's header is not)."""
    reply = message.reply_to_message
    return None if reply is None or _is_topic_header(message, reply) else reply


def _reply_context(message: Message, bot: User) -> tuple[str | None, bool]:
    """(the replied-to or quoted text with its author, whether it replies to the bot)."""
    reply = _replied(message)
    quote = message.quote.text if message.quote else None
    if reply is None and quote is None:
        return None, False
    to_bot = reply is not None and reply.from_user is not None and reply.from_user.id == bot.id
    body = quote
    if body is None and reply is not None:
        words = reply.text if reply.text is not None else reply.caption
        body = " ".join(p for p in (placeholder(reply), (words or "").strip()) if p)
    context = f"{display_name(reply.from_user)}: {body}" if reply is not None else body or ""
    if len(context) > REPLY_CONTEXT_CHARS:
        context = context[: REPLY_CONTEXT_CHARS - 1] + "…"
    return (context or None), to_bot


def _chat_shape(message: Message) -> tuple[ChatType, str | None] | None:
    chat = message.chat
    thread = str(message.message_thread_id) if message.message_thread_id is not None else None
    if chat.type == "private":
        return "direct", thread if message.is_topic_message else None
    if chat.type in ("group", "supergroup"):
        if chat.is_forum and message.is_topic_message and thread is not None:
            return "thread", thread
        return "group", None  # a reply chain in an ordinary group is not a thread
    return None  # channels


def normalise_update(
    update: Update, *, account: str, bot: User, edited_messages: EditRule = "ignore"
) -> InboundMessage | None:
    """The message for the gateway, or None when the update is not for us."""
    message, edited = update.message, False
    if message is None and update.edited_message is not None:
        if edited_messages == "ignore":
            logger.debug("telegram %s: edit of a message ignored", account)
            return None
        message, edited = update.edited_message, True
    if message is None:
        logger.debug("telegram %s: update %s is not a message", account, update.update_id)
        return None
    sender = message.from_user
    if sender is None or sender.is_bot:
        logger.debug("telegram %s: message without a human sender dropped", account)
        return None
    shape = _chat_shape(message)
    if shape is None:
        return None
    chat_type, thread_id = shape
    body = _Body(message, bot)
    if body.foreign_command and chat_type != "direct":
        logger.debug("telegram %s: command for another bot dropped", account)
        return None
    text = " ".join(p for p in (placeholder(message), body.text) if p)
    attachments = attachments_of(message)
    if not text and not attachments:
        logger.debug("telegram %s: message %s has nothing usable", account, message.message_id)
        return None
    reply_to_text, replies_to_bot = _reply_context(message, bot)
    # reply_to_message is always of the same chat (a reply to another chat's message
    # comes as external_reply, never read here): its files are this chat's.
    replied = _replied(message)
    reply_attachments = attachments_of(replied) if replied is not None else ()
    chat_id = str(message.chat.id)
    message_id = f"{chat_id}:{message.message_id}"
    timestamp = message.date
    if edited:
        edit_date = message.edit_date or message.date
        message_id = f"{message_id}:edit:{int(edit_date.timestamp())}"
        timestamp, text = edit_date, EDITED_PREFIX + text
    return InboundMessage(
        channel=CHANNEL,
        account=account,
        chat_type=chat_type,
        chat_id=chat_id,
        sender_id=str(sender.id),
        sender_name=display_name(sender),
        text=text,
        message_id=message_id,
        timestamp=timestamp,
        mentions_bot=(chat_type == "direct" or body.mentioned or body.command or replies_to_bot),
        thread_id=thread_id,
        reply_to_text=reply_to_text,
        edited=edited,
        attachments=() if edited else attachments,  # an edit's file was sent before
        reply_attachments=() if edited else reply_attachments,
    )
