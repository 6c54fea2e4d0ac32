"""Each compaction strategy against a planted conversation, and the failure chain."""

from __future__ import annotations

import asyncio
from pathlib import Path

from parley.core.context.compaction.compactor import (
    TRIGGER_MANUAL,
    TRIGGER_THRESHOLD,
    CompactionOutcome,
)
from parley.core.context.compaction.ledger import Ledger
from parley.core.context.compaction.strategies.base import FoldRequest
from parley.core.context.compaction.strategies.hierarchical import (
    ACTIVE_HEADING,
    EARLIER_HEADING,
    RECENT_HEADING,
    active_task,
    split_tasks,
)
from parley.core.context.compaction.strategies.selective import SELECTIVE_HEADER, SelectiveStrategy
from parley.core.context.compaction.strategies.sliding_window import SLIDING_WINDOW_NOTE
from parley.core.context.history import COMPACTION_SUMMARY_PREFIX, build_history
from parley.core.errors import InvalidRequestError, ServerError
from parley.core.messages import Message, ToolResultBlock, ToolUseBlock
from parley.core.providers.base import ProviderRequest, ProviderResponse
from parley.core.tokens import default_counter
from parley.core.transcript import Transcript
from tests.core.context.compaction.compaction_fakes import (
    CHATTER,
    DECISION,
    HOST,
    KEY_PATH,
    ORDER,
    TODO,
    TOOL_ERROR,
    SummaryProvider,
    make_compactor,
    new_transcript,
    planted,
    reply,
    summary_reply,
)

THRESHOLD = 4_000  # keeps at most 1,400 tokens; selective target 1,000 tokens
# Hierarchical tests keep only the newest turn, so every planted task is folded.
NEWEST_TURN_ONLY = {"keep_recent_turns": 1, "keep_recent_tokens": 0}


async def compact(
    compactor: object, transcript: Transcript, trigger: str = TRIGGER_THRESHOLD
) -> CompactionOutcome:
    return await compactor.compact(  # type: ignore[attr-defined]
        transcript,
        trigger=trigger,
        window=20_000,
        threshold=THRESHOLD,
        base_tokens=0,
        tokens_before=100_000,
    )


def details(outcome: CompactionOutcome) -> dict[str, object]:
    assert outcome.compacted, outcome.describe()
    assert outcome.entry is not None
    return outcome.entry.payload["details"]


def failing(_: ProviderRequest) -> ProviderResponse:
    raise InvalidRequestError("model gone", provider="scripted", status=400)


# -- summary (the default) ------------------------------------------------------------


async def test_summary_is_the_default_and_records_its_strategy(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript)
    provider = SummaryProvider(summary_reply("## Decisions\n- keep going"))
    outcome = await compact(make_compactor(provider), transcript)
    got = details(outcome)
    assert outcome.strategy == "summary"
    assert got["strategy"] == "summary" and got["produced_by"] == "summarizer"
    assert "fallbacks" not in got and "requested_strategy" not in got
    assert outcome.describe().startswith("Compacted (100,000 → ")


# -- selective -------------------------------------------------------------------------


async def test_selective_keeps_what_matters_verbatim_without_a_model(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript)
    provider = SummaryProvider(failing)
    outcome = await compact(make_compactor(provider, strategy="selective"), transcript)
    got = details(outcome)
    text = str(got["summary_only"])

    assert provider.requests == []  # no model call at all
    assert got["strategy"] == "selective" and outcome.strategy == "selective"
    assert text.startswith(SELECTIVE_HEADER)
    for kept in (ORDER, TOOL_ERROR, DECISION, TODO):
        assert kept in text
    # The chatter and most of the filler were dropped to meet the budget.
    assert f"[User]: {CHATTER}" not in text
    assert int(got["dropped"]) > 0
    assert default_counter().text(text) <= int(got["budget_tokens"]) + 50
    # Survivors stay in their original order, one line each.
    assert text.index(ORDER) < text.index(DECISION) < text.index(TODO)
    # The ledger still rides after the text the model sees.
    assert KEY_PATH in outcome.entry.payload["summary"]  # type: ignore[union-attr]


