"""Compaction strategies and automatic recall: what survives, what gets injected (issue 9).

Part 1, strategies. Seeded synthetic conversations (``--conversations`` x ~``--messages``
messages: user requests, assistant replies, tool calls with results, chatter such as
"ok thanks", verbatim repeats) carry planted facts of five kinds:

- ``identifier``: a UUID, an order number, a URL or a path the user hands over;
- ``decision``: "We decided to use X for Y because Z.";
- ``todo``: "Remind me to ... next week." / "Please ... later.";
- ``constraint``: "... must never ..." / "... must always ...";
- ``tool_error``: a tool result with ``is_error=True`` whose text names an identifier.

Facts sit in the first ``PLANT_SHARE`` of each conversation, so every strategy has to
fold them (what stays verbatim at the end proves nothing). Each conversation is written
to a real transcript (``FileTranscriptStore``) once per strategy and compacted once by
the real ``core.context.compaction.compactor.Compactor`` with the product's
``CompactionConfig`` defaults and only ``strategy`` changed, at the threshold of a
``--window`` token model (``core.context.window.compaction_threshold``). The
summariser is the real ``Summarizer`` over a
deterministic stand-in provider (``ExtractiveProvider``): it answers every summary prompt
with the five required headings and, as bullets, the prompt's sentences that
``core.importance.text_importance`` scores >= 0.6, highest first within the call's
``max_tokens``. No network, no model.

Measured per strategy, summed over the conversations: ``tokens_before`` (the live view,
messages only: no system prompt or tools), ``tokens_after`` (the compaction outcome's:
summary message plus kept messages), ``facts_kept`` (a planted fact's needle, the
identifier or its distinctive phrase, occurs verbatim in the model's view after the
compaction: summary, ledger and kept messages, whitespace collapsed) and ``lost``
(``<conversation>:<kind>:<needle>``). ``strategy_used`` names what made the entry (a
failing strategy falls back to the sliding window; that would show here).

Part 2, automatic recall on LoCoMo (``--data``, never copied): the conversations are
written and indexed with ``gateway.cli.locomo``'s own machinery (``write_transcripts``,
``MemoryIndex.sync``), one scope each. For each scored question (categories 1-4 with
evidence turns in the conversation, as the locomo bench scores them), with the question
as the user message and nothing in the live context:

- ``memory_search``: ``MemoryIndex.search`` read in rank order within 1,500 tokens
  (``recall_within`` at a 1500 budget);
- automatic recall: ``core.memory.recall.Recaller`` in mode ``auto`` (the default; the
  rules in ``core.memory.recall_rules`` decide whether it searches) and ``always``, with
  a 1,500-token budget (the whole block, markers included).

A question counts when at least one evidence turn's whole text is inside what was read
(injected), as ``found_dia_ids`` decides. ``evidence_recall_mean`` is the mean share of
evidence turns found, the locomo bench's own measure. ``tokens_injected_p50`` is over the
questions that got a block. ``--embedder none`` (default) is keyword-only; ``--embedder
e5`` runs the real model (offline: ``HF_HUB_OFFLINE=1``).

Prints one JSON object: ``strategies``, ``auto_recall``, ``machine``, ``date`` and the
parameters of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parley.core.context.budget import context_budget
from parley.core.context.compaction.compactor import TRIGGER_THRESHOLD, CompactionOutcome, Compactor
from parley.core.context.compaction.strategies import (
    STRATEGY_HIERARCHICAL,
    STRATEGY_SELECTIVE,
    STRATEGY_SLIDING_WINDOW,
    STRATEGY_SUMMARY,
)
from parley.core.context.compaction.summarizer import REQUIRED_HEADINGS, Summarizer
from parley.core.context.config import CompactionConfig, ContextConfig
from parley.core.context.history import build_history
from parley.core.context.window import compaction_threshold
from parley.core.importance import (
    ASK,
    CONSTRAINT,
    DECISION,
    ERROR,
    IDENTIFIER,
    PREFERENCE,
    text_importance,
)
from parley.core.memory.embedders import EmbedderSettings, build_embedder
from parley.core.memory.index import MemoryIndex
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.recall import Recaller, RecallHit, RecallSearch, index_search
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse, TextCallback
from parley.core.providers.provider_config import RetryConfig
from parley.core.tokens import TokenCounter, default_counter
from parley.core.transcript_store import FileTranscriptStore
from parley.gateway.cli.locomo import (
    SCORED_CATEGORIES,
    Conversation,
    LocomoError,
    embedder_settings,
    found_dia_ids,
    load_locomo,
    percentile,
    recall_within,
    write_transcripts,
)

STRATEGIES: tuple[str, ...] = (
    STRATEGY_SUMMARY,
    STRATEGY_SELECTIVE,
    STRATEGY_HIERARCHICAL,
    STRATEGY_SLIDING_WINDOW,
)
FACT_KINDS: tuple[str, ...] = ("identifier", "decision", "todo", "constraint", "tool_error")
# Facts go into the first 70% of a conversation: the cut keeps the newest part verbatim,
# and a fact that is never folded tells nothing about a strategy.
PLANT_SHARE = 0.7
DEFAULT_WINDOW = 32_000  # a small local model: the threshold falls well inside 300 messages
QUICK_WINDOW = 16_000  # threshold 9,600 tokens: below a 160-message conversation
DEFAULT_MAX_OUTPUT = 4_096
RECALL_BUDGET = 1_500
RECALL_MODES: tuple[Literal["auto", "always"], ...] = ("auto", "always")
DEFAULT_DATA = Path("/work/shared/data/locomo/locomo-dev.json")
# The stand-in summariser keeps sentences at least this important (open asks and up).
KEEP_SCORE = ASK
BASE_TIME = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

_SPACES = re.compile(r"\s+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_ROLE_TAG = re.compile(
    r"^\[(?:User|Assistant|Assistant tool calls|Tool result(?: \(error\))?)\]:\s*"
)
_SECTION = re.compile(
    r"<(conversation|previous-summary|partial-summaries|draft-summary)>\n(.*?)\n</\1>", re.S
)


def collapse(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- synthetic conversations --------------------------------------------------------------

TOPICS = (
    "the billing dashboard", "the onboarding emails", "the search latency", "the nightly backup",
    "the mobile release", "the API rate limits", "the on-call rotation", "the invoice export",
    "the cache warm-up", "the feature flags", "the CSV importer", "the audit log",
)  # fmt: skip
ACTIONS = (
    "summarise the open issues about", "draft a short update on", "look into",
    "compare the options for", "write release notes for", "check the status of",
)  # fmt: skip
FILLER_SENTENCES = (
    "The numbers look similar to last month overall.",
    "Most of the traffic comes from the web client.",
    "The team reviewed the draft in the weekly sync.",
    "There are a few small follow-up items in the tracker.",
    "The change went out to a small group of users first.",
    "The graphs show a steady trend across the week.",
    "The documentation covers the common cases well.",
    "A couple of customers asked about the new layout.",
)
CHATTER = ("ok thanks", "thanks!", "got it", "ok", "cool, thanks", "great")
TOOLS = ("search_docs", "read_file", "query_metrics", "list_tickets")
TECH = ("PostgreSQL", "Redis", "SQLite", "Kafka", "S3", "Celery", "gRPC", "Caddy", "Litestream")
COMPONENTS = (
    "session store", "job queue", "report archive", "rate limiter", "search index",
    "webhook relay", "metrics pipeline", "upload service", "audit trail", "billing sync",
)  # fmt: skip
REASONS = (
    "it survives restarts", "the team already runs it", "it is cheaper at our volume",
    "it keeps the latency under budget", "backups are simpler", "it needs no extra server",
)  # fmt: skip
TODO_TASKS = (
    "renew the TLS certificate for status.{n}.example.org",
    "rotate the deploy key of the {c}",
    "send the quarterly report to Ines",
    "archive the {c} logs older than {k} days",
    "book the load test for the {c}",
    "ask legal about the data retention clause {k}",
)  # fmt: skip
CONSTRAINTS = (
    "the {c} must never run on the shared host",
    "the {c} must always be deployed behind the VPN",
    "exports from the {c} must never include email addresses",
    "the {c} must stay under {k} MB of memory",
)  # fmt: skip
ERRORS = (
    ("upload_file", "upload of {i} failed: access denied"),
    ("fetch_invoice", "invoice {i} not found in the ledger"),
    ("run_migration", "migration {i} failed: lock timeout"),
    ("deploy", "deploy of build {i} failed: health check refused"),
)


@dataclass(frozen=True, slots=True)
class PlantedFact:
    kind: str
    needle: str  # exact text that must stay in the model's view


@dataclass(slots=True)
class SyntheticConversation:
    conversation_id: str
    messages: list[Message] = field(default_factory=list)
    facts: list[PlantedFact] = field(default_factory=list)


def _identifier(rng: random.Random, n: int) -> tuple[str, str]:
    """(the identifier, how the user introduces it)."""
    kind = n % 4
    if kind == 0:
        value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return value, f"The customer account id is {value}, can you pull its history"
    if kind == 1:
        value = f"ORD-{rng.randrange(100_000, 999_999)}"
        return value, f"Order {value} never arrived, can you look it up"
    if kind == 2:
        value = f"https://tickets.example.com/browse/OPS-{rng.randrange(1000, 9999)}"
        return value, f"The incident is tracked at {value}, can you read it"
    value = f"/srv/parley/exports/{rng.choice(COMPONENTS).replace(' ', '-')}-{n}.csv"
    return value, f"The export landed in {value}, can you check it"


class _Builder:
    """Appends turns to one conversation; every id and word comes from ``rng``."""

    def __init__(self, conv: SyntheticConversation, rng: random.Random) -> None:
        self.conv = conv
        self.rng = rng
        self.calls = 0
        self.asked: list[str] = []

    def _call_id(self) -> str:
        self.calls += 1
        return f"toolu_{self.conv.conversation_id}_{self.calls:04d}"

    def _filler(self, low: int, high: int) -> str:
        return " ".join(
            self.rng.choice(FILLER_SENTENCES) for _ in range(self.rng.randint(low, high))
        )

    def say(self, role: Literal["user", "assistant"], text: str) -> None:
        self.conv.messages.append(Message(role, (TextBlock(text),)))

    def tool(self, name: str, args: dict[str, Any], result: str, *, error: bool = False) -> None:
        call_id = self._call_id()
        self.conv.messages.append(
            Message("assistant", (TextBlock("Let me check."), ToolUseBlock(call_id, name, args)))
        )
        self.conv.messages.append(
            Message("tool_result", (ToolResultBlock(call_id, result, error),))
        )

    def request(self) -> None:
        text = f"Can you {self.rng.choice(ACTIONS)} {self.rng.choice(TOPICS)}"
        self.asked.append(text)
        self.say("user", text)
        self.say("assistant", self._filler(2, 4))

    def repeat(self) -> None:
        self.say("user", self.rng.choice(self.asked) if self.asked else "hello again")
        self.say("assistant", self._filler(1, 3))

    def tool_turn(self) -> None:
        topic = self.rng.choice(TOPICS)
        self.say("user", f"Can you {self.rng.choice(ACTIONS)} {topic} using the tools")
        for _ in range(self.rng.randint(1, 2)):
            name = self.rng.choice(TOOLS)
            self.tool(name, {"query": topic}, self._filler(3, 12))
        self.say("assistant", self._filler(2, 3))

    def chatter(self) -> None:
        self.say("user", self.rng.choice(CHATTER))
        self.say("assistant", "You're welcome.")

    def plant(self, kind: str, n: int) -> None:
        rng = self.rng
        component = f"{rng.choice(COMPONENTS)} {n}"
        if kind == "identifier":
            value, text = _identifier(rng, n)
            self.say("user", text + ".")
            self.tool("lookup", {"ref": value}, f"Found 1 record for {value}. {self._filler(1, 2)}")
            self.say("assistant", self._filler(1, 2))
            needle = value
        elif kind == "decision":
            needle = f"use {rng.choice(TECH)} for the {component} because {rng.choice(REASONS)}"
            self.say("user", f"After the review we decided to {needle}.")
            self.say("assistant", "Understood, I will plan around that.")
        elif kind == "todo":
            needle = rng.choice(TODO_TASKS).format(n=n, c=component, k=rng.randint(30, 400))
            opener = "Remind me to {} next week." if n % 2 else "Please {} later, not now."
            self.say("user", opener.format(needle))
            self.say("assistant", "Noted, I will bring it up.")
        elif kind == "constraint":
            needle = rng.choice(CONSTRAINTS).format(c=component, k=rng.randint(64, 512))
            self.say("user", f"One rule for this project: {needle}.")
            self.say("assistant", "Understood.")
        else:
            name, template = rng.choice(ERRORS)
            ident = f"{name.split('_')[0].upper()}-{rng.randrange(10_000, 99_999)}"
            needle = template.format(i=ident)
            self.say("user", f"Can you run {name} for {component}")
            self.tool(name, {"target": ident}, f"Error: {needle}.", error=True)
            self.say("assistant", f"That did not work: {needle}. I will retry later.")
        self.conv.facts.append(PlantedFact(kind, needle))


def generate_conversation(
    conversation_id: str, *, messages: int, facts: int, seed: int
) -> SyntheticConversation:
    """About ``messages`` messages with ``facts`` planted facts (kinds in turn), seeded."""
    rng = random.Random(seed)
    conv = SyntheticConversation(conversation_id)
    builder = _Builder(conv, rng)
    plant_at = [int(messages * PLANT_SHARE * (k + 0.5) / facts) for k in range(facts)]
    planted = 0
    while len(conv.messages) < messages:
        if planted < facts and len(conv.messages) >= plant_at[planted]:
            builder.plant(FACT_KINDS[planted % len(FACT_KINDS)], planted)
            planted += 1
            continue
        roll = rng.random()
        if roll < 0.35:
            builder.request()
        elif roll < 0.7:
            builder.tool_turn()
        elif roll < 0.88:
            builder.chatter()
        else:
            builder.repeat()
    return conv


# -- the stand-in summariser -------------------------------------------------------------


def _heading_for(score: float) -> str:
    if score >= ERROR or score in (CONSTRAINT, PREFERENCE):
        return "## Constraints/Rules"
    if score >= DECISION:
        return "## Decisions"
    if score >= IDENTIFIER:
        return "## Exact identifiers"
    return "## Pending user asks"


def extractive_summary(prompt: str, budget_tokens: int, counter: TokenCounter) -> str:
    """The five headings with the prompt's important sentences as bullets.

    Sentences come from the conversation, previous summary, partial summaries and
    draft sections of the prompt; those scoring >= ``KEEP_SCORE`` are kept, highest
    score first and the newest first among equals, while they fit ``budget_tokens``
    (like a model with an output limit), then shown in their original order."""
    sentences: list[str] = []
    for _, body in _SECTION.findall(prompt):
        for line in body.splitlines():
            line = _ROLE_TAG.sub("", line.strip())
            if line.startswith("- "):
                line = line[2:]
            if not line or line.startswith(("#", "[Part ")) or line.lower() == "none":
                continue
            sentences.extend(s.strip() for s in _SENTENCE.split(line) if s.strip())
    unique = list(dict.fromkeys(sentences))
    scored = [(text_importance(s), n, s) for n, s in enumerate(unique)]
    chosen: list[tuple[int, float, str]] = []
    spent = 0
    for score, n, sentence in sorted(scored, key=lambda t: (-t[0], -t[1])):
        if score < KEEP_SCORE:
            break
        cost = counter.text(f"- {sentence}\n")
        if spent + cost > budget_tokens:
            continue
        spent += cost
        chosen.append((n, score, sentence))
    by_heading: dict[str, list[str]] = {h: [] for h in REQUIRED_HEADINGS}
    for _, score, sentence in sorted(chosen):
        by_heading[_heading_for(score)].append(f"- {sentence}")
    return "\n".join(
        f"{heading}\n" + ("\n".join(lines) if lines else "- none")
        for heading, lines in by_heading.items()
    )


class ExtractiveProvider:
    """A ``core.providers.base.Provider`` answering summary prompts extractively."""

    name = "bench"
    model = "extractive-summariser"

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.calls = 0

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        self.calls += 1
        prompt = request.messages[-1].text
        text = extractive_summary(prompt, request.max_tokens, self.counter)
        usage = Usage(self.counter.text(prompt), self.counter.text(text))
        if on_text is not None:
            await on_text(text)
        return ProviderResponse((TextBlock(text),), STOP_END, usage, self.model)

    async def aclose(self) -> None:
        return None


# -- part 1: strategies -------------------------------------------------------------------


def view_text(messages: Sequence[Message]) -> str:
    """Everything the model reads in ``messages``, whitespace collapsed."""
    parts: list[str] = []
    for message in messages:
        for block in message.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                parts.append(json.dumps(block.input, ensure_ascii=False))
            elif isinstance(block, ToolResultBlock):
                parts.append(block.content)
    return collapse("\n".join(parts))


@dataclass(slots=True)
class StrategyTally:
    tokens_before: int = 0
    tokens_after: int = 0
    facts_planted: int = 0
    facts_kept: int = 0
    lost: list[str] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)  # status or the strategy that folded
    summary_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "facts_planted": self.facts_planted,
            "facts_kept": self.facts_kept,
            "lost": self.lost,
            "strategy_used": sorted(set(self.outcomes)),
            "summary_calls": self.summary_calls,
        }


async def compact_once(
    conv: SyntheticConversation,
    strategy: str,
    sessions: FileTranscriptStore,
    *,
    window: int,
    max_output: int,
    counter: TokenCounter,
) -> tuple[CompactionOutcome, list[Message], int]:
    """Write ``conv`` to a fresh transcript, compact it once with ``strategy``: the
    outcome, the model's view after it and the summariser calls it made."""
    config = CompactionConfig(strategy=strategy)  # pydantic checks the name
    provider = ExtractiveProvider(counter)
    summarizer = Summarizer(
        provider,
        counter=counter,
        retry=RetryConfig(max_attempts=1, base_delay_seconds=0),
        max_output_tokens=config.summary_max_tokens,
        custom_instructions=config.custom_instructions,
    )
    compactor = Compactor(
        summarizer=summarizer,
        count=counter.entry,
        count_message=counter.message,
        count_text=counter.text,
        config=config,
    )
    session_id = f"{conv.conversation_id}-{strategy}"
    meta = {"agent": "bench", "agent_name": "Parley"}
    with sessions.create(session_id, f"agent:bench:direct:{session_id}", meta) as transcript:
        for offset, message in enumerate(conv.messages):
            transcript.append_message(message, ts=BASE_TIME + timedelta(seconds=30 * offset))
        before = build_history(transcript.live_entries(), max_turns=0, max_messages=0)
        # The figures the engine would use for this window (core/context/budget.py).
        budget = context_budget(window, ContextConfig(compaction=config), max_output)
        outcome = await compactor.compact(
            transcript,
            trigger=TRIGGER_THRESHOLD,
            window=window,
            threshold=budget.threshold,
            base_tokens=0,  # messages only: no system prompt or tools in this bench
            tokens_before=counter.messages(before),
            budget=budget,
        )
        after = build_history(transcript.live_entries(), max_turns=0, max_messages=0)
    return outcome, after, provider.calls


