"""$PARLEY_HOME is owner-only: directories 0700, files 0600 (issue 19).

The home holds every message (state.db, memory.db, the transcripts, the log), so no
other local user may read anything in it, whatever the umask parley was started under.

- ``secure_home`` runs at the start of every `parley` command that touches the home
  (gateway/cli/main.py): it sets the process umask to 077, so every file and directory
  created afterwards, by parley or by a library (SQLite, logging, shutil), is
  owner-only; it creates the home 0700 and narrows the home itself and the SQLite
  databases that already exist (SQLite creates a database's -wal and -shm with the
  database's own mode, so a 0600 database gets 0600 companions).
- ``find_wide_modes`` lists what is open to group or others; `parley doctor` reports it
  and `parley doctor --fix` narrows it with ``narrow_modes``.

The umask belongs to the process, not to a thread or a home: the CLI restores the
previous one when its command returns, because tests run ``main`` in their own process.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from parley.gateway.errors import StateError

OWNER_ONLY_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600
# Group and other bits: any of them set is a mode wider than owner-only.
WIDE_BITS = 0o077
SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


def owner_only_umask() -> int:
    """Set the process umask to 077; returns the previous one (to restore)."""
    return os.umask(OWNER_ONLY_UMASK)


def secure_home(home: Path, databases: Iterable[Path] = ()) -> int:
    """Owner-only from here on: umask 077, ``home`` created or narrowed to 0700, and
    each of ``databases`` that exists (with its -wal, -shm) narrowed to 0600.

    Returns the previous umask. StateError when the home cannot be created.
    """
    previous = owner_only_umask()
    try:
        home.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        os.umask(previous)
        raise StateError(f"cannot create {home}: {exc}") from exc
    _narrow(home)
    for database in databases:
        owner_only_sqlite(database)
    return previous


def owner_only_sqlite(path: Path) -> None:
    """Narrow a SQLite database and its -wal, -shm and -journal, those that exist."""
    for suffix in SQLITE_COMPANIONS:
        _narrow(path.with_name(path.name + suffix))


def find_wide_modes(home: Path) -> list[tuple[Path, int]]:
    """Every entry under ``home`` (``home`` included, symlinks neither followed nor
    listed) whose permission bits give group or others anything: (path, mode bits)."""
    wide: list[tuple[Path, int]] = []
    mode = _mode(home)
    if mode is None:
        return wide
    if mode & WIDE_BITS:
        wide.append((home, mode))
    for root, dirs, files in os.walk(home, followlinks=False):
        for name in (*dirs, *files):
            path = Path(root, name)
            mode = _mode(path)
            if mode is not None and mode & WIDE_BITS:
                wide.append((path, mode))
    return wide


def narrow_modes(entries: Iterable[tuple[Path, int]]) -> tuple[int, list[str]]:
    """Remove group and other bits from each entry (0755 becomes 0700, 0644 0600; the
    owner's own bits are kept). Returns (how many were narrowed, failures)."""
    narrowed = 0
    failures: list[str] = []
    for path, mode in entries:
        try:
            os.chmod(path, mode & ~WIDE_BITS)
        except FileNotFoundError:
            continue  # gone since (a -wal the gateway removed): nothing to narrow
        except OSError as exc:
            failures.append(f"{path}: {exc}")
            continue
        narrowed += 1
    return narrowed, failures


def _mode(path: Path) -> int | None:
    """The permission bits of ``path``; None for a symlink or a vanished entry."""
    try:
        info = path.lstat()
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return None
    return stat.S_IMODE(info.st_mode)


def _narrow(path: Path) -> None:
    """Drop ``path``'s group and other bits when it exists and has any. A failure (the
    file is someone else's) is left for `parley doctor` to report."""
    mode = _mode(path)
    if mode is not None and mode & WIDE_BITS:
        with contextlib.suppress(OSError):
            os.chmod(path, mode & ~WIDE_BITS)
