"""LaneManager: per-session serialisation, the global cap, modes, failures, stop, reaping.

No wall-time sleeps: runners yield with sleep(0) or block on events the test owns,
and every wait is bounded by asyncio.timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from parley.gateway.lanes import (
    DEFAULT_MAX_CONCURRENT_RUNS,
    DEFAULT_QUEUE_CAP,
    LaneManager,
    LanesConfig,
    SubmitStatus,
)

WAIT = 5.0  # bound on every wait; a healthy run needs a tiny fraction of it


async def wait_until(predicate: Callable[[], bool]) -> None:
    # For states no event announces (a lane reaped): re-check on every loop turn.
    async with asyncio.timeout(WAIT):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0)


async def idle(lanes: LaneManager[object]) -> None:
    async with asyncio.timeout(WAIT):
        await lanes.wait_idle()


class Gate:
    """A runner that records batches and holds chosen items until released."""

    def __init__(self, hold: set[object] | None = None) -> None:
        self.hold = hold if hold is not None else set()
        self.batches: list[tuple[str, list[object]]] = []
        self.started: dict[object, asyncio.Event] = defaultdict(asyncio.Event)
        self.release = asyncio.Event()
        self.cancelled: list[object] = []

    async def __call__(self, key: str, batch: list[object]) -> None:
        self.batches.append((key, batch))
        for item in batch:
            self.started[item].set()
        if self.hold & set(batch):
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.extend(batch)
                raise

    async def wait_started(self, item: object) -> None:
        async with asyncio.timeout(WAIT):
            await self.started[item].wait()

    def items(self, key: str) -> list[object]:
        return [item for k, batch in self.batches if k == key for item in batch]


def test_config_defaults_and_bounds() -> None:
    config = LanesConfig()
    assert config.mode == "collect"
    assert config.max_concurrent_runs == DEFAULT_MAX_CONCURRENT_RUNS == 4
    assert config.queue_cap == DEFAULT_QUEUE_CAP == 20
    for bad in (
        {"max_concurrent_runs": 0},
        {"max_concurrent_runs": 257},
        {"queue_cap": 0},
        {"queue_cap": 10_001},
        {"idle_lane_ttl_seconds": -1},
        {"mode": "parallel"},
        {"surprise": 1},
    ):
        with pytest.raises(ValidationError):
            LanesConfig.model_validate(bad)
    with pytest.raises(ValidationError):
        config.mode = "collect"  # type: ignore[misc]
    assert LanesConfig.model_fields["queue_cap"].description


@pytest.mark.parametrize("mode", ["queue", "collect"])
@pytest.mark.parametrize("ttl", [0.0, 300.0], ids=["reap-always", "keep"])
async def test_many_sessions_exactly_once_in_order_within_caps(mode: str, ttl: float) -> None:
    sessions, per_session, submitters, cap = 50, 20, 25, 7
    in_flight: Counter[str] = Counter()
    running = 0
    max_running = 0
    processed: dict[str, list[int]] = defaultdict(list)
    batch_sizes: list[int] = []

    async def runner(key: str, batch: list[int]) -> None:
        nonlocal running, max_running
        in_flight[key] += 1
        running += 1
        max_running = max(max_running, running)
        assert in_flight[key] == 1, f"two runs of {key} at once"
        batch_sizes.append(len(batch))
        for _ in range(3):
            await asyncio.sleep(0)
        processed[key].extend(batch)
        in_flight[key] -= 1
        running -= 1

    config = LanesConfig(
        mode=mode,  # type: ignore[arg-type]
        max_concurrent_runs=cap,
        queue_cap=per_session,
        idle_lane_ttl_seconds=ttl,
    )
    # Every session's messages are spread over many submitting tasks, in a seeded
    # random interleaving; the order a session's lane accepted them is the order
    # the runner must see.
    messages = [(f"s{n % sessions}", n) for n in range(sessions * per_session)]
    random.Random(7).shuffle(messages)
    accepted: dict[str, list[int]] = defaultdict(list)

    async def submit_share(share: list[tuple[str, int]]) -> None:
        for key, n in share:
            result = await lanes.submit(key, n)
            assert result.accepted, result
            accepted[key].append(n)
            await asyncio.sleep(0)

    async with LaneManager(config, runner) as lanes:
        async with asyncio.TaskGroup() as group:
            for i in range(submitters):
                group.create_task(submit_share(messages[i::submitters]))
        await idle(lanes)
        assert lanes.stats().active_runs == 0
        assert lanes.stats().queued == 0

    every = [n for items in processed.values() for n in items]
    assert sorted(every) == list(range(sessions * per_session))  # exactly once
    assert dict(processed) == dict(accepted)  # in order within each session
    assert max_running == cap  # the cap was reached and never passed
    if mode == "queue":
        assert set(batch_sizes) == {1}
    else:
        assert max(batch_sizes) > 1  # runs did fold waiting messages


async def test_collect_folds_items_arriving_during_a_run() -> None:
    gate = Gate(hold={"a1"})
    async with LaneManager(LanesConfig(mode="collect"), gate) as lanes:
        await lanes.submit("a", "a1")
        await gate.wait_started("a1")
        for item in ("a2", "a3", "a4"):
            assert (await lanes.submit("a", item)).accepted
        assert lanes.pending("a") == 3
        gate.release.set()
        await idle(lanes)
        await lanes.submit("a", "a5")
        await idle(lanes)
    assert gate.batches == [("a", ["a1"]), ("a", ["a2", "a3", "a4"]), ("a", ["a5"])]


async def test_queue_mode_runs_waiting_items_one_per_run() -> None:
    gate = Gate(hold={"a1"})
    async with LaneManager(LanesConfig(mode="queue"), gate) as lanes:
        await lanes.submit("a", "a1")
        await gate.wait_started("a1")
        positions = [(await lanes.submit("a", item)).position for item in ("a2", "a3")]
        assert positions == [1, 2]
        gate.release.set()
        await idle(lanes)
    assert gate.batches == [("a", ["a1"]), ("a", ["a2"]), ("a", ["a3"])]


async def test_full_queue_rejects_and_leaves_the_rest_alone() -> None:
    gate = Gate(hold={"a1"})
    async with LaneManager(LanesConfig(queue_cap=2), gate) as lanes:
        await lanes.submit("a", "a1")
        await gate.wait_started("a1")
        assert (await lanes.submit("a", "a2")).accepted
        assert (await lanes.submit("a", "a3")).accepted
        full = await lanes.submit("a", "a4")
        assert full.status is SubmitStatus.QUEUE_FULL
        assert not full.accepted
        assert full.position == 0
        assert lanes.pending("a") == 2
        assert lanes.busy("a")

        # Another session is not held up by the full one.
        assert (await lanes.submit("b", "b1")).accepted
        await gate.wait_started("b1")

        gate.release.set()
        await idle(lanes)
        assert (await lanes.submit("a", "a5")).accepted
        await idle(lanes)
    assert gate.items("a") == ["a1", "a2", "a3", "a5"]
    assert gate.items("b") == ["b1"]


async def test_forced_submits_pass_the_cap_in_order() -> None:
    # What the gateway does with messages recovered after a crash: they were accepted
    # once, and a full queue must not turn them away the second time.
    gate = Gate(hold={"r1"})
    async with LaneManager(LanesConfig(queue_cap=1), gate) as lanes:
        for item in ("r1", "r2", "r3", "r4"):
            assert (await lanes.submit("a", item, force=True)).accepted
        assert (await lanes.submit("a", "new")).status is SubmitStatus.QUEUE_FULL
        gate.release.set()
        await idle(lanes)
    assert gate.items("a") == ["r1", "r2", "r3", "r4"]


async def test_runner_failure_is_logged_and_the_lane_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: dict[str, list[int]] = defaultdict(list)

    async def runner(key: str, batch: list[int]) -> None:
        await asyncio.sleep(0)
        seen[key].extend(batch)
        if batch[0] % 3 == 0:
            raise RuntimeError(f"boom on {batch[0]}")

    with caplog.at_level(logging.ERROR, logger="parley.gateway.lanes"):
        async with LaneManager(LanesConfig(mode="queue"), runner) as lanes:
            for n in range(10):
                await lanes.submit("flaky", n)
                await lanes.submit("steady", 100 + n)
            await idle(lanes)
    assert seen["flaky"] == list(range(10))
    assert seen["steady"] == [100 + n for n in range(10)]
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 4 + 3  # 0, 3, 6, 9 and 102, 105, 108
    assert all(r.exc_info for r in failures)
    assert sum("'flaky'" in r.getMessage() for r in failures) == 4


async def test_stop_without_drain_reports_unstarted_and_interrupted() -> None:
    gate = Gate(hold={"a1"})
    lanes: LaneManager[object] = LaneManager(LanesConfig(max_concurrent_runs=1), gate)
    await lanes.start()
    await lanes.submit("a", "a1")
    await gate.wait_started("a1")
    await lanes.submit("a", "a2")
    await lanes.submit("a", "a3")
    await lanes.submit("b", "b1")  # waits for the only slot

    report = await lanes.stop(drain=False)

    assert report.unstarted == {"a": ["a2", "a3"], "b": ["b1"]}
    assert report.interrupted == {"a": ["a1"]}
    assert report.unfinished == 4
    assert gate.cancelled == ["a1"]
    assert [item for _, batch in gate.batches for item in batch] == ["a1"]
    assert lanes.stats().lanes == 0
    assert (await lanes.submit("a", "late")).status is SubmitStatus.CLOSED


async def test_stop_with_drain_finishes_queued_items() -> None:
    gate = Gate()
    lanes: LaneManager[object] = LaneManager(LanesConfig(max_concurrent_runs=1), gate)
    await lanes.start()
    for item in ("a1", "a2", "b1", "a3"):
        await lanes.submit(item[0], item)
    report = await lanes.stop(drain=True)
    assert report.drained
    assert report.unstarted == {} and report.interrupted == {}
    assert gate.items("a") == ["a1", "a2", "a3"]
    assert gate.items("b") == ["b1"]


async def test_stop_drain_that_times_out_cancels_and_reports() -> None:
    gate = Gate(hold={"a1"})  # never released
    lanes: LaneManager[object] = LaneManager(LanesConfig(mode="queue"), gate)
    await lanes.start()
    await lanes.submit("a", "a1")
    await lanes.submit("a", "a2")
    await lanes.submit("b", "b1")
    await gate.wait_started("a1")
    # b1 is not held, so it finishes while the drain waits on a1.
    report = await lanes.stop(drain=True, timeout=0.05)
    assert not report.drained
    assert report.interrupted == {"a": ["a1"]}
    assert report.unstarted == {"a": ["a2"]}
    assert gate.items("b") == ["b1"]


async def test_runner_that_swallows_cancellation_runs_nothing_more() -> None:
    ran: list[str] = []
    release = asyncio.Event()

    async def stubborn(key: str, batch: list[str]) -> None:
        ran.extend(batch)
        # Deliberately rude: the manager must still stop the lane.
        with contextlib.suppress(asyncio.CancelledError):
            await release.wait()

    lanes: LaneManager[str] = LaneManager(LanesConfig(mode="queue"), stubborn)
    await lanes.start()
    await lanes.submit("a", "a1")
    await lanes.submit("a", "a2")
    await wait_until(lambda: ran == ["a1"])
    report = await lanes.stop(drain=False)
    assert report.unstarted == {"a": ["a2"]}
    assert report.interrupted == {}  # the runner returned normally
    assert ran == ["a1"]


async def test_lifecycle_closed_before_start_after_stop_and_restartable() -> None:
    gate = Gate()
    lanes: LaneManager[object] = LaneManager(LanesConfig(mode="queue"), gate)
    assert (await lanes.submit("a", "early")).status is SubmitStatus.CLOSED
    async with lanes:
        with pytest.raises(RuntimeError):
            await lanes.start()
        await lanes.submit("a", "one")
        await idle(lanes)
    assert (await lanes.submit("a", "after")).status is SubmitStatus.CLOSED
    assert (await lanes.stop()).unfinished == 0  # a second stop is harmless
    async with lanes:
        await lanes.submit("a", "two")
        await idle(lanes)
    assert gate.items("a") == ["one", "two"]


async def test_leaving_the_context_on_error_cancels_instead_of_draining() -> None:
    gate = Gate(hold={"a1"})  # never released: a drain would hang until its timeout
    lanes: LaneManager[object] = LaneManager(LanesConfig(mode="queue"), gate)
    with pytest.raises(ZeroDivisionError):
        async with asyncio.timeout(WAIT), lanes:
            await lanes.submit("a", "a1")
            await gate.wait_started("a1")
            _ = 1 / 0
    assert gate.cancelled == ["a1"]


async def test_pending_busy_and_stats() -> None:
    gate = Gate(hold={"a1", "b1"})
    async with LaneManager(LanesConfig(max_concurrent_runs=2), gate) as lanes:
        assert not lanes.busy("a") and lanes.pending("a") == 0
        await lanes.submit("a", "a1")
        await lanes.submit("b", "b1")
        await gate.wait_started("a1")
        await gate.wait_started("b1")
        await lanes.submit("a", "a2")
        await lanes.submit("c", "c1")  # no slot left: waits
        stats = lanes.stats()
        assert (stats.active_runs, stats.queued, stats.lanes) == (2, 2, 3)
        assert stats.max_concurrent_runs == 2
        assert lanes.busy("a") and lanes.pending("a") == 1
        assert not lanes.busy("c") and lanes.pending("c") == 1

        waiter = asyncio.create_task(lanes.wait_idle())
        await asyncio.sleep(0)
        assert not waiter.done()
        gate.release.set()
        async with asyncio.timeout(WAIT):
            await waiter
        assert lanes.stats().active_runs == lanes.stats().queued == 0
        assert not lanes.busy("a")


async def test_idle_lanes_are_reaped_and_recreated_in_order() -> None:
    gate = Gate()
    async with LaneManager(LanesConfig(idle_lane_ttl_seconds=0), gate) as lanes:
        for n in range(30):
            await lanes.submit(f"s{n}", f"s{n}-1")
        await idle(lanes)
        await wait_until(lambda: lanes.stats().lanes == 0)
        assert lanes._lanes == {}

        for n in range(3):
            for m in range(2, 6):
                assert (await lanes.submit(f"s{n}", f"s{n}-{m}")).accepted
        await idle(lanes)
        await wait_until(lambda: lanes.stats().lanes == 0)
    for n in range(3):
        assert gate.items(f"s{n}") == [f"s{n}-{m}" for m in range(1, 6)]


async def test_lanes_within_their_ttl_are_kept() -> None:
    gate = Gate()
    async with LaneManager(LanesConfig(idle_lane_ttl_seconds=3600), gate) as lanes:
        for n in range(5):
            await lanes.submit(f"s{n}", n)
        await idle(lanes)
        for _ in range(20):
            await asyncio.sleep(0)
        assert lanes.stats().lanes == 5


@pytest.mark.parametrize("mode", ["queue", "collect"])
async def test_order_holds_when_lanes_are_reaped_between_submits(mode: str) -> None:
    # A zero TTL and uneven pauses between a session's submits make its lane go
    # idle, get reaped and come back many times while other sessions keep going.
    processed: dict[str, list[int]] = defaultdict(list)

    async def runner(key: str, batch: list[int]) -> None:
        await asyncio.sleep(0)
        processed[key].extend(batch)

    rng = random.Random(11)
    config = LanesConfig(
        mode=mode,  # type: ignore[arg-type]
        max_concurrent_runs=8,  # no session waits for a slot, so lanes do fall idle
        idle_lane_ttl_seconds=0,
    )

    async def feed(key: str) -> None:
        for n in range(40):
            assert (await lanes.submit(key, n)).accepted
            for _ in range(rng.randrange(10)):
                await asyncio.sleep(0)

    async with LaneManager(config, runner) as lanes:
        async with asyncio.TaskGroup() as group:
            for s in range(8):
                group.create_task(feed(f"s{s}"))
        await idle(lanes)
        reaped = lanes.stats().lanes_reaped
    assert reaped >= 8 * 5  # far more than one reap per session
    assert dict(processed) == {f"s{s}": list(range(40)) for s in range(8)}


async def test_cancelling_stop_mid_drain_still_stops_the_workers() -> None:
    gate = Gate(hold={"a1"})  # never released
    lanes: LaneManager[object] = LaneManager(LanesConfig(mode="queue"), gate)
    await lanes.start()
    await lanes.submit("a", "a1")
    await lanes.submit("a", "a2")
    await gate.wait_started("a1")
    stopping = asyncio.create_task(lanes.stop(drain=True, timeout=None))
    await asyncio.sleep(0)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await wait_until(lambda: gate.cancelled == ["a1"])
    assert (await lanes.submit("a", "late")).status is SubmitStatus.CLOSED
    assert [item for _, batch in gate.batches for item in batch] == ["a1"]


class Handoff:
    """A runner that works "on the model" for each item, then hands its slot back and
    "sends" until the test lets the send finish; a second group of a batch takes the
    slot again first."""

    def __init__(self) -> None:
        self.lanes: LaneManager[object] | None = None
        self.in_turn: set[object] = set()
        self.most_in_turn = 0
        self.sending: dict[object, asyncio.Event] = defaultdict(asyncio.Event)
        self.sent = asyncio.Event()
        self.turned: list[object] = []

    async def __call__(self, key: str, batch: list[object]) -> None:
        assert self.lanes is not None
        for item in batch:
            await self.lanes.hold_slot(key)
            self.turned.append(item)  # the turn starts
            self.in_turn.add(item)
            self.most_in_turn = max(self.most_in_turn, len(self.in_turn))
            await asyncio.sleep(0)
            self.in_turn.discard(item)
            self.lanes.release_slot(key)
            self.sending[item].set()
            await self.sent.wait()

    async def wait_sending(self, item: object) -> None:
        async with asyncio.timeout(WAIT):
            await self.sending[item].wait()


async def test_a_run_that_hands_back_its_slot_lets_other_sessions_run_and_keeps_its_own_order() -> (
    None
):
    runner = Handoff()
    async with LaneManager(LanesConfig(max_concurrent_runs=1, mode="queue"), runner) as lanes:
        runner.lanes = lanes
        await lanes.submit("a", "a1")
        await runner.wait_sending("a1")
        assert lanes.stats().active_runs == 0  # sending: no slot held
        await lanes.submit("a", "a2")
        await lanes.submit("b", "b1")
        await lanes.submit("c", "c1")

        # One slot, and "a1" still sending: b and c take their turns; a2 waits behind a1.
        await runner.wait_sending("b1")
        await runner.wait_sending("c1")
        assert lanes.busy("a") and lanes.pending("a") == 1
        assert "a2" not in runner.turned

        runner.sent.set()
        await idle(lanes)
    assert runner.turned.index("a1") < runner.turned.index("a2")
    assert sorted(runner.turned) == ["a1", "a2", "b1", "c1"]
    assert runner.most_in_turn == 1  # never two turns on one slot


async def test_taking_the_slot_back_waits_for_a_free_one() -> None:
    """A batch's second turn counts against the cap again: with the only slot taken by
    another session meanwhile, it waits until that session's run is done."""
    runner = Handoff()
    gate = Gate(hold={"b1"})

    async def route(key: str, batch: list[object]) -> None:
        if key == "b":
            await gate(key, batch)
            runner.turned.append("b1 done")
        else:
            await runner(key, batch)

    async with LaneManager(LanesConfig(max_concurrent_runs=1, mode="collect"), route) as lanes:
        runner.lanes = lanes
        # Queued before the lane's worker first runs: one batch of two.
        await lanes.submit("a", "a1")
        await lanes.submit("a", "a2")
        await runner.wait_sending("a1")
        await lanes.submit("b", "b1")  # takes the slot a1 handed back, and keeps it
        await gate.wait_started("b1")
        assert lanes.stats().active_runs == 1
        # a's send finishes first; were its next turn not to wait for the slot, a2
        # would run before b1 is done.
        runner.sent.set()
        gate.release.set()
        await idle(lanes)
    assert gate.batches == [("b", ["b1"])]
    assert runner.turned == ["a1", "b1 done", "a2"]


