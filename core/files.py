"""Replacing a private file atomically: a kill leaves the old file or the new one,
never a mix, and the file is never visible with a wider mode than asked for.

Blocking: call it on a worker thread from async code.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

PRIVATE_FILE_MODE = 0o600


@contextmanager
def atomic_file(path: Path, mode: int = PRIVATE_FILE_MODE) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into: a temporary file beside it
    (never through a symlink), fsynced and renamed over ``path`` when the block ends
    cleanly; removed, with ``path`` untouched, when it raises."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(temp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """Replace ``path`` with ``data`` (``atomic_file``)."""
    with atomic_file(path, mode) as out:
        out.write(data)  # a buffered write loops until all of it is written
