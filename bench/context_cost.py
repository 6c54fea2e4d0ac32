"""What a long conversation costs: parley's context engine against a naive baseline.

One seeded 300-turn conversation with tool calls (results from a few bytes to 1 MB,
some failing) and pauses (most under the 5-minute cache TTL, some longer) is replayed
twice, each against its own fake Messages API on 127.0.0.1 with a 200,000-token
window, prompt caching accounted as the real service does and a virtual clock:

- parley: the real runner, context engine and Anthropic provider (real SDK);
- naive: full history, no pruning, no cache breakpoints, the oldest turns dropped
  when the API answers "prompt is too long". It gets the same 40,000-character tool
  result cap at ingest (without one it could never send a 1 MB result at all).

Identifiers are planted in the first turns and looked for in the final request.
The summariser and the memory flush are answered by the fake (a summary that keeps
only what is near its end, like a model that skims: the ledger must do the rest).

Prints one JSON object (see the issue): turns, overflow_errors, max_request_tokens,
window, compactions, billed_input_tokens, cache_read_share, naive_billed_input_tokens,
cost_ratio (cache reads at 10%, writes at 125%), identifiers_planted/recalled, plus
the naive run's own figures and the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anthropic
from anthropic.types import (
    ContentBlock,
    ContentBlockParam,
    MessageParam,
    ToolParam,
    ToolResultBlockParam,
)

from parley.core.agent_config import AgentConfig
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT
from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine
from parley.core.context.flush import FLUSH_PROMPT, FlushTarget
from parley.core.errors import ToolError
from parley.core.memory.audience import Audience
from parley.core.memory.notes import NoteStore
from parley.core.messages import ToolUseBlock
from parley.core.prompt import SystemPromptBuilder, render_turn_context
from parley.core.providers.anthropic import AnthropicProvider
from parley.core.providers.provider_config import RetryConfig
from parley.core.runner import Runner, TurnRequest
from parley.core.tools.tool_registry import Tool, ToolContext, ToolRegistry
from parley.core.transcript import ENTRY_COMPACTION, Transcript
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.llm_common import Reply, ToolCall

WINDOW = 200_000
MODEL = "claude-sonnet-5-5"
MAX_OUTPUT = 4_096
TOOL_CAP = 40_000
MIN_CACHE_TOKENS = 1_024  # Sonnet's minimum cacheable prompt
PLANTED = (
    "ORD-88123",
    "3f2c9a1e-7b4d-4c2a-9e8f-1a2b3c4d5e6f",
    "https://git.example.com/acme/billing/pull/4711",
    "/srv/data/exports/2026-q3/ledger.csv",
    "db-replica-2.internal:5433",
    "a94f3c1d9b0e",
)
FETCH_RE = re.compile(r"fetch dataset (\d+) \(size (\d+)(, failing)?\)")
WORDS = (
    *("budget", "meeting", "schedule", "invoice", "garden", "recipe", "travel", "train"),
    *("ticket", "hotel", "report", "draft", "review", "deadline", "weekend", "family"),
    *("dinner", "project", "release", "plan", "backup", "server", "upgrade", "question"),
    *("answer", "idea", "note", "reminder", "list", "shopping", "book", "film", "music"),
)


class VirtualClock:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.start = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds)


@dataclass(frozen=True, slots=True)
class Turn:
    text: str
    pause_seconds: float


def make_conversation(turns: int, seed: int) -> list[Turn]:
    rng = random.Random(seed)
    out: list[Turn] = []
    sizes = (10, 200, 2_000, 20_000, 60_000, 200_000, 1_000_000)
    weights = (20, 25, 20, 15, 10, 6, 4)
    for n in range(turns):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 120)))
        if n < len(PLANTED):
            text = f"Please remember {PLANTED[n]} for later. {words}"
        elif rng.random() < 0.3:
            size = rng.choices(sizes, weights)[0]
            failing = ", failing" if rng.random() < 0.15 else ""
            text = f"Could you fetch dataset {n} (size {size}{failing}) and tell me? {words}"
        else:
            text = f"{words}?"
        pause = rng.uniform(15, 150) if rng.random() < 0.9 else rng.uniform(400, 3_600)
        out.append(Turn(text, pause))
    return out


def dataset(number: int, size: int) -> str:
    line = f"row {number:06d}: value=" + "x" * 40 + "\n"
    body = (line * (size // len(line) + 1))[:size]
    return body + f"\ntotal rows: {size // len(line)}"


async def fetch_data(args: dict[str, Any], _: ToolContext) -> str:
    if args.get("failing"):
        raise ToolError(
            f"Traceback (most recent call last):\n  ...\nIOError: dataset {args['dataset']} "
            "is locked (exit code 3)"
        )
    return dataset(int(args["dataset"]), int(args["size"]))


FETCH_SCHEMA = {
    "type": "object",
    "properties": {
        "dataset": {"type": "integer"},
        "size": {"type": "integer"},
        "failing": {"type": "boolean"},
    },
    "required": ["dataset", "size"],
}


def registry() -> ToolRegistry:
    tools = ToolRegistry(max_result_chars=TOOL_CAP)
    tools.register(Tool("fetch_data", "Fetch a dataset by number.", FETCH_SCHEMA, fetch_data))
    return tools


def _text_of(block: Any) -> str:
    if isinstance(block, dict):
        if block.get("type") == "text":
            return str(block.get("text", ""))
        if block.get("type") == "tool_result":
            content = block.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _system_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    if isinstance(system, list):
        return "".join(_text_of(b) for b in system)
    return str(system or "")


def responder(body: dict[str, Any]) -> Reply:
    """The model: summaries, flush notes, tool calls on request, short answers."""
    last = body["messages"][-1]
    blocks = (
        last["content"]
        if isinstance(last["content"], list)
        else [{"type": "text", "text": last["content"]}]
    )
    said = " ".join(_text_of(b) for b in blocks)
    if _system_text(body) == SUMMARY_SYSTEM_PROMPT:
        # A skimming summariser: it keeps only the end of what it was shown.
        tail = said[-1_500:].replace("\n", " ")
        return Reply(
            "## Decisions\n- keep going as discussed\n## Open TODOs\n- none\n"
            f"## Constraints/Rules\n- none\n## Pending user asks\n- {tail[:600]}\n"
            "## Exact identifiers\n- see the ledger"
        )
    if said.startswith(FLUSH_PROMPT[:14]):
        return Reply("- the user keeps asking about datasets and budgets")
    if last["role"] == "user" and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks
    ):
        return Reply("I looked at the result: " + said[:200].replace("\n", " "))
    match = FETCH_RE.search(said)
    if match:
        args = {"dataset": int(match.group(1)), "size": int(match.group(2))}
        if match.group(3):
            args["failing"] = True
        return Reply("Fetching it now.", tool_calls=(ToolCall("fetch_data", args),))
    # Answers of 150-450 words, as assistants write: the history outgrows pruning.
    rng = random.Random(len(said) * 7919 + len(body["messages"]))
    answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 450)))
    return Reply("Sure. " + " ".join(said.split()[:40]) + "\n\n" + answer)


@dataclass(slots=True)
class RunStats:
    overflow_errors: int = 0
    max_request_tokens: int = 0
    compactions: int = 0
    billed_input_tokens: float = 0.0
    cache_read_share: float = 0.0
    requests: int = 0
    final_body: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def collect(fake: FakeAnthropic, stats: RunStats) -> None:
    bodies = fake.requests_bodies
    stats.requests = len(bodies)
    stats.overflow_errors = len(bodies) - fake.billing.requests
    stats.max_request_tokens = max(
        (
            u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
            for u in fake.usages
        ),
        default=0,
    )
    stats.billed_input_tokens = fake.billing.weighted_input()
    stats.cache_read_share = fake.billing.cache_read_share
    main = [b for b in bodies if _system_text(b) != SUMMARY_SYSTEM_PROMPT]
    stats.final_body = json.dumps(main[-1], ensure_ascii=False) if main else ""


def bench_runner(
    provider: Any,
    engine: ContextEngine,
    tools: ToolRegistry,
    workspace: Path,
    retry: RetryConfig,
    clock: VirtualClock,
    max_output: int,
) -> Runner:
    """The runner both context benches drive: the real prompt builder and tools, the
    engine and clock they set up."""
    return Runner(
        provider=provider,
        tools=tools,
        prompt=SystemPromptBuilder(workspace, agent_name="Parley", tools=tools.specs()),
        agent=AgentConfig(max_output_tokens=max_output, tool_result_max_chars=TOOL_CAP),
        retry=retry,
        workspace=workspace,
        now=clock.now,
        engine=engine,
    )


async def run_parley(conversation: list[Turn], home: Path) -> RunStats:
    clock = VirtualClock()
    stats = RunStats()
    async with FakeAnthropic(
        context_window=WINDOW, min_cache_tokens=MIN_CACHE_TOKENS, clock=clock.monotonic
    ) as fake:
        fake.responder = responder
        provider = AnthropicProvider(
            model=MODEL, api_key=fake.api_key, base_url=fake.base_url, timeout=60
        )
        workspace = home / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        tools = registry()
        config = ContextConfig.model_validate({"models": {MODEL: {"context_tokens": WINDOW}}})
        retry = RetryConfig(max_attempts=2, base_delay_seconds=0, max_delay_seconds=0)
        engine = ContextEngine(
            config=config,
            provider=provider,
            retry=retry,
            max_output=MAX_OUTPUT,
            # Flushes write to Ada's private notes (the bench's one direct chat).
            flush_target=FlushTarget(
                NoteStore(home / "notes"), lambda _header: Audience.person("ada")
            ),
            checkpoints_dir=home / "checkpoints",
            now=clock.now,
        )
        runner = bench_runner(provider, engine, tools, workspace, retry, clock, MAX_OUTPUT)
        transcript = Transcript.create(home / "bench.jsonl", "bench", "agent:main:bench")
        try:
            for turn in conversation:
                context = render_turn_context(
                    now=clock.now(),
                    channel="bench",
                    chat_type="direct",
                    sender_name="Ada",
                    sender_id="ada",
                )
                await runner.run_turn(
                    transcript, TurnRequest("agent:main:bench", turn.text, context_text=context)
                )
                clock.seconds += turn.pause_seconds
            stats.compactions = sum(1 for e in transcript.entries() if e.type == ENTRY_COMPACTION)
            stats.extra["prunes"] = sum(
                1 for e in transcript.entries() if e.custom_type == "context_prune"
            )
            stats.extra["flushes"] = sum(
                1 for e in transcript.entries() if e.custom_type == "memory_flush"
            )
        finally:
            transcript.close()
            await provider.aclose()
        collect(fake, stats)
    return stats


async def run_naive(conversation: list[Turn], system: str) -> RunStats:
    clock = VirtualClock()
    stats = RunStats()
    tools = registry()
    wire_tools: list[ToolParam] = [
        {"name": s.name, "description": s.description, "input_schema": s.input_schema}
        for s in tools.specs()
    ]
    async with FakeAnthropic(
        context_window=WINDOW, min_cache_tokens=MIN_CACHE_TOKENS, clock=clock.monotonic
    ) as fake:
        fake.responder = responder
        client = anthropic.AsyncAnthropic(
            api_key=fake.api_key, base_url=fake.base_url, max_retries=0
        )
        history: list[MessageParam] = []
        context = ToolContext(workspace=Path("."), session_key="naive")
        try:
            for turn in conversation:
                history.append({"role": "user", "content": [{"type": "text", "text": turn.text}]})
                while True:
                    try:
                        reply = await client.messages.create(
                            model=MODEL,
                            max_tokens=MAX_OUTPUT,
                            system=system,
                            tools=wire_tools,
                            messages=history,
                        )
                    except anthropic.BadRequestError as exc:
                        overflow = "too long" in str(exc) or "exceed context limit" in str(exc)
                        if not overflow or not _drop_oldest_turn(history):
                            raise
                        continue
                    content = [_sent_back(b) for b in reply.content]
                    history.append({"role": "assistant", "content": content})
                    uses = [b for b in reply.content if b.type == "tool_use"]
                    if not uses:
                        break
                    results: list[ToolResultBlockParam] = []
                    for use in uses:
                        block = await tools.run(ToolUseBlock(use.id, use.name, use.input), context)
                        results.append(
                            {
                                "type": "tool_result",
                                "tool_use_id": block.tool_use_id,
                                "content": block.content,
                                "is_error": block.is_error,
                            }
                        )
                    history.append({"role": "user", "content": results})
                clock.seconds += turn.pause_seconds
        finally:
            await client.close()
        collect(fake, stats)
    return stats


def _sent_back(block: ContentBlock) -> ContentBlockParam:
    """A block of the model's answer as the next request carries it: the SDK's own dump
    of the block (None fields left out), the request's shape of that block. The SDK
    types a dump as ``dict[str, Any]``, hence the cast."""
    return cast("ContentBlockParam", block.model_dump(exclude_none=True))


def _opens_turn(message: MessageParam) -> bool:
    """A user message with text: a turn's start (tool results come without)."""
    content = message["content"]
    return message["role"] == "user" and (
        isinstance(content, str)
        or any(not isinstance(b, anthropic.BaseModel) and b.get("type") == "text" for b in content)
    )


