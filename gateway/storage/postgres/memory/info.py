"""What a PostgreSQL memory store reports about its server: ``PgStoreInfo`` (the
counterpart of SQLite's ``core.memory.driver.DriverInfo``) and ``version_tuple``."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psycopg


def version_tuple(version: str | None) -> tuple[int, ...]:
    """``"0.8.2"`` → ``(0, 8, 2)``; unknown or odd versions → ``()`` (the oldest)."""
    try:
        return tuple(int(part) for part in (version or "").split("."))
    except ValueError:
        return ()


@dataclass(frozen=True, slots=True)
class PgStoreInfo:
    vector_available: bool
    vector_error: str | None
    server_version: str
    vector_version: str | None
    module: ModuleType = psycopg

    @property
    def iterative_scan(self) -> bool:
        """pgvector 0.8 added ``hnsw.iterative_scan`` (older servers refuse the name)."""
        return version_tuple(self.vector_version) >= (0, 8)

    def describe(self) -> dict[str, Any]:
        return {
            "driver": "psycopg",
            "sqlite": "n/a",  # the status line still reads this key
            "postgres": self.server_version,
            "vector": self.vector_available,
            "vector_version": self.vector_version,
            "vector_error": self.vector_error,
        }
