"""Stored pictures in a request (core.media): inline for a model that sees images, a
placeholder otherwise; the transcript form never holds bytes; the token estimate."""

from __future__ import annotations

import base64

from parley.core.media import (
    UNKNOWN_IMAGE_TOKENS,
    has_stored_images,
    image_tokens,
    resolve_images,
)
from parley.core.messages import ImageBlock, Message, TextBlock, block_from_dict
from parley.core.tokens import IMAGE_PLACEHOLDER_TOKENS, IMAGE_TOKENS, default_counter

PHOTO = ImageBlock("image/jpeg", ref="person/telegram%3A1/ab/" + "ab" * 32 + ".jpg",
                   name="cat.jpg", width=1200, height=900)  # fmt: skip


class Loader:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.loads: list[str] = []

    def load(self, ref: str) -> bytes | None:
        self.loads.append(ref)
        return self.files.get(ref)


def test_a_stored_picture_is_a_reference_in_the_transcript() -> None:
    stored = PHOTO.to_dict()
    assert "data" not in stored
    assert stored == {"type": "image", "media_type": "image/jpeg", "ref": PHOTO.ref,
                      "name": "cat.jpg", "width": 1200, "height": 900}  # fmt: skip
    assert block_from_dict(stored) == PHOTO
    # Older transcripts: inline data (and a bare placeholder) read as before.
    assert block_from_dict({"type": "image", "media_type": "image/png", "data": "aGk="}) == (
        ImageBlock("image/png", "aGk=")
    )
    assert block_from_dict({**stored, "width": "12", "height": True}).width == 0


def test_image_tokens_follow_the_pixels() -> None:
    assert image_tokens(1200, 900) == 1440
    assert image_tokens(750, 1) == 1 and image_tokens(751, 1) == 2
    assert image_tokens(0, 10) == UNKNOWN_IMAGE_TOKENS
    counter = default_counter()
    assert counter.block(PHOTO) == 1440
    assert counter.block(ImageBlock("image/png", "aGk=")) == IMAGE_TOKENS
    assert counter.block(ImageBlock("image/png")) == IMAGE_PLACEHOLDER_TOKENS


def test_resolve_inlines_for_vision_and_keeps_other_messages_as_they_are() -> None:
    plain = Message.user("hello")
    sent = Message("user", (TextBlock("look"), PHOTO))
    loader = Loader({PHOTO.ref: b"\xff\xd8jpeg"})
    cache: dict[str, str | None] = {}
    out = resolve_images([plain, sent, sent], loader, vision=True, cache=cache)
    assert out[0] is plain  # untouched messages keep their identity (and cached forms)
    assert out[1].content == (
        TextBlock("look"),
        TextBlock("[image cat.jpg, 1200×900]"),
        ImageBlock("image/jpeg", base64.b64encode(b"\xff\xd8jpeg").decode()),
    )
    assert sent.content == (TextBlock("look"), PHOTO)  # the original is not changed
    assert loader.loads == [PHOTO.ref]  # read once per turn (the cache)
    assert has_stored_images([sent]) and not has_stored_images(out)


def test_resolve_without_vision_or_without_the_file_is_a_placeholder() -> None:
    sent = Message("user", (TextBlock("what is it?"), PHOTO))
    blind = resolve_images([sent], Loader({PHOTO.ref: b"x"}), vision=False)
    assert blind[0].content[1] == TextBlock(
        "[image cat.jpg, 1200×900: the current model cannot see images; "
        "only the words sent with it are here]"
    )
    gone = resolve_images([sent], Loader({}), vision=True)
    assert gone[0].content == (TextBlock("what is it?"),
                               TextBlock("[image cat.jpg, 1200×900: no longer kept]"))  # fmt: skip
    assert resolve_images([sent], None, vision=True)[0].content[1] == gone[0].content[1]
