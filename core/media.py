"""Pictures in the model's view: what a request sends for an ``ImageBlock``.

A picture someone sent is stored by the gateway (its media store) and the transcript
holds only a reference (``ImageBlock.ref``) with its name and size in pixels. Only a
request carries the bytes: just before each provider call the runner hands the view to
``resolve_images`` (on a worker thread), which gives back the same messages, except
that each message holding a stored picture is a new copy in which the picture is
either inline (base64, for a model that sees images) or a placeholder that says what
it was. The copies live as long as the request: no megabytes are kept with the
session's messages, and no encoded request body holding them outlives its call.

For a model without vision the view itself shows each picture as a placeholder
(``without_vision``, applied by ``core.context.view.build_view``): what is counted is
what is sent, and a 2,048-token local model is not told a photo costs 1,280 tokens.

The bytes come from a ``MediaLoader`` the gateway builds for the turn's reader: it
refuses (None) any file the reader may not see, under the one audience rule
(``core.memory.audience.may_read``), and a file the media store no longer keeps. Either
way the model is told in words, never given an error.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from typing import Protocol

from parley.core.messages import Block, DerivedKey, ImageBlock, Message, TextBlock

# Anthropic's estimate of an image's tokens: width × height / 750.
PIXELS_PER_TOKEN = 750
# An image whose size is not known (an older transcript's inline data).
UNKNOWN_IMAGE_TOKENS = 1_600


class MediaLoader(Protocol):
    """The stored bytes of a picture for one reader, or None (gone, or not theirs).
    Blocking: called on a worker thread."""

    def load(self, ref: str) -> bytes | None: ...


def image_tokens(width: int, height: int) -> int:
    """What an image of ``width`` × ``height`` pixels costs a vision model."""
    if width <= 0 or height <= 0:
        return UNKNOWN_IMAGE_TOKENS
    return max(1, math.ceil(width * height / PIXELS_PER_TOKEN))


def describe(block: ImageBlock) -> str:
    """ "photo.jpg, 1200×900" (what a placeholder names)."""
    name = block.name or "picture"
    if block.width and block.height:
        return f"{name}, {block.width}×{block.height}"
    return name


def gone_placeholder(block: ImageBlock) -> str:
    return f"[image {describe(block)}: no longer kept]"


def no_vision_placeholder(block: ImageBlock) -> str:
    return (
        f"[image {describe(block)}: the current model cannot see images; "
        "only the words sent with it are here]"
    )


def pruned_placeholder(block: ImageBlock) -> str:
    return f"[image {describe(block)}: sent earlier, no longer shown to the model]"


# Kept on each message (``Message.derived``): asked before every provider call, over a
# view whose messages are the same objects from turn to turn.
_STORED_IMAGES: DerivedKey[bool] = DerivedKey("stored images")


def _holds_stored_images(message: Message) -> bool:
    found = message.derived(_STORED_IMAGES)
    if found is None:
        found = any(isinstance(b, ImageBlock) and b.ref for b in message.content)
        message.keep_derived(_STORED_IMAGES, found)
    return found


def has_stored_images(messages: Sequence[Message]) -> bool:
    return any(_holds_stored_images(m) for m in messages)


_BLIND: DerivedKey[Message] = DerivedKey("images for a model without vision")


def without_vision(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as a model without vision reads them: each stored picture a
    placeholder saying so (the words sent with it stay). Done on the view, so what is
    counted is what is sent; each copy is kept on its message, so the view hands the
    same one from turn to turn. Messages without pictures are the same objects."""
    out = []
    for message in messages:
        if not _holds_stored_images(message):
            out.append(message)
            continue
        blind = message.derived(_BLIND)
        if blind is None:
            blind = Message(
                message.role,
                tuple(
                    TextBlock(no_vision_placeholder(b))
                    if isinstance(b, ImageBlock) and b.ref
                    else b
                    for b in message.content
                ),
            )
            message.keep_derived(_BLIND, blind)
        out.append(blind)
    return out


def resolve_images(
    messages: Sequence[Message],
    loader: MediaLoader | None,
    *,
    vision: bool,
    cache: dict[str, str | None] | None = None,
) -> tuple[Message, ...]:
    """``messages`` as a request sends them (see the module doc). ``cache`` keeps each
    ref's base64 for the calls of one turn (a tool loop sends the same picture again);
    the caller drops it with the turn. Blocking (reads files): call it on a thread."""
    cache = {} if cache is None else cache
    out: list[Message] = []
    for message in messages:
        if not _holds_stored_images(message):
            out.append(message)
            continue
        blocks: list[Block] = []
        for block in message.content:
            if not isinstance(block, ImageBlock) or not block.ref:
                blocks.append(block)
            elif not vision:
                blocks.append(TextBlock(no_vision_placeholder(block)))
            else:
                data = _load(block.ref, loader, cache)
                if data is None:
                    blocks.append(TextBlock(gone_placeholder(block)))
                else:
                    # Named for the model: which picture this is (the words may refer to it).
                    blocks.append(TextBlock(f"[image {describe(block)}]"))
                    blocks.append(ImageBlock(block.media_type, data))
        out.append(Message(message.role, tuple(blocks)))
    return tuple(out)


def _load(ref: str, loader: MediaLoader | None, cache: dict[str, str | None]) -> str | None:
    if ref in cache:
        return cache[ref]
    raw = loader.load(ref) if loader is not None else None
    data = base64.b64encode(raw).decode("ascii") if raw else None
    cache[ref] = data
    return data
