"""Replacing a small private file atomically: a kill leaves the old text or the new one,
never a mix, and the file is never visible with a wider mode than asked for.

Blocking: call it on a worker thread from async code.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

PRIVATE_FILE_MODE = 0o600


def write_atomically(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """Write ``data`` to a temporary file beside ``path`` (never through a symlink),
    fsync it, then rename it over ``path``. A failure leaves no temporary file."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(temp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)  # a buffered write loops until all of it is written
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
