"""Lanes: one run at a time per session, a global cap on concurrent runs.

A ``LaneManager`` owns one lane per session key. A lane is a bounded FIFO of items
plus a worker task that hands them to the runner, one run at a time. Different
sessions run in parallel, but never more than ``max_concurrent_runs`` at once: the
single semaphore here is the only place that bounds concurrency.

A run holds its slot while it works on the model's side of a turn. The runner may
hand the slot back (``release_slot``) while it waits on something that is not a run,
such as sending the reply to a chat platform that is slow or rate-limits the bot,
and must take it again (``hold_slot``) before its next turn. The lane itself stays
busy until the runner returns, so a session's replies keep their order; only the
cap on model work is shared out sooner.

While lanes wait for a slot, the first ``max_concurrent_runs`` of them (in the order
they will get one) are handed to ``prefetch(session_key)``, when one is given: what a
run reads before its model work (the session's transcript) is then read while other
runs hold the slots, not inside the run's own. A prefetch is only a hint: its failure
is logged at debug level and the run goes on (reading for itself what it needs), and
stop() waits up to the cancel grace for those under way (bench/load.py: with 1,000
chats, opening windows again took 12-20 ms of each run's slot in the late rounds).

Modes decide what one run gets:

- ``queue``: one item per run, in arrival order;
- ``collect``: everything waiting when the run starts, folded into one batch (a
  chat where the user sent three short messages while the agent was busy gets one
  answer to all three).

Nothing is dropped silently: a full lane rejects the submit (the caller answers
"busy"), a runner failure is logged and the lane goes on, and ``stop()`` hands back
every item it did not finish. Idle lane workers are reaped after
``idle_lane_ttl_seconds`` and recreated on the next submit.

The manager knows nothing about chat platforms: items are opaque.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("parley.gateway.lanes")

T = TypeVar("T")

DEFAULT_MODE: Literal["queue", "collect"] = "collect"
DEFAULT_MAX_CONCURRENT_RUNS = 4
DEFAULT_QUEUE_CAP = 20
DEFAULT_IDLE_LANE_TTL_SECONDS = 300.0
DEFAULT_STOP_TIMEOUT_SECONDS = 30.0
# How long stop() waits for cancelled runs to unwind before giving up on them.
DEFAULT_CANCEL_GRACE_SECONDS = 5.0

Runner = Callable[[str, list[T]], Awaitable[None]]
Prefetch = Callable[[str], Coroutine[Any, Any, None]]


class LanesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["queue", "collect"] = Field(
        DEFAULT_MODE,
        description="queue: one message per run, in order; "
        "collect: everything that arrived during a run is answered in the next run",
    )
    max_concurrent_runs: int = Field(
        DEFAULT_MAX_CONCURRENT_RUNS,
        ge=1,
        le=256,
        description="runs in flight across all sessions",
    )
    queue_cap: int = Field(
        DEFAULT_QUEUE_CAP,
        ge=1,
        le=10_000,
        description="messages waiting per session; beyond it the sender is told to retry",
    )
    idle_lane_ttl_seconds: float = Field(
        DEFAULT_IDLE_LANE_TTL_SECONDS,
        ge=0,
        le=86_400,
        description="an idle session's worker is released after this long",
    )


class SubmitStatus(StrEnum):
    ACCEPTED = "accepted"
    QUEUE_FULL = "queue_full"  # the session already has queue_cap items waiting
    CLOSED = "closed"  # the manager is not running (not started, stopping or stopped)


@dataclass(frozen=True, slots=True)
class SubmitResult:
    status: SubmitStatus
    # 1-based place among the session's waiting items (1: next to run); 0 when rejected.
    position: int = 0

    @property
    def accepted(self) -> bool:
        return self.status is SubmitStatus.ACCEPTED


@dataclass(frozen=True, slots=True)
class LaneStats:
    active_runs: int
    queued: int
    lanes: int
    max_concurrent_runs: int
    lanes_reaped: int  # since start, for metrics: a high rate suggests too short a TTL


@dataclass(frozen=True, slots=True)
class StopReport(Generic[T]):
    """What stop() did not finish, per session key, in arrival order.

    ``unstarted`` items never reached the runner; ``interrupted`` ones were in a run
    that was cancelled (or that outlived the cancel grace period), so their answer
    may be missing or partial. The gateway's durable inbox answers both on restart.
    """

    unstarted: dict[str, list[T]] = field(default_factory=dict)
    interrupted: dict[str, list[T]] = field(default_factory=dict)
    drained: bool = True  # False when drain was asked for but the timeout ran out

    @property
    def unfinished(self) -> int:
        return sum(map(len, self.unstarted.values())) + sum(map(len, self.interrupted.values()))


class _State(StrEnum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(eq=False, slots=True)
class _Lane(Generic[T]):
    key: str
    queue: deque[T] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    running: list[T] | None = None
    task: asyncio.Task[None] | None = None
    # The semaphore whose slot this lane's run holds now (None between runs, and while
    # the run has handed it back): the one it was taken from, since stop() replaces
    # the manager's semaphore.
    slot: asyncio.Semaphore | None = None
    # Set by stop(): the worker must not start another run, even one that swallowed
    # its cancellation and outlived the manager's reset.
    halted: bool = False
    # Handed to the prefetch while it waits for its slot (reset once it has one).
    prefetched: bool = False


class LaneManager(Generic[T]):
    """Serialises runs per session key and bounds them globally.

    ``runner(session_key, batch)`` is awaited for each run; an exception from it is
    logged and does not stop the lane. Use as ``async with LaneManager(...) as
    lanes:`` or call ``start()``/``stop()``.
    """

    def __init__(
        self, config: LanesConfig, runner: Runner[T], *, prefetch: Prefetch | None = None
    ) -> None:
        self._config = config
        self._runner = runner
        self._prefetch = prefetch
        # Lanes waiting for a slot to start a run, in the order they began to wait (an
        # ordered set), and the prefetches under way.
        self._waiting: dict[_Lane[T], None] = {}
        self._prefetches: set[asyncio.Task[None]] = set()
        self._state = _State.NEW
        self._lanes: dict[str, _Lane[T]] = {}
        self._slots = asyncio.Semaphore(config.max_concurrent_runs)
        # Kept as running totals so stats() and the idle check never walk every lane.
        self._queued = 0
        self._active = 0  # lanes with a batch in flight, slot or not
        self._holding = 0  # runs holding a slot now
        self._reaped = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = asyncio.Event()

    @property
    def config(self) -> LanesConfig:
        return self._config

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        if self._state is _State.RUNNING or self._state is _State.STOPPING:
            raise RuntimeError("LaneManager is already running")
        self._stopped = asyncio.Event()
        self._reaped = 0
        self._state = _State.RUNNING

    async def stop(
        self,
        *,
        drain: bool = True,
        # A parameter rather than the caller's asyncio.timeout: running out of time
        # must still cancel cleanly and return the report, not abort stop() itself.
        timeout: float | None = DEFAULT_STOP_TIMEOUT_SECONDS,  # noqa: ASYNC109
    ) -> StopReport[T]:
        """Refuse new items, then finish (``drain``) or cancel what is left.

        With ``drain``, queued items still run until the lanes are empty or
        ``timeout`` runs out; whatever is left then is cancelled. Every item not
        finished comes back in the report.
        """
        if self._state is _State.STOPPING:
            await self._stopped.wait()
            return StopReport()
        if self._state is not _State.RUNNING:
            return StopReport()
        self._state = _State.STOPPING
        try:
            drained = True
            if drain:
                drained = await self._drain(timeout)
            report = await self._cancel_all(drained)
        finally:
            # Reached early only if stop() itself was cancelled mid-drain: no worker
            # may outlive the manager's state.
            for lane in self._lanes.values():
                lane.halted = True
                if lane.task is not None:
                    lane.task.cancel()
            self._reset()
            self._state = _State.STOPPED
            self._stopped.set()
        if report.unfinished:
            log.warning(
                "lanes stopped with %d unfinished item(s) in %d session(s)",
                report.unfinished,
                len(report.unstarted.keys() | report.interrupted.keys()),
            )
        return report

    async def __aenter__(self) -> LaneManager[T]:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving on an error is no time to keep running turns.
        await self.stop(drain=exc_type is None)

    # -- submitting and observing ------------------------------------------------

    async def submit(self, session_key: str, item: T, *, force: bool = False) -> SubmitResult:
        """Queue ``item``; ``force`` ignores ``queue_cap`` (for messages accepted before
        a restart: the cap must not turn them away the second time)."""
        if self._state is not _State.RUNNING:
            return SubmitResult(SubmitStatus.CLOSED)
        lane = self._lanes.get(session_key)
        if lane is None:
            lane = _Lane(session_key)
            self._lanes[session_key] = lane
        if not force and len(lane.queue) >= self._config.queue_cap:
            return SubmitResult(SubmitStatus.QUEUE_FULL)
        lane.queue.append(item)
        self._queued += 1
        self._idle.clear()
        if lane.task is None:
            lane.task = asyncio.create_task(self._work(lane), name=f"lane {session_key!r}")
        lane.wakeup.set()
        return SubmitResult(SubmitStatus.ACCEPTED, position=len(lane.queue))

    def pending(self, session_key: str) -> int:
        """Items of this session waiting to run (the batch in flight excluded)."""
        lane = self._lanes.get(session_key)
        return len(lane.queue) if lane is not None else 0

    def busy(self, session_key: str) -> bool:
        """Whether a run for this session is in flight."""
        lane = self._lanes.get(session_key)
        return lane is not None and lane.running is not None

    async def hold_slot(self, session_key: str) -> None:
        """Take a run slot again for the session's batch in flight, waiting for one if
        the cap is reached; nothing when it holds one or no batch is in flight."""
        lane = self._own_lane(session_key)
        if lane is None or lane.running is None or lane.slot is not None:
            return
        await self._take_slot(lane)

    def release_slot(self, session_key: str) -> None:
        """Hand back the run slot of the session's batch in flight, for the time its
        runner waits on something other than the model; its lane stays busy."""
        lane = self._own_lane(session_key)
        if lane is not None:
            self._give_slot(lane)

    def _own_lane(self, session_key: str) -> _Lane[T] | None:
        """The session's lane, when the caller is its run: a run that outlived stop()
        (its lane halted, a new lane under the same key after a restart) or a caller
        outside any lane (a redelivery) must not move another run's slot."""
        lane = self._lanes.get(session_key)
        if lane is None or lane.halted or lane.task is not asyncio.current_task():
            return None
        return lane

    def stats(self) -> LaneStats:
        return LaneStats(
            active_runs=self._holding,
            queued=self._queued,
            lanes=len(self._lanes),
            max_concurrent_runs=self._config.max_concurrent_runs,
            lanes_reaped=self._reaped,
        )

    async def wait_idle(self) -> None:
        """Return once nothing is running or waiting (at once when already so)."""
        await self._idle.wait()

    # -- workers -----------------------------------------------------------------

    async def _work(self, lane: _Lane[T]) -> None:
        while not lane.halted:
            if not lane.queue:
                if await self._idle_out(lane):
                    return
                continue
            await self._take_slot(lane, ahead=True)
            try:
                # stop() may have halted us while we waited for a slot, and in
                # collect mode more items may have arrived meanwhile: take the batch
                # only now.
                if lane.halted or not lane.queue:
                    continue
                batch = self._take_batch(lane)
                try:
                    await self._runner(lane.key, list(batch))
                except Exception:
                    log.exception(
                        "lane run failed for session %r (%d item(s)); the lane goes on",
                        lane.key,
                        len(batch),
                    )
                # Not reached on cancellation: lane.running then stays set so that
                # stop() reports the batch as interrupted.
                lane.running = None
                if lane.halted:
                    # stop() has taken over the totals (a runner that swallowed its
                    # cancellation lands here); nothing more runs in this lane.
                    return
                self._active -= 1
                self._refresh_idle()
            finally:
                self._give_slot(lane)

    async def _take_slot(self, lane: _Lane[T], *, ahead: bool = False) -> None:
        """Wait for a run slot; ``ahead``: a run about to start, whose wait may be used
        to prefetch what it will read."""
        slots = self._slots
        if ahead and self._prefetch is not None and slots.locked():
            self._waiting[lane] = None
            self._prefetch_front()
            try:
                await slots.acquire()
            finally:
                # pop: a stop() cancelled mid-drain may have cleared the line already.
                self._waiting.pop(lane, None)
                lane.prefetched = False
                self._prefetch_front()
        else:
            await slots.acquire()
        lane.slot = slots
        if slots is self._slots:  # not replaced by a stop() meanwhile
            self._holding += 1

    def _prefetch_front(self) -> None:
        """Start the prefetch of each of the first ``max_concurrent_runs`` waiting lanes
        that has none yet: the lanes the next slots go to (the semaphore wakes its
        waiters in order)."""
        assert self._prefetch is not None
        for lane in itertools.islice(self._waiting, self._config.max_concurrent_runs):
            if lane.prefetched or lane.halted:
                continue
            lane.prefetched = True
            task = asyncio.create_task(self._prefetch(lane.key), name=f"prefetch {lane.key!r}")
            self._prefetches.add(task)
            task.add_done_callback(self._prefetch_done)

    def _prefetch_done(self, task: asyncio.Task[None]) -> None:
        self._prefetches.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # A hint that failed: the run reads for itself, and reports what it finds.
            log.debug("%s failed: %s: %s", task.get_name(), type(exc).__name__, exc)

    def _give_slot(self, lane: _Lane[T]) -> None:
        if lane.slot is None:
            return
        if lane.slot is self._slots:
            # A run that stop() abandoned holds a slot of the semaphore it replaced,
            # which the count (restarted from zero) never included.
            self._holding -= 1
        lane.slot.release()
        lane.slot = None

    def _take_batch(self, lane: _Lane[T]) -> list[T]:
        if self._config.mode == "collect":
            batch = list(lane.queue)
            lane.queue.clear()
        else:
            batch = [lane.queue.popleft()]
        # Both totals change before anyone can look, so the manager never seems idle
        # between taking a batch and running it.
        lane.running = batch
        self._queued -= len(batch)
        self._active += 1
        return batch

    async def _idle_out(self, lane: _Lane[T]) -> bool:
        """Wait for work; True when the lane stayed idle for the TTL and was reaped."""
        lane.wakeup.clear()
        try:
            async with asyncio.timeout(self._config.idle_lane_ttl_seconds):
                await lane.wakeup.wait()
        except TimeoutError:
            # A submit may have landed just as the timer fired; the check and the
            # removal run without a suspension between them, so none slips through.
            if lane.queue or lane.halted:
                return False
            if self._lanes.get(lane.key) is lane:
                del self._lanes[lane.key]
                self._reaped += 1
            return True
        return False

    def _refresh_idle(self) -> None:
        if self._active == 0 and self._queued == 0:
            self._idle.set()
        else:
            self._idle.clear()

    # -- stopping ----------------------------------------------------------------

    async def _drain(self, limit: float | None) -> bool:
        try:
            async with asyncio.timeout(limit):
                await self._idle.wait()
        except TimeoutError:
            log.warning(
                "lanes did not drain within %ss (%d running, %d queued); cancelling",
                limit,
                self._active,
                self._queued,
            )
            return False
        return True

    async def _cancel_all(self, drained: bool) -> StopReport[T]:
        for lane in self._lanes.values():
            lane.halted = True
        tasks = [lane.task for lane in self._lanes.values() if lane.task and not lane.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=DEFAULT_CANCEL_GRACE_SECONDS)
            for task in stuck:
                log.error("%s ignored cancellation; abandoning it", task.get_name())
        if self._prefetches:
            # Let them finish rather than cancel them: what they open is then kept, and
            # closed with the cache (an open that outlives it closes what it gets).
            _, late = await asyncio.wait(
                set(self._prefetches), timeout=DEFAULT_CANCEL_GRACE_SECONDS
            )
            for task in late:
                task.cancel()
        unstarted: dict[str, list[T]] = {}
        interrupted: dict[str, list[T]] = {}
        for key, lane in self._lanes.items():
            if lane.running is not None:
                interrupted[key] = list(lane.running)
            if lane.queue:
                unstarted[key] = list(lane.queue)
        return StopReport(unstarted=unstarted, interrupted=interrupted, drained=drained)

    def _reset(self) -> None:
        self._lanes.clear()
        self._waiting.clear()
        for task in self._prefetches:
            task.cancel()
        self._queued = 0
        self._active = 0
        self._holding = 0
        self._idle.set()
        # A run abandoned after the grace period may still hold a slot.
        self._slots = asyncio.Semaphore(self._config.max_concurrent_runs)
