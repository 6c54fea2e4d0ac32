"""Is this failure the storage's? Full, over quota, read-only or failing storage under a
transcript, state.db or memory.db, or a PostgreSQL that refuses writes or is out of
reach, is told to the user as such (and the message marked failed), never as a generic
internal error."""

from __future__ import annotations

import errno
import sqlite3
from types import ModuleType

from parley.core.errors import TranscriptError
from parley.gateway.errors import StateError

psycopg: ModuleType | None
try:
    import psycopg
except ImportError:  # the postgres extra is optional; SQLite alone needs no psycopg
    psycopg = None

# SQLite's words for the same (SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR, SQLITE_CANTOPEN).
_SQLITE_STORAGE_MESSAGES = ("disk is full", "readonly", "disk i/o error", "unable to open")
# OS errors that mean the disk refused a write: full, over quota, read-only, failing.
_STORAGE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}
)


def storage_failure(exc: BaseException) -> str | None:
    """What the storage refused, when ``exc`` (or what caused it) is a storage failure:
    a full or read-only disk under a transcript, state.db or memory.db, or PostgreSQL
    refusing writes or unreachable. None otherwise."""
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
            or postgres_storage_error(current)
        ):
            # The outermost message says where (a transcript's path names its file);
            # SQLite's own does not, and state.db is the one the gateway writes.
            if isinstance(exc, sqlite3.Error):
                return f"state.db: {exc}"
            if _is_psycopg_error(exc):
                return f"PostgreSQL: {_one_line(exc)}"
            return str(exc) or f"{type(current).__name__}: {current}"
        current = current.__cause__ or current.__context__
    return None


def storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from the storage at all (any SQLite, PostgreSQL or OS error,
    a busy database included), not only a refusal ``storage_failure`` names: for reads
    whose failure can be waited out."""
    return (
        storage_failure(exc) is not None
        or isinstance(exc, (sqlite3.Error, OSError, StateError))
        or _is_psycopg_error(exc)
    )


def postgres_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL refusing or losing the work rather than a bug in a
    statement: OperationalError covers a lost connection (AdminShutdown, 57P01), a pool
    with no free connection, a full disk (DiskFull, 53100) and I/O errors (58030); a
    read-only server or standby (ReadOnlySqlTransaction, 25006) is an InternalError."""
    if psycopg is None:
        return False
    return isinstance(exc, (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction))


def _is_psycopg_error(exc: BaseException) -> bool:
    return psycopg is not None and isinstance(exc, psycopg.Error)


def _one_line(exc: BaseException) -> str:
    # libpq's messages can run over several lines (a connection error names each address
    # it tried); one line keeps the log entry and the user's notice readable.
    return " ".join(str(exc).split()) or type(exc).__name__
