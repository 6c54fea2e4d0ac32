"""The turn loop: user message in, reply out, everything recorded in the transcript.

A turn appends the user message, builds the model's view (stable system prompt +
history from the live window), calls the provider (streaming, with the bounded
retry policy), runs the tools it asks for in a bounded loop, and appends every
assistant message and tool result with its usage. Provider errors propagate typed
(``core.errors.ProviderError``) after a ``turn_error`` entry is written, so the
session is never stuck and the next turn starts from a consistent transcript.
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

from core.config import AgentConfig, RetryConfig
from core.errors import ContextOverflowError, ProviderError
from core.history import build_history
from core.messages import Message, TextBlock, ToolResultBlock, Usage
from core.prompt import SystemPromptBuilder
from core.providers.base import STOP_OVERFLOW, Provider, ProviderRequest, TextCallback
from core.providers.retry import call_with_retry
from core.tools.registry import ToolContext, ToolRegistry
from core.transcript import Entry, Transcript

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


@dataclass(slots=True)
class TurnRequest:
    session_key: str
    user_text: str
    context_text: str = ""  # volatile facts, stored as the first block of the user message
    meta: dict[str, Any] = field(default_factory=dict)
    resume: bool = False  # the user message is already in the transcript (crash recovery)
    model: str | None = None  # per-session override


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
    ) -> None:
        self.provider = provider
        self.tools = tools
        self.prompt = prompt
        self.agent = agent
        self.retry = retry
        self.workspace = workspace
        self.offer_tools = offer_tools
        self.now = now

    async def run_turn(
        self,
        transcript: Transcript,
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

        if not turn.resume:
            blocks = [TextBlock(turn.context_text)] if turn.context_text else []
            blocks.append(TextBlock(turn.user_text))
            await append(Message("user", tuple(blocks)), meta=turn.meta or None)

        system = (await asyncio.to_thread(self.prompt.build)).text
        specs = self.tools.specs() if self.offer_tools else ()
        context = ToolContext(workspace=self.workspace, session_key=turn.session_key, now=self.now)
        total = Usage()
        last_usage = Usage()
        calls = tool_calls = 0
        stop_reason = ""
        reply_parts: list[str] = []
        limit_reached = False
        while True:
            history = build_history(transcript.live_entries())
            request = ProviderRequest(
                model=turn.model or self.provider.model,
                system=system,
                messages=tuple(history),
                tools=specs,
                max_tokens=self.agent.max_output_tokens,
            )
            try:
                response = await call_with_retry(
                    self.provider, request, self.retry, on_text, on_retry=on_retry
                )
            except ProviderError as exc:
                await asyncio.to_thread(
                    transcript.append_custom,
                    "turn_error",
                    {"kind": type(exc).__name__, "message": exc.message, "status": exc.status},
                )
                raise
            calls += 1
            total = total + response.usage
            last_usage = response.usage
            stop_reason = response.stop_reason
            await append(
                response.message,
                usage=response.usage,
                meta={"model": response.model or request.model, "stop_reason": stop_reason},
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
                results = [await self.tools.run(use, context) for use in uses]
            await append(Message("tool_result", tuple(results)))

        reply = reply_parts[-1] if reply_parts else ""
        result = TurnResult(
            reply=reply.strip(),
            usage=total,
            context_tokens=last_usage.context_tokens + last_usage.output_tokens,
            model_calls=calls,
            tool_calls=tool_calls,
            stop_reason=stop_reason,
            latency_ms=(time.perf_counter() - started) * 1000,
            entries=tuple(appended),
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
