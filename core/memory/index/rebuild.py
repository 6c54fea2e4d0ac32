"""Rebuild: the whole index built anew beside the live one, then swapped in.

When what the rows depend on changes (embedder, model, dimensions, chunking, tokenizer:
``IndexMeta``), the backend's *shadow* (``memory.db.reindex`` for SQLite) is filled by
an ordinary sync while the live index keeps answering (keyword-only: its vectors belong
to another model), then promoted in one step, vectors included. A shadow already built
for the same meta is a killed rebuild: it is resumed, not started over. Tombstones and
the forgetting schedule's last run are carried over, so what was forgotten stays
forgotten; so are the sources retention removed but kept (``kept``: their files are
gone, their rows come from the live index), so what was kept stays searchable.
"""

from __future__ import annotations

from parley.core.memory.forgetting import LAST_RUN_KEY
from parley.core.memory.index.file_sync import FileSync, ProgressCallback, SyncReport
from parley.core.memory.index.kept import carry_kept
from parley.core.memory.index.state import IndexState
from parley.core.memory.index.vectors import VectorPass
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.rows import IndexMeta
from parley.core.memory.store_protocol import StoreBackend


class Rebuild:
    def __init__(
        self,
        backend: StoreBackend,
        *,
        files: FileSync,
        vectors: VectorPass,
        threads: StoreThreads,
        state: IndexState,
    ) -> None:
        self.backend = backend
        self._files = files
        self._vectors = vectors
        self._threads = threads
        self._state = state

    async def run(
        self, wanted: IndexMeta, reason: str, progress: ProgressCallback | None, *, vector: bool
    ) -> SyncReport:
        """Build the whole index for ``wanted`` beside the live one, then swap it in."""
        w, threads, backend = self._threads.w, self._threads, self.backend
        report = SyncReport(reason=reason, reindexed=True)
        self._state.reindexing = True
        try:
            shadow = await w(backend.open_shadow, vector=vector)
            try:
                if await w(shadow.meta) != wanted:  # else: resume a killed rebuild
                    await w(shadow.close)
                    await w(backend.discard_shadow)
                    shadow = await w(backend.open_shadow, vector=vector)
                    await w(shadow.set_meta, wanted)
                # What was forgotten stays forgotten in the new index.
                tombstones = await w(threads.writer_store().tombstones)
                await w(shadow.add_tombstones, tombstones)
                last_run = await w(threads.writer_store().state, LAST_RUN_KEY)
                if last_run is not None:  # and the schedule keeps its rhythm
                    await w(shadow.set_state, LAST_RUN_KEY, last_run)
                await self._files.sync_into(shadow, wanted, report, progress)
                live = threads.writer_store()
                # What retention removed but kept stays searchable: those sources are
                # gone, so their rows come from the live index (``kept``).
                report.files_kept = await carry_kept(live, shadow, wanted, threads)
                # The new index is swapped in with its vectors (the live index's cache
                # spares re-embedding what the same model embedded before).
                await self._vectors.fill(shadow, wanted, report, live=live)
                await w(shadow.checkpoint)
            finally:
                await w(shadow.close)
            await threads.swap_in(backend, vector=vector)
            self._state.live_meta = wanted
        finally:
            self._state.reindexing = False
        return report