async def test_slot_calls_outside_a_run_change_nothing() -> None:
    gate = Gate()
    async with LaneManager(LanesConfig(max_concurrent_runs=1), gate) as lanes:
        lanes.release_slot("nobody")
        await lanes.hold_slot("nobody")
        await lanes.submit("a", "a1")
        await idle(lanes)
        lanes.release_slot("a")  # its lane is idle: no slot to give
        await lanes.hold_slot("a")
        assert lanes.stats().active_runs == 0
        await lanes.submit("b", "b1")
        await idle(lanes)
    assert gate.items("b") == ["b1"]


class Prefetches:
    """A prefetch that records the keys it is given and can be made to fail or wait."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.keys: list[str] = []
        self.fail = fail or set()
        self.release = asyncio.Event()
        self.release.set()
        self.finished: list[str] = []

    async def __call__(self, key: str) -> None:
        self.keys.append(key)
        if key in self.fail:
            raise OSError(f"cannot read {key}")
        await self.release.wait()
        self.finished.append(key)


async def test_the_lanes_next_in_line_for_a_slot_are_prefetched_in_order() -> None:
    gate = Gate(hold={"a1", "b1"})
    prefetch = Prefetches()
    config = LanesConfig(max_concurrent_runs=2, mode="queue")
    async with LaneManager(config, gate, prefetch=prefetch) as lanes:
        await lanes.submit("a", "a1")
        await lanes.submit("b", "b1")
        await gate.wait_started("a1")
        await gate.wait_started("b1")
        assert prefetch.keys == []  # slots were free: nothing to read ahead of

        for key in "cdef":
            await lanes.submit(key, f"{key}1")
        await wait_until(lambda: len(prefetch.keys) == 2)
        assert prefetch.keys == ["c", "d"]  # only the two that the next slots go to

        gate.release.set()
        await idle(lanes)
    # As c and d took their slots, e and f moved up and were read ahead of in turn.
    assert prefetch.keys == ["c", "d", "e", "f"]
    assert [key for key, _ in gate.batches] == ["a", "b", "c", "d", "e", "f"]


async def test_a_failed_prefetch_changes_nothing_for_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Gate(hold={"a1"})
    prefetch = Prefetches(fail={"b"})
    config = LanesConfig(max_concurrent_runs=1, mode="queue")
    caplog.set_level(logging.DEBUG, logger="parley.gateway.lanes")
    async with LaneManager(config, gate, prefetch=prefetch) as lanes:
        await lanes.submit("a", "a1")
        await gate.wait_started("a1")
        await lanes.submit("b", "b1")
        await wait_until(lambda: prefetch.keys == ["b"])
        gate.release.set()
        await idle(lanes)
    assert gate.items("b") == ["b1"]
    assert "prefetch 'b' failed: OSError: cannot read b" in caplog.text


async def test_stop_lets_the_prefetches_under_way_finish() -> None:
    gate = Gate(hold={"a1"})
    prefetch = Prefetches()
    prefetch.release.clear()
    lanes = LaneManager(LanesConfig(max_concurrent_runs=1), gate, prefetch=prefetch)
    await lanes.start()
    await lanes.submit("a", "a1")
    await gate.wait_started("a1")
    await lanes.submit("b", "b1")
    await wait_until(lambda: prefetch.keys == ["b"])

    stopping = asyncio.create_task(lanes.stop(drain=False))
    await wait_until(lambda: gate.cancelled == ["a1"])
    assert not stopping.done()  # b's prefetch is still reading
    prefetch.release.set()
    async with asyncio.timeout(WAIT):
        report = await stopping
    assert prefetch.finished == ["b"]
    assert report.unstarted == {"b": ["b1"]} and report.interrupted == {"a": ["a1"]}


async def test_cancelling_stop_mid_drain_with_lanes_waiting_for_a_slot_ends_them_cleanly() -> None:
    gate = Gate(hold={"a1"})  # never released
    lanes: LaneManager[object] = LaneManager(
        LanesConfig(max_concurrent_runs=1), gate, prefetch=Prefetches()
    )
    await lanes.start()
    await lanes.submit("a", "a1")
    await gate.wait_started("a1")
    await lanes.submit("b", "b1")  # waits for the slot, in the prefetch's line
    waiting = lanes._lanes["b"].task
    assert waiting is not None
    await asyncio.sleep(0)
    stopping = asyncio.create_task(lanes.stop(drain=True, timeout=None))
    await asyncio.sleep(0)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    async with asyncio.timeout(WAIT):
        await asyncio.wait([waiting])
    # Cancelled, as stop() meant: not ended by an error of the lanes' own bookkeeping.
    assert waiting.cancelled()
