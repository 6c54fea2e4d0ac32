"""When and how a sync runs: one at a time, in the background or awaited.

``request`` starts a background sync, or asks the running one to go round once more
(changes noticed during a sync are not lost, and never start a second one). ``sync``
decides between an incremental sync of the live index (``FileSync``) and a rebuild
(``Rebuild``: the wanted ``IndexMeta`` differs, or ``force``), then runs the forgetting
schedule if it is due. The chunks it wrote are findable by keyword when it returns; their
vectors come from the vector pass (``vectors``): awaited by ``sync`` (the CLI, tests),
in the background after a requested sync, so a search waiting for a sync never waits
for the embedder. The lock it holds is the one on-demand forgetting takes too:
evictions never interleave with a sync's writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from parley.core.memory.index.file_sync import FileSync, ProgressCallback, SyncReport
from parley.core.memory.index.forgetting_schedule import ForgettingSchedule
from parley.core.memory.index.rebuild import Rebuild
from parley.core.memory.index.state import IndexState
from parley.core.memory.index.vectors import VectorPass
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.rows import IndexMeta

log = logging.getLogger("parley.core.memory")


class SyncRunner:
    def __init__(
        self,
        *,
        files: FileSync,
        rebuild: Rebuild,
        forgetting: ForgettingSchedule,
        vectors: VectorPass,
        threads: StoreThreads,
        state: IndexState,
        wanted_meta: Callable[[], IndexMeta],
        wants_vectors: Callable[[], bool],
    ) -> None:
        self._files = files
        self._rebuild = rebuild
        self._forgetting = forgetting
        self._vectors = vectors
        self._threads = threads
        self._state = state
        self._wanted_meta = wanted_meta
        self._wants_vectors = wants_vectors
        self.lock = asyncio.Lock()
        self.task: asyncio.Task[SyncReport] | None = None
        self.last: SyncReport | None = None
        self._again = False

    @property
    def syncing(self) -> bool:
        return self.task is not None and not self.task.done()

    def request(self, reason: str) -> asyncio.Task[SyncReport]:
        """Start a background sync, or ask the running one to go round once more."""
        self._state.dirty = True
        if self.task is not None and not self.task.done():
            self._again = True
            return self.task
        self.task = asyncio.create_task(self._loop(reason), name="memory-sync")
        return self.task

    async def _loop(self, reason: str) -> SyncReport:
        while True:
            self._again = False
            try:
                # An empty index's first sync brings its vectors too (searches wait for
                # it whole, as they always did); later ones leave them to the background.
                report = await self.sync(reason=reason, wait_vectors=self._state.empty)
            except Exception as exc:  # a background sync must not die silently
                log.exception("memory sync failed")
                report = SyncReport(reason=reason, errors=[str(exc)])
            if not self._again or self._state.closed:
                return report
            reason = "follow-up"

    async def sync(
        self,
        *,
        reason: str = "manual",
        force: bool = False,
        progress: ProgressCallback | None = None,
        scheduled_forgetting: bool = True,
        wait_vectors: bool = True,
    ) -> SyncReport:
        """Bring the index up to date (``force``: rebuild it), then run the forgetting
        schedule if it is due (``scheduled_forgetting=False``: not now, e.g. before a
        dry run, which must change nothing). ``wait_vectors``: then add the vectors of
        what was written before returning (else they come in the background)."""
        state = self._state
        async with self.lock:
            started = time.perf_counter()
            # Cleared first, so that changes noticed during this sync mark it dirty again;
            # restored when the sync does not finish.
            state.dirty = False
            # Not dirty, yet not caught up either: a search meanwhile waits for this sync
            # (a /remember just asked for it) instead of answering from the old rows.
            state.syncing = True
            store = self._threads.writer_store()
            wanted = self._wanted_meta()
            try:
                if force or state.live_meta != wanted:
                    vector = self._wants_vectors()
                    report = await self._rebuild.run(wanted, reason, progress, vector=vector)
                else:
                    report = SyncReport(reason=reason)
                    await self._files.sync_into(store, wanted, report, progress)
            except BaseException:
                state.dirty = True
                raise
            finally:
                state.syncing = False
            if report.files_indexed or report.files_unchanged:
                state.empty = False
            if scheduled_forgetting:
                await self._forgetting.run_if_due(report)
            state.known_scopes = None
            state.synced_once = True
        if wait_vectors:
            await self._vectors.drain(report)
        else:
            self._vectors.kick()
        report.seconds = round(time.perf_counter() - started, 3)
        self.last = report
        for error in report.errors:
            log.warning("memory sync (%s): %s", reason, error)
        return report