async def run_strategies(
    *,
    conversations: int,
    messages: int,
    facts: int,
    seed: int,
    window: int = DEFAULT_WINDOW,
    max_output: int = DEFAULT_MAX_OUTPUT,
    work_dir: Path | None = None,
) -> dict[str, dict[str, Any]]:
    counter = default_counter()
    convs = [
        generate_conversation(f"c{n}", messages=messages, facts=facts, seed=seed * 1000 + n)
        for n in range(conversations)
    ]
    tallies = {name: StrategyTally() for name in STRATEGIES}
    with tempfile.TemporaryDirectory(prefix="parley-compaction-", dir=work_dir) as tmp:
        sessions = FileTranscriptStore(Path(tmp))
        for conv in convs:
            for strategy in STRATEGIES:
                outcome, after, calls = await compact_once(
                    conv, strategy, sessions, window=window, max_output=max_output, counter=counter
                )
                tally = tallies[strategy]
                before_tokens = counter.messages(conv.messages)
                tally.tokens_before += outcome.tokens_before or before_tokens
                # A skipped or failed compaction leaves the view as it was.
                tally.tokens_after += (
                    outcome.tokens_after if outcome.compacted else counter.messages(after)
                )
                tally.outcomes.append(outcome.strategy if outcome.compacted else outcome.status)
                tally.summary_calls += calls
                seen = view_text(after)
                for fact in conv.facts:
                    tally.facts_planted += 1
                    if collapse(fact.needle) in seen:
                        tally.facts_kept += 1
                    else:
                        tally.lost.append(f"{conv.conversation_id}:{fact.kind}:{fact.needle}")
    return {name: tally.to_dict() for name, tally in tallies.items()}


