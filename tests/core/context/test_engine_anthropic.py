"""The context engine end to end: the runner, the real ``AnthropicProvider`` (real SDK)
and the fake Messages API enforcing a window and accounting the prompt cache.

Where ``test_engine`` checks the same scenarios at the provider seam, these
tests check what the wire sees: the fake counts every request with its own
deterministic estimate (not the engine's tokenizer), refuses an oversized one with the
real 400 "prompt is too long: N tokens > M maximum", and bills cache reads and writes.
The fake's ``responder`` answers the summariser (by its system prompt) and the memory
flush (by its prompt); every other call is echoed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from parley.core.agent_config import AgentConfig
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT
from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine, PreparedView, TurnEvents, ViewRequest
from parley.core.context.flush import FLUSH_CUSTOM_TYPE, FlushTarget
from parley.core.context.history import COMPACTION_SUMMARY_PREFIX
from parley.core.errors import ContextOverflowError
from parley.core.memory.audience import Audience
from parley.core.memory.notes import NoteStore
from parley.core.messages import Message, Usage
from parley.core.prompt import SystemPrompt, SystemPromptBuilder
from parley.core.providers.anthropic import AnthropicProvider
from parley.core.providers.provider_config import RetryConfig
from parley.core.runner import Runner, TurnRequest, TurnResult
from parley.core.tools.builtin import default_registry
from parley.core.transcript import ENTRY_COMPACTION, Transcript
from tests.fakes.anthropic_api import FakeAnthropic, prompt_segments, prompt_tokens
from tests.fakes.llm_common import HttpError, Reply, Step, estimate_tokens

MODEL = "claude-test-model"  # not in the SDK's deprecation table
KEY = "sk-test"
MAX_OUTPUT = 1_000
# Short enough that a broken stream fails fast, long enough for a loaded machine.
TIMEOUT_SECONDS = 5.0
FLUSH_MARK = "[memory flush]"
# The audience every session's flushes write to (its private notes).
ALICE = Audience.person("alice")
IDS = (
    "ORD-88123",
    "3f2c9a1e-7b4d-4c2a-9e8f-1a2b3c4d5e6f",
    "https://example.com/tickets/4711",
    "/srv/data/reports/q3.csv",
    "db.internal:5432",
)
# About 300 tokens of varied prose (a repeated word would tokenise unrealistically well).
FILLER = (
    "We went through the quarterly numbers again, compared the regional spreadsheets, "
    "argued about whether the marketing budget should move to the spring campaign, and "
    "agreed that the onboarding flow needs another round of user interviews before the "
    "design team commits to the new layout. "
) * 5

SummaryFn = Callable[[str], Step]


# -- what the fake answers -----------------------------------------------------------------


def _texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content or [] if b.get("type") == "text"]


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    if isinstance(system, str):
        return system
    return "".join(b.get("text", "") for b in system or [])


def last_text(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    texts = _texts(messages[-1]) if messages else []
    return texts[-1] if texts else ""


def is_summary(body: dict[str, Any]) -> bool:
    return system_text(body) == SUMMARY_SYSTEM_PROMPT


def is_flush(body: dict[str, Any]) -> bool:
    return last_text(body).startswith(FLUSH_MARK)


def is_main(body: dict[str, Any]) -> bool:
    return not is_summary(body) and not is_flush(body)


def good_summary(prompt: str) -> Step:
    """A well-behaved summariser: the five headings, every identifier it was shown."""
    kept = "\n".join(f"- {i}" for i in IDS if i in prompt) or "- none"
    return Reply(
        "## Decisions\n- review the onboarding flow\n## Open TODOs\n- none\n"
        "## Constraints/Rules\n- none\n## Pending user asks\n- none\n"
        f"## Exact identifiers\n{kept}"
    )


def forgetful_summary(_: str) -> Step:
    """A summariser that drops every identifier, however often it is asked."""
    return Reply(
        "## Decisions\n- talked about budgets\n## Open TODOs\n- none\n"
        "## Constraints/Rules\n- none\n## Pending user asks\n- none\n## Exact identifiers\n- none"
    )


def failing_summary(_: str) -> Step:
    return HttpError(500, "api_error", "Internal server error")


@dataclass
class Router:
    """The fake's responder: summaries and flushes by content, None (echo) otherwise."""

    summary: SummaryFn = good_summary
    calls: dict[str, int] = field(default_factory=lambda: {"summary": 0, "flush": 0, "main": 0})

    def __call__(self, body: dict[str, Any]) -> Step | None:
        if is_summary(body):
            self.calls["summary"] += 1
            return self.summary(last_text(body))
        if is_flush(body):
            self.calls["flush"] += 1
            return Reply("- the user reviews budgets quarterly")
        self.calls["main"] += 1
        return None