def _drop_oldest_turn(history: list[MessageParam]) -> bool:
    """Drop the oldest user turn (and what answered it); False when only one is left."""
    starts = [i for i, m in enumerate(history) if _opens_turn(m)]
    if len(starts) < 2:
        return False
    del history[: starts[1]]
    return True


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    conversation = make_conversation(args.turns, args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        parley = await run_parley(conversation, home)
        parley_seconds = time.perf_counter() - started
        system = (
            SystemPromptBuilder(home / "workspace", agent_name="Parley", tools=registry().specs())
            .build()
            .text
        )
        naive = await run_naive(conversation, system)
    recalled = sum(1 for ident in PLANTED if ident in parley.final_body)
    naive_recalled = sum(1 for ident in PLANTED if ident in naive.final_body)
    result = {
        "turns": args.turns,
        "overflow_errors": parley.overflow_errors,
        "max_request_tokens": parley.max_request_tokens,
        "window": WINDOW,
        "compactions": parley.compactions,
        "billed_input_tokens": round(parley.billed_input_tokens),
        "cache_read_share": round(parley.cache_read_share, 4),
        "naive_billed_input_tokens": round(naive.billed_input_tokens),
        "cost_ratio": round(parley.billed_input_tokens / naive.billed_input_tokens, 4),
        "identifiers_planted": len(PLANTED),
        "identifiers_recalled": recalled,
        "prunes": parley.extra.get("prunes", 0),
        "flushes": parley.extra.get("flushes", 0),
        "requests": parley.requests,
        "naive_requests": naive.requests,
        "naive_overflow_errors": naive.overflow_errors,
        "naive_max_request_tokens": naive.max_request_tokens,
        "naive_identifiers_recalled": naive_recalled,
        "seed": args.seed,
        "parley_seconds": round(parley_seconds, 1),
        "total_seconds": round(time.perf_counter() - started, 1),
        "machine": (
            f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
