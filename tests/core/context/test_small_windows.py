"""Self-hosted models with 2,048- to 32,768-token windows (issue #21), through the runner.

The provider is ``window_fake.WindowFake``: a llama.cpp-like server that refuses a
prompt over its window and stops a reply that fills it. Identifiers are planted in
the first turns and looked for in the last request, where the model would see them.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from parley.core.agent_config import AgentConfig
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT
from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine, TurnEvents, ViewRequest
from parley.core.context.flush import FLUSH_CUSTOM_TYPE, FLUSH_PROMPT, FlushTarget
from parley.core.errors import (
    CAUSE_MESSAGE,
    ContextBudgetError,
    ContextOverflowError,
    WindowTooSmallError,
)
from parley.core.memory.audience import Audience
from parley.core.memory.notes import NoteStore
from parley.core.messages import Message, ToolResultBlock, ToolUseBlock
from parley.core.prompt import SystemPromptBuilder
from parley.core.providers.base import ProviderRequest
from parley.core.providers.provider_config import RetryConfig
from parley.core.runner import Runner, TurnRequest
from parley.core.tools.builtin import default_registry
from parley.core.tools.truncation import tool_result_cap
from parley.core.transcript import ENTRY_COMPACTION, Transcript
from tests.core.context.window_fake import Answer, WindowFake

PLANTED = (
    "Remember: my car is on level 3, spot 42.",
    "Please keep order ORD-88123 in mind.",
    "The export lives in /srv/data/exports/ledger.csv, remember that.",
)
KEPT = ("level 3, spot 42", "ORD-88123", "/srv/data/exports/ledger.csv")
WORDS = ("budget", "garden", "travel", "invoice", "family", "weekend", "report", "music")
FORGETFUL = (
    "## Decisions\n- none\n## Open TODOs\n- none\n## Constraints/Rules\n- none\n"
    "## Pending user asks\n- none\n## Exact identifiers\n- none"
)


def chatty(request: ProviderRequest) -> str:
    """Answers of 60-160 words; a summary that keeps nothing (the ledger must); a note."""
    if request.system == SUMMARY_SYSTEM_PROMPT:
        return FORGETFUL
    if request.messages[-1].text.startswith(FLUSH_PROMPT[:14]):
        return "- the user parks at the office"
    rng = random.Random(len(request.messages))
    return "Sure. " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 160)))


def runner_for(
    tmp_path: Path,
    provider: WindowFake,
    *,
    max_output: int = 4_096,
    tools: bool = True,
    **context: object,
) -> Runner:
    registry = default_registry(10_000)
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    retry = RetryConfig(max_attempts=1, base_delay_seconds=0, max_delay_seconds=0)
    engine = ContextEngine(
        config=ContextConfig.model_validate(context),
        provider=provider,
        retry=retry,
        max_output=max_output,
        flush_target=FlushTarget(NoteStore(tmp_path / "notes"), lambda _: Audience.person("ada")),
    )
    return Runner(
        provider=provider,
        tools=registry,
        prompt=SystemPromptBuilder(
            workspace, agent_name="T", tools=registry.specs() if tools else ()
        ),
        agent=AgentConfig(max_output_tokens=max_output),
        retry=retry,
        workspace=workspace,
        offer_tools=tools,
        engine=engine,
    )


def user_text(n: int) -> str:
    rng = random.Random(n)
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
    return f"{PLANTED[n]} {words}" if n < len(PLANTED) else f"{words}?"


async def converse(runner: Runner, transcript: Transcript, turns: int) -> TurnEvents:
    """``turns`` turns; every one must be answered. Returns the events summed up."""
    seen = TurnEvents()
    for n in range(turns):
        result = await runner.run_turn(transcript, TurnRequest("k", user_text(n)))
        assert result.reply, f"turn {n} got no answer"
        seen.compactions.extend(result.events.compactions)
        seen.flushes.extend(result.events.flushes)
        seen.trims += result.events.trims
    return seen


def last_request_text(provider: WindowFake) -> str:
    main = [r for r in provider.requests if r.system != SUMMARY_SYSTEM_PROMPT]
    return json.dumps([m.to_dict() for m in main[-1].messages], ensure_ascii=False)


@pytest.fixture
def transcript(tmp_path: Path) -> Transcript:
    return Transcript.create(tmp_path / "s.jsonl", "sid", "agent:main:x")


@pytest.mark.parametrize("summaries", [True, False], ids=["summaries", "no-summaries"])
@pytest.mark.parametrize("window", [2_048, 4_096, 8_192, 32_768])
async def test_a_long_chat_compacts_and_keeps_what_was_planted(
    tmp_path: Path, transcript: Transcript, window: int, summaries: bool
) -> None:
    provider = WindowFake(window, chatty, summaries=summaries)
    # Tools are offered except at 2,048 tokens, where their schemas alone are a third
    # of the window (a llama.cpp model that small is not offered tools anyway).
    runner = runner_for(tmp_path, provider, tools=window > 2_048)
    turns = 40 if window < 32_768 else 120
    events = await converse(runner, transcript, turns)
    # Every turn was answered (converse asserts it), the history was folded, not cut
    # from the view, and no request was ever over the window.
    assert provider.refused == 0
    assert events.trims == 0
    compactions = [e for e in transcript.entries() if e.type == ENTRY_COMPACTION]
    assert compactions
    for request in provider.requests:
        assert provider.prompt_tokens(request) + min(request.max_tokens, 1) <= window
    seen = last_request_text(provider)
    for kept in KEPT:
        assert kept in seen, kept
    if not summaries:
        # A model that cannot summarise is never asked to: the fold is by code, and
        # there is no memory flush.
        assert not any(r.system == SUMMARY_SYSTEM_PROMPT for r in provider.requests)
        assert all(c.payload["details"]["strategy"] == "selective" for c in compactions)
        assert not any(
            e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE for e in transcript.entries()
        )


async def test_the_issues_2048_window_with_a_4096_output_limit(
    tmp_path: Path, transcript: Transcript
) -> None:
    """llama.cpp n_ctx 2,048, SmolLM2-135M, max_output 4,096: the window's own figures."""
    provider = WindowFake(2_048, chatty, summaries=False)
    runner = runner_for(tmp_path, provider, tools=False)
    events = await converse(runner, transcript, 12)
    assert events.compactions
    # Each request asked for a quarter of the window, never for 4,096 tokens.
    assert {r.max_tokens for r in provider.requests} == {512}
    engine = runner.engine
    view = await engine.prepare(transcript, await runner.view_request("k"), TurnEvents())
    assert view.budget.limit == 1_536 and view.threshold > 0


