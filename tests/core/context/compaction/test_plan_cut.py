"""Where a compaction cuts the live window, at small windows too."""

from __future__ import annotations

from pathlib import Path

from parley.core.context.compaction.compactor import plan_cut
from parley.core.messages import Message, ToolResultBlock, ToolUseBlock
from parley.core.transcript import Entry, Transcript
from tests.core.context.compaction.compaction_fakes import new_transcript


def _words(entry: Entry) -> int:
    return sum(len(str(b).split()) for b in entry.message.content)


def _turns(transcript: Transcript, turns: int) -> None:
    for n in range(turns):
        transcript.append_message(Message.user(f"question {n} " + "word " * 20))
        transcript.append_message(Message.assistant(f"answer {n} " + "word " * 20))


def test_the_newest_turn_too_big_to_keep_still_lets_the_older_turns_fold(
    tmp_path: Path,
) -> None:
    """A tool result most of a small window: before, nothing was compactable and the
    view was trimmed, older turns dropped without a summary."""
    with new_transcript(tmp_path) as transcript:
        _turns(transcript, 4)
        transcript.append_message(Message.user("fetch the dataset"))
        transcript.append_message(
            Message("assistant", (ToolUseBlock("t1", "fetch_data", {"dataset": 1}),))
        )
        transcript.append_message(Message("tool_result", (ToolResultBlock("t1", "row " * 2_000),)))
        entries = transcript.live_entries()
        plan = plan_cut(
            entries, count=_words, keep_recent_tokens=10, keep_recent_turns=1, max_keep_tokens=200
        )
        assert plan is not None
        # Every older turn is folded; the newest turn is kept whole, call with result.
        assert [e.message.role for e in plan.kept] == ["user", "assistant", "tool_result"]
        assert len(plan.summarize) == 8


def test_a_single_turn_too_big_to_keep_has_nothing_to_fold(tmp_path: Path) -> None:
    with new_transcript(tmp_path) as transcript:
        transcript.append_message(Message.user("fetch the dataset"))
        transcript.append_message(
            Message("assistant", (ToolUseBlock("t1", "fetch_data", {"dataset": 1}),))
        )
        transcript.append_message(Message("tool_result", (ToolResultBlock("t1", "row " * 2_000),)))
        plan = plan_cut(
            transcript.live_entries(),
            count=_words,
            keep_recent_tokens=10,
            keep_recent_turns=1,
            max_keep_tokens=200,
        )
        assert plan is None
