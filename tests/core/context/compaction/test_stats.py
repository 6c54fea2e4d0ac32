"""Compaction figures derived from a transcript."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from parley.core.context.compaction.stats import (
    CompactionStats,
    compaction_stats,
    fold_stats,
    merge_stats,
    utilisation,
)
from parley.core.messages import Message
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_CUSTOM, ENTRY_MESSAGE, Entry
from tests.core.context.compaction.compaction_fakes import new_transcript


def test_stats_count_by_strategy_and_trigger_and_sum_the_savings(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    assert compaction_stats(transcript.entries()) == CompactionStats()
    transcript.append_message(Message.user("hi"))
    # An entry from before strategies existed counts as "summary".
    transcript.append_compaction(
        "s1", first_kept_entry_id=None, tokens_before=9_000, tokens_after=2_000, trigger="threshold"
    )
    transcript.append_message(Message.user("more"))
    transcript.append_compaction(
        "s2",
        first_kept_entry_id=None,
        tokens_before=8_000,
        tokens_after=1_500,
        trigger="messages",
        details={"strategy": "sliding-window", "fallbacks": ["summarizer: down"]},
    )
    transcript.append_message(Message.user("again"))
    last = transcript.append_compaction(
        "s3",
        first_kept_entry_id=None,
        tokens_before=3_000,
        tokens_after=3_500,  # an overflow compaction may grow: it saves nothing
        trigger="overflow",
        details={"strategy": "selective"},
    )
    stats = compaction_stats(transcript.entries())
    assert stats.count == 3
    assert dict(stats.by_strategy) == {"summary": 1, "sliding-window": 1, "selective": 1}
    assert dict(stats.by_trigger) == {"threshold": 1, "messages": 1, "overflow": 1}
    assert stats.with_fallbacks == 1
    assert (stats.last_tokens_before, stats.last_tokens_after) == (3_000, 3_500)
    assert stats.tokens_saved == 7_000 + 6_500
    assert stats.last_at == last.ts


def test_utilisation() -> None:
    assert utilisation(50_000, 200_000) == 0.25
    assert utilisation(300, 0) == 0.0
    assert utilisation(250, 200) == 1.25  # an overflow shows as such


# -- folding: the figures of a prefix, brought up to date, equal the whole's ----------------


def _payload(kind: str, draw: Any) -> dict[str, Any]:
    if kind == ENTRY_MESSAGE:
        return {"message": Message.user("hi").to_dict()}
    if kind == ENTRY_CUSTOM:
        return {"custom_type": "delivery", "data": {}}
    details: dict[str, Any] = {}
    strategy = draw(st.sampled_from([None, "", "summary", "selective", "sliding-window"]))
    if strategy is not None:
        details["strategy"] = strategy
    if draw(st.booleans()):
        details["fallbacks"] = draw(st.lists(st.just("summarizer: down"), max_size=2))
    return {
        "summary": "s",
        "first_kept_entry_id": None,
        "tokens_before": draw(st.one_of(st.none(), st.integers(0, 50_000))),
        "tokens_after": draw(st.one_of(st.none(), st.integers(0, 50_000))),
        "trigger": draw(st.sampled_from([None, "threshold", "history", "manual"])),
        "details": draw(st.sampled_from([details, None])),
    }


@st.composite
def _entries(draw: Any) -> list[Entry]:
    kinds = draw(st.lists(st.sampled_from([ENTRY_MESSAGE, ENTRY_COMPACTION, ENTRY_CUSTOM])))
    return [
        Entry(
            f"{i:016x}", None, f"2026-01-01T00:00:{i % 60:02d}.{i:06d}Z", kind, _payload(kind, draw)
        )
        for i, kind in enumerate(kinds)
    ]


@given(entries=_entries(), cuts=st.lists(st.integers(0, 60), max_size=4))
def test_folding_in_any_number_of_steps_equals_the_whole(
    entries: list[Entry], cuts: list[int]
) -> None:
    whole = compaction_stats(entries)
    stats = CompactionStats()
    start = 0
    for cut in sorted({min(c, len(entries)) for c in cuts} | {len(entries)}):
        stats = fold_stats(stats, entries[start:cut])
        start = cut
    assert stats == whole
    assert dict(stats.by_strategy) == dict(whole.by_strategy)
    assert sum(stats.by_trigger.values()) == stats.count


@given(a=_entries(), b=_entries())
def test_merge_is_the_figures_of_the_concatenation(a: list[Entry], b: list[Entry]) -> None:
    assert merge_stats(compaction_stats(a), compaction_stats(b)) == compaction_stats(a + b)
    assert merge_stats(CompactionStats(), compaction_stats(b)) == compaction_stats(b)