async def test_an_overflow_with_the_issues_numbers_recovers_with_positive_budgets(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = WindowFake(2_048, chatty, summaries=False)
    runner = runner_for(tmp_path, provider, tools=False)
    engine = runner.engine
    for n in range(6):
        transcript.append_message(Message.user(f"{n}: " + "words " * 120))
        transcript.append_message(Message.assistant(f"{n}: " + "more " * 120))
    request = await runner.view_request("k")
    events = TurnEvents()
    view = await engine.prepare(transcript, request, events)
    overflow = ContextOverflowError(
        "request (2326 tokens) exceeds the available context size (2048 tokens)",
        observed_tokens=2_326,
        limit=2_048,
    )
    refused: list[ContextBudgetError] = []
    for _ in range(6):  # more than max_attempts: the budget never reaches zero
        await engine.recover_overflow(transcript, request, view, overflow, events)
        try:
            view = await engine.prepare(transcript, request, events)
        except ContextBudgetError as exc:
            refused.append(exc)
        assert view.budget.limit > 0 and view.threshold > 0
    assert events.compactions and events.compactions[0].compacted
    # Whatever could not be made to fit says so with numbers a person can read.
    for error in refused:
        assert error.limit is not None and error.used is not None
        assert 0 < error.limit < error.used
        assert "-" not in error.message


async def test_a_message_bigger_than_the_window_is_said_plainly(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = WindowFake(4_096, chatty)
    runner = runner_for(tmp_path, provider)
    await converse(runner, transcript, 6)
    before = len(provider.requests)
    folds = sum(e.type == ENTRY_COMPACTION for e in transcript.entries())
    with pytest.raises(ContextBudgetError) as caught:
        await runner.run_turn(transcript, TurnRequest("k", "paste " * 6_000))
    # Refused before any call: no summary of the history first (it could not help).
    assert len(provider.requests) == before
    assert sum(e.type == ENTRY_COMPACTION for e in transcript.entries()) == folds
    error = caught.value
    # The newest message alone does not fit: compacting or a new session cannot help.
    assert error.cause == CAUSE_MESSAGE
    assert error.used is not None and error.limit is not None
    assert 0 < error.limit < error.used


def test_the_floor_admits_2048_and_warns_below_16000(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider = WindowFake(2_048, chatty)
    runner = runner_for(tmp_path, provider)
    with caplog.at_level(logging.WARNING, logger="parley.core.window"):
        info = runner.engine.check("smol")
        runner.engine.check("smol")
    assert info.tokens == 2_048 and info.source == "provider"
    warnings = [r.getMessage() for r in caplog.records if r.name == "parley.core.window"]
    assert len(warnings) == 1  # once per model
    assert "2,048" in warnings[0] and "16,000" in warnings[0]
    assert "llama.cpp /props" in warnings[0]  # where the figure came from
    small = runner_for(tmp_path, WindowFake(1_024, chatty))
    with pytest.raises(WindowTooSmallError, match="2,048"):
        small.engine.check("smol")
    stated = runner_for(tmp_path, provider, models={"smol": {"context_tokens": 8_192}})
    assert stated.engine.check("smol").tokens == 8_192  # the true window, admitted


@pytest.mark.parametrize(
    ("note", "written"),
    [
        ("tea " * 300, None),  # a loop inside one line: nothing worth writing
        ("- the user likes tea and biscuits\n" * 40, "- the user likes tea and biscuits"),
        ("- parks on level 3, spot 42\n- prefers tea\n", "- parks on level 3, spot 42"),
    ],
    ids=["loop", "repeated-lines", "real-note"],
)
async def test_a_looping_flush_note_is_dropped_or_de_looped(
    tmp_path: Path, transcript: Transcript, note: str, written: str | None
) -> None:
    def answer(request: ProviderRequest) -> str:
        if request.messages[-1].text.startswith(FLUSH_PROMPT[:14]):
            return note
        return chatty(request)

    runner = runner_for(tmp_path, WindowFake(8_192, answer))
    for n in range(10):
        transcript.append_message(Message.user(f"{n}: " + "words " * 60))
        transcript.append_message(Message.assistant(f"{n}: " + "more " * 60))
    outcome, events = await runner.engine.compact_now(
        transcript, ViewRequest("k", "system", (), "smol")
    )
    assert outcome.compacted
    (flush,) = events.flushes
    files = list((tmp_path / "notes").rglob("*.md"))
    if written is None:
        assert flush.status == "nothing" and "repetition" in flush.reason
        assert files == []
    else:
        assert flush.status == "written"
        (file,) = files
        text = file.read_text()
        assert written in text
        assert text.count(written) == 1  # each line once


async def test_a_model_that_cannot_summarise_gets_no_flush(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = WindowFake(8_192, chatty, summaries=True)
    # The operator says so for this model, whatever the provider claims.
    runner = runner_for(tmp_path, provider, models={"smol": {"summaries": False}})
    for n in range(10):
        transcript.append_message(Message.user(f"{n}: please keep ORD-8812{n}. " + "w " * 60))
        transcript.append_message(Message.assistant(f"{n}: " + "more " * 60))
    outcome, events = await runner.engine.compact_now(
        transcript, ViewRequest("k", "system", (), "smol")
    )
    assert outcome.compacted and outcome.strategy == "selective"
    assert events.flushes == [] and provider.requests == []  # no model call at all
    entry = outcome.entry
    assert entry is not None
    assert entry.payload["details"]["configured_strategy"] == "summary"
    assert "ORD-88120" in entry.payload["summary"]


async def test_a_tool_result_is_capped_to_the_room_a_small_window_has(
    tmp_path: Path, transcript: Transcript
) -> None:
    calls = 0

    def reading(request: ProviderRequest) -> str | Answer:
        nonlocal calls
        if request.messages[-1].role == "user" and calls == 0:
            calls += 1
            return Answer("Reading it.", (ToolUseBlock("t1", "read_file", {"path": "big.txt"}),))
        return chatty(request)

    provider = WindowFake(4_096, reading)
    runner = runner_for(tmp_path, provider)
    line = "value " * 30
    (tmp_path / "ws" / "big.txt").write_text("".join(f"{n}: {line}\n" for n in range(2_000)))
    # Before any call: calibration can only make the room (and the cap) smaller.
    budget = runner.engine.session_budget(await runner.view_request("k"))
    result = await runner.run_turn(transcript, TurnRequest("k", "read big.txt"))
    assert result.tool_calls == 1 and result.reply
    (stored,) = [
        b
        for e in transcript.entries()
        if e.type == "message" and e.message.role == "tool_result"
        for b in e.message.content
    ]
    assert isinstance(stored, ToolResultBlock)
    # Below core.tools' own cap for the window (30% of it, 4,915 characters): what the
    # system prompt and tools leave of a 4k window could not hold that next to a turn.
    assert 2_000 <= len(stored.content) <= budget.tool_result_chars < tool_result_cap(4_096)
    assert result.events.trims == 0
