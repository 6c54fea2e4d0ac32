"""What the memory index and search need from a store, whichever database keeps the rows.

Two stores implement it: ``core.memory.store.MemoryStore`` (SQLite, one memory.db per
agent) and the gateway's PostgreSQL store. Nothing here imports either: the index,
search and forgetting are typed against these protocols and ``core.memory.rows``, so a
store is chosen at run time (``StoreBackend``) and no module of ``core`` depends on the
gateway's. Every method is synchronous and runs on the index's writer or reader
thread, never on the event loop.

- ``SearchStore``: the primitives one search runs (``core.memory.search.run_search``).
- ``MemoryStoreProtocol``: those, plus what sync, rebuild, forgetting and status call.
- ``StoreBackend``: opens one agent's live and shadow stores and swaps them. A full
  rebuild fills a *shadow* store while the live one keeps answering, then
  ``promote_shadow`` makes it live in one step (a file rename for SQLite, a row flip in
  one transaction for PostgreSQL), so no reader ever sees a half-built index.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from parley.core.memory.rows import (
    ChunkRow,
    FileRow,
    ForgettableChunk,
    IndexMeta,
    NewChunk,
    StoreCounts,
    Tombstone,
)


class StoreInfo(Protocol):
    @property
    def vector_available(self) -> bool: ...

    @property
    def vector_error(self) -> str | None: ...

    # The DB-API module whose ``Error`` the store's statements raise (a failed write is
    # reported per file by a sync, not raised out of it).
    @property
    def module(self) -> ModuleType: ...

    def describe(self) -> dict[str, Any]: ...


class SearchStore(Protocol):
    """What one hybrid search reads: keyword and vector hits, then the chunks' rows."""

    @property
    def vector_dims(self) -> int | None: ...

    def keyword_hits(
        self, table: str, match: str, scopes: Sequence[str], limit: int
    ) -> list[tuple[int, float]]: ...
    def vector_hits(
        self, query: np.ndarray, scopes: Sequence[str], k: int
    ) -> list[tuple[int, float]]: ...
    def vectors_for(self, ids: Sequence[int]) -> dict[int, np.ndarray]: ...
    def chunks_by_id(self, ids: Sequence[int]) -> dict[int, ChunkRow]: ...


class MemoryStoreProtocol(SearchStore, Protocol):
    """The methods of a store that the index (sync, rebuild, forgetting, status) and the
    search pipeline call."""

    @property
    def info(self) -> StoreInfo: ...

    def close(self) -> None: ...
    def checkpoint(self) -> None: ...
    def meta(self) -> IndexMeta | None: ...
    def set_meta(self, meta: IndexMeta) -> None: ...
    def ensure_vectors(self, dims: int) -> None: ...
    def files(self) -> dict[str, FileRow]: ...
    def touch_file(self, path: str, mtime: float, size: int) -> None: ...
    def replace_file(
        self, file: FileRow, chunks: Sequence[NewChunk], vectors: np.ndarray | None
    ) -> None: ...
    def delete_file(self, path: str) -> None: ...
    def cached_vectors(
        self, provider: str, model: str, provider_key: str, hashes: Sequence[str], dims: int = 0
    ) -> dict[str, np.ndarray]: ...
    def cache_vectors(
        self,
        provider: str,
        model: str,
        provider_key: str,
        items: Sequence[tuple[str, np.ndarray]],
        *,
        max_entries: int,
    ) -> None: ...
    def chunk_texts(self, path: str) -> list[tuple[int, str, str]]: ...
    def add_vectors(
        self, path: str, scope: str, items: Sequence[tuple[int, np.ndarray]]
    ) -> None: ...
    def state(self, key: str) -> str | None: ...
    def set_state(self, key: str, value: str) -> None: ...
    def forgettable_chunks(self, sources: Sequence[str]) -> list[ForgettableChunk]: ...
    def evict_chunks(self, evictions: Sequence[tuple[int, Tombstone]]) -> int: ...
    def add_tombstones(self, tombstones: Sequence[Tombstone]) -> None: ...
    def forgotten_hashes(self, path: str) -> set[str]: ...
    def tombstones(self, limit: int | None = None) -> list[Tombstone]: ...
    def scopes(self) -> list[str]: ...
    def counts(self) -> StoreCounts: ...
    def integrity_check(self) -> list[str]: ...
    def fts_available(self) -> bool: ...


class StoreBackend(Protocol):
    """Opens one agent's live and shadow stores (synchronous: call on a worker thread)."""

    @property
    def where(self) -> str: ...  # for status output: a file path or a redacted URL

    def open_live(self, *, vector: bool) -> MemoryStoreProtocol: ...

    def open_shadow(self, *, vector: bool) -> MemoryStoreProtocol: ...

    def discard_shadow(self) -> None:
        """Drop the shadow (a stale rebuild for other settings); no store is open on it."""
        ...

    def promote_shadow(self) -> None:
        """Make the shadow the live index; the caller has closed its stores of both."""
        ...
