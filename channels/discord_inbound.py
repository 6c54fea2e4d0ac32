"""Turning a discord.py ``Message`` into an ``InboundMessage`` (or nothing).

Dropped, by design: the bot's own messages, other bots' unless ``allow_bots``, system
messages (joins, pins, boosts, thread notices: anything but a plain message or a
reply), edits under the "ignore" rule or edits that did not change the text (embed
unfurls arrive as edits too), and messages with nothing usable in them (a guild
message reads as blank when the bot lacks the Message Content intent).

Shapes: a DM is "direct" (chat id = the DM channel), a guild channel "group", a thread
"thread" with the parent channel as chat id and the thread as thread id; the guild id
rides along for the per-guild rules.

Ids: snowflakes are unique across Discord, so ``message_id`` is the message id; an
edit is ``"<id>:edit:<edited_at in ms>"`` so each edit is a new inbox entry while a
repeated delivery of the same edit is still recognised.

Text keeps Markdown (the model reads it fine) and turns Discord's markup into what a
person sees: ``<@id>`` → ``@Name``, ``<@&id>`` → ``@role``, ``<#id>`` → ``#channel``,
``<:name:id>`` → ``:name:``; the bot's own mention is removed. Attachments and stickers
become placeholders such as ``[image: cat.png]``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import discord

from parley.channels.base import Attachment, AttachmentKind, ChatType, InboundMessage
from parley.channels.config import EditRule

logger = logging.getLogger("parley.channels.discord")

CHANNEL = "discord"
REPLY_CONTEXT_CHARS = 500
EDITED_PREFIX = "(edited) "
_ANSWERABLE_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})
# Snowflakes are ASCII digits, at most 20 of them (64 bits). ``\d`` would also take
# other scripts' digits, and a run past int()'s 4,300-digit limit would raise and lose
# the whole message: such look-alikes stay as typed.
_MARKUP = re.compile(
    r"<(?P<kind>@!?|@&|#)(?P<id>[0-9]{1,20})>"  # user, role and channel mentions
    r"|<a?:(?P<emoji>\w+):[0-9]{1,20}>"  # custom (and animated) emoji
    r"|</(?P<command>[\w -]+):[0-9]{1,20}>"  # slash-command mentions
)
_TRAILING_PUNCTUATION = ",.!?:;"

ChannelLookup = Callable[[int], object | None]


def display_name(user: discord.abc.User) -> str:
    # A Member's display name is its guild nick first; a User's its global name.
    return user.display_name or user.name or str(user.id)


def _size_label(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{round(size / 1024)} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def _is_voice(message: discord.Message, attachment: discord.Attachment) -> bool:
    return attachment.duration is not None and (
        attachment.is_voice_message() or message.flags.voice
    )


def attachments_of(message: discord.Message) -> tuple[Attachment, ...]:
    """Every file of ``message``, described; fetched later through its URL (discord.py's
    own CDN request, ``DiscordChannel.fetch_attachment``)."""
    found = []
    for attachment in message.attachments:
        mime = attachment.content_type or ""
        kind: AttachmentKind = "document"
        if _is_voice(message, attachment):
            kind = "voice"
        elif mime.startswith("image/"):
            kind = "image"
        found.append(
            Attachment(
                kind,
                attachment.url,
                name=attachment.filename,
                mime_type=mime,
                size=attachment.size,
                width=attachment.width,
                height=attachment.height,
                duration=attachment.duration,
            )
        )
    return tuple(found)


def placeholders(message: discord.Message) -> list[str]:
    """Stand-ins for what text cannot carry, one per attachment and sticker."""
    labels = []
    for attachment in message.attachments:
        if _is_voice(message, attachment):
            labels.append(f"[voice message, {round(attachment.duration or 0)} s]")
        elif (attachment.content_type or "").startswith("image/"):
            labels.append(f"[image: {attachment.filename}]")
        else:
            labels.append(f"[file: {attachment.filename}, {_size_label(attachment.size)}]")
    labels.extend(f"[sticker: {sticker.name}]" for sticker in message.stickers)
    return labels


def _own_role_ids(message: discord.Message, me: discord.abc.User) -> list[int]:
    # Discord gives each bot a managed role named after it; people pick it from the
    # mention list by mistake as often as the bot itself.
    return [r.id for r in message.role_mentions if r.tags is not None and r.tags.bot_id == me.id]


def mentions_me(message: discord.Message, me: discord.abc.User) -> bool:
    return any(u.id == me.id for u in message.mentions) or bool(_own_role_ids(message, me))


def _remove_own_mentions(text: str, me: discord.abc.User, role_ids: list[int]) -> str:
    tokens = [rf"<@!?{me.id}>", *(rf"<@&{rid}>" for rid in role_ids)]
    pattern = re.compile(
        rf"[ \t]*(?:{'|'.join(tokens)})[ \t]*(?:(?P<punct>[{_TRAILING_PUNCTUATION}])[ \t]*)?"
    )

    def cut(match: re.Match[str]) -> str:
        before, after = match.string[: match.start()], match.string[match.end() :]
        if not before.strip(" \t") or before.endswith("\n"):
            return ""  # "@bot, do this" → "do this"
        punct = match["punct"] or ""
        if not after or after.startswith("\n"):
            return punct  # "thanks @bot!" → "thanks!"
        return f"{punct} " if punct else " "  # "hey @bot, look" → "hey, look"

    return pattern.sub(cut, text)


def _rewrite_markup(text: str, message: discord.Message, lookup: ChannelLookup) -> str:
    guild = message.guild
    users = {u.id: u for u in message.mentions}
    roles = {r.id: r for r in message.role_mentions}

    def user_name(uid: int) -> str:
        user = users.get(uid) or (guild.get_member(uid) if guild else None)
        return f"@{display_name(user)}" if user is not None else "@unknown-user"

    def role_name(rid: int) -> str:
        role = roles.get(rid) or (guild.get_role(rid) if guild else None)
        return f"@{role.name}" if role is not None else "@unknown-role"

    def channel_name(cid: int) -> str:
        name = getattr(lookup(cid), "name", None)
        return f"#{name}" if name else "#unknown-channel"

    def replace(match: re.Match[str]) -> str:
        if match["emoji"]:
            return f":{match['emoji']}:"
        if match["command"]:
            return f"/{match['command']}"
        kind, ident = match["kind"], int(match["id"])
        if kind == "@&":
            return role_name(ident)
        return channel_name(ident) if kind == "#" else user_name(ident)

    return _MARKUP.sub(replace, text)


def render_text(message: discord.Message, me: discord.abc.User, lookup: ChannelLookup) -> str:
    """The message as a person reads it, placeholders after the words."""
    text = _remove_own_mentions(message.content, me, _own_role_ids(message, me))
    if not text.strip():
        text = message.content  # a bare ping still says something: keep it as "@Name"
    text = _rewrite_markup(text, message, lookup).strip()
    return "\n".join(p for p in (text, *placeholders(message)) if p)


def _replied(message: discord.Message) -> discord.Message | None:
    """The message ``message`` replies to, when Discord sent it along and it is in the
    same channel (a thread's reply to its starter counts: discord.py gives it the
    thread). None: not a reply, the original was deleted, or it lies elsewhere (a
    reference can point at another channel), whose words and files are another
    conversation's."""
    reference = message.reference
    replied = reference.resolved if reference is not None else None
    if not isinstance(replied, discord.Message) or replied.channel.id != message.channel.id:
        return None
    return replied


