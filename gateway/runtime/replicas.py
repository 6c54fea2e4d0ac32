"""Several gateway replicas on one PostgreSQL: who answers what, and when.

Any replica may receive any message (a load balancer in front of the Telegram
webhook, Discord shards spread over replicas). Every message goes into the shared
inbox with its session key, then into the receiving replica's lane for that session,
as with SQLite. What changes is the lane's run:

1. It takes the session's advisory lock (``SessionLocks``): one turn at a time per
   session across every replica. A replica that dies drops its locks with its
   connection.
2. Under the lock it reads the session's open inbox items afresh
   (``PgInbox.open_for_session``): those another replica answered meanwhile are
   dropped from the batch, and those other replicas received but have not answered
   yet are added, in arrival order, up to the first one still queued in this
   replica's own lane after this batch (its run comes next, as with SQLite); one
   queued here but older than a message of the batch (an adopted orphan, a resend
   put at the lane's back) is answered now, first. The lock holder
   answers the lot; the other replicas' lanes then find nothing left. Checking the
   status under the lock is what makes each message answered exactly once.
3. An item whose turn a dead replica had started (its user message is in the
   transcript already, or its reply is stored) runs as *recovered*, through the same
   code that resumes a turn after a restart, so nothing is written or sent twice.
4. Before each reply is stored and sent, the run checks that the lock is still its
   own (``SessionLocks.still_held``): a lock has no lease that a slow replica could
   outlive, but its connection can break mid-turn, and then another replica may
   take the session and answer the same messages. The run then stops without
   sending; its messages are answered under the lock by whoever holds it (queued
   here again by the next scan, as the stranded ones are).

A replica that dies leaves items nobody's lane holds: ``adopt_orphans`` claims the
open items whose claimant's connection is gone (PostgreSQL's ``pg_stat_activity``
says who is alive) and queues them here. It runs at start and then every few seconds.

With SQLite there is one process: none of this runs (``state.locks`` is None).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from parley.gateway.errors import StateError
from parley.gateway.lanes import LaneManager
from parley.gateway.runtime.commands.parsing import parse_info_command
from parley.gateway.runtime.context import Runtime
from parley.gateway.runtime.dispatch import Dispatch, SessionLost
from parley.gateway.runtime.lane_items import LaneItem, LaneTask
from parley.gateway.runtime.redelivery import Redelivery
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.storage.errors import storage_failure
from parley.gateway.storage.inbox import InboxItem, ReplicaInbox
from parley.gateway.tasks import cancel_and_wait

if TYPE_CHECKING:
    from parley.gateway.storage.postgres.session_locks import SessionLocks

log = logging.getLogger("parley.gateway.replicas")

ORPHAN_SCAN_SECONDS = 5.0


class ReplicaCoordinator:
    """The PostgreSQL backend's share of a gateway's lane runs (see the module doc)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        locks: SessionLocks,
        inbox: ReplicaInbox,
        lanes: LaneManager[LaneItem | LaneTask],
        transcripts: TranscriptCache,
        dispatch: Dispatch,
        redelivery: Redelivery,
    ) -> None:
        self.rt = rt
        self.locks = locks
        self.inbox = inbox
        self.lanes = lanes
        self.transcripts = transcripts
        self.dispatch = dispatch
        self.redelivery = redelivery
        self.scan_seconds = ORPHAN_SCAN_SECONDS
        # Lane items whose session lock could not be taken (the lock connection was
        # down): queued again by the next scan instead of waiting for a restart.
        self._stranded: dict[int, LaneItem] = {}
        self._task: asyncio.Task[None] | None = None
        dispatch.fence = locks.still_held

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._scan_loop(), name="orphan-scan")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    # -- a lane run ---------------------------------------------------------------------

    async def run_locked(self, key: str, items: list[LaneItem | LaneTask]) -> None:
        """Run a lane batch of session ``key`` under its lock, with every open item of
        the session (whoever received it) and none already answered."""
        # No slot is held while waiting for the lock: a lock holder of another replica
        # may be waiting for a slot of ours held by a lane that waits for its lock, a
        # cycle. The run takes a slot again before its first turn (Dispatch._answer).
        if self.dispatch.slots is not None:
            self.dispatch.slots.release_slot(key)
        try:
            await self.locks.acquire(key)
        except Exception as exc:  # the lock connection is down and did not come back
            log.error("cannot lock session %s: %s; its messages are tried again", key, exc)
            self._strand(items, exc)
            return
        try:
            try:
                batch = await self._claim_batch(key, items)
            except Exception as exc:
                if storage_failure(exc) is None:
                    raise
                # Reading the session's open items failed (the pool timed out under
                # load, the server went): nothing was answered; queued again by the
                # next scan instead of left open until a restart.
                log.error("reading session %s's open messages failed: %s", key, exc)
                self._strand(items, exc)
                return
            await self.dispatch.run_batch(key, batch)
        except SessionLost:
            # Whatever this run had not sent is still open in the inbox: queued here
            # again by the next scan (the status check under the lock drops what the
            # new holder answered meanwhile).
            log.warning("lost the lock of session %s mid-run; its replies were not sent", key)
            self._strand(items, StateError(f"lost the lock of session {key}"))
        finally:
            await self.locks.release(key)

    def _strand(self, items: Sequence[LaneItem | LaneTask], exc: Exception) -> None:
        """Keep a failed run's messages for the next scan; fail its tasks."""
        self.rt.metrics.error("storage")
        for item in items:
            if isinstance(item, LaneItem):
                self._stranded[item.inbox_id] = item
            elif not item.done.done():
                item.done.set_exception(exc)

    async def _claim_batch(
        self, key: str, items: Sequence[LaneItem | LaneTask]
    ) -> list[LaneItem | LaneTask]:
        local = {i.inbox_id: i for i in items if isinstance(i, LaneItem)}
        batch: list[LaneItem | LaneTask] = [i for i in items if not isinstance(i, LaneItem)]
        rows = await self.inbox.open_for_session(key, list(local))
        started = await self._started_ids(key) if rows else set()
        me = self.locks.pid
        last_local = max(local, default=-1)
        foreign_ok = True
        for row in rows:
            item = local.get(row.id)
            if item is None:
                if row.claimed_by == me and row.id > last_local:
                    # Waiting in this replica's own lane for a later run, as with SQLite;
                    # taking anything after it now would answer out of order.
                    foreign_ok = False
                    continue
                # Another replica's, or claimed here but older than a message of this
                # batch: queued behind it out of arrival order (an adopted orphan, a
                # resend), so answered now, first; its own run finds it answered later.
                item = self._foreign_item(key, row) if foreign_ok else None
                if item is None:
                    continue
            if item.recovered is not None or row.status != "received" or row.id in started:
                # Begun somewhere (maybe by a replica that died): resume, never redo.
                item = dataclasses.replace(item, recovered=row)
            batch.append(item)
        dropped = set(local) - {r.id for r in rows}
        if dropped:
            log.debug("inbox %s answered by another replica", sorted(dropped))
            self.dispatch.redelivering.difference_update(dropped)
        return batch

    def _foreign_item(self, key: str, row: InboxItem) -> LaneItem | None:
        """A lane item for an open item outside this batch (received by another replica,
        or queued behind it here), or None when it is not this lane's to answer."""
        # A failed send (kept for another one) is taken too, whoever's it is: left to
        # its claimant's redelivery, it would reach the chat after this batch's
        # replies. Under this lock it is sent once, and that redelivery finds it done.
        if parse_info_command(row.message.text) is not None:
            return None  # /status and the like: answered by the receiver, outside lanes
        if row.message.channel not in self.rt.channels:
            return None  # no adapter here to reply through
        route = self.rt.route(row.message)
        if route.key != key:
            return None  # routed differently here (configs differ): not under this lock
        return self.dispatch.lane_item(row.id, row.message, route)

    async def _started_ids(self, key: str) -> set[int]:
        """Inbox ids of the session's latest user message: a turn on them was begun."""
        record = await self.rt.registry.get_active(key)
        if record is None:
            return set()
        transcript = await self.transcripts.current(record)
        for entry in reversed(transcript.live_entries()):
            if entry.type == "message" and entry.message.role == "user":
                meta = entry.payload.get("meta") or {}
                return {int(i) for i in meta.get("inbox_ids") or ()}
        return set()

    # -- orphans ------------------------------------------------------------------------

    async def adopt_orphans(self) -> int:
        """Claim the open items of replicas that died and queue them here; queue again
        the stranded ones. Returns how many were queued."""
        queued = 0
        stranded, self._stranded = self._stranded, {}
        for item in stranded.values():
            if (await self.lanes.submit(item.route.key, item, force=True)).accepted:
                queued += 1
        for row in await self.inbox.claim_orphans(channels=list(self.rt.channels)):
            queued += await self.redelivery.requeue(row)
        if queued:
            log.info("took over %d unanswered message(s) from stopped replicas", queued)
        return queued

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scan_seconds)
            try:
                await self.adopt_orphans()
            except Exception:  # a database hiccup must not end the loop
                log.exception("looking for messages of stopped replicas failed")
