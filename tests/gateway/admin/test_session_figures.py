"""The figures cache: brought up to date from the entries appended since, never by
reading the whole transcript again, and right across reopens and stale copies."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.core.context.compaction.stats import compaction_stats
from parley.core.messages import Message
from parley.core.transcript import Entry, Transcript
from parley.core.transcript import base as transcript_base
from parley.core.transcript.entries import iso_timestamp
from parley.gateway.admin.session_figures import SessionFiguresCache


class Reads:
    """A transcript that records where each storage read began."""

    def __init__(self, transcript: Transcript) -> None:
        self.transcript = transcript
        self.offsets: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transcript, name)

    def numbered_entries(
        self, offset: int = 0, limit: int | None = None
    ) -> Iterator[tuple[int, Entry]]:
        self.offsets.append(offset)
        return self.transcript.numbered_entries(offset, limit)

    def entries(self, offset: int = 0, limit: int | None = None) -> Iterator[Entry]:
        self.offsets.append(offset)
        return self.transcript.entries(offset, limit)


def _chat(t: Transcript, turns: int) -> None:
    for i in range(turns):
        t.append_message(Message.user(f"question {i}"))
        t.append_message(Message.assistant(f"answer {i}"))


def _compact(t: Transcript, trigger: str = "history", strategy: str = "summary") -> Entry:
    return t.append_compaction(
        "folded",
        first_kept_entry_id=t.live_entries()[-1].id,
        tokens_before=5_000,
        tokens_after=1_000,
        trigger=trigger,
        details={"strategy": strategy},
    )


async def test_a_turn_folds_in_only_its_own_entries(tmp_path: Path) -> None:
    cache = SessionFiguresCache()
    with Transcript.create(tmp_path / "s.jsonl", "s", "k") as t:
        _chat(t, 300)
        _compact(t, trigger="threshold")
        reads = Reads(t)
        first = await cache.stats("s", reads)
        assert first.count == 1 and reads.offsets == [0]
        for turn in range(5):
            _chat(t, 1)
            last = _compact(t)
            stats = await cache.stats("s", reads)
            # The turn's entries and its compaction, folded in from memory: not read.
            assert reads.offsets == [0]
            assert stats.count == 2 + turn and stats.last_at == last.ts
        assert await cache.stats("s", reads) is stats
        assert stats == compaction_stats(t.entries())
        assert dict(stats.by_trigger) == {"threshold": 1, "history": 5}


async def test_what_this_object_did_not_append_lately_is_read(tmp_path: Path) -> None:
    cache = SessionFiguresCache()
    with Transcript.create(tmp_path / "s.jsonl", "s", "k") as t:
        _chat(t, 3)
        reads = Reads(t)
        await cache.stats("s", reads)
        covered = t.entry_count
        _chat(t, 40)  # more than the appends it keeps (APPENDS_KEPT)
        _compact(t)
        stats = await cache.stats("s", reads)
        assert reads.offsets == [0, covered]
        assert stats == compaction_stats(t.entries())


async def test_a_reopened_transcript_folds_from_the_cached_count(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    cache = SessionFiguresCache()
    with Transcript.create(path, "s", "k") as t:
        _chat(t, 50)
        _compact(t)
        await cache.stats("s", t)
        covered = t.entry_count
    with Transcript.open(path) as again:  # a restart, or the lane's cache let it go
        _chat(again, 2)
        _compact(again, strategy="selective")
        reads = Reads(again)
        stats = await cache.stats("s", reads)
        assert reads.offsets == [covered]
        assert stats == compaction_stats(again.entries())
        assert dict(stats.by_strategy) == {"summary": 1, "selective": 1}


async def test_a_stale_copy_and_a_new_transcript_are_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    cache = SessionFiguresCache()
    with Transcript.create(path, "s", "k") as t:
        _chat(t, 5)
        _compact(t)
        with Transcript.open(path, read_only=True) as stale:
            _compact(t)  # the owner writes on after the copy was opened
            newest = await cache.stats("s", t)
            assert newest.count == 2
            reads = Reads(stale)
            old = await cache.stats("s", reads)
            assert old.count == 1 and reads.offsets == [0]
            assert cache.peek("s") == newest  # the figures that cover more stay cached
    path.unlink()  # the session's transcript made anew (another header)
    # Made later, as a new transcript always is: on a fast machine the whole test can
    # run inside one millisecond of the header's clock, and the headers would be equal.
    later = datetime.now(UTC) + timedelta(seconds=1)
    monkeypatch.setattr(transcript_base, "_now_iso", lambda: iso_timestamp(later))
    with Transcript.create(path, "s", "k") as fresh:
        assert fresh.header.created != t.header.created
        _chat(fresh, 40)
        reads = Reads(fresh)
        stats = await cache.stats("s", reads)
        assert stats.count == 0 and reads.offsets == [0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.sampled_from(["chat", "compact", "reopen", "read"]), max_size=25))
def test_the_cached_figures_always_equal_a_full_read(
    tmp_path_factory: Any, steps: list[str]
) -> None:
    async def run() -> None:
        path = tmp_path_factory.mktemp("figures") / "s.jsonl"
        cache = SessionFiguresCache()
        t = Transcript.create(path, "s", "k")
        try:
            for step in steps:
                if step == "chat":
                    _chat(t, 1)
                elif step == "compact" and t.live_entries():
                    _compact(t, trigger=f"t{t.entry_count % 3}")
                elif step == "reopen":
                    t.close()
                    t = Transcript.open(path)
                assert await cache.stats("s", t) == compaction_stats(t.entries())
        finally:
            t.close()

    asyncio.run(run())