# -- part 2: automatic recall on LoCoMo ---------------------------------------------------


def memoised(search: RecallSearch) -> RecallSearch:
    """``search`` answering a repeated (query, scopes) from memory: the recall modes ask
    the same question; the index's answer does not change between them."""
    cache: dict[tuple[str, tuple[str, ...]], Sequence[RecallHit]] = {}

    async def cached(query: str, *, scopes: Sequence[str]) -> Sequence[RecallHit]:
        key = (query, tuple(scopes))
        if key not in cache:
            cache[key] = await search(query, scopes=scopes)
        return cache[key]

    return cached


def memory_settings(embedder: str) -> MemorySettings:
    """The product's memory defaults, the chosen embedder, transcripts only, no watcher
    (as ``run_locomo`` configures its index)."""
    base = MemorySettings()
    return base.model_copy(
        update={
            "embedder": embedder_settings(embedder, EmbedderSettings()),
            "sources": ("sessions",),
            "sync": base.sync.model_copy(update={"watch": False, "on_start": False}),
        }
    )


@dataclass(slots=True)
class RecallTally:
    questions: int = 0
    hit: dict[str, int] = field(default_factory=dict)  # questions with an evidence turn
    recall: dict[str, list[float]] = field(default_factory=dict)  # share of evidence found
    tokens: dict[str, list[int]] = field(default_factory=dict)  # block tokens, when injected
    triggered: dict[str, int] = field(default_factory=dict)  # recaller searched at all

    def add(self, name: str, found: set[str], wanted: set[str]) -> None:
        self.hit[name] = self.hit.get(name, 0) + bool(found & wanted)
        self.recall.setdefault(name, []).append(len(found & wanted) / len(wanted))

    def share(self, name: str) -> float:
        return round(self.hit.get(name, 0) / self.questions, 4) if self.questions else 0.0

    def mean(self, name: str) -> float:
        values = self.recall.get(name, [])
        return round(statistics.fmean(values), 4) if values else 0.0


