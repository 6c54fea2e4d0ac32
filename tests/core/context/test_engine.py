"""The context engine through the runner: guard, flush, compaction, ledger, trim, pruning.

A scripted provider answers at the seam; it routes summariser calls (by their system
prompt) and flush calls (by their prompt) to per-test functions, so each test decides
how the summariser behaves: well, badly, or not at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from parley.core.agent_config import AgentConfig
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT
from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine, TurnEvents, ViewRequest
from parley.core.context.flush import FLUSH_CUSTOM_TYPE, FLUSH_PROMPT, FlushTarget
from parley.core.context.history import COMPACTION_SUMMARY_PREFIX
from parley.core.context.pruning import PRUNE_CUSTOM_TYPE
from parley.core.errors import (
    ContextBudgetError,
    ContextOverflowError,
    InvalidRequestError,
    WindowTooSmallError,
)
from parley.core.memory.audience import AGENT, Audience
from parley.core.memory.notes import NoteStore
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from parley.core.prompt import SILENT_REPLY, SystemPromptBuilder
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse
from parley.core.providers.provider_config import RetryConfig
from parley.core.runner import Runner, TurnRequest
from parley.core.tokens import default_counter
from parley.core.tools.builtin import default_registry
from parley.core.transcript import ENTRY_COMPACTION, Transcript, TranscriptHeader
from tests.fakes.scripted_provider import ScriptedProvider, echo_text

MODEL = "scripted-model"
IDS = (
    "ORD-88123",
    "3f2c9a1e-7b4d-4c2a-9e8f-1a2b3c4d5e6f",
    "https://example.com/tickets/4711",
    "/srv/data/reports/q3.csv",
    "db.internal:5432",
)
FILLER = "The weather report and other chatter that nobody needs to keep verbatim. " * 12

Responder = Callable[[ProviderRequest], ProviderResponse]
AudienceOf = Callable[[TranscriptHeader], Audience | None]
ALICE = Audience.person("alice")


def alice(_: TranscriptHeader) -> Audience:
    return ALICE


def notes_of(tmp_path: Path) -> NoteStore:
    """The private notes ``make`` hands the flush (outside the workspace)."""
    return NoteStore(tmp_path / "private" / "notes")


def reply(text: str, usage: Usage | None = None) -> ProviderResponse:
    return ProviderResponse((TextBlock(text),), STOP_END, usage or Usage(10, 5), MODEL)


def good_summary(request: ProviderRequest) -> ProviderResponse:
    """A summary that keeps every identifier it was shown."""
    prompt = request.messages[-1].text
    kept = [i for i in IDS if i in prompt]
    body = "\n".join(f"- {i}" for i in kept) or "- none"
    return reply(
        "## Decisions\n- none\n## Open TODOs\n- none\n## Constraints/Rules\n- none\n"
        f"## Pending user asks\n- none\n## Exact identifiers\n{body}"
    )


def forgetful_summary(_: ProviderRequest) -> ProviderResponse:
    """A summary that drops every identifier."""
    return reply(
        "## Decisions\n- talked about the weather\n## Open TODOs\n- none\n"
        "## Constraints/Rules\n- none\n## Pending user asks\n- none\n## Exact identifiers\n- none"
    )


class Router:
    """Routes each call by kind; records how many of each it saw."""

    def __init__(
        self,
        summary: Responder = good_summary,
        flush: Responder | None = None,
        main: Responder | None = None,
    ) -> None:
        self.summary = summary
        self.flush = flush or (lambda _: reply("- the user likes tea"))
        self.main = main or (lambda r: reply(echo_text(r)))
        self.calls: dict[str, int] = {"summary": 0, "flush": 0, "main": 0}
        self.main_requests: list[ProviderRequest] = []

    def __call__(self, request: ProviderRequest) -> ProviderResponse:
        if request.system == SUMMARY_SYSTEM_PROMPT:
            self.calls["summary"] += 1
            return self.summary(request)
        if request.messages and request.messages[-1].text.startswith("[memory flush]"):
            self.calls["flush"] += 1
            return self.flush(request)
        self.calls["main"] += 1
        self.main_requests.append(request)
        return self.main(request)


def small_window(**compaction: object) -> ContextConfig:
    # 10,000 tokens: a 1,000-token reply and a reserve of 15% (1,500); threshold 7,500.
    # history_messages=-1: these tests are about the token guard over the whole live
    # window, not the view's derived message limit (compaction/test_triggers.py).
    return ContextConfig.model_validate(
        {
            "models": {MODEL: {"context_tokens": 10_000}},
            "history_messages": -1,
            "compaction": compaction,
        }
    )


def make(
    tmp_path: Path,
    router: Router,
    config: ContextConfig,
    *,
    now: Callable[[], datetime] | None = None,
    audience_of: AudienceOf | None = alice,
) -> tuple[Runner, ScriptedProvider]:
    """A runner over the engine; its flushes write to ``notes_of(tmp_path)`` in the
    audience ``audience_of`` names (``audience_of=None``: no flush target at all)."""
    provider = ScriptedProvider(MODEL)
    provider.responder = router
    tools = default_registry(10_000)
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    clock = now or (lambda: datetime.now(UTC))
    engine = ContextEngine(
        config=config,
        provider=provider,
        retry=RetryConfig(max_attempts=2, base_delay_seconds=0, max_delay_seconds=0),
        max_output=1_000,
        flush_target=None if audience_of is None else FlushTarget(notes_of(tmp_path), audience_of),
        checkpoints_dir=tmp_path / "checkpoints",
        now=clock,
    )
    runner = Runner(
        provider=provider,
        tools=tools,
        prompt=SystemPromptBuilder(workspace, agent_name="T", tools=tools.specs()),
        agent=AgentConfig(max_output_tokens=1_000),
        retry=RetryConfig(max_attempts=1),
        workspace=workspace,
        now=clock,
        engine=engine,
    )
    return runner, provider


def seed(transcript: Transcript, turns: int, *, plant: bool = True) -> None:
    """``turns`` user/assistant pairs; the first turns carry the identifiers."""
    for n in range(turns):
        said = f"turn {n}: {FILLER}"
        if plant and n < len(IDS):
            said = f"turn {n}: please keep {IDS[n]} in mind. {FILLER}"
        transcript.append_message(Message.user(said))
        transcript.append_message(Message.assistant(f"noted {n}"), usage=Usage(50, 5))


def request_text(request: ProviderRequest) -> str:
    return json.dumps([m.to_dict() for m in request.messages], ensure_ascii=False)


@pytest.fixture
def transcript(tmp_path: Path) -> Transcript:
    return Transcript.create(tmp_path / "s.jsonl", "sid", "agent:main:x")


async def test_threshold_flushes_then_compacts_and_keeps_identifiers(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 40)
    before = transcript.entry_count
    router = Router()
    runner, _ = make(tmp_path, router, small_window())
    result = await runner.run_turn(transcript, TurnRequest("k", "what did we agree?"))

    assert result.reply == "echo: what did we agree?"
    assert result.compactions == 1
    assert router.calls["flush"] == 1 and router.calls["summary"] >= 1
    compactions = [e for e in transcript.entries() if e.type == ENTRY_COMPACTION]
    assert len(compactions) == 1
    entry = compactions[0]
    assert entry.payload["trigger"] == "threshold"
    assert entry.payload["tokens_after"] < entry.payload["tokens_before"]
    # The transcript only grew: every message written before is still there.
    assert transcript.entry_count > before
    # The model's view starts with the summary, and the identifiers ride in it.
    sent = router.main_requests[-1]
    assert sent.messages[0].text.startswith(COMPACTION_SUMMARY_PREFIX)
    for identifier in IDS:
        assert identifier in sent.messages[0].text
    # The flush wrote its note to today's file in the audience's private notes (never
    # the workspace), under a header that names no session, and recorded the outcome.
    folder = notes_of(tmp_path).folder(ALICE)
    notes = list(folder.glob("*.md"))
    assert len(notes) == 1 and "the user likes tea" in notes[0].read_text()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}\.md", notes[0].name)
    text = notes[0].read_text()
    assert re.search(r"^## \d{2}:\d{2} — saved before compaction$", text, re.MULTILINE)
    assert "agent:main:x" not in text
    assert not (tmp_path / "ws" / "memory").exists()
    flushes = [e for e in transcript.entries() if e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE]
    assert [f.payload["data"]["status"] for f in flushes] == ["written"]
    assert flushes[0].payload["data"]["path"] == f"notes/person/alice/{notes[0].name}"
    # A checkpoint of the pre-compaction transcript was kept.
    assert len(list((tmp_path / "checkpoints" / "sid").glob("*.jsonl"))) == 1
    # The request sent fits the window with its output.
    counter = default_counter()
    assert counter.request(sent.system, sent.messages, sent.tools) <= 10_000 - 1_000


async def test_flush_runs_once_per_cycle_and_accepts_no_reply(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 40)
    router = Router(flush=lambda _: reply(SILENT_REPLY))
    runner, _ = make(tmp_path, router, small_window(enabled=False))
    for n in range(3):
        await runner.run_turn(transcript, TurnRequest("k", f"again {n}"))
    assert router.calls["flush"] == 1
    assert not (tmp_path / "ws" / "memory").exists()
    assert not notes_of(tmp_path).folder(ALICE).exists()
    flushes = [e for e in transcript.entries() if e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE]
    assert [f.payload["data"]["status"] for f in flushes] == ["nothing"]


@pytest.mark.parametrize("audience", [None, AGENT], ids=["nobody", "agent"])
async def test_a_session_of_no_audience_gets_no_note_and_a_failed_flush(
    tmp_path: Path, transcript: Transcript, audience: Audience | None
) -> None:
    seed(transcript, 40)
    asked: list[str] = []

    def audience_of(header: TranscriptHeader) -> Audience | None:
        asked.append(header.key)
        return audience

    router = Router()
    runner, _ = make(tmp_path, router, small_window(), audience_of=audience_of)
    result = await runner.run_turn(transcript, TurnRequest("k", "what did we agree?"))
    assert result.compactions == 1  # the compaction still runs
    assert asked == ["agent:main:x"]  # asked about this transcript's header
    # Nothing the bot writes on its own is agent-wide or nobody's: no model call, no file.
    assert router.calls["flush"] == 0
    assert not (tmp_path / "private").exists()
    assert not (tmp_path / "ws" / "memory").exists()
    flushes = [e for e in transcript.entries() if e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE]
    assert [f.payload["data"]["status"] for f in flushes] == ["failed"]
    assert flushes[0].payload["data"]["reason"] == "the session has no audience"
    assert flushes[0].payload["data"]["path"] is None


async def test_without_a_flush_target_no_flush_runs(tmp_path: Path, transcript: Transcript) -> None:
    seed(transcript, 40)
    router = Router()
    runner, _ = make(tmp_path, router, small_window(), audience_of=None)
    result = await runner.run_turn(transcript, TurnRequest("k", "what did we agree?"))
    assert result.compactions == 1
    assert router.calls["flush"] == 0
    assert not any(e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE for e in transcript.entries())
    assert not (tmp_path / "private").exists()
    assert not (tmp_path / "ws" / "memory").exists()


async def test_summariser_that_always_fails_falls_back_to_the_sliding_window(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 60)
    before = [e.id for e in transcript.entries()]

    def broken(_: ProviderRequest) -> ProviderResponse:
        raise InvalidRequestError("summariser unavailable", provider="scripted", status=400)

    router = Router(summary=broken)
    runner, _ = make(tmp_path, router, small_window())
    for n in range(2):
        result = await runner.run_turn(transcript, TurnRequest("k", f"still there {n}?"))
        assert result.reply == f"echo: still there {n}?"
    # The last resort made the entry: a compaction always succeeds.
    entries = [e for e in transcript.entries() if e.type == ENTRY_COMPACTION]
    assert len(entries) == 1
    details = entries[0].payload["details"]
    assert details["strategy"] == "sliding-window"
    assert details["requested_strategy"] == "summary"
    assert details["fallbacks"] == ["summarizer: summariser failed: summariser unavailable"]
    # Nothing lost: every earlier entry is still in the file, in order.
    assert [e.id for e in transcript.entries()][: len(before)] == before
    # No summary, but the ledger carries the planted identifiers into the view.
    sent = router.main_requests[-1]
    for identifier in IDS:
        assert identifier in sent.messages[0].text
    assert default_counter().request(sent.system, sent.messages, sent.tools) <= 9_000
    assert sent.messages[-1].text.startswith("still there 1?")
    # A non-retryable error is not retried, and the compaction is not repeated.
    assert router.calls["summary"] == 1


async def test_summariser_that_drops_identifiers_is_backed_by_the_ledger(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 40)
    router = Router(summary=forgetful_summary)
    runner, _ = make(tmp_path, router, small_window())
    await runner.run_turn(transcript, TurnRequest("k", "go on"))
    entry = next(e for e in transcript.entries() if e.type == ENTRY_COMPACTION)
    assert entry.payload["details"]["regenerated"] is True
    sent = router.main_requests[-1].messages[0].text
    for identifier in IDS:
        assert identifier in sent


async def test_ten_consecutive_compactions_keep_the_first_identifiers(
    tmp_path: Path, transcript: Transcript
) -> None:
    router = Router(summary=forgetful_summary)
    runner, _ = make(tmp_path, router, small_window())
    engine = runner.engine
    seed(transcript, 8)
    request = ViewRequest("k", "system", (), MODEL)
    for round_ in range(10):
        outcome, _ = await engine.compact_now(transcript, request, focus="")
        assert outcome.compacted, outcome.describe()
        seed(transcript, 4, plant=False)
        del round_
    messages, _ = engine.view(transcript.live_entries(), "direct")
    for identifier in IDS:
        assert identifier in messages[0].text
    assert sum(e.type == ENTRY_COMPACTION for e in transcript.entries()) == 10


async def test_nothing_real_to_summarise_writes_no_entry(
    tmp_path: Path, transcript: Transcript
) -> None:
    router = Router()
    runner, _ = make(tmp_path, router, small_window())
    transcript.append_message(Message.user("hi"))
    outcome, _ = await runner.engine.compact_now(transcript, ViewRequest("k", "s", (), MODEL))
    assert outcome.status == "skipped"
    assert outcome.describe().startswith("Skipped: ")
    # Only tool noise before the kept turns: still nothing to summarise.
    transcript.append_message(Message.assistant(SILENT_REPLY))
    for n in range(4):
        transcript.append_message(Message.user(f"q{n}"))
        transcript.append_message(Message.assistant(f"a{n}"))
    assert not any(e.type == ENTRY_COMPACTION for e in transcript.entries())
    assert router.calls["summary"] == 0
    # A compaction known to be skipped costs no model call at all, not even the flush.
    assert router.calls["flush"] == 0


async def test_overflow_on_the_first_call_of_a_restored_session(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with Transcript.create(path, "sid", "agent:main:x") as first:
        seed(first, 60)
    restored = Transcript.open(path)
    limit = 12_000

    def strict(request: ProviderRequest) -> ProviderResponse:
        size = default_counter().request(request.system, request.messages, request.tools)
        if size > limit:
            raise ContextOverflowError(
                f"prompt is too long: {size} tokens > {limit} maximum",
                provider="scripted",
                status=400,
                observed_tokens=size,
                limit=limit,
            )
        return reply(echo_text(request))

    router = Router(main=strict)
    # The config believes in a 200,000 window: only the provider knows better.
    runner, _ = make(tmp_path, router, ContextConfig())
    result = await runner.run_turn(restored, TurnRequest("k", "hello again"))
    assert result.reply == "echo: hello again"
    entry = next(e for e in restored.entries() if e.type == ENTRY_COMPACTION)
    assert entry.payload["trigger"] == "overflow"
    flushes = [e for e in restored.entries() if e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE]
    assert [f.payload["data"]["trigger"] for f in flushes] == ["overflow"]
    restored.close()


async def test_overflow_that_never_converges_fails_with_numbers(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 4)

    def always(request: ProviderRequest) -> ProviderResponse:
        raise ContextOverflowError(
            "prompt is too long: 300000 tokens > 200000 maximum",
            provider="scripted",
            observed_tokens=300_000,
            limit=200_000,
        )

    router = Router(main=always)
    runner, _ = make(tmp_path, router, ContextConfig())
    with pytest.raises(ContextOverflowError):
        await runner.run_turn(transcript, TurnRequest("k", "hi"))
    # One first try plus max_attempts recoveries, never an endless loop.
    assert router.calls["main"] == 1 + ContextConfig().compaction.max_attempts
    errors = [e for e in transcript.entries() if e.payload.get("custom_type") == "turn_error"]
    assert errors and errors[-1].payload["data"]["kind"] == "ContextOverflowError"


async def test_window_below_the_minimum_is_refused_before_any_call(
    tmp_path: Path, transcript: Transcript
) -> None:
    router = Router()
    config = ContextConfig.model_validate({"models": {MODEL: {"context_tokens": 2_000}}})
    runner, provider = make(tmp_path, router, config)
    with pytest.raises(WindowTooSmallError) as caught:
        await runner.run_turn(transcript, TurnRequest("k", "hi"))
    assert provider.requests == []
    assert caught.value.limit == 2_000 and "2,048" in caught.value.message


def tool_turn(transcript: Transcript, n: int, size: int) -> None:
    transcript.append_message(Message.user(f"read file {n}"))
    transcript.append_message(
        Message("assistant", (ToolUseBlock(f"t{n}", "read_file", {"path": f"f{n}"}),)),
        usage=Usage(100, 5),
    )
    transcript.append_message(
        Message("tool_result", (ToolResultBlock(f"t{n}", f"line {n}\n" * (size // 7)),))
    )
    transcript.append_message(Message.assistant(f"file {n} read"), usage=Usage(100, 5))


async def test_pruning_after_the_ttl_is_recorded_and_sticky(
    tmp_path: Path, transcript: Transcript
) -> None:
    for n in range(6):
        tool_turn(transcript, n, 30_000)
    later = datetime.now(UTC) + timedelta(minutes=10)
    runner, _ = make(tmp_path, Router(), ContextConfig(), now=lambda: later)
    engine = runner.engine
    request = ViewRequest("k", "system", (), MODEL)
    events = TurnEvents()
    # 180,000 chars of results in a 40,000-token window: past the soft ratio.
    engine.config = ContextConfig.model_validate({"models": {MODEL: {"context_tokens": 40_000}}})
    first = await engine.prepare(transcript, request, events)
    assert events.prunes == 1
    prunes = [e for e in transcript.entries() if e.payload.get("custom_type") == PRUNE_CUSTOM_TYPE]
    assert len(prunes) == 1
    second = await engine.prepare(transcript, request, events)
    assert events.prunes == 1  # nothing new to decide: the same view, byte for byte
    assert [m.to_dict() for m in second.messages] == [m.to_dict() for m in first.messages]
    # The current tool loop (results after the oldest of the newest three assistant
    # messages) keeps its result whole; the older ones were soft-trimmed to a head and
    # a tail within the window's share (2% of 160,000 characters).
    results = [b for m in second.messages if m.role == "tool_result" for b in m.content]
    assert len(results) == 6
    assert len(results[-1].content) > 20_000
    assert all(len(b.content) <= 3_200 for b in results[:-1])


async def test_manual_compact_with_focus_reaches_the_summariser(
    tmp_path: Path, transcript: Transcript
) -> None:
    seen: list[str] = []

    def summary(request: ProviderRequest) -> ProviderResponse:
        seen.append(request.messages[-1].text)
        return good_summary(request)

    router = Router(summary=summary)
    runner, _ = make(tmp_path, router, small_window())
    seed(transcript, 10)
    outcome, events = await runner.engine.compact_now(
        transcript, ViewRequest("k", "s", (), MODEL), focus="the order numbers"
    )
    assert outcome.compacted
    assert outcome.describe().startswith("Compacted (")
    assert any("the order numbers" in prompt for prompt in seen)
    assert [f.trigger for f in events.flushes] == ["manual"]
    assert FLUSH_PROMPT.split("]")[0] + "]" == "[memory flush]"


async def test_a_message_that_never_fit_does_not_block_the_next_one(
    tmp_path: Path, transcript: Transcript
) -> None:
    router = Router()
    runner, _ = make(tmp_path, router, small_window(enabled=False))
    huge = "lorem ipsum dolor " * 20_000  # far beyond the 10,000-token window
    with pytest.raises(ContextBudgetError) as caught:
        await runner.run_turn(transcript, TurnRequest("k", huge))
    assert caught.value.used is not None and caught.value.limit is not None
    assert caught.value.used > caught.value.limit
    assert router.calls["main"] == 0  # refused before sending
    # The failed message merges into the next user turn; it is left out, not resent.
    result = await runner.run_turn(transcript, TurnRequest("k", "a short question"))
    assert result.reply == "echo: a short question"
    sent = router.main_requests[-1].messages[-1].text
    assert "did not fit the context window" in sent and "lorem ipsum" not in sent
    # The transcript still holds the huge message: nothing was lost.
    assert any(huge in e.message.text for e in transcript.entries() if e.type == "message")


async def test_overflow_whose_flush_cannot_fit_is_recorded_not_lost(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 4)
    limit = 12_000

    def strict(request: ProviderRequest) -> ProviderResponse:
        size = default_counter().request(request.system, request.messages, request.tools)
        raise ContextOverflowError(
            f"prompt is too long: {size} tokens > {limit} maximum",
            provider="scripted",
            observed_tokens=size,
            limit=limit,
        )

    router = Router(main=strict)
    runner, _ = make(tmp_path, router, ContextConfig())
    # Fits the configured 200,000 window, not the provider's real 12,000.
    with pytest.raises(ContextBudgetError):
        await runner.run_turn(transcript, TurnRequest("k", "lorem ipsum dolor " * 8_000))
    entries = list(transcript.entries())
    errors = [e for e in entries if e.payload.get("custom_type") == "turn_error"]
    assert [e.payload["data"]["kind"] for e in errors] == ["ContextBudgetError"]
    # The flush could not be given a view that fits: it was skipped, not sent oversized.
    assert router.calls["flush"] == 0
