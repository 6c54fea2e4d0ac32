"""A photo made ready for a vision model, with Pillow (the ``media`` extra).

Decoded only when its header's size is within ``max_image_pixels``, turned upright
(EXIF orientation), downscaled so its longer side is at most ``max_side`` and encoded
again: JPEG (quality 85) for an opaque picture, PNG for one with transparency. The
first frame of an animation. Metadata (EXIF, GPS) is not carried over.

Blocking and CPU-bound: callers run it on a worker thread.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from parley.gateway.errors import MediaRejected

JPEG_QUALITY = 85
NO_PILLOW = (
    "pictures need the media extra (Pillow), which is not installed here; "
    'run `make run`, or pip install "parley[media]"'
)


@dataclass(frozen=True, slots=True)
class PreparedImage:
    data: bytes
    media_type: str
    extension: str
    width: int
    height: int


def pillow_available() -> bool:
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def prepare_image(data: bytes, *, max_side: int, max_pixels: int) -> PreparedImage:
    """``data`` as the model will see it; raises ``MediaRejected`` (not a picture, too
    many pixels, Pillow missing)."""
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise MediaRejected(NO_PILLOW) from None
    try:
        with Image.open(io.BytesIO(data)) as opened:
            width, height = opened.size
            if width * height > max_pixels:
                raise MediaRejected(
                    f"it is {width}×{height} pixels; the limit is {max_pixels:,} pixels"
                )
            opened.seek(0)
            image = ImageOps.exif_transpose(opened)
            image.load()
    except MediaRejected:
        raise
    except Exception as exc:
        # Untrusted bytes: whatever a decoder raises on them (SyntaxError, EOFError,
        # struct.error, ...) is the file's fault, not the turn's.
        raise MediaRejected(
            "it is not a picture that can be read (corrupt or unknown format)"
        ) from exc
    if max(image.size) > max_side:
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    transparent = image.mode in ("RGBA", "LA", "PA") or (
        image.mode == "P" and "transparency" in image.info
    )
    out = io.BytesIO()
    if transparent:
        image.convert("RGBA").save(out, format="PNG", optimize=True)
        media_type, extension = "image/png", "png"
    else:
        image.convert("RGB").save(out, format="JPEG", quality=JPEG_QUALITY, optimize=True)
        media_type, extension = "image/jpeg", "jpg"
    return PreparedImage(out.getvalue(), media_type, extension, image.width, image.height)
