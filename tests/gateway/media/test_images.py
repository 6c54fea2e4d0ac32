"""Photos made ready for a model with Pillow: upright, downscaled, re-encoded, bounded."""

from __future__ import annotations

import io
import sys

import pytest
from PIL import Image

from parley.gateway.errors import MediaRejected
from parley.gateway.media.images import NO_PILLOW, pillow_available, prepare_image
from tests.gateway.media_support import decoded_size, picture


def test_the_longer_side_is_brought_to_the_limit() -> None:
    wide = prepare_image(picture(3000, 1000), max_side=1200, max_pixels=10**8)
    assert (wide.width, wide.height) == (1200, 400)
    assert decoded_size(wide.data) == ("JPEG", (1200, 400))
    assert (wide.media_type, wide.extension) == ("image/jpeg", "jpg")
    small = prepare_image(picture(300, 200), max_side=1200, max_pixels=10**8)
    assert (small.width, small.height) == (300, 200)  # never enlarged


def test_transparency_stays_png_and_other_formats_become_jpeg() -> None:
    clear = prepare_image(picture(64, 64, fmt="PNG", mode="RGBA"), max_side=32, max_pixels=10**6)
    assert clear.media_type == "image/png" and decoded_size(clear.data) == ("PNG", (32, 32))
    gif = prepare_image(picture(40, 30, fmt="GIF"), max_side=1200, max_pixels=10**6)
    assert gif.media_type == "image/jpeg"
    webp = prepare_image(picture(40, 30, fmt="WEBP"), max_side=1200, max_pixels=10**6)
    assert decoded_size(webp.data) == ("JPEG", (40, 30))


def test_exif_orientation_is_applied_and_metadata_dropped() -> None:
    image = Image.new("RGB", (200, 100), (10, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90° clockwise
    exif[0x010F] = "Camera maker"
    out = io.BytesIO()
    image.save(out, format="JPEG", exif=exif)
    ready = prepare_image(out.getvalue(), max_side=1200, max_pixels=10**6)
    assert (ready.width, ready.height) == (100, 200)
    with Image.open(io.BytesIO(ready.data)) as result:
        assert not result.getexif()


def test_too_many_pixels_and_garbage_are_refused() -> None:
    with pytest.raises(MediaRejected, match="4000×4000 pixels; the limit is 1,000,000"):
        prepare_image(picture(4000, 4000), max_side=1200, max_pixels=1_000_000)
    with pytest.raises(MediaRejected, match="not a picture that can be read"):
        prepare_image(b"\x89PNG\r\n\x1a\n truncated", max_side=1200, max_pixels=10**6)
    with pytest.raises(MediaRejected, match="not a picture"):
        prepare_image(picture(100, 100)[:300], max_side=1200, max_pixels=10**6)


def test_without_pillow_a_clear_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "PIL" or n.startswith("PIL.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL raises ImportError
    assert not pillow_available()
    with pytest.raises(MediaRejected) as caught:
        prepare_image(b"anything", max_side=1200, max_pixels=10**6)
    assert str(caught.value) == NO_PILLOW and "media extra" in NO_PILLOW