# -- the stack ---------------------------------------------------------------------------


def window_config(tokens: int, **compaction: object) -> ContextConfig:
    """The model's window as the engine believes it (small windows on purpose: no warning)."""
    return ContextConfig.model_validate(
        {
            "models": {MODEL: {"context_tokens": tokens}},
            "warn_below_tokens": 0,
            # These tests are about the token guard over the whole live window, not
            # the view's derived message limit (tested in compaction/test_triggers.py).
            "history_messages": -1,
            "compaction": compaction,
        }
    )


@dataclass
class Stack:
    fake: FakeAnthropic
    router: Router
    runner: Runner
    provider: AnthropicProvider
    workspace: Path
    notes: NoteStore

    @property
    def engine(self) -> ContextEngine:
        return self.runner.engine

    def bodies(self, start: int = 0) -> list[dict[str, Any]]:
        return [b for b in self.fake.requests_bodies[start:] if isinstance(b, dict)]

    def main_bodies(self, start: int = 0) -> list[dict[str, Any]]:
        return [b for b in self.bodies(start) if is_main(b)]

    async def turn(self, transcript: Transcript, text: str) -> TurnResult:
        return await self.runner.run_turn(transcript, TurnRequest("k", text))

    def view_request(self, prompt: SystemPrompt) -> ViewRequest:
        """What the runner would ask the engine for (for ``compact_now``)."""
        return ViewRequest("k", prompt.text, tuple(self.runner.tools.specs()), MODEL)


