"""Count and age triggers, the derived history limit, and the compacting state."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from parley.core.context.compaction.compactor import (
    TRIGGER_AGE,
    TRIGGER_HISTORY,
    TRIGGER_MESSAGES,
    CompactionOutcome,
)
from parley.core.context.compaction.triggers import due_trigger, parse_timestamp
from parley.core.context.config import CompactionConfig, ContextConfig
from parley.core.context.engine import ContextEngine, TurnEvents, ViewRequest
from parley.core.context.history import (
    COMPACTION_SUMMARY_PREFIX,
    build_history,
    limit_history_messages,
    summary_message,
)
from parley.core.context.window import derived_history_messages
from parley.core.messages import Message, ToolResultBlock, ToolUseBlock
from parley.core.providers.base import ProviderRequest, ProviderResponse
from parley.core.providers.provider_config import RetryConfig
from parley.core.transcript import ENTRY_COMPACTION, Transcript
from tests.core.context.compaction.compaction_fakes import (
    MODEL,
    SummaryProvider,
    new_transcript,
    reply,
    summary_reply,
)

REQUEST = ViewRequest("k", "system", (), MODEL)


def chat(transcript: Transcript, turns: int, *, then_user: bool = True) -> None:
    for n in range(turns):
        transcript.append_message(Message.user(f"question {n} about order ORD-{1000 + n}"))
        transcript.append_message(Message.assistant(f"answer {n}"))
    if then_user:
        transcript.append_message(Message.user("and now?"))


def engine(provider: SummaryProvider, tmp_path: Path, **settings: object) -> ContextEngine:
    compaction = settings.pop("compaction", {})
    config = ContextConfig.model_validate(
        {
            "models": {MODEL: {"context_tokens": 200_000}},
            "flush": {"enabled": False},
            "compaction": compaction,
            **settings,
        }
    )
    return ContextEngine(
        config=config,
        provider=provider,
        retry=RetryConfig(max_attempts=1, base_delay_seconds=0, max_delay_seconds=0),
        max_output=1_000,
    )


def compactions(transcript: Transcript) -> list[dict[str, object]]:
    return [e.payload for e in transcript.entries() if e.type == ENTRY_COMPACTION]


# -- due_trigger -----------------------------------------------------------------------


def test_message_count_fires_at_the_limit(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 5)  # 11 messages
    now = parse_timestamp(transcript.live_entries()[-1].ts)
    assert now is not None
    assert due_trigger(transcript.live_entries(), CompactionConfig(max_messages=11), now) == (
        TRIGGER_MESSAGES
    )
    assert due_trigger(transcript.live_entries(), CompactionConfig(max_messages=12), now) is None
    assert due_trigger(transcript.live_entries(), CompactionConfig(max_messages=0), now) is None


def test_count_and_age_never_fire_mid_tool_call(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 5)
    call = ToolUseBlock("c1", "shell", {"cmd": "ls"})
    transcript.append_message(Message("assistant", (call,)))
    settings = CompactionConfig(max_messages=2, max_age_seconds=1)
    later = parse_timestamp(transcript.live_entries()[0].ts)
    assert later is not None
    later += timedelta(days=1)
    # Tool use awaiting its result.
    assert due_trigger(transcript.live_entries(), settings, later) is None
    # A result awaiting the assistant's continuation.
    transcript.append_message(Message("tool_result", (ToolResultBlock("c1", "a b"),)))
    assert due_trigger(transcript.live_entries(), settings, later) is None
    # The assistant's answer: the turn is over, but the next one has not started.
    transcript.append_message(Message.assistant("done"))
    assert due_trigger(transcript.live_entries(), settings, later) is None
    transcript.append_message(Message.user("next"))
    assert due_trigger(transcript.live_entries(), settings, later) == TRIGGER_MESSAGES


def test_age_is_off_by_default_and_counts_from_the_last_compaction(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 2)
    first = parse_timestamp(transcript.live_entries()[0].ts)
    assert first is not None
    assert CompactionConfig().max_age_seconds is None
    assert (
        due_trigger(transcript.live_entries(), CompactionConfig(), first + timedelta(days=365))
        is None
    )
    hourly = CompactionConfig(max_age_seconds=3_600)
    assert due_trigger(transcript.live_entries(), hourly, first + timedelta(minutes=30)) is None
    assert due_trigger(transcript.live_entries(), hourly, first + timedelta(hours=2)) == TRIGGER_AGE
    # After a compaction, the age starts again from it.
    compaction = transcript.append_compaction(
        "summary", first_kept_entry_id=None, tokens_before=10, tokens_after=5, trigger="manual"
    )
    transcript.append_message(Message.user("hello again"))
    at = parse_timestamp(compaction.ts)
    assert at is not None
    assert due_trigger(transcript.live_entries(), hourly, at + timedelta(minutes=30)) is None
    assert due_trigger(transcript.live_entries(), hourly, at + timedelta(hours=1)) == TRIGGER_AGE


# -- through the engine ----------------------------------------------------------------


async def test_prepare_compacts_on_the_message_count(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 10)
    provider = SummaryProvider(summary_reply("## Decisions\n- counted"))
    eng = engine(provider, tmp_path, compaction={"max_messages": 20, "keep_recent_turns": 1})
    events = TurnEvents()
    view = await eng.prepare(transcript, REQUEST, events)
    [made] = compactions(transcript)
    assert made["trigger"] == TRIGGER_MESSAGES
    assert [o.trigger for o in events.compactions] == [TRIGGER_MESSAGES]
    assert view.messages[0].text.startswith(COMPACTION_SUMMARY_PREFIX)
    assert "ORD-1000" in view.messages[0].text  # the ledger came along
    # The next call of the same turn does not compact again.
    await eng.prepare(transcript, REQUEST, TurnEvents())
    assert len(compactions(transcript)) == 1


def test_history_fires_when_the_view_limit_would_hide_messages(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 5)  # 11 messages
    now = parse_timestamp(transcript.live_entries()[-1].ts)
    assert now is not None
    config = CompactionConfig(max_messages=0)
    assert due_trigger(transcript.live_entries(), config, now, history_limit=10) == (
        TRIGGER_HISTORY
    )
    assert due_trigger(transcript.live_entries(), config, now, history_limit=11) is None
    assert due_trigger(transcript.live_entries(), config, now) is None


async def test_messages_the_derived_limit_would_hide_are_folded_instead(tmp_path: Path) -> None:
    """A 10k window shows 20 messages: at 41 live ones, the older are summarised (and
    their identifiers kept in the ledger), not silently left out of the view."""
    transcript = new_transcript(tmp_path)
    chat(transcript, 20)
    provider = SummaryProvider(summary_reply("## Decisions\n- folded"))
    eng = engine(
        provider,
        tmp_path,
        models={MODEL: {"context_tokens": 10_000}},
        min_window_tokens=1_000,
        compaction={"keep_recent_turns": 2, "keep_recent_tokens": 100},
    )
    small = ViewRequest("k", "system", (), MODEL)
    view = await eng.prepare(transcript, small, TurnEvents())
    [made] = compactions(transcript)
    assert made["trigger"] == TRIGGER_HISTORY
    assert view.messages[0].text.startswith(COMPACTION_SUMMARY_PREFIX)
    assert "ORD-1000" in view.messages[0].text  # hidden before; in the ledger now
    assert len(view.messages) <= derived_history_messages(10_000)
    # Nothing left to hide: the next turn's first call does not compact again.
    transcript.append_message(Message.assistant("ok"))
    transcript.append_message(Message.user("more?"))
    await eng.prepare(transcript, small, TurnEvents())
    assert len(compactions(transcript)) == 1


async def test_a_history_compaction_keeps_at_most_half_the_limit(tmp_path: Path) -> None:
    """Short messages under the default keep figures: 20,000 tokens would keep hundreds
    of them, more than the 200 a 200k window shows, so the history trigger fired again
    on every turn (a summary, a flush and a checkpoint each). The kept part is capped at
    half the limit, and the next history compaction is that many messages away."""
    transcript = new_transcript(tmp_path)
    chat(transcript, 110)  # 221 messages: past the derived limit of 200
    limit = derived_history_messages(200_000)
    eng = engine(SummaryProvider(summary_reply()), tmp_path, compaction={"max_messages": 0})
    await eng.prepare(transcript, REQUEST, TurnEvents())
    [made] = compactions(transcript)
    assert made["trigger"] == TRIGGER_HISTORY
    kept = [e for e in transcript.live_entries() if e.type == "message"]
    assert 0 < len(kept) <= limit // 2
    turns = 0
    while len(compactions(transcript)) == 1 and turns < limit:
        transcript.append_message(Message.assistant("ok"))
        transcript.append_message(Message.user(f"next {turns}"))
        await eng.prepare(transcript, REQUEST, TurnEvents())
        turns += 1
    # The next one only when the kept part and the new turns pass the limit again.
    assert turns == (limit - len(kept)) // 2 + 1


async def test_prepare_does_not_compact_on_count_mid_tool_loop(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 10)
    transcript.append_message(Message("assistant", (ToolUseBlock("c1", "shell", {"a": 1}),)))
    transcript.append_message(Message("tool_result", (ToolResultBlock("c1", "ok"),)))
    provider = SummaryProvider(summary_reply())
    eng = engine(provider, tmp_path, compaction={"max_messages": 20, "keep_recent_turns": 1})
    await eng.prepare(transcript, REQUEST, TurnEvents())
    assert compactions(transcript) == [] and provider.requests == []


async def test_the_default_message_limit_does_not_fire_on_a_short_session(
    tmp_path: Path,
) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 40)
    provider = SummaryProvider(summary_reply())
    await engine(provider, tmp_path).prepare(transcript, REQUEST, TurnEvents())
    assert compactions(transcript) == []


# -- the derived history limit ---------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "messages"),
    [
        (8_000, 20),
        (15_999, 20),
        (16_000, 50),
        (63_999, 50),
        (64_000, 100),
        (128_000, 100),
        (128_001, 200),
        (1_000_000, 200),
    ],
)
def test_derived_history_limit_bands(window: int, messages: int) -> None:
    assert derived_history_messages(window) == messages


def tool_turns(count: int) -> list[Message]:
    out: list[Message] = []
    for n in range(count):
        out.append(Message.user(f"do {n}"))
        out.append(Message("assistant", (ToolUseBlock(f"c{n}", "shell", {"n": n}),)))
        out.append(Message("tool_result", (ToolResultBlock(f"c{n}", f"r{n}"),)))
        out.append(Message.assistant(f"done {n}"))
    return out


def test_message_limit_cuts_only_at_a_turn_start() -> None:
    messages = tool_turns(10)  # 40 messages, turns of 4
    for limit in range(1, 12):
        kept = limit_history_messages(messages, limit)
        assert kept[0].role == "user" and kept[0].text.startswith("do ")
        assert len(kept) <= max(limit, 4)
        assert kept == messages[-len(kept) :]


def test_message_limit_keeps_the_newest_turn_whole_and_the_summary_first() -> None:
    summary = summary_message("old things")
    messages = [summary, *tool_turns(3)]
    kept = limit_history_messages(messages, 2)
    assert kept[0] == summary
    assert kept[1:] == messages[-4:]  # the newest turn is longer than the limit
    assert limit_history_messages(messages, 0) == messages
    assert limit_history_messages(messages, 12) == messages  # the summary is not counted


async def test_engine_view_applies_the_derived_limit(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 100)
    eng = engine(SummaryProvider(summary_reply()), tmp_path)
    small, _ = eng.view(transcript.live_entries(), "direct", window=10_000)
    assert len(small) == 19 and small[0].role == "user"  # cut forward to a turn start
    assert small[-1].text == "and now?"
    big, _ = eng.view(transcript.live_entries(), "direct", window=200_000)
    assert len(big) == 199
    unlimited = engine(SummaryProvider(summary_reply()), tmp_path, history_messages=-1)
    everything, _ = unlimited.view(transcript.live_entries(), "direct", window=10_000)
    assert len(everything) == 201
    fixed = engine(SummaryProvider(summary_reply()), tmp_path, history_messages=7)
    seven, _ = fixed.view(transcript.live_entries(), "direct", window=1_000_000)
    assert len(seven) == 7
    # A configured turn limit is the history limit: nothing is derived on top.
    turns = engine(SummaryProvider(summary_reply()), tmp_path, dm_history_turns=30)
    thirty, _ = turns.view(transcript.live_entries(), "direct", window=10_000)
    assert len(thirty) == 59
    assert build_history(transcript.live_entries()) == everything


# -- the compacting state --------------------------------------------------------------


class BlockingSummary:
    """A summariser that tells when it was called and answers only when released."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()