async def test_selective_keeps_a_failed_call_with_its_error(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript)
    outcome = await compact(
        make_compactor(SummaryProvider(failing), strategy="selective"), transcript
    )
    line = next(x for x in str(details(outcome)["summary_only"]).splitlines() if TOOL_ERROR in x)
    assert "shell(" in line and "[Tool result (error)]" in line


async def test_selective_keeps_what_the_compact_focus_names(tmp_path: Path) -> None:
    """An ordinary answer (scored like the filler, and older) is dropped first unless
    ``/compact <focus>`` names it."""
    gazebo = "The gazebo gets two coats of sage green paint, the shed stays as it is."

    async def fold(focus: str) -> str:
        folder = tmp_path / ("focus" if focus else "none")
        folder.mkdir()
        transcript = new_transcript(folder)
        transcript.append_message(Message.user("And the garden?"))
        transcript.append_message(Message.assistant(gazebo))
        planted(transcript)
        compactor = make_compactor(SummaryProvider(failing), strategy="selective")
        outcome = await compactor.compact(
            transcript,
            trigger=TRIGGER_MANUAL,
            window=20_000,
            threshold=THRESHOLD,
            base_tokens=0,
            tokens_before=100_000,
            focus=focus,
        )
        return str(details(outcome)["summary_only"])

    assert gazebo not in await fold("")
    kept = await fold("what about the Gazebo?")
    assert gazebo in kept and DECISION in kept  # the focus adds, the rules still hold


async def test_selective_carries_the_previous_selection_forward(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript)
    compactor = make_compactor(SummaryProvider(failing), strategy="selective")
    await compact(compactor, transcript)
    planted(transcript, fillers=12)  # new chatter, no new planted facts beyond repeats
    second = await compact(compactor, transcript)
    text = str(details(second)["summary_only"])
    assert DECISION in text and TOOL_ERROR in text
    assert text.count(SELECTIVE_HEADER) == 1


# -- hierarchical ----------------------------------------------------------------------


async def test_hierarchical_keeps_key_points_of_recent_tasks(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript, fillers=3)
    provider = SummaryProvider(summary_reply())
    compactor = make_compactor(
        provider, strategy="hierarchical", hierarchical_recent_tasks=10, **NEWEST_TURN_ONLY
    )
    outcome = await compact(compactor, transcript, TRIGGER_MANUAL)
    text = str(details(outcome)["summary_only"])
    assert RECENT_HEADING in text
    assert f"Decision: {DECISION}" in text
    assert f"TODO: {TODO}" in text
    assert f"Error: {TOOL_ERROR}" in text
    assert ORDER in text and HOST in text
    assert "Outcome: The deploy failed: the database refused." in text


async def test_hierarchical_reduces_old_tasks_to_one_line(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript, fillers=3)
    compactor = make_compactor(
        SummaryProvider(summary_reply()),
        strategy="hierarchical",
        hierarchical_recent_tasks=1,
        **NEWEST_TURN_ONLY,
    )
    outcome = await compact(compactor, transcript, TRIGGER_MANUAL)
    got = details(outcome)
    text = str(got["summary_only"])
    earlier = text.split(EARLIER_HEADING, 1)[1].split("##", 1)[0]
    assert f"- Please deploy {ORDER} to staging. → The deploy failed:" in earlier
    assert f"- {DECISION} → Noted, PostgreSQL 16 it is." in earlier
    assert "Decision:" not in earlier  # one line, no key points
    assert got["recent_tasks"] == 1 and int(got["old_tasks"]) >= 3
    # What the one line lost, the ledger kept.
    assert KEY_PATH in outcome.entry.payload["summary"]  # type: ignore[union-attr]


def unfinished(transcript: Transcript) -> None:
    """A task that ended on a failed tool call, then a new request."""
    transcript.append_message(Message.user("Investigate the outage on ticket INC-4711."))
    call = ToolUseBlock("call-9", "shell", {"cmd": "journalctl"})
    transcript.append_message(Message("assistant", (call,)))
    transcript.append_message(
        Message("tool_result", (ToolResultBlock("call-9", "permission denied", is_error=True),))
    )