async def _ask(
    conv: Conversation,
    index: MemoryIndex,
    recallers: dict[str, Recaller],
    tally: RecallTally,
) -> None:
    turns = {t.dia_id: collapse(t.text) for t in conv.turns}
    scopes = ["agent", f"locomo:{conv.sample_id}"]
    for q in conv.questions:
        wanted = {e for e in q.evidence if e in turns}
        if not wanted or q.category not in SCORED_CATEGORIES:
            continue  # not scored by the locomo bench either
        tally.questions += 1
        result = await index.search(q.question, scopes=scopes)
        rows = [(h.snippet, found_dia_ids(h.snippet, turns)) for h in result.hits]
        # recall_within answers a share; asked about one turn at a time it says which
        # turns were read whole within the budget, with the locomo bench's own reading.
        read = {d for d in wanted if recall_within(rows, {d}, turns, (RECALL_BUDGET,)) == [1.0]}
        tally.add("memory_search", read, wanted)
        for mode, recaller in recallers.items():
            recall = await recaller.recall(q.question, scopes=scopes)
            if recall is not None:
                tally.triggered[mode] = tally.triggered.get(mode, 0) + 1
            text = recall.text if recall is not None else ""
            if recall is not None and recall.text:
                tally.tokens.setdefault(mode, []).append(recall.tokens)
            tally.add(mode, set(found_dia_ids(text, turns)), wanted)


