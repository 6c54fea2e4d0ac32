"""The turn loop: user message in, reply out, everything recorded in the transcript.

A turn appends the user message (its volatile context at the tail, so everything
before it stays byte-stable for the prompt cache), then for every provider call asks
the context engine (``core.context.engine``) for the model's view: history since the
latest compaction, sticky pruning applied, flushed, compacted or trimmed so that it
fits. It calls the provider (streaming, with the bounded retry policy), runs the tools
it asks for in a bounded loop, truncating each result once where it enters the
transcript, and appends every assistant message and tool result with its usage.

Before appending the user message, an optional ``Recaller`` (``core.memory.recall``)
searches long-term memory within the conversation's scopes; its block rides in the user
message (never in the system prompt) and what it injected is recorded in the entry's
``meta["recall"]``. A failing memory index costs the turn its recall, nothing more.

A context overflow reported by the provider is recovered by the engine (flush,
compact, shrink) and retried, at most ``compaction.max_attempts`` times. Provider and
context errors propagate typed after a ``turn_error`` entry is written, so the session
is never stuck and the next turn starts from a consistent transcript.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from parley.core.agent_config import AgentConfig
from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine, PreparedView, TurnEvents, ViewRequest
from parley.core.errors import ContextError, ContextOverflowError, CoreError, ProviderError
from parley.core.memory.audience import Viewer
from parley.core.memory.recall import (
    RECALL_META_KEY,
    LiveContext,
    Recall,
    Recaller,
    previous_user_text,
)
from parley.core.messages import Message, TextBlock, ToolResultBlock, Usage
from parley.core.prompt import SystemPromptBuilder, turn_context_block
from parley.core.providers.base import STOP_OVERFLOW, Provider, ProviderRequest, TextCallback
from parley.core.providers.provider_config import RetryConfig
from parley.core.providers.retry import call_with_retry
from parley.core.tools.tool_registry import ToolContext, ToolRegistry
from parley.core.tools.truncation import tool_result_cap
from parley.core.transcript import Entry
from parley.core.transcript_store import SessionTranscript

log = logging.getLogger("parley.core.runner")

TOOL_LIMIT_NOTE = (
    "[not run: the tool-call limit for this turn was reached; answer with what you have]"
)


@dataclass(frozen=True, slots=True)
class TurnResult:
    reply: str
    usage: Usage  # summed over every provider call of the turn
    context_tokens: int  # what the last call read, cache included, plus its output
    model_calls: int
    tool_calls: int
    stop_reason: str
    latency_ms: float
    entries: tuple[Entry, ...] = field(default=())
    events: TurnEvents = field(default_factory=TurnEvents)
    recall: Recall | None = None  # what automatic recall injected into the user message

    @property
    def compactions(self) -> int:
        """Compactions made during the turn."""
        return sum(1 for c in self.events.compactions if c.compacted)


@dataclass(slots=True)
class TurnRequest:
    session_key: str
    user_text: str
    context_text: str = ""  # volatile facts, stored as the last block of the user message
    meta: dict[str, Any] = field(default_factory=dict)
    resume: bool = False  # the user message is already in the transcript (crash recovery)
    model: str | None = None  # per-session override
    chat_type: str = "direct"  # picks the history turn limit
    memory_scopes: tuple[str, ...] = ()  # what memory_search may see in this conversation
    # Who is reading and writing memory in this conversation (core.memory.audience):
    # memory_get, remember and the flush ask it; None where memory is off.
    memory_viewer: Viewer | None = None


RetryHook = Callable[[int, ProviderError, float], None]


class Runner:
    def __init__(
        self,
        *,
        provider: Provider,
        tools: ToolRegistry,
        prompt: SystemPromptBuilder,
        agent: AgentConfig,
        retry: RetryConfig,
        workspace: Path,
        offer_tools: bool = True,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        engine: ContextEngine | None = None,
        recaller: Recaller | None = None,
    ) -> None:
        self.provider = provider
        self.tools = tools
        self.prompt = prompt
        self.agent = agent
        self.retry = retry
        self.workspace = workspace
        self.offer_tools = offer_tools
        self.now = now
        self.recaller = recaller
        self.engine = engine or ContextEngine(
            config=ContextConfig(),
            provider=provider,
            retry=retry,
            max_output=agent.max_output_tokens,
            now=now,
        )

    async def run_turn(
        self,
        transcript: SessionTranscript,
        turn: TurnRequest,
        *,
        on_text: TextCallback | None = None,
        on_retry: RetryHook | None = None,
    ) -> TurnResult:
        started = time.perf_counter()
        appended: list[Entry] = []

        async def append(message: Message, **kwargs: Any) -> Entry:
            entry = await asyncio.to_thread(transcript.append_message, message, **kwargs)
            appended.append(entry)
            return entry

        recall: Recall | None = None
        view_request: ViewRequest | None = None
        if not turn.resume:
            if self._wants_recall(turn):
                # Built once for the turn: recall needs its system prompt (what is already
                # in view), and every provider call of the turn sends it.
                view_request = await self.view_request(turn.session_key, turn.model, turn.chat_type)
                recall = await self._recall(transcript, turn, view_request.system)
            # The recall block goes first: the engine protects the newest user words and
            # the turn context at the tail when it must shed text, and recalled notes are
            # the cheapest thing to lose. Either way it is in the volatile newest message.
            blocks = [recall.block] if recall is not None and recall.block is not None else []
            blocks.append(TextBlock(turn.user_text))
            if turn.context_text:
                blocks.append(turn_context_block(turn.context_text))
            meta = dict(turn.meta)
            if recall is not None:
                meta[RECALL_META_KEY] = recall.to_meta()
            await append(Message("user", tuple(blocks)), meta=meta or None)

        if view_request is None:
            view_request = await self.view_request(turn.session_key, turn.model, turn.chat_type)
        system, specs, model = view_request.system, view_request.tools, view_request.model
        context = ToolContext(
            workspace=self.workspace,
            session_key=turn.session_key,
            now=self.now,
            extra={"memory_scopes": turn.memory_scopes, "memory_viewer": turn.memory_viewer},
        )
        events = TurnEvents()
        total = Usage()
        last_usage = Usage()
        calls = tool_calls = overflows = 0
        stop_reason = ""
        reply_parts: list[str] = []
        limit_reached = False
        view: PreparedView | None = None
        while True:
            try:
                view = await self.engine.prepare(transcript, view_request, events)
                request = ProviderRequest(
                    model=model,
                    system=system,
                    messages=view.messages,
                    tools=specs,
                    max_tokens=self.agent.max_output_tokens,
                )
                response = await call_with_retry(
                    self.provider, request, self.retry, on_text, on_retry=on_retry
                )
            except ContextOverflowError as exc:
                overflows += 1
                if view is None or overflows > self.engine.config.compaction.max_attempts:
                    self.engine.end_overflow_pressure(turn.session_key)
                    await self._record_error(transcript, exc)
                    raise
                try:
                    await self.engine.recover_overflow(transcript, view_request, view, exc, events)
                except ContextError as failed:
                    self.engine.end_overflow_pressure(turn.session_key)
                    await self._record_error(transcript, failed)
                    raise
                continue
            except ContextError as exc:
                self.engine.end_overflow_pressure(turn.session_key)
                await self._record_error(transcript, exc)
                raise
            except ProviderError as exc:
                await self._record_error(transcript, exc)
                raise
            calls += 1
            total = total + response.usage
            last_usage = response.usage
            stop_reason = response.stop_reason
            self.engine.record_call(
                view_request, view, usage=response.usage, response=response.message
            )
            await append(
                response.message,
                usage=response.usage,
                meta={
                    "model": response.model or request.model,
                    "stop_reason": stop_reason,
                    # The runtime's clock (the TTL pruning compares against it).
                    "called_at": self.now().isoformat(),
                },
            )
            if response.message.text:
                reply_parts.append(response.message.text)
            if stop_reason == STOP_OVERFLOW:
                # The window filled up mid-answer: keep what was said, run no half-formed
                # tool call. With nothing said, the user is told (with /new as a way out).
                if not reply_parts:
                    raise ContextOverflowError(
                        "the model's context window filled up before it could answer",
                        provider=self.provider.name,
                    )
                break
            uses = response.message.tool_uses
            if not uses or limit_reached:
                break
            tool_calls += len(uses)
            if calls > self.agent.max_tool_iterations:
                # Answer every call (the API requires it) but run none; one last call follows.
                results = [ToolResultBlock(u.id, TOOL_LIMIT_NOTE, is_error=True) for u in uses]
                limit_reached = True
            else:
                # Truncated once, here, so the transcript and the model hold the same text.
                cap = tool_result_cap(view.window, self.agent.tool_result_max_chars)
                # The compacting state: a compaction of this session (e.g. /compact from
                # the admin API) finishes before a tool runs against the history.
                await self.engine.idle(turn.session_key)
                results = [await self.tools.run(use, context, max_chars=cap) for use in uses]
            await append(Message("tool_result", tuple(results)))

        reply = reply_parts[-1] if reply_parts else ""
        result = TurnResult(
            reply=reply.strip(),
            usage=total + events.usage,
            context_tokens=last_usage.context_tokens + last_usage.output_tokens,
            model_calls=calls,
            tool_calls=tool_calls,
            stop_reason=stop_reason,
            latency_ms=(time.perf_counter() - started) * 1000,
            entries=tuple(appended),
            events=events,
            recall=recall,
        )
        log.info(
            "turn session=%s calls=%d tools=%d in=%d out=%d cache_read=%d cache_write=%d "
            "latency_ms=%.1f",
            turn.session_key,
            calls,
            tool_calls,
            total.input_tokens,
            total.output_tokens,
            total.cache_read_tokens,
            total.cache_write_tokens,
            result.latency_ms,
        )
        return result

    def _wants_recall(self, turn: TurnRequest) -> bool:
        return (
            self.recaller is not None
            and bool(turn.memory_scopes)
            and self.recaller.reason(turn.user_text) is not None
        )

    async def _recall(
        self, transcript: SessionTranscript, turn: TurnRequest, system: str
    ) -> Recall | None:
        """Recall for this turn's message; None when it found nothing to add or failed."""
        assert self.recaller is not None
        try:
            live = transcript.live_entries()
            return await self.recaller.recall(
                turn.user_text,
                scopes=turn.memory_scopes,
                previous=previous_user_text(live),
                live=await asyncio.to_thread(LiveContext.from_entries, live, also=(system,)),
            )
        except Exception as exc:
            # Recall is a help, not a step the turn depends on: a broken index, a slow
            # embedder (TimeoutError) or a bug here costs this turn its recall, no more.
            log.warning(
                "recall skipped in session %s: %s: %s", turn.session_key, type(exc).__name__, exc
            )
            return None

    async def view_request(
        self, session_key: str, model: str | None = None, chat_type: str = "direct"
    ) -> ViewRequest:
        """What every request of a session shares: the stable system prompt (read from
        the workspace in a thread), the tools on offer and the model."""
        system = (await asyncio.to_thread(self.prompt.build)).text
        specs = self.tools.specs() if self.offer_tools else ()
        return ViewRequest(
            session_key, system, tuple(specs), model or self.provider.model, chat_type
        )

    async def _record_error(self, transcript: SessionTranscript, exc: CoreError) -> None:
        status = getattr(exc, "status", None)
        message = getattr(exc, "message", str(exc))
        # Users get a plain-language text; the operator's log keeps the real cause.
        log.warning(
            "turn failed in session %s: %s (status %s): %s",
            transcript.header.key,
            type(exc).__name__,
            status,
            message,
        )
        await asyncio.to_thread(
            transcript.append_custom,
            "turn_error",
            {"kind": type(exc).__name__, "message": message, "status": status},
        )
