"""What a turn makes of the attachments of its messages: the blocks the model reads, and
the notices the person is told.

Decided here, at the start of the turn (the inbox holds only the platform's references,
so a turn run again after a crash fetches again):

- a picture is fetched through its adapter (``channels.base.AttachmentSource``), made
  ready (``images``: upright, longer side ``image_max_side``) and kept in the media
  store under the conversation's audience; the transcript gets an ``ImageBlock`` that
  refers to it (``core.media`` puts the bytes in the request, or a placeholder for a
  model without vision);
- a document's text (``documents``), cut like a tool result to fit the window;
- a voice note's words, when a transcription endpoint is configured, else a placeholder
  saying it was not transcribed.

Whatever cannot be used (too big, an unsupported type, unreadable, gone from the
platform) costs only itself: the model reads a line saying what it was and why it is
missing, beside the words sent with it, and the person gets a notice before the reply.
Nothing is fetched from anywhere but the platform's own file API.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from parley.channels.base import (
    Attachment,
    AttachmentSource,
    AttachmentUnavailable,
    Channel,
    InboundMessage,
)
from parley.core.fences import neutralise_line
from parley.core.memory.audience import Audience
from parley.core.messages import Block, ImageBlock, TextBlock
from parley.core.tools.truncation import tool_result_cap, truncate_tool_result
from parley.gateway.errors import MediaRejected
from parley.gateway.media.config import MediaConfig
from parley.gateway.media.documents import SUPPORTED, document_kind, document_text
from parley.gateway.media.images import prepare_image
from parley.gateway.media.store import MediaStore
from parley.gateway.media.transcription import Transcriber

log = logging.getLogger("parley.gateway.media")

_NOUNS = {"image": "picture", "document": "document", "voice": "voice note"}


@dataclass(frozen=True, slots=True)
class Intake:
    blocks: tuple[Block, ...] = ()
    notices: tuple[str, ...] = ()  # one line per attachment that could not be used


def size_label(size: int) -> str:
    if size >= 1_000_000:
        return f"{size / 1_000_000:.1f} MB"
    if size >= 1_000:
        return f"{size / 1_000:.0f} kB"
    return f"{size} bytes"


def _name(attachment: Attachment) -> str:
    if attachment.kind == "voice" or not attachment.name:
        return f"the {_NOUNS[attachment.kind]}"
    return attachment.name


def _duration(attachment: Attachment) -> str:
    return f", {round(attachment.duration)} s" if attachment.duration else ""


def with_notices(reply: str, notices: Sequence[str]) -> str:
    """The reply with the notices before it (the person learns first what was not read)."""
    if not notices:
        return reply
    return "\n".join(notices) + ("\n\n" + reply if reply else "")


@dataclass(frozen=True, slots=True)
class TakenFile:
    message: InboundMessage  # the message of the turn it is fetched for (same chat)
    attachment: Attachment
    origin: str = ""  # where it came from, when not with the message itself


def has_files(message: InboundMessage) -> bool:
    """Does ``message`` bring files a turn may take (its own, its reply's, its group
    context's)?"""
    return bool(
        message.attachments
        or message.reply_attachments
        or any(line.attachments for line in message.group_context)
    )


def files_of(messages: Sequence[InboundMessage], earlier_files: int) -> list[TakenFile]:
    """The files a turn over ``messages`` takes, in the order the model reads them.

    Of the group context (what others said before the agent was addressed), only the
    newest ``earlier_files``: those are what "what do you make of this?" is about, and
    each costs what it does when sent directly. Every message's own files and those of
    the message it replies to are taken, a file that two of them bring only once (a
    reply to a photo that is also in the group context). All of them come from the
    turn's own chat: the adapters keep a reply's files only when the replied-to
    message is in that chat, and the group context is the conversation's own.
    """
    earlier = [
        TakenFile(message, attachment, f"sent earlier in this chat by {_who(line.sender_name)}")
        for message in messages
        for line in message.group_context
        for attachment in line.attachments
    ]
    taken = earlier[-earlier_files:] if earlier_files else []
    for message in messages:
        replied = "in the message replied to"
        taken += [TakenFile(message, a, replied) for a in message.reply_attachments]
        taken += [TakenFile(message, a) for a in message.attachments]
    seen: set[str] = set()
    unique = []
    for file in taken:
        if file.attachment.ref not in seen:
            seen.add(file.attachment.ref)
            unique.append(file)
    return unique


def _who(name: str) -> str:
    # A display name is the sender's own words: one line, and short.
    line = neutralise_line(name).strip() or "someone"
    return line if len(line) <= 64 else line[:63] + "…"


class MediaIntake:
    def __init__(
        self,
        config: MediaConfig,
        store: MediaStore,
        channels: Mapping[str, Channel],
        transcriber: Transcriber | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.channels = channels
        self.transcriber = transcriber or Transcriber(config.transcription)

    async def take(
        self, messages: Sequence[InboundMessage], audience: Audience, window_tokens: int
    ) -> Intake:
        """The blocks and notices for the files of ``messages``, in order: the newest
        of the group context's, then per message those of the message it replies to
        and its own."""
        if not self.config.enabled:
            return Intake()
        blocks: list[Block] = []
        notices: list[str] = []
        for taken in files_of(messages, self.config.earlier_files):
            message, attachment = taken.message, taken.attachment
            if taken.origin:
                blocks.append(TextBlock(f"[{taken.origin}:]"))
            try:
                blocks.extend(await self._one(message, attachment, audience, window_tokens))
            except MediaRejected as exc:
                noun, name = _NOUNS[attachment.kind], _name(attachment)
                log.info("%s %s from %s not used: %s", noun, name, message.message_id, exc)
                label = noun if name.startswith("the ") else f"{noun} {name}"
                blocks.append(TextBlock(f"[{label}: not read: {exc}]"))
                notices.append(f"(I could not read {name}: {exc}.)")
        return Intake(tuple(blocks), tuple(notices))

    async def _one(
        self,
        message: InboundMessage,
        attachment: Attachment,
        audience: Audience,
        window_tokens: int,
    ) -> list[Block]:
        config = self.config
        if attachment.kind == "image":
            if audience.kind == "agent":  # nothing anyone sends is everyone's
                raise MediaRejected("pictures are kept only for a person or a group")
            data = await self._fetch(message, attachment, config.max_image_bytes)
            image = await asyncio.to_thread(
                functools.partial(
                    prepare_image,
                    data,
                    max_side=config.image_max_side,
                    max_pixels=config.max_image_pixels,
                )
            )
            ref = await asyncio.to_thread(self.store.put, audience, image.data, image.extension)
            name = attachment.name or f"photo.{image.extension}"
            return [ImageBlock(image.media_type, ref=ref, name=name, width=image.width,
                               height=image.height)]  # fmt: skip
        if attachment.kind == "document":
            kind = document_kind(attachment.name, attachment.mime_type)
            if kind is None:
                what = attachment.mime_type or "this kind of file"
                raise MediaRejected(f"{what} is not a kind of file I read; send {SUPPORTED}")
            data = await self._fetch(message, attachment, config.max_document_bytes)
            text = await asyncio.to_thread(
                functools.partial(
                    document_text, data, kind=kind, max_pdf_pages=config.max_pdf_pages
                )
            )
            text = truncate_tool_result(text, tool_result_cap(window_tokens))
            name = _name(attachment)
            head = f"[document {name} ({kind}, {size_label(len(data))}) begins]"
            return [TextBlock(f"{head}\n{text}\n[document {name} ends]")]
        # A voice note.
        label = f"voice note{_duration(attachment)}"
        if not self.transcriber.configured:
            return [TextBlock(f"[{label}: not transcribed: no transcription service is set up]")]
        data = await self._fetch(message, attachment, config.transcription.max_bytes)
        words = await self.transcriber.transcribe(
            data,
            file_name=attachment.name or "voice.ogg",
            mime_type=attachment.mime_type or "audio/ogg",
        )
        return [TextBlock(f"[{label}, transcribed]\n{words or '(no words heard)'}")]

    async def _fetch(self, message: InboundMessage, attachment: Attachment, limit: int) -> bytes:
        if attachment.size is not None and attachment.size > limit:
            raise MediaRejected(
                f"it is {size_label(attachment.size)}; the limit is {size_label(limit)}"
            )
        channel = self.channels.get(message.channel)
        if not isinstance(channel, AttachmentSource):
            raise MediaRejected(f"files sent on {message.channel} cannot be fetched")
        try:
            data = await channel.fetch_attachment(message, attachment, limit)
        except AttachmentUnavailable as exc:
            if exc.too_large:
                raise MediaRejected(f"it is larger than the limit of {size_label(limit)}") from exc
            raise MediaRejected(f"it could not be fetched from {message.channel} ({exc})") from exc
        if len(data) > limit:  # an adapter that could not stop early
            raise MediaRejected(f"it is {size_label(len(data))}; the limit is {size_label(limit)}")
        return data
