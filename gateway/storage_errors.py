"""Is this failure the disk's? Full, over quota, read-only or failing storage under a
transcript, state.db or memory.db is told to the user as such (and the message marked
failed), never as a generic internal error."""

from __future__ import annotations

import errno
import sqlite3

from core.errors import TranscriptError
from gateway.errors import StateError

# SQLite's words for the same (SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR, SQLITE_CANTOPEN).
_SQLITE_STORAGE_MESSAGES = ("disk is full", "readonly", "disk i/o error", "unable to open")
# OS errors that mean the disk refused a write: full, over quota, read-only, failing.
_STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}
)


def storage_failure(exc: BaseException) -> str | None:
    """What the disk refused, when ``exc`` (or what caused it) is a storage failure: a
    full or read-only disk under a transcript, state.db or memory.db. None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (
            (isinstance(current, OSError) and current.errno in _STORAGE_ERRNOS)
            # a write the disk took only part of: full
            or (isinstance(current, TranscriptError) and "short write" in str(current))
            or isinstance(current, StateError)
            or (
                isinstance(current, sqlite3.OperationalError)
                and any(m in str(current).lower() for m in _SQLITE_STORAGE_MESSAGES)
            )
        ):
            # The outermost message says where (a transcript's path names its file);
            # SQLite's own does not, and state.db is the one the gateway writes.
            if isinstance(exc, sqlite3.Error):
                return f"state.db: {exc}"
            return str(exc) or f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return None
