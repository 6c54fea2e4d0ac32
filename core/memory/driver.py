"""The SQLite driver for memory.db: one that can load sqlite-vec, or FTS-only, said loudly.

The standard library's ``sqlite3`` is used when it was built with extension loading
(``Connection.enable_load_extension``); some Pythons (pyenv's default build, among them
the one on these machines) are not, so the bundled ``pysqlite3`` (SQLite 3.51) is the
next choice. When neither can load sqlite-vec the index still works, on FTS5 alone, and
``DriverInfo.vector_error`` says why in every status output.
"""

from __future__ import annotations

import importlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

DriverChoice = Literal["auto", "sqlite3", "pysqlite3"]
# Wait this long for a lock held by another connection before failing.
BUSY_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class DriverInfo:
    name: str  # "sqlite3" | "pysqlite3"
    sqlite_version: str
    vector_available: bool
    vector_version: str | None
    vector_error: str | None  # why vectors are off (None when they are on)
    module: ModuleType

    def describe(self) -> dict[str, Any]:
        return {
            "driver": self.name,
            "sqlite": self.sqlite_version,
            "vector": self.vector_available,
            "vector_version": self.vector_version,
            "vector_error": self.vector_error,
        }


def _load_vec(conn: Any) -> tuple[str | None, str | None]:
    """Load sqlite-vec into ``conn``: (version, None) or (None, reason)."""
    if not hasattr(conn, "enable_load_extension"):
        return None, "this SQLite driver cannot load extensions"
    try:
        import sqlite_vec
    except ImportError:
        return None, "the sqlite-vec package is not installed"
    try:
        conn.enable_load_extension(True)
        try:
            sqlite_vec.load(conn)
        finally:
            conn.enable_load_extension(False)
        return str(conn.execute("SELECT vec_version()").fetchone()[0]), None
    except Exception as exc:  # each driver has its own error classes
        return None, f"sqlite-vec failed to load: {exc}"


def _candidates(choice: DriverChoice) -> list[ModuleType]:
    modules: list[ModuleType] = []
    if choice in ("auto", "sqlite3"):
        modules.append(sqlite3)
    if choice in ("auto", "pysqlite3"):
        try:
            modules.append(importlib.import_module("pysqlite3.dbapi2"))
        except ImportError:
            pass
    return modules


def open_connection(
    path: Path | str, *, choice: DriverChoice = "auto", vector: bool = True
) -> tuple[Any, DriverInfo]:
    """Open ``path`` with the first driver that can load sqlite-vec (or FTS-only).

    ``vector=False`` skips sqlite-vec on purpose (keyword-only configurations).
    Raises the driver's own error when the file cannot be opened at all.
    """
    modules = _candidates(choice)
    if not modules:
        raise ImportError(f"SQLite driver {choice!r} is not installed")
    reasons: list[str] = []
    fallback: tuple[Any, DriverInfo] | None = None
    for module in modules:
        conn = _connect(module, path)
        if not vector:
            info = _info(module, conn, None, "vector search is turned off (keyword-only)")
            return conn, info
        version, error = _load_vec(conn)
        if version is not None:
            if fallback is not None:
                fallback[0].close()
            return conn, _info(module, conn, version, None)
        reasons.append(f"{module.__name__}: {error}")
        if fallback is None:
            fallback = (conn, _info(module, conn, None, "; ".join(reasons)))
        else:
            conn.close()
    assert fallback is not None
    conn, info = fallback
    return conn, _info(info.module, conn, None, "; ".join(reasons))


def _connect(module: ModuleType, path: Path | str) -> Any:
    conn = module.connect(
        str(path), timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _info(module: ModuleType, conn: Any, version: str | None, error: str | None) -> DriverInfo:
    sqlite_version = str(conn.execute("SELECT sqlite_version()").fetchone()[0])
    name = "pysqlite3" if module.__name__.startswith("pysqlite3") else "sqlite3"
    return DriverInfo(name, sqlite_version, version is not None, version, error, module)