class BlockingProvider(SummaryProvider):
    def __init__(self, gate: BlockingSummary) -> None:
        super().__init__(summary_reply("## Decisions\n- blocked then done"))
        self.block = gate

    async def complete(self, request: ProviderRequest, on_text: object = None) -> ProviderResponse:
        self.block.entered.set()
        await self.block.release.wait()
        return await super().complete(request, None)


async def test_compacting_state_is_set_while_the_compaction_runs(tmp_path: Path) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 10)
    gate = BlockingSummary()
    eng = engine(BlockingProvider(gate), tmp_path, compaction={"keep_recent_turns": 1})
    assert not eng.compacting("k")
    await asyncio.wait_for(eng.idle("k"), 1)  # returns at once when not compacting

    task = asyncio.create_task(eng.compact_now(transcript, REQUEST))
    await gate.entered.wait()
    assert eng.compacting("k") and not eng.compacting("other")
    waiter = asyncio.create_task(eng.idle("k"))
    await asyncio.sleep(0)
    assert not waiter.done()

    gate.release.set()
    outcome, _ = await task
    await asyncio.wait_for(waiter, 1)
    assert outcome.compacted and not eng.compacting("k")


async def test_compacting_state_is_cleared_when_the_compaction_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transcript = new_transcript(tmp_path)
    chat(transcript, 10)
    eng = engine(SummaryProvider(summary_reply()), tmp_path, compaction={"keep_recent_turns": 1})
    seen: list[bool] = []

    async def broken(*_: object, **__: object) -> CompactionOutcome:
        seen.append(eng.compacting("k"))
        raise OSError("disk gone")

    monkeypatch.setattr(eng.compactor, "compact", broken)
    with pytest.raises(OSError):
        await eng.compact_now(transcript, REQUEST)
    assert seen == [True]
    assert not eng.compacting("k")
    await asyncio.wait_for(eng.idle("k"), 1)


def test_summary_retries_are_retries_with_backoff(tmp_path: Path) -> None:
    eng = ContextEngine(
        config=ContextConfig(),
        provider=SummaryProvider(lambda _r: reply("x")),
        retry=RetryConfig(),
        max_output=1_000,
    )
    policy = eng.compactor.summarizer._retry
    assert policy.max_attempts == CompactionConfig().summary_retries + 1
    assert policy.base_delay_seconds > 0 and policy.max_delay_seconds > policy.base_delay_seconds
    assert eng.compactor.fallback_summarizer is None