async def run_auto_recall(
    data: Path,
    *,
    embedder: str = "none",
    limit_conversations: int | None = None,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    conversations = load_locomo(data)[:limit_conversations]
    memory = memory_settings(embedder)
    counter = default_counter()
    tally = RecallTally()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="parley-recall-", dir=work_dir) as tmp:
        home = Path(tmp)
        sessions_dir = home / "sessions"
        sessions_dir.mkdir()
        store = FileTranscriptStore(sessions_dir)
        for conv in conversations:
            write_transcripts(conv, store, f"locomo:{conv.sample_id}")
        index = MemoryIndex(
            memory,
            db_path=home / "memory" / "memory.db",
            workspace=home / "workspace",
            sessions_dir=sessions_dir,
            embedder=build_embedder(memory.embedder),
        )
        await index.open()
        try:
            await index.sync(reason="bench")
            status = (await index.status()).to_dict()
            search = memoised(index_search(index))
            recallers: dict[str, Recaller] = {
                mode: Recaller(search, counter=counter, mode=mode, budget_tokens=RECALL_BUDGET)
                for mode in RECALL_MODES
            }
            for conv in conversations:
                await _ask(conv, index, recallers, tally)
        finally:
            await index.close()
    auto, search_share = tally.share("auto"), tally.share("memory_search")
    return {
        "questions": tally.questions,
        "evidence_injected_share": {mode: tally.share(mode) for mode in RECALL_MODES},
        "memory_search_share_1500": search_share,
        "tokens_injected_p50": {
            mode: round(percentile(tally.tokens.get(mode, []), 0.5)) for mode in RECALL_MODES
        },
        "evidence_recall_mean": {
            name: tally.mean(name) for name in ("memory_search", *RECALL_MODES)
        },
        "auto_triggered_share": (
            round(tally.triggered.get("auto", 0) / tally.questions, 4) if tally.questions else 0.0
        ),
        "target_met": auto >= search_share,
        "budget_tokens": RECALL_BUDGET,
        "conversations": len(conversations),
        "embedder": {"provider": status["provider"], "model": status["model"]},
        "seconds": round(time.perf_counter() - started, 1),
    }


