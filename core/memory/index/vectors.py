"""The vector pass: vectors for the chunks a sync wrote without them, in batches.

A sync writes chunks (text and keyword rows) at once, so a fact is findable by keyword
as soon as its turn is synced; this pass then embeds the pending chunks of every file
together, the embedder's max batch at a time (embedding one turn's chunk per call ran at
2.2 chunks/s with e5, batches at tens per second), from the cache by content hash first
(the live index's too, during a rebuild), and adds them (``store.set_vectors``, which
skips a chunk replaced meanwhile and puts each vector in its chunk's own scope).

In the background (``kick``) the pass runs beside syncs: the embedding holds no lock,
each write takes the sync lock briefly and is dropped when the live index changed
meanwhile (a rebuild swapped in another, or the meta moved on). ``drain`` runs it to
the end and waits (``MemoryIndex.sync``, a rebuild's shadow before it is swapped in).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import numpy as np

from parley.core.errors import EmbedderError, MemoryIndexError
from parley.core.memory.embedders import ResilientEmbedder
from parley.core.memory.index.file_sync import SyncReport
from parley.core.memory.index.state import IndexState, made_by
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.rows import IndexMeta, PendingChunk
from parley.core.memory.store_protocol import MemoryStoreProtocol

log = logging.getLogger("parley.core.memory")


class VectorPass:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        embedder: ResilientEmbedder | None,
        threads: StoreThreads,
        state: IndexState,
        sync_lock: Callable[[], asyncio.Lock],
    ) -> None:
        self.settings = settings
        self.embedder = embedder
        self._threads = threads
        self._state = state
        self._sync_lock = sync_lock
        self._running = asyncio.Lock()  # one pass at a time over the live index
        self.task: asyncio.Task[None] | None = None
        self._again = False
        self.last: SyncReport | None = None  # the last background pass's figures

    def _batch(self) -> int:
        return max(1, self.embedder.max_batch) if self.embedder is not None else 1

    # -- the live index ------------------------------------------------------------------

    def kick(self) -> None:
        """Embed the live index's pending chunks in the background (or once more, when a
        pass is running: chunks written meanwhile are not left behind)."""
        if self._state.closed or self.embedder is None:
            return
        if self.task is not None and not self.task.done():
            self._again = True
            return
        self.task = asyncio.create_task(self._loop(), name="memory-vectors")

    async def _loop(self) -> None:
        while True:
            self._again = False
            report = SyncReport(reason="vectors")
            try:
                await self.live(report)
            except Exception:  # a background pass must not die silently
                log.exception("memory vector pass failed")
            self.last = report
            for error in report.errors:
                log.warning("memory vectors: %s", error)
            if not self._again or self._state.closed:
                return

    async def live(self, report: SyncReport) -> None:
        """One pass over the live index, to the end (or until the embedder fails)."""
        async with self._running:
            meta = self._state.live_meta
            if meta is None or self._state.reindexing or self._state.closed:
                return
            store = self._threads.writer_store()
            try:
                await self.fill(store, meta, report, guarded=True)
            except (MemoryIndexError, store.info.module.Error) as exc:
                # The driver's own errors too (a full or read-only disk): the chunks stay
                # pending and keyword-findable; the next pass retries them.
                report.errors.append(f"adding vectors failed: {exc}")

    async def drain(self, report: SyncReport) -> None:
        """Wait for a background pass, then run one to the end with ``report``."""
        task = self.task
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(task)
        await self.live(report)

    async def cancel(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- any store -----------------------------------------------------------------------

    async def fill(
        self,
        store: MemoryStoreProtocol,
        meta: IndexMeta,
        report: SyncReport,
        *,
        guarded: bool = False,
        live: MemoryStoreProtocol | None = None,
    ) -> None:
        """Vectors for every pending chunk of ``store``, a batch at a time. ``guarded``:
        ``store`` is the live index and others write it too (take the sync lock for each
        write; stop when it is no longer the live one). ``live``: a rebuild's live index,
        whose cache may hold vectors of the same model."""
        if meta.embedder == "none" or self.embedder is None:
            return
        w = self._threads.w
        # (id, hash): a chunk whose vector could not be written is not asked for again in
        # this pass (a new chunk that reuses a replaced one's id is another chunk).
        tried: set[tuple[int, str]] = set()
        while not self._state.closed:
            rows = await w(store.pending_vectors, self._batch())
            rows = [r for r in rows if (r.id, r.hash) not in tried]
            if not rows:
                break  # done, or only chunks whose vectors could not be written
            tried.update((r.id, r.hash) for r in rows)
            vectors = await self._vectors(store, meta, rows, report, live)
            if vectors is None:
                break  # the embedder failed: the chunks stay pending, keyword-only
            items = [(r.id, r.hash, vectors[r.hash]) for r in rows]
            async with self._guard(store, meta, guarded) as current:
                if not current:
                    return
                await w(store.ensure_vectors, len(items[0][2]))
                await w(store.set_vectors, items)
        if tried:  # a pass that found nothing to embed (most of them) reads no file rows
            files = await w(store.files)
            report.vectors_pending = sum(1 for f in files.values() if f.vectors_pending)

    @contextlib.asynccontextmanager
    async def _guard(
        self, store: MemoryStoreProtocol, meta: IndexMeta, guarded: bool
    ) -> AsyncIterator[bool]:
        """Whether writing ``store`` is still right, held so until the write is done."""
        if not guarded:
            yield True
            return
        async with self._sync_lock():
            state = self._state
            yield (
                self._threads.wstore is store
                and state.live_meta == meta
                and not state.reindexing
                and not state.closed
            )

    async def _vectors(
        self,
        store: MemoryStoreProtocol,
        meta: IndexMeta,
        rows: list[PendingChunk],
        report: SyncReport,
        live: MemoryStoreProtocol | None,
    ) -> dict[str, np.ndarray] | None:
        """Vectors of ``rows`` by content hash: cached, else embedded (and cached). None
        when the embedder failed or a fallback model answered (its vectors cannot share
        a table with these)."""
        assert self.embedder is not None
        w = self._threads.w
        key = (meta.embedder, meta.model, meta.provider_key)
        hashes = list(dict.fromkeys(r.hash for r in rows))
        dims = meta.dimensions
        cached = await w(store.cached_vectors, *key, hashes, dims)
        if live is not None and live is not store and len(cached) < len(hashes):
            # A rebuild (e.g. new chunking) reuses the live index's vectors of the same model.
            wanted = [h for h in hashes if h not in cached]
            cached.update(await w(live.cached_vectors, *key, wanted, dims))
        report.cache_hits += sum(1 for r in rows if r.hash in cached)
        missing = [h for h in hashes if h not in cached]
        if not missing:
            return cached
        texts = {r.hash: r.text for r in rows}
        try:
            result = await self.embedder.embed([texts[h] for h in missing], kind="passage")
        except EmbedderError as exc:
            report.errors.append(f"embedding failed, keyword-only for now: {exc}")
            return None
        if not made_by(result.embedder, meta):
            return None
        fresh = list(zip(missing, result.vectors, strict=True))
        report.embedded += len(fresh)
        cached.update(fresh)
        try:
            await w(store.cache_vectors, *key, fresh, max_entries=self.settings.cache_max_entries)
        except (MemoryIndexError, store.info.module.Error) as exc:
            # The vectors are good; only the cache missed them (a full disk, say).
            report.errors.append(f"caching vectors failed: {exc}")
        return cached
