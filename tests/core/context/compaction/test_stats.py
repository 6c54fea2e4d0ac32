"""Compaction figures derived from a transcript."""

from __future__ import annotations

from pathlib import Path

from parley.core.context.compaction.stats import CompactionStats, compaction_stats, utilisation
from parley.core.messages import Message
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