def reply_attachments_of(message: discord.Message) -> tuple[Attachment, ...]:
    """The files of the message ``message`` replies to (see ``_replied``)."""
    replied = _replied(message)
    return attachments_of(replied) if replied is not None else ()


def _reply_context(
    message: discord.Message, me: discord.abc.User, lookup: ChannelLookup
) -> tuple[str | None, bool]:
    """(the replied-to message as "Name: text", whether it is one of the bot's)."""
    replied = _replied(message)
    if replied is None:
        return None, False
    context = f"{display_name(replied.author)}: {render_text(replied, me, lookup)}"
    if len(context) > REPLY_CONTEXT_CHARS:
        context = context[: REPLY_CONTEXT_CHARS - 1] + "…"
    return context, replied.author.id == me.id


def _shape(message: discord.Message) -> tuple[ChatType, str, str | None, str | None]:
    """(chat type, chat id, thread id, guild id)."""
    channel = message.channel
    guild_id = message.guild.id if message.guild is not None else None
    if guild_id is None:
        # A guild message can reach us before its guild is cached: its channel is
        # then a PartialMessageable that still knows the guild id.
        guild_id = getattr(channel, "guild_id", None)
    if guild_id is None:
        return "direct", str(channel.id), None, None
    if isinstance(channel, discord.Thread):
        return "thread", str(channel.parent_id), str(channel.id), str(guild_id)
    return "group", str(channel.id), None, str(guild_id)


def _wanted(message: discord.Message, me: discord.abc.User, allow_bots: bool) -> bool:
    if message.author.id == me.id:
        return False
    if message.type not in _ANSWERABLE_TYPES:
        return False
    return allow_bots or not message.author.bot


def normalise_message(
    message: discord.Message,
    *,
    account: str,
    me: discord.abc.User,
    lookup: ChannelLookup,
    allow_bots: bool = False,
    edited: bool = False,
) -> InboundMessage | None:
    """The message for the gateway, or None when it is not for us."""
    if not _wanted(message, me, allow_bots):
        return None
    chat_type, chat_id, thread_id, guild_id = _shape(message)
    text = render_text(message, me, lookup)
    if not text:
        logger.debug("discord %s: message %s has nothing usable", account, message.id)
        return None
    reply_to_text, replies_to_me = _reply_context(message, me, lookup)
    message_id, timestamp = str(message.id), message.created_at
    if edited and message.edited_at is not None:
        timestamp = message.edited_at
        message_id = f"{message.id}:edit:{int(timestamp.timestamp() * 1000)}"
        text = EDITED_PREFIX + text
    return InboundMessage(
        channel=CHANNEL,
        account=account,
        chat_type=chat_type,
        chat_id=chat_id,
        sender_id=str(message.author.id),
        sender_name=display_name(message.author),
        text=text,
        message_id=message_id,
        timestamp=timestamp,
        mentions_bot=chat_type == "direct" or mentions_me(message, me) or replies_to_me,
        thread_id=thread_id,
        reply_to_text=reply_to_text,
        guild_id=guild_id,
        edited=edited,
        attachments=() if edited else attachments_of(message),  # an edit's files came before
        reply_attachments=() if edited else reply_attachments_of(message),
    )


def normalise_edit(
    update: discord.RawMessageUpdateEvent,
    *,
    account: str,
    me: discord.abc.User,
    lookup: ChannelLookup,
    rule: EditRule,
    allow_bots: bool = False,
) -> InboundMessage | None:
    """An edit under the edit rule, or None. Uses the raw event so that edits of
    messages from before a restart (not in discord.py's cache) count too."""
    if rule == "ignore":
        return None
    after, before = update.message, update.cached_message
    if after.edited_at is None:
        return None  # an embed unfurl or a pin: Discord did not mark it edited
    if before is not None and before.content == after.content:
        return None  # only attachments or embeds changed
    return normalise_message(
        after, account=account, me=me, lookup=lookup, allow_bots=allow_bots, edited=True
    )
