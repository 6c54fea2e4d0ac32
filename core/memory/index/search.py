"""Search through the index: catch up first if it is dirty, embed the query, then run
the hybrid search (``core.memory.search``) on the reader's thread.

A dirty index syncs before answering (``on_search``), waiting at most
``search_wait_seconds`` (an empty index waits for its first sync; a long rebuild is not
waited for). Vectors are used only when the query's embedding comes from the model the
live index was built with; otherwise the search is keyword-only and ``fallback`` says
why. ``SearchResult`` is the answer, with its timing and trace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from parley.core.errors import EmbedderError
from parley.core.memory.embedders import ResilientEmbedder
from parley.core.memory.index.file_sync import SyncReport
from parley.core.memory.index.state import IndexState, made_by
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.rows import SearchHit
from parley.core.memory.search import SearchParams, SearchTrace, run_search

# Where unrelated text lands in cosine similarity, per embedder. e5 puts almost
# everything above 0.75 (measured on LoCoMo: the best chunk of an unrelated conversation
# scores 0.77-0.83, evidence 0.81-0.89), so its similarities are rescaled from 0.78;
# min_score then filters unrelated text for it as for embedders whose cosines spread
# over [0, 1] (MiniLM, OpenAI).
SIMILARITY_FLOORS: Mapping[str, float] = {"e5": 0.78}


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: list[SearchHit]
    mode: str  # hybrid | keyword | vector
    provider: str
    model: str
    fallback: str | None  # why vectors were not used, when they were not
    search_ms: float
    synced_first: bool
    trace: SearchTrace

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [h.to_dict() for h in self.hits],
            "mode": self.mode,
            "provider": self.provider,
            "model": self.model,
            "fallback": self.fallback,
            "search_ms": round(self.search_ms, 1),
        }


def keyword_only_reason(threads: StoreThreads, embedder: ResilientEmbedder | None) -> str:
    """Why the index answers by keyword alone (status and search say it)."""
    store = threads.wstore
    if store is not None and not store.info.vector_available:
        return f"vector search unavailable: {store.info.vector_error}"
    if embedder is None or embedder.primary.provider == "none":
        return "no embedder configured: keyword search only"
    return "the index holds no vectors yet"


class IndexSearch:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        embedder: ResilientEmbedder | None,
        threads: StoreThreads,
        state: IndexState,
        request_sync: Callable[[str], asyncio.Task[SyncReport]],
        now: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self._threads = threads
        self._state = state
        self._request_sync = request_sync
        self._now = now
        # Called with each search's seconds (the gateway's latency histogram).
        self.on_search: Callable[[float], None] | None = None

    async def search(
        self,
        query: str,
        *,
        scopes: Sequence[str],
        max_results: int | None = None,
        min_score: float | None = None,
        catch_up: bool = True,
    ) -> SearchResult:
        started = time.perf_counter()
        # ``catch_up=False`` (automatic recall, before every turn) answers from what is
        # indexed: syncing first would defeat the transcript debounce and make every turn
        # wait for a sync, for turns the live context already holds.
        synced_first = await self.catch_up() if catch_up else False
        meta = self._state.live_meta
        fallback: str | None = None
        query_vector: np.ndarray | None = None
        provider = meta.embedder if meta else "none"
        model = meta.model if meta else ""
        if meta is None or meta.embedder == "none" or self.embedder is None:
            fallback = keyword_only_reason(self._threads, self.embedder)
        elif self._state.reindexing:
            fallback = "reindexing: keyword search until the new index is ready"
        else:
            try:
                result = await self.embedder.embed([query], kind="query")
                if made_by(result.embedder, meta):
                    query_vector = result.vectors[0]
                else:
                    fallback = (
                        f"{meta.embedder} unavailable; {result.embedder.provider} cannot search it"
                    )
            except EmbedderError as exc:
                fallback = f"embedder failed, keyword-only: {exc}"
        params = SearchParams.from_settings(
            self.settings.search,
            max_results=max_results,
            min_score=min_score,
            similarity_floor=SIMILARITY_FLOORS.get(provider, 0.0),
        )
        async with self._threads.reader() as store:
            hits, trace = await self._threads.r(
                run_search, store, query, query_vector, list(scopes), params, now=self._now()
            )
        if query_vector is None and fallback is None and trace.mode == "keyword":
            fallback = "the index holds no vectors yet"
        elapsed = time.perf_counter() - started
        if self.on_search is not None:
            self.on_search(elapsed)
        return SearchResult(
            hits=hits,
            mode=trace.mode,
            provider=provider,
            model=model,
            fallback=fallback,
            search_ms=elapsed * 1000,
            synced_first=synced_first,
            trace=trace,
        )

    async def catch_up(self) -> bool:
        """Sync before a search when the index is dirty (bounded by
        ``search_wait_seconds``); wait for an empty one. Whether it synced."""
        state = self._state
        if not self.settings.sync.on_search:
            return False
        if not state.dirty and not state.syncing and state.synced_once:
            return False
        task = self._request_sync("search")
        if state.reindexing and not state.empty:
            return False  # a rebuild takes long: answer from the old index meanwhile
        wait: float | None = self.settings.sync.search_wait_seconds
        if state.empty:
            wait = None  # an empty index answers nothing useful: wait for it
        try:
            await asyncio.wait_for(asyncio.shield(task), wait)
        except TimeoutError:
            return False
        return True
