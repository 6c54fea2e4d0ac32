"""Reading what a GGUF model file says of itself: its architecture and trained context.

The embedded provider sizes llama.cpp's window (``n_ctx``) from the file's own
``<architecture>.context_length`` rather than a guess. Only the header is read: the
magic ``GGUF``, a version, the tensor and key/value counts, then the typed key/values
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). Reading stops as soon as
both keys are known, so the big tokenizer arrays that usually follow are rarely
touched, and an array that is skipped is skipped by seeking, not read.

Versions 2 and 3 use 64-bit counts and lengths, version 1 32-bit ones. A file written
big-endian is told by its version number, which then reads as a huge little-endian
value. Blocking (it reads the file): call from a worker thread.

Every way a header can be wrong (not GGUF, cut short, absurd lengths, an unknown
value type) raises ``GGUFError`` with what was wrong and where; the caller decides
what to fall back to.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

GGUF_MAGIC = b"GGUF"
ARCHITECTURE_KEY = "general.architecture"
CONTEXT_LENGTH_SUFFIX = ".context_length"
# Far above any real key or string value (chat templates run to tens of KB); a length
# over it means a corrupt header, not a big one.
MAX_STRING_BYTES = 16 * 1024 * 1024
MAX_KV_COUNT = 1_000_000
MAX_ARRAY_ITEMS = 100_000_000

# GGUF value types: code -> (struct format, size). 8 (string) and 9 (array) are apart.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1),  # uint8
    1: ("b", 1),  # int8
    2: ("H", 2),  # uint16
    3: ("h", 2),  # int16
    4: ("I", 4),  # uint32
    5: ("i", 4),  # int32
    6: ("f", 4),  # float32
    7: ("?", 1),  # bool
    10: ("Q", 8),  # uint64
    11: ("q", 8),  # int64
    12: ("d", 8),  # float64
}
_STRING = 8
_ARRAY = 9
_INTEGER_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})


class GGUFError(ValueError):
    """The file is not a GGUF file, or its header cannot be read."""


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    """What the header says that parley uses (``None``: the header does not say)."""

    version: int
    architecture: str | None
    context_length: int | None


class _Reader:
    def __init__(self, stream: BinaryIO, order: str, end: int) -> None:
        self.stream = stream
        self.order = order  # "<" or ">"
        self.wide = True  # 64-bit counts and lengths (GGUF v2+)
        self.end = end  # the stream's length: seeking past it would not fail by itself

    def take(self, size: int) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            raise GGUFError(
                f"truncated GGUF header: wanted {size} bytes at offset "
                f"{self.stream.tell() - len(data)}, got {len(data)}"
            )
        return data

    def unpack(self, fmt: str, size: int) -> int | float | bool:
        value: int | float | bool = struct.unpack(self.order + fmt, self.take(size))[0]
        return value

    def count(self) -> int:
        return int(self.unpack("Q", 8) if self.wide else self.unpack("I", 4))

    def string(self) -> str:
        size = self.count()
        if size > MAX_STRING_BYTES:
            raise GGUFError(f"corrupt GGUF header: a {size}-byte string")
        return self.take(size).decode("utf-8", errors="replace")

    def skip(self, size: int) -> None:
        here = self.stream.tell()
        if here + size > self.end:
            raise GGUFError(
                f"truncated GGUF header: a {size}-byte array at offset {here} "
                f"runs past the end ({self.end})"
            )
        self.stream.seek(here + size)

    def value(self, kind: int) -> int | float | bool | str | None:
        """Read one value of type ``kind``; arrays are skipped (``None``)."""
        if kind in _SCALARS:
            fmt, size = _SCALARS[kind]
            return self.unpack(fmt, size)
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind = int(self.unpack("I", 4))
            items = self.count()
            if items > MAX_ARRAY_ITEMS:
                raise GGUFError(f"corrupt GGUF header: an array of {items} items")
            if item_kind in _SCALARS:
                self.skip(items * _SCALARS[item_kind][1])
            else:
                for _ in range(items):
                    self.value(item_kind)
            return None
        raise GGUFError(f"corrupt GGUF header: unknown value type {kind}")


def read_gguf_info(stream: BinaryIO) -> GGUFInfo:
    """The architecture and trained context a GGUF header declares (module docstring).

    ``stream`` must be seekable and positioned at the file's start."""
    end = stream.seek(0, 2)
    stream.seek(0)
    if stream.read(4) != GGUF_MAGIC:
        raise GGUFError("not a GGUF file (bad magic)")
    reader = _Reader(stream, "<", end)
    version = int(reader.unpack("I", 4))
    if version > 0xFFFF:  # a big-endian file: 3 reads as 0x03000000
        reader.order = ">"
        version = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version < 1 or version > 3:
        raise GGUFError(f"unsupported GGUF version {version}")
    reader.wide = version >= 2
    reader.count()  # tensors: not needed
    kv_count = reader.count()
    if kv_count > MAX_KV_COUNT:
        raise GGUFError(f"corrupt GGUF header: {kv_count} key/values")
    architecture: str | None = None
    lengths: dict[str, int] = {}  # "<arch>.context_length" may come before the architecture
    for _ in range(kv_count):
        key = reader.string()
        kind = int(reader.unpack("I", 4))
        value = reader.value(kind)
        if key == ARCHITECTURE_KEY and isinstance(value, str):
            architecture = value
        elif key.endswith(CONTEXT_LENGTH_SUFFIX) and kind in _INTEGER_TYPES:
            lengths[key] = int(value or 0)
        if architecture is not None and architecture + CONTEXT_LENGTH_SUFFIX in lengths:
            break
    length = lengths.get(f"{architecture}{CONTEXT_LENGTH_SUFFIX}") if architecture else None
    return GGUFInfo(version, architecture, length if length and length > 0 else None)


def read_gguf_file(path: Path) -> GGUFInfo:
    """``read_gguf_info`` of a file (``OSError`` when it cannot be opened)."""
    with path.open("rb") as stream:
        return read_gguf_info(stream)
