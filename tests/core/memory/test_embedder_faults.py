"""The embedder down (raising) or slow (hanging past its timeout), seen through
``MemoryIndex.search`` and ``sync``: search answers by keyword and says why (the
result's ``fallback``, the index status), indexing keeps new files keyword-only with
their vectors pending, and both recover when the embedder answers again, including
after a lockout. ``test_embedders.py`` covers the wrapper's own retries and timeouts;
these go through the index. Timeouts are configured in hundredths of a second and the
hung calls are held on an event that is never set: nothing sleeps hoping for timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from parley.core.errors import EmbedderError
from parley.core.memory.embedders import (
    DEFAULT_QUERY_BUDGET_SECONDS,
    CallTimeouts,
    ResilientEmbedder,
    RetryPolicy,
)
from parley.core.memory.index import MemoryIndex
from tests.core.memory.helpers import Layout, make_layout, open_index, quiet_settings
from tests.fakes.embedder import HashingEmbedder

SCOPES = ["agent", "person:alice"]
MEMORY_MD = "# Memory\n\nThe user's favourite tea is oolong, brewed at 90 degrees.\n"
NEW_NOTE = "The narwhal figurine sits on the third shelf of the study.\n"
TINY = CallTimeouts(query_seconds=0.02, batch_seconds=0.02)


class Flaky(HashingEmbedder):
    """A ``HashingEmbedder`` that can be ``up``, ``down`` (raises) or ``slow`` (never
    answers until cancelled); counts its calls and the hung calls cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "up"
        self.calls = 0
        self.cancelled = 0
        self._never = asyncio.Event()

    async def _gate(self) -> None:
        self.calls += 1
        if self.mode == "down":
            raise EmbedderError("connection refused", provider=self.provider, retryable=True)
        if self.mode == "slow":
            try:
                await self._never.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        await self._gate()
        return await super().embed_queries(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        await self._gate()
        return await super().embed_passages(texts)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


def wrap(
    flaky: Flaky, *, retries: int = 0, failure_limit: int = 100, clock: Clock | None = None
) -> ResilientEmbedder:
    return ResilientEmbedder(
        flaky,
        retry=RetryPolicy(retries=retries),
        failure_limit=failure_limit,
        lockout_seconds=60.0,
        timeouts=TINY,
        sleep=no_wait,
        clock=clock or Clock(),
    )


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = make_layout(tmp_path)
    layout.write("MEMORY.md", MEMORY_MD)
    return layout


async def healthy_search(index: MemoryIndex, query: str) -> None:
    result = await index.search(query, scopes=SCOPES)
    assert result.mode == "hybrid" and result.fallback is None
    assert result.hits


@pytest.mark.parametrize("mode", ["down", "slow"])
async def test_search_falls_back_to_keywords_says_why_and_recovers(
    layout: Layout, mode: str
) -> None:
    flaky = Flaky()
    async with open_index(layout, quiet_settings(), wrap(flaky, retries=1)) as index:
        await index.sync()
        await healthy_search(index, "oolong tea")

        flaky.mode = mode
        calls = flaky.calls
        result = await index.search("oolong tea", scopes=SCOPES)
        status = (await index.status()).to_dict()

        assert result.mode == "keyword"
        assert result.hits and result.hits[0].path == "MEMORY.md"
        assert result.fallback is not None
        assert result.fallback.startswith("embedder failed, keyword-only")
        why = "connection refused" if mode == "down" else "gave no answer within 0.02 s"
        assert why in result.fallback
        assert flaky.calls - calls == 2  # bounded: one attempt and one retry
        assert flaky.cancelled == (2 if mode == "slow" else 0)  # hung calls do not linger
        assert status["embedder"]["failures"] == 1 and why in status["embedder"]["last_error"]
        assert status["fallback"] is not None and why in status["fallback"]

        flaky.mode = "up"
        await healthy_search(index, "oolong tea")
        status = (await index.status()).to_dict()
        assert status["embedder"]["failures"] == 0 and status["fallback"] is None


@pytest.mark.parametrize("mode", ["down", "slow"])
async def test_indexing_while_the_embedder_fails_keeps_files_searchable_by_keyword(
    layout: Layout, mode: str
) -> None:
    flaky = Flaky()
    async with open_index(layout, quiet_settings(), wrap(flaky)) as index:
        await index.sync()
        layout.write("memory/study.md", NEW_NOTE)
        flaky.mode = mode
        report = await index.sync()
        status = (await index.status()).to_dict()
        result = await index.search("narwhal figurine", scopes=SCOPES)

        assert report.files_indexed == 1 and report.vectors_pending == 1
        assert any("embedding failed, keyword-only for now" in e for e in report.errors)
        assert status["files_awaiting_vectors"] == 1
        assert result.mode == "keyword" and result.fallback is not None
        assert result.hits and result.hits[0].path == "memory/study.md"
        assert await index.integrity_check() == []

        flaky.mode = "up"
        healed = await index.sync()
        status = (await index.status()).to_dict()
        assert healed.errors == [] and healed.embedded >= 1
        assert status["files_awaiting_vectors"] == 0
        assert status["vectors"] == status["chunks"]
        result = await index.search("narwhal figurine", scopes=SCOPES)
        assert result.mode == "hybrid" and result.fallback is None
        assert result.hits[0].path == "memory/study.md"
        assert await index.integrity_check() == []


async def test_a_locked_out_embedder_is_left_alone_until_the_lockout_ends(
    layout: Layout,
) -> None:
    flaky = Flaky()
    clock = Clock()
    embedder = wrap(flaky, failure_limit=2, clock=clock)
    async with open_index(layout, quiet_settings(), embedder) as index:
        await index.sync()
        flaky.mode = "down"
        for _ in range(2):
            result = await index.search("oolong", scopes=SCOPES)
            assert result.mode == "keyword" and result.hits
        calls = flaky.calls

        flaky.mode = "up"  # back, but the lockout still holds: searches do not wait on it
        result = await index.search("oolong", scopes=SCOPES)
        assert flaky.calls == calls
        assert result.mode == "keyword" and result.hits
        assert result.fallback is not None and "locked out for another 60 s" in result.fallback
        status = (await index.status()).to_dict()
        assert status["embedder"]["lockout_remaining_seconds"] == 60.0

        clock.now += 61
        await healthy_search(index, "oolong")
        assert flaky.calls == calls + 1
        assert (await index.status()).to_dict()["embedder"]["failures"] == 0


async def test_a_hung_remote_embedder_holds_a_search_for_its_budget_not_its_retries(
    layout: Layout,
) -> None:
    """Per attempt a remote query may take 60 s and is retried three times; the whole
    call still ends at the query budget, so the search answers by keyword then."""
    flaky = Flaky()
    embedder = ResilientEmbedder(
        flaky,
        retry=RetryPolicy(retries=3),
        failure_limit=100,
        timeouts=CallTimeouts(query_seconds=60.0, batch_seconds=60.0),
        query_budget_seconds=0.05,
        sleep=no_wait,
    )
    async with open_index(layout, quiet_settings(), embedder) as index:
        await index.sync()
        flaky.mode = "slow"
        result = await index.search("oolong tea", scopes=SCOPES)

        assert result.mode == "keyword" and result.hits[0].path == "MEMORY.md"
        assert result.fallback is not None
        assert "gave no answer within the 0.05 s a search waits" in result.fallback
        assert flaky.cancelled == 1  # the one hung attempt, cancelled at the budget

        flaky.mode = "up"
        await healthy_search(index, "oolong tea")


def test_only_remote_embedders_get_a_query_budget() -> None:
    remote = ResilientEmbedder(HashingEmbedder())
    local = ResilientEmbedder(HashingEmbedder(provider="e5"))
    assert remote.query_budget(remote.primary) == DEFAULT_QUERY_BUDGET_SECONDS
    assert local.query_budget(local.primary) is None
