"""The SQLite ``StoreBackend``: memory.db, and ``memory.db.reindex`` beside it for rebuilds.

A full rebuild fills the shadow file while the live one keeps answering; promoting it
is one rename, so no reader ever sees a half-built index. (The protocol, and what the
index needs of any store, is ``core.memory.store_protocol``; the gateway's PostgreSQL
backend is the other implementation.)
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from parley.core.memory.driver import DriverChoice
from parley.core.memory.store import MemoryStore

SHADOW_SUFFIX = ".reindex"


class SqliteBackend:
    """memory.db, and ``memory.db.reindex`` beside it for rebuilds."""

    def __init__(self, db_path: Path, driver: DriverChoice = "auto") -> None:
        self.db_path = db_path
        self.driver: DriverChoice = driver
        self.shadow_path = db_path.with_name(db_path.name + SHADOW_SUFFIX)

    @property
    def where(self) -> str:
        return str(self.db_path)

    def open_live(self, *, vector: bool) -> MemoryStore:
        return MemoryStore.open(self.db_path, driver=self.driver, vector=vector)

    def open_shadow(self, *, vector: bool) -> MemoryStore:
        return MemoryStore.open(self.shadow_path, driver=self.driver, vector=vector)

    def discard_shadow(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.shadow_path}{suffix}")

    def promote_shadow(self) -> None:
        """One rename (the old file's WAL files go first: they belong to the old file)."""
        target, shadow = self.db_path, self.shadow_path
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{target}{suffix}")
        os.replace(shadow, target)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{shadow}{suffix}")
