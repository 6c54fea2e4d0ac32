"""tune_collector: start-up objects frozen, the young generation's threshold raised."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from parley.gateway.process_gc import YOUNG_THRESHOLD, tune_collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tuning_freezes_what_lives_and_raises_the_threshold(restored_collector: None) -> None:
    alive = [[i] for i in range(1000)]  # containers alive at "start-up"
    frozen = tune_collector()
    assert frozen == gc.get_freeze_count() >= len(alive)
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD


def test_the_collector_still_runs_on_its_own(restored_collector: None) -> None:
    """Raised, not off: past the threshold of new containers a collection runs, and a
    cycle made after start-up goes."""
    tune_collector()
    runs: list[str] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            runs.append(phase)

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.callbacks.append(count)
    try:
        churn = [[i] for i in range(YOUNG_THRESHOLD * 2)]
    finally:
        gc.callbacks.remove(count)
    del churn
    assert runs  # no explicit gc.collect() in this test
    assert gone() is None
