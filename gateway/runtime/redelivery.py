"""Messages answered again: what the inbox holds unanswered after a restart, and
replies a platform outage kept from being sent, tried again with a backoff and given
up on after a day.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from parley.gateway.lanes import LaneManager
from parley.gateway.runtime.context import Runtime
from parley.gateway.runtime.dispatch import Dispatch
from parley.gateway.runtime.lane_items import LaneItem, LaneTask
from parley.gateway.storage.inbox import InboxItem
from parley.gateway.storage.sessions import utcnow

log = logging.getLogger("parley.gateway")

# Replies that could not be sent (a platform outage) are tried again this often, and
# given up on (marked failed) this long after their message arrived.
REDELIVERY_INTERVAL_SECONDS = 30.0
REDELIVERY_MAX_BACKOFF_SECONDS = 1800.0  # per reply, doubling from the interval
REDELIVERY_GIVE_UP = timedelta(hours=24)


class Redelivery:
    def __init__(
        self, rt: Runtime, dispatch: Dispatch, lanes: LaneManager[LaneItem | LaneTask]
    ) -> None:
        self.rt = rt
        self.dispatch = dispatch
        self.lanes = lanes
        # Per undelivered reply: (sends tried again, monotonic time of the next one).
        self._schedule: dict[int, tuple[int, float]] = {}

    async def recover(self) -> None:
        """Queue again whatever the inbox holds unanswered (one process: SQLite)."""
        items = await self.rt.inbox.open_items()
        queued = 0
        for item in items:
            if item.message.channel not in self.rt.channels:
                continue  # that channel is not running now; it stays open for later
            queued += await self.requeue(item)
        if queued:
            log.info("recovering %d unanswered message(s) from the inbox", queued)

    async def requeue(self, item: InboxItem) -> bool:
        """Queue an inbox item again, as recovered. It was accepted once: the queue cap
        must not turn it away the second time."""
        route = self.rt.route(item.message)
        lane_item = LaneItem(item.id, item.message, route, recovered=item)
        if not (await self.lanes.submit(route.key, lane_item, force=True)).accepted:
            return False
        self.dispatch.redelivering.add(item.id)
        return True

    async def redeliver_now(self, *, due_only: bool = False) -> int:
        """Queue again every reply a platform outage kept from being sent (the inbox
        holds them as ``replied`` with an error); give up on those older than
        ``REDELIVERY_GIVE_UP``. ``due_only`` (the background loop) skips replies whose
        backoff has not run out: each try appends a delivery entry to the transcript,
        so a day-long outage must not write one every 30 s. Returns how many were queued."""
        rt = self.rt
        queued = 0
        now = utcnow()  # the inbox stamps arrivals with the real time, not the clock
        tick = time.monotonic()
        items = await rt.inbox.open_items()
        mine = rt.state.locks.pid if rt.state.locks is not None else None
        for item in items:
            if item.status != "replied" or not item.error:
                continue  # not a failed send
            if item.id in self.dispatch.redelivering:
                continue  # already queued
            if mine is not None and item.claimed_by != mine:
                continue  # another replica's to resend (or an orphan, adopted first)
            tries, next_at = self._schedule.get(item.id, (0, 0.0))
            if due_only and tick < next_at:
                continue
            if item.message.channel not in rt.channels:
                continue
            if item.received_at is not None and now - item.received_at > REDELIVERY_GIVE_UP:
                await rt.inbox.mark_failed([item.id], f"gave up resending: {item.error}")
                log.warning("inbox %d: gave up resending its reply: %s", item.id, item.error)
                continue
            if await self.requeue(item):
                delay = min(REDELIVERY_INTERVAL_SECONDS * 2**tries, REDELIVERY_MAX_BACKOFF_SECONDS)
                self._schedule[item.id] = (tries + 1, tick + delay)
                queued += 1
        open_ids = {item.id for item in items}
        for stale in set(self._schedule) - open_ids:  # delivered or given up
            del self._schedule[stale]
        if queued:
            log.info("sending %d reply(ies) again after a failed delivery", queued)
        return queued

    async def loop(self) -> None:
        """Every ``REDELIVERY_INTERVAL_SECONDS``, the replies whose backoff ran out."""
        while True:
            await asyncio.sleep(REDELIVERY_INTERVAL_SECONDS)
            try:
                await self.redeliver_now(due_only=True)
            except Exception:  # a storage failure here must not end the loop
                log.exception("resending undelivered replies failed")
