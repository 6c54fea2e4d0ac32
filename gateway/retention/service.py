"""The daily retention run inside the gateway: an explicit lifecycle (``start``/``stop``,
registered on the gateway's exit stack).

It runs once a day at ``[retention] run_hour_utc``; a gateway started when the last run
is more than a day old (or there was none) runs once ``CATCH_UP_DELAY_SECONDS`` after
its start too, so a gateway restarted every night before that hour still tidies. A run
that fails (a full disk, a lost database connection) is logged and tried again the next
day: it never stops the gateway. One that finds another run holding the home's lock (an
operator's `parley maintenance`) skips the day with one line in the log. File work runs
on worker threads (``gateway.retention.run``), never on the event loop.

On PostgreSQL every replica's timer fires at the same hour, and one run does the day's
work for all of them: a replica that finds the shared database's run lock taken, or a
run recorded there since that day's hour (``run.run_daily``), skips with one line in
the log; that is no failure. "The last run" (for the catch-up) is the newer of this
home's record and the shared database's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from parley.gateway.config import LoadedConfig
from parley.gateway.errors import RetentionBusy
from parley.gateway.retention.run import (
    RemovedRows,
    RetentionState,
    RunReport,
    finished_at,
    latest_run,
    run_daily,
)
from parley.gateway.tasks import cancel_and_wait

log = logging.getLogger("parley.gateway.retention")

# A first run this long after start when the last one is more than a day old: after the
# start's own work (recovery, the memory sync), before the next scheduled hour.
CATCH_UP_DELAY_SECONDS = 600.0


def next_run(now: datetime, hour: int) -> datetime:
    """The next ``hour``:00 UTC strictly after ``now`` (an aware datetime)."""
    at = now.replace(hour=hour, minute=0, second=0, microsecond=0)
    return at if at > now else at + timedelta(days=1)


class RetentionService:
    """Runs retention daily until stopped."""

    def __init__(
        self,
        loaded: LoadedConfig,
        state: RetentionState,
        *,
        clock: Callable[[], datetime],
        memory: Callable[[], RemovedRows | None],
        forget_cached: Callable[[str], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.loaded = loaded
        self.state = state
        self.clock = clock
        self.memory = memory
        self.forget_cached = forget_cached
        self._sleep = sleep
        self._task: asyncio.Task[None] | None = None
        self.last_report: RunReport | None = None
        self.failures = 0

    def start(self) -> None:
        if self._task is None and self.loaded.config.retention.enabled:
            self._task = asyncio.create_task(self._loop(), name="retention")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def run_once(self) -> RunReport | None:
        """One run now; a failure is logged (and counted), never raised. None when it
        failed, when another run holds the lock (``parley maintenance`` on this home, or
        on PostgreSQL another replica's), or on PostgreSQL when another replica's run
        already did today's (since the last ``run_hour_utc``)."""
        now = self.clock()
        today = next_run(now, self.loaded.config.retention.run_hour_utc) - timedelta(days=1)
        try:
            report = await run_daily(
                self.loaded,
                self.state,
                now=now,
                unless_ran_since=today,
                memory=self.memory(),
                forget_cached=self.forget_cached,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, RetentionBusy):
                # Another run does the work: another replica's daily run (every day but
                # on one replica), or an operator's `parley maintenance` on this home.
                # Not a failure either way.
                log.info("retention: skipped (tried again tomorrow): %s", exc)
                return None
            self.failures += 1
            log.error("retention run failed (tried again tomorrow): %s", exc, exc_info=True)
            return None
        if report is None:
            return None  # another replica's run did today's work (run_daily logged it)
        self.last_report = report
        plan = report.plan
        log.info(
            "retention: removed %d archived transcript(s), %d inbox row(s), %d media file(s); "
            "%d bytes freed under the home",
            len(plan.transcripts),
            plan.inbox.rows,
            len(plan.media),
            plan.freed_bytes,
        )
        for error in report.errors:
            log.warning("retention: %s", error)
        if plan.cap_unmet:
            log.warning(
                "retention: the home is still above the disk cap's low-water mark with no "
                "archived data left to remove (active sessions, memory and state remain)"
            )
        return report

    async def _loop(self) -> None:
        hour = self.loaded.config.retention.run_hour_utc
        now = self.clock()
        wait = (next_run(now, hour) - now).total_seconds()
        if await self._overdue(now):
            wait = min(wait, CATCH_UP_DELAY_SECONDS)
        while True:
            await self._sleep(max(0.0, wait))
            await self.run_once()
            now = self.clock()
            wait = (next_run(now, hour) - now).total_seconds()

    async def _overdue(self, now: datetime) -> bool:
        try:
            last = await latest_run(self.loaded, self.state.pg)
        except Exception as exc:  # the database is down: the catch-up run will say more
            log.warning("retention: cannot read when the last run was (%s)", exc)
            return True
        at = finished_at(last)
        return at is None or now - at > timedelta(days=1)
