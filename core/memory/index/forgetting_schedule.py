"""The forgetting schedule: when the index applies ``core.memory.forgetting``'s policies.

After a sync, once ``schedule_hours`` have passed since the last run (kept in the store,
so the rhythm survives restarts and rebuilds), and on demand (``parley memory prune``).
``core.memory.forgetting`` plans what to evict; this applies the plan: the chunks go,
their tombstones stay, and every eviction is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from parley.core.errors import MemoryIndexError
from parley.core.memory.decay import iso_timestamp
from parley.core.memory.forgetting import (
    FORGETTABLE_SOURCES,
    LAST_RUN_KEY,
    ForgettingReport,
    plan_forgetting,
)
from parley.core.memory.index.file_sync import SyncReport
from parley.core.memory.index.state import IndexState
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.memory_config import ForgettingSettings
from parley.core.memory.rows import Tombstone

log = logging.getLogger("parley.core.memory")


class ForgettingSchedule:
    def __init__(
        self,
        settings: ForgettingSettings,
        *,
        threads: StoreThreads,
        state: IndexState,
        now: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self._threads = threads
        self._state = state
        self._now = now

    async def run(self, *, dry_run: bool) -> ForgettingReport:
        """Apply the policies now (``dry_run``: only say what they evict); the caller
        holds the sync lock."""
        w = self._threads.w
        store = self._threads.writer_store()
        now = self._now()
        chunks = await w(store.forgettable_chunks, FORGETTABLE_SOURCES)
        evictions = await asyncio.to_thread(plan_forgetting, chunks, self.settings, now)
        report = ForgettingReport(dry_run=dry_run, ran_at=now, evictions=evictions)
        if dry_run:
            return report
        stamp = now.timestamp()
        report.evicted = await w(
            store.evict_chunks, [(e.chunk.id, e.tombstone(stamp)) for e in evictions]
        )
        for e in evictions:
            log.info(
                "memory forgot %s#L%d-L%d (scope %s, %s): %s",
                e.chunk.path, e.chunk.start_line, e.chunk.end_line, e.chunk.scope,
                e.policy, e.reason,
            )  # fmt: skip
        await w(store.set_state, LAST_RUN_KEY, now.isoformat())
        return report

    async def run_if_due(self, report: SyncReport) -> None:
        """The scheduled run, after a sync (the caller holds the sync lock)."""
        settings = self.settings
        if not settings.enabled or settings.schedule_hours <= 0 or self._state.closed:
            return
        store = self._threads.writer_store()
        try:
            last = await self._threads.w(store.state, LAST_RUN_KEY)
            last_run = iso_timestamp(last)
            if last_run is not None:
                elapsed = self._now().timestamp() - last_run
                if elapsed < settings.schedule_hours * 3600:
                    return
            report.forgotten = (await self.run(dry_run=False)).evicted
        except (ValueError, MemoryIndexError, store.info.module.Error) as exc:
            # Forgetting is housekeeping: the sync itself succeeded.
            report.errors.append(f"forgetting failed: {exc}")

    async def forgotten(self, limit: int | None) -> list[Tombstone]:
        """Evictions, newest first."""
        return await self._threads.w(self._threads.writer_store().tombstones, limit)