# -- entry point --------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(args.quick)
    conversations = args.conversations or (1 if quick else 3)
    messages = args.messages or (160 if quick else 300)
    # Quick mode's shorter conversations need a smaller model to pass the threshold.
    window = args.window or (QUICK_WINDOW if quick else DEFAULT_WINDOW)
    facts = args.facts or (10 if quick else 25)
    started = time.perf_counter()
    strategies = await run_strategies(
        conversations=conversations,
        messages=messages,
        facts=facts,
        seed=args.seed,
        window=window,
    )
    log(f"strategies done in {time.perf_counter() - started:.1f}s")
    locomo_limit = args.locomo_conversations or (1 if quick else None)
    auto_recall = await run_auto_recall(
        args.data, embedder=args.embedder, limit_conversations=locomo_limit
    )
    return {
        "strategies": strategies,
        "auto_recall": auto_recall,
        "parameters": {
            "quick": quick,
            "conversations": conversations,
            "messages_per_conversation": messages,
            "facts_per_conversation": facts,
            "seed": args.seed,
            "window": window,
            "threshold": compaction_threshold(window, CompactionConfig(), DEFAULT_MAX_OUTPUT),
            "data": str(args.data),
        },
        "seconds": round(time.perf_counter() - started, 1),
        "machine": (
            f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="1 conversation of each, short")
    parser.add_argument("--conversations", type=int, default=None, help="synthetic ones")
    parser.add_argument("--messages", type=int, default=None, help="per synthetic conversation")
    parser.add_argument("--facts", type=int, default=None, help="planted per conversation")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--window", type=int, default=None, help="the model's window")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo-format file")
    parser.add_argument(
        "--locomo-conversations", type=int, default=None, help="only the first N LoCoMo ones"
    )
    parser.add_argument(
        "--embedder",
        choices=("none", "e5", "local", "auto"),
        default="none",
        help="none: keyword-only (fast); e5: the real model",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    # The e5 model must come from the local cache; a bench never downloads.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        result = asyncio.run(run(parse_args(argv)))
    except LocomoError as exc:
        log(f"compaction_strategies: {exc}")
        raise SystemExit(2) from exc
    print(json.dumps(result))


if __name__ == "__main__":
    main()