async def test_hierarchical_summarises_the_unfinished_task(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript, fillers=0)
    unfinished(transcript)
    transcript.append_message(Message.user("Meanwhile, what time is it?"))
    transcript.append_message(Message.assistant("Noon."))
    seen: list[str] = []

    def active(request: ProviderRequest) -> ProviderResponse:
        seen.append(request.messages[-1].text)
        return reply("ACTIVE: outage on INC-4711 blocked by permissions")

    compactor = make_compactor(SummaryProvider(active), strategy="hierarchical", **NEWEST_TURN_ONLY)
    outcome = await compact(compactor, transcript)
    got = details(outcome)
    text = str(got["summary_only"])
    assert got["active_task"] is True and got["active_summary"] == "summarizer"
    assert text.endswith(f"{ACTIVE_HEADING}\nACTIVE: outage on INC-4711 blocked by permissions")
    # Only the active task went to the model.
    assert len(seen) == 1 and "INC-4711" in seen[0] and ORDER not in seen[0]


async def test_hierarchical_falls_back_to_key_points_when_the_model_fails(
    tmp_path: Path,
) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript, fillers=0)
    unfinished(transcript)
    transcript.append_message(Message.user("Meanwhile, what time is it?"))
    transcript.append_message(Message.assistant("Noon."))
    compactor = make_compactor(
        SummaryProvider(failing), strategy="hierarchical", **NEWEST_TURN_ONLY
    )
    outcome = await compact(compactor, transcript)
    got = details(outcome)
    active = str(got["summary_only"]).split(ACTIVE_HEADING, 1)[1]
    assert got["strategy"] == "hierarchical" and got["active_summary"] == "key-points"
    assert "INC-4711" in active and "Error: permission denied" in active
    assert "Outcome: not finished" in active
    assert got["fallbacks"] == ["summarizer: summariser failed: model gone"]


def test_active_task_rules() -> None:
    tasks = split_tasks(
        [
            Message.assistant("continuing earlier work"),
            Message.user("first"),
            Message.assistant("done first"),
            Message.user("second"),
            Message.assistant("done second"),
        ]
    )
    assert [t.request for t in tasks] == ["", "first", "second"]
    assert tasks[1].outcome == "done first"
    new_request = [Message.user("third")]
    assert active_task(tasks, new_request) is None  # finished, and the kept part moves on
    assert active_task(tasks, [Message.assistant("more on second")]) is tasks[-1]
    assert active_task(tasks, []) is tasks[-1]  # everything folded


# -- sliding window --------------------------------------------------------------------


async def test_sliding_window_keeps_the_last_messages_and_only_the_ledger(
    tmp_path: Path,
) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript, fillers=4)
    provider = SummaryProvider(failing)
    compactor = make_compactor(provider, strategy="sliding-window", sliding_window_messages=4)
    outcome = await compact(compactor, transcript)
    got = details(outcome)
    summary = outcome.entry.payload["summary"]  # type: ignore[union-attr]
    assert provider.requests == []
    assert got["strategy"] == "sliding-window" and got["summary_only"] == SLIDING_WINDOW_NOTE
    # The ledger kept the identifiers, the open ask and the decision ...
    for kept in (ORDER, KEY_PATH, "PostgreSQL 16"):
        assert kept in summary
    # ... but the rest of the conversation is gone from the view.
    assert TOOL_ERROR not in summary and "The deploy failed" not in summary
    kept = [e.message for e in transcript.live_entries() if e.type == "message"]
    assert len(kept) == 4 and kept[0].text.startswith("tell me more, part 2.")
    view = build_history(transcript.live_entries())
    assert view[0].text.startswith(COMPACTION_SUMMARY_PREFIX)


async def test_sliding_window_never_cuts_a_call_from_its_result(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript, fillers=2)
    transcript.append_message(Message.user("check the disk"))
    transcript.append_message(
        Message("assistant", (ToolUseBlock("call-2", "shell", {"cmd": "df"}),))
    )
    transcript.append_message(Message("tool_result", (ToolResultBlock("call-2", "42% used"),)))
    transcript.append_message(Message.assistant("The disk is 42% used."))
    compactor = make_compactor(
        SummaryProvider(failing), strategy="sliding-window", sliding_window_messages=2
    )
    outcome = await compact(compactor, transcript)
    assert outcome.compacted
    kept = [e.message for e in transcript.live_entries() if e.type == "message"]
    assert kept[0].role != "tool_result"
    assert kept == [Message.assistant("The disk is 42% used.")]


# -- the failure chain -----------------------------------------------------------------