class VirtualClock:
    """The fake's cache clock, frozen: no cache entry expires however slow the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(api_key=KEY, clock=VirtualClock()) as server:
        yield server


@pytest.fixture
async def stack_factory(fake: FakeAnthropic, tmp_path: Path) -> AsyncIterator[Callable[..., Stack]]:
    providers: list[AnthropicProvider] = []

    def build(config: ContextConfig, summary: SummaryFn = good_summary) -> Stack:
        router = Router(summary)
        fake.responder = router
        provider = AnthropicProvider(MODEL, KEY, base_url=fake.base_url, timeout=TIMEOUT_SECONDS)
        providers.append(provider)
        tools = default_registry(10_000)
        workspace = tmp_path / "ws"
        workspace.mkdir(exist_ok=True)
        notes = NoteStore(tmp_path / "private" / "notes")
        fixed = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
        engine = ContextEngine(
            config=config,
            provider=provider,
            retry=RetryConfig(max_attempts=2, base_delay_seconds=0, max_delay_seconds=0),
            max_output=MAX_OUTPUT,
            flush_target=FlushTarget(notes, lambda _header: ALICE),
            checkpoints_dir=tmp_path / "checkpoints",
            now=lambda: fixed,
        )
        runner = Runner(
            provider=provider,
            tools=tools,
            prompt=SystemPromptBuilder(workspace, agent_name="T", tools=tools.specs()),
            agent=AgentConfig(max_output_tokens=MAX_OUTPUT),
            retry=RetryConfig(max_attempts=1, base_delay_seconds=0, max_delay_seconds=0),
            workspace=workspace,
            now=lambda: fixed,
            engine=engine,
        )
        return Stack(fake, router, runner, provider, workspace, notes)

    yield build
    for provider in providers:
        await provider.aclose()


@pytest.fixture
def transcript(tmp_path: Path) -> Iterator[Transcript]:
    with Transcript.create(tmp_path / "s.jsonl", "sid", "agent:main:x") as opened:
        yield opened


def said(n: int, *, plant: bool = True) -> str:
    if plant and n < len(IDS):
        return f"turn {n}: please keep {IDS[n]} in mind. {FILLER}"
    return f"turn {n}: {FILLER}"


def seed(transcript: Transcript, turns: int) -> None:
    """``turns`` user/assistant pairs written straight to the transcript."""
    for n in range(turns):
        transcript.append_message(Message.user(said(n)))
        transcript.append_message(Message.assistant(f"noted {n}"), usage=Usage(50, 5))


def assert_all_fit(bodies: list[dict[str, Any]], window: int) -> None:
    """Every request the fake saw fits its window, output included (no 400 was earned)."""
    for index, body in enumerate(bodies):
        size = prompt_tokens(body)
        assert size + body["max_tokens"] <= window, (index, size, body["max_tokens"])


def first_text(body: dict[str, Any]) -> str:
    return _texts(body["messages"][0])[0]


def compactions(transcript: Transcript) -> list[Any]:
    return [e for e in transcript.entries() if e.type == ENTRY_COMPACTION]


def flushes(transcript: Transcript) -> list[Any]:
    return [e for e in transcript.entries() if e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE]


# -- the guard -----------------------------------------------------------------------------


async def test_long_conversation_is_compacted_before_the_window_overflows(
    fake: FakeAnthropic, stack_factory: Callable[..., Stack], transcript: Transcript
) -> None:
    fake.context_window = 30_000
    stack = stack_factory(window_config(30_000))
    compacted_turns = 0
    for n in range(80):
        start = len(fake.requests_bodies)
        result = await stack.turn(transcript, said(n))
        assert result.reply.startswith(f"echo: turn {n}:")
        if result.compactions:
            compacted_turns += 1
            # The request made after the compaction starts with the summary.
            main = stack.main_bodies(start)
            assert first_text(main[-1]).startswith(COMPACTION_SUMMARY_PREFIX)
    assert_all_fit(stack.bodies(), 30_000)
    entries = compactions(transcript)
    assert entries and compacted_turns == len(entries)
    assert all(e.payload["trigger"] == "threshold" for e in entries)
    # Each compaction cycle flushed once before compacting.
    assert stack.router.calls["flush"] >= len(entries)
    assert stack.router.calls["main"] == 80
    final = stack.main_bodies()[-1]
    assert first_text(final).startswith(COMPACTION_SUMMARY_PREFIX)
    for identifier in IDS:
        assert identifier in first_text(final)


class OverflowSpy:
    """Wraps ``engine.recover_overflow`` to keep the errors the runner handed it."""

    def __init__(self, engine: ContextEngine) -> None:
        self.errors: list[ContextOverflowError] = []
        self._recover = engine.recover_overflow
        engine.recover_overflow = self  # type: ignore[method-assign]

    async def __call__(
        self,
        transcript: Transcript,
        request: ViewRequest,
        view: PreparedView,
        exc: ContextOverflowError,
        events: TurnEvents,
    ) -> None:
        self.errors.append(exc)
        await self._recover(transcript, request, view, exc, events)


def restore(tmp_path: Path, turns: int) -> Transcript:
    """A session written by an earlier process, reopened from disk."""
    path = tmp_path / "restored.jsonl"
    with Transcript.create(path, "sid", "agent:main:x") as first:
        seed(first, turns)
    return Transcript.open(path)


@pytest.mark.parametrize("keep_recent_tokens", [4_000, 20_000], ids=["keep-4k", "keep-default"])
async def test_restored_session_overflow_is_parsed_compacted_and_retried(
    fake: FakeAnthropic,
    stack_factory: Callable[..., Stack],
    tmp_path: Path,
    keep_recent_tokens: int,
) -> None:
    restored = restore(tmp_path, 80)
    fake.context_window = 20_000
    # The config believes in a 200,000 window: only the service knows better. With the
    # default keep_recent_tokens the kept part alone would fill the real window.
    config = window_config(200_000, keep_recent_tokens=keep_recent_tokens)
    stack = stack_factory(config)
    spy = OverflowSpy(stack.engine)
    result = await stack.turn(restored, "hello again")

    assert result.reply == "echo: hello again"
    # The first call was refused with the service's real wording; the numbers were read.
    observed = prompt_tokens(stack.main_bodies()[0])
    assert observed > 20_000
    assert len(spy.errors) == 1
    error = spy.errors[0]
    assert error.status == 400
    assert error.message == f"prompt is too long: {observed} tokens > 20000 maximum"
    assert (error.observed_tokens, error.limit) == (observed, 20_000)
    # The engine calibrated on the error's count: its tokenizer undercounts this service.
    assert stack.engine.calibration.ratio("anthropic", MODEL) > 1.0
    # A flush, then a compaction, both caused by the overflow, in that order.
    events = [
        (e.type, e.payload.get("trigger") or e.payload["data"]["trigger"])
        for e in restored.entries()
        if e.type == ENTRY_COMPACTION or e.payload.get("custom_type") == FLUSH_CUSTOM_TYPE
    ]
    assert events[:2] == [("custom", "overflow"), (ENTRY_COMPACTION, "overflow")]
    assert [t for k, t in events if k == ENTRY_COMPACTION] == ["overflow"]
    # Once the service said how big its window is, nothing else was sent oversized:
    # the flush saved its notes and the summariser's chunks fit.
    assert_all_fit(stack.bodies(1), 20_000)
    assert {f.payload["data"]["status"] for f in flushes(restored)} == {"written"}
    note = stack.notes.folder(ALICE) / "2025-03-14.md"
    assert "## 09:30 — saved before compaction\n" in note.read_text()
    assert not (stack.workspace / "memory").exists()
    # One refused main call; the retry that answered starts with the summary.
    mains = stack.main_bodies()
    assert len(mains) == 2
    assert first_text(mains[-1]).startswith(COMPACTION_SUMMARY_PREFIX)
    assert last_text(mains[-1]) == "hello again"
    # The session now plans against the real window: later turns do not overflow again.
    for n in range(6):
        await stack.turn(restored, said(100 + n, plant=False))
    assert len(spy.errors) == 1
    assert_all_fit(stack.bodies(1), 20_000)
    restored.close()


# -- prompt caching --------------------------------------------------------------------------


def prefix_tokens(body: dict[str, Any]) -> int:
    """Tokens of the tools and system blocks: the part no compaction changes."""
    segments, _ = prompt_segments(body)
    size = 0
    for segment in segments:
        if isinstance(segment, dict) and segment.keys() == {"role"}:
            break
        size += estimate_tokens(segment)
    return size


async def test_prompt_cache_is_read_across_turns_and_rewritten_after_compaction(
    fake: FakeAnthropic, stack_factory: Callable[..., Stack], transcript: Transcript
) -> None:
    fake.context_window = 60_000
    stack = stack_factory(window_config(60_000, keep_recent_tokens=200, keep_recent_turns=2))
    previous: dict[str, Any] | None = None
    for n in range(10):
        result = await stack.turn(transcript, f"short question {n}: how are the numbers?")
        body = stack.main_bodies()[-1]
        usage = fake.last_usage
        assert usage is not None
        # What the provider reports is what the service billed.
        assert result.usage.cache_read_tokens == usage["cache_read_input_tokens"]
        assert result.usage.cache_write_tokens == usage["cache_creation_input_tokens"]
        if previous is not None:
            # Byte-stable prefix: the whole previous prompt is read back.
            assert usage["cache_read_input_tokens"] == prompt_tokens(previous)
        previous = body
    assert stack.router.calls == {"summary": 0, "flush": 0, "main": 10}
    assert fake.billing.cache_read_share > 0.6

    request = stack.view_request(await asyncio.to_thread(stack.runner.prompt.build))
    outcome, _ = await stack.engine.compact_now(transcript, request)
    assert outcome.compacted, outcome.describe()

    await stack.turn(transcript, "after the compaction?")
    after = stack.main_bodies()[-1]
    usage = fake.last_usage
    assert usage is not None and first_text(after).startswith(COMPACTION_SUMMARY_PREFIX)
    # Tools and system are still cached; the new history (summary on) is written again.
    assert usage["cache_read_input_tokens"] == prefix_tokens(after)
    assert usage["cache_creation_input_tokens"] == prompt_tokens(after) - prefix_tokens(after)

    await stack.turn(transcript, "and the turn after that?")
    usage = fake.last_usage
    assert usage is not None
    assert usage["cache_read_input_tokens"] == prompt_tokens(after)


# -- summariser failures -------------------------------------------------------------------


async def test_summariser_that_always_fails_still_answers_within_the_window(
    fake: FakeAnthropic, stack_factory: Callable[..., Stack], transcript: Transcript
) -> None:
    seed(transcript, 100)  # well over the window: something has to give
    before = [e.id for e in transcript.entries()]
    fake.context_window = 30_000
    stack = stack_factory(window_config(30_000), summary=failing_summary)
    for n in range(2):
        result = await stack.turn(transcript, f"still there {n}?")
        assert result.reply == f"echo: still there {n}?"
    # The summariser's retries failed, so the sliding window made the one entry.
    made = compactions(transcript)
    assert len(made) == 1
    assert made[0].payload["details"]["strategy"] == "sliding-window"
    assert made[0].payload["details"]["fallbacks"]
    # Nothing lost: every earlier entry is still in the file, in order.
    assert [e.id for e in transcript.entries()][: len(before)] == before
    bodies = stack.bodies()
    first_main = next(i for i, b in enumerate(bodies) if is_main(b))
    assert_all_fit(bodies[first_main:], 30_000)
    last = stack.main_bodies()[-1]
    assert last_text(last) == "still there 1?"
    assert first_text(last).startswith(COMPACTION_SUMMARY_PREFIX)
    assert stack.router.calls["main"] == 2
    # One compaction: the first attempt plus summary_retries retries, no more.
    retries = ContextConfig().compaction.summary_retries
    assert stack.router.calls["summary"] == retries + 1


async def test_ten_compactions_keep_the_first_identifiers_in_the_request(
    fake: FakeAnthropic, stack_factory: Callable[..., Stack], transcript: Transcript
) -> None:
    # A roomy window: the only compactions are the ten asked for.
    fake.context_window = 60_000
    stack = stack_factory(window_config(60_000), summary=forgetful_summary)
    for n in range(8):
        await stack.turn(transcript, said(n))
    request = stack.view_request(await asyncio.to_thread(stack.runner.prompt.build))
    for round_ in range(10):
        outcome, _ = await stack.engine.compact_now(transcript, request)
        assert outcome.compacted, (round_, outcome.describe())
        for n in range(4):
            await stack.turn(transcript, f"round {round_} chat {n}: {FILLER}")
    entries = compactions(transcript)
    assert len(entries) == 10
    # The first fold saw the identifiers, asked again for them, and got nothing.
    assert entries[0].payload["details"]["regenerated"] is True
    await stack.turn(transcript, "what were the identifiers?")
    final = stack.main_bodies()[-1]
    assert first_text(final).startswith(COMPACTION_SUMMARY_PREFIX)
    sent = json.dumps(final, ensure_ascii=False)
    for identifier in IDS:
        assert identifier in sent
    # The kept turns no longer mention them: only the ledger carried them this far.
    assert not any(i in json.dumps(final["messages"][1:]) for i in IDS)
    assert_all_fit(stack.bodies(), 60_000)