async def test_failure_chain_retries_then_uses_the_fallback_model(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript)

    def by_model(request: ProviderRequest) -> ProviderResponse:
        if request.model == "cheap":
            raise ServerError("overloaded", provider="scripted", status=500)
        return reply("## Decisions\n- from the backup model")

    provider = SummaryProvider(by_model)
    compactor = make_compactor(provider, attempts=4, model="cheap", fallback_model="backup")
    outcome = await compact(compactor, transcript)
    got = details(outcome)
    assert got["strategy"] == "summary" and got["produced_by"] == "fallback-model"
    assert str(got["summary_only"]).endswith("from the backup model")
    assert len(got["fallbacks"]) == 1 and str(got["fallbacks"][0]).startswith("summarizer:")
    # Four attempts of the retryable error on the primary model, then only the backup.
    models = provider.summary_models
    assert models[: models.index("backup")] == ["cheap"] * 4
    assert set(models[4:]) == {"backup"}


async def test_failure_chain_ends_in_the_sliding_window(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript)
    before = [e.id for e in transcript.entries()]
    provider = SummaryProvider(failing)
    compactor = make_compactor(provider, model="cheap", fallback_model="backup")
    outcome = await compact(compactor, transcript)
    got = details(outcome)
    assert outcome.strategy == "sliding-window"
    assert got["strategy"] == "sliding-window" and got["requested_strategy"] == "summary"
    assert got["produced_by"] == "sliding-window"
    assert [str(f).split(":")[0] for f in got["fallbacks"]] == ["summarizer", "fallback-model"]
    assert provider.summary_models == ["cheap", "backup"]
    assert ORDER in outcome.entry.payload["summary"]  # type: ignore[union-attr]
    # The transcript only grew.
    assert [e.id for e in transcript.entries()][: len(before)] == before
    assert "sliding-window" in outcome.describe()


async def test_a_broken_strategy_still_compacts(tmp_path: Path, monkeypatch: object) -> None:
    transcript = new_transcript(tmp_path)
    planted(transcript)
    compactor = make_compactor(SummaryProvider(failing), strategy="selective")

    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("bug")

    import parley.core.context.compaction.strategies.selective as selective

    monkeypatch.setattr(selective, "select", boom)  # type: ignore[attr-defined]
    outcome = await compact(compactor, transcript)
    got = details(outcome)
    assert got["strategy"] == "sliding-window"
    assert got["fallbacks"] == ["selective: RuntimeError: bug"]


def test_selective_keeps_what_the_person_said_over_long_answers() -> None:
    """A small window: the person's short statement outlives the model's long answers
    (the hand test at 2,048 tokens lost "level 3, spot 42" this way)."""
    counter = default_counter()
    said = "Hi, my car is on level 3, spot 42."
    babble = " ".join(["It is a lovely day for a drive around the town."] * 30)
    messages = [
        Message.user(said),
        Message.assistant(babble),
        Message.user("Tell me about Rome."),
        Message.assistant(babble + " Rome."),
    ]
    request = FoldRequest(
        messages=tuple(messages),
        kept=(),
        previous_summary=None,
        fresh_ledger=Ledger(),
        window=2_048,
        threshold=1_000,
        focus="",
        fold_tokens=241,
    )
    fold = asyncio.run(SelectiveStrategy(target_ratio=0.25, count_text=counter.text).fold(request))
    assert said in fold.text
    assert babble not in fold.text


def test_selective_keeps_the_persons_words_across_a_second_fold() -> None:
    counter = default_counter()
    said = "Hi, my car is on level 3, spot 42."
    babble = " ".join(["It is a lovely day for a drive around the town."] * 30)
    previous = f"{SELECTIVE_HEADER}\n- [User]: {said}\n- [User]: Tell me about Rome."
    request = FoldRequest(
        messages=(
            Message.user("Now Greece."),
            Message.assistant(babble),
            Message.user("And Egypt?"),
            Message.assistant(babble + " Egypt."),
        ),
        kept=(),
        previous_summary=previous,
        fresh_ledger=Ledger(),
        window=2_048,
        threshold=1_000,
        fold_tokens=241,
    )
    fold = asyncio.run(SelectiveStrategy(target_ratio=0.25, count_text=counter.text).fold(request))
    assert said in fold.text
