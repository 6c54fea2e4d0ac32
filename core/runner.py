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
compact, shrink) and retried, at most ``compaction.max_attempts`` times. So is a reply
that stopped because the window filled (``STOP_OVERFLOW``, a llama.cpp server counting
only the prompt): the turn's ``on_retry`` hook is called first (a UI drops the streamed
text), and once the retry has answered, the cut-off reply is recorded as a
``discarded_reply`` custom entry, which the view never resends, and the retry's reply
is the answer. When recovery cannot make the request smaller, or fails, or the retry
fails (refused, overflowing again), the cut-off reply is kept as the answer. Each
request asks for at most the window's output reserve (``core.context.budget``), and the
recall block is capped to the window's share. Provider and context errors propagate
typed after a ``turn_error`` entry is written, so the session is never stuck and the
next turn starts from a consistent transcript.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from parley.core.agent_config import AgentConfig
from parley.core.context.budget import recall_tokens
from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine, PreparedView, TurnEvents, ViewRequest
from parley.core.context.history import is_turn_start
from parley.core.errors import (
    CAUSE_HISTORY,
    CAUSE_MESSAGE,
    ContextError,
    ContextOverflowError,
    CoreError,
    ProviderError,
)
from parley.core.fences import read_user_message
from parley.core.group_context import group_context_block
from parley.core.media import MediaLoader, has_stored_images, resolve_images
from parley.core.memory.audience import Viewer
from parley.core.memory.recall import (
    RECALL_META_KEY,
    LiveContext,
    Recall,
    Recaller,
    previous_user_text,
)
from parley.core.messages import Block, Message, TextBlock, ToolResultBlock, Usage
from parley.core.prompt import SystemPromptBuilder, turn_context_block
from parley.core.providers.base import (
    STOP_OVERFLOW,
    Provider,
    ProviderRequest,
    ProviderResponse,
    TextCallback,
)
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
    # What others said in the group since the last answer (core.group_context), stored
    # as a block before the words; "" when there is none.
    group_context_text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    resume: bool = False  # the user message is already in the transcript (crash recovery)
    model: str | None = None  # per-session override
    chat_type: str = "direct"  # picks the history turn limit
    memory_scopes: tuple[str, ...] = ()  # what memory_search may see in this conversation
    # Who is reading and writing memory in this conversation (core.memory.audience):
    # memory_get, remember and the flush ask it; None where memory is off.
    memory_viewer: Viewer | None = None
    # What came with the words (pictures, documents read as text, transcribed voice
    # notes: the gateway's media intake), stored after them in the user message.
    attachments: tuple[Block, ...] = ()
    # The bytes of the session's stored pictures, for this reader only (core.media).
    media: MediaLoader | None = None


RetryHook = Callable[[int, ProviderError, float], None]
# A reply the window cut off, recorded (not as a message) when a retry replaces it.
DISCARDED_REPLY_TYPE = "discarded_reply"


@dataclass(frozen=True, slots=True)
class _Held:
    """A reply that stopped because the window filled, and the request that got it."""

    view: PreparedView
    request: ProviderRequest
    response: ProviderResponse
    error: ContextOverflowError  # what the stop stands for (stopped_overflow)


def stopped_overflow(response: ProviderResponse, provider: str) -> ContextOverflowError:
    """The overflow a reply stopped by a full window stands for. Its numbers are the
    prompt's (what the server read) and the window it filled (prompt plus what was
    written before it stopped). Recovery calibrates on them but learns no window from
    them: where a reply stopped is no refusal."""
    prompt = response.usage.context_tokens
    return ContextOverflowError(
        "the reply stopped because the model's context window filled up",
        provider=provider,
        observed_tokens=prompt or None,
        limit=(prompt + response.usage.output_tokens) if prompt else None,
        prompt_only=True,
    )


def _cause(messages: Sequence[Message]) -> str:
    """What a request that never fits is made of: the newest turn alone (shorter parts
    help, /compact and /new cannot) or history besides it."""
    starts = [i for i, m in enumerate(messages) if is_turn_start(m)]
    return CAUSE_MESSAGE if starts[-1:] == [0] or not starts else CAUSE_HISTORY


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
        model: str | None = None,
    ) -> None:
        """``model``: what a request names when its session sets none (None: the
        provider's own)."""
        self.provider = provider
        self.model = model
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
        on_status: Callable[[str | None], None] | None = None,
    ) -> TurnResult:
        """``on_status`` hears what the turn is busy with besides writing (a tool, a
        compaction), then None once it is done: a chat shows it as a status line."""
        started = time.perf_counter()
        appended: list[Entry] = []

        counter = self.engine.counter

        async def append(message: Message, **kwargs: Any) -> Entry:
            # Counted here and stored with it: neither the next turn nor a later reader
            # of the file counts it again (TokenCounter.know_stored). Counted as the
            # transcript gives it back: a user's words neutralised (core/fences.py).
            # On the worker thread with the write: tiktoken lets go of the GIL while it
            # encodes, so a long reply is counted beside the event loop, not on it.
            def write() -> tuple[Entry, int]:
                stored = read_user_message(message)
                stamp = counter.stamp(stored)
                entry = transcript.append_message(message, tokens=stamp, **kwargs)
                return entry, counter.message(stored)

            entry, count = await asyncio.to_thread(write)
            counter.know(entry.message, count)
            appended.append(entry)
            return entry

        recall: Recall | None = None
        view_request: ViewRequest | None = None
        if not turn.resume:
            if self._wants_recall(turn):
                # Built once for the turn: recall needs its system prompt (what is already
                # in view), and every provider call of the turn sends it.
                view_request = await self.view_request(turn.session_key, turn.model, turn.chat_type)
                recall = await self._recall(transcript, turn, view_request)
            # The recall block goes first: the engine protects the newest user words and
            # the turn context at the tail when it must shed text, and recalled notes are
            # the cheapest thing to lose. Either way it is in the volatile newest message.
            blocks: list[Block] = (
                [recall.block] if recall is not None and recall.block is not None else []
            )
            if turn.group_context_text:
                blocks.append(group_context_block(turn.group_context_text))
            if turn.user_text or not turn.attachments:
                blocks.append(TextBlock(turn.user_text))
            blocks.extend(turn.attachments)
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
        events = TurnEvents(on_status=on_status)
        total = Usage()
        last_usage = Usage()
        calls = tool_calls = overflows = 0
        stop_reason = ""
        reply_parts: list[str] = []
        limit_reached = False
        view: PreparedView | None = None
        # A reply the window cut off, held while recovery makes room for a retry; kept
        # as the answer when recovery cannot make the request any smaller.
        held: _Held | None = None
        # The turn's pictures as base64, by ref (core.media): dropped with the turn.
        images: dict[str, str | None] = {}
        while True:
            try:
                view = await self.engine.prepare(transcript, view_request, events)
            except ContextError as exc:
                if held is None:
                    self.engine.end_overflow_pressure(turn.session_key)
                    await self._record_error(transcript, exc)
                    raise
                view = held.view  # no room for a retry: the held reply is kept below
            if held is not None and view.messages == held.view.messages:
                # Recovery changed nothing: the same request would stop the same way.
                view, request, response, held = held.view, held.request, held.response, None
            else:
                if held is not None and on_retry is not None:
                    # Retrying: a UI that showed the cut-off reply's streamed text drops it.
                    on_retry(overflows, held.error, 0.0)
                request = ProviderRequest(
                    model=model,
                    system=system,
                    messages=await self._with_images(view.messages, turn, images),
                    tools=specs,
                    # The reply's reserve of the window (a quarter at most): a server
                    # that counts max_tokens against its window refuses more than fits.
                    max_tokens=min(self.agent.max_output_tokens, view.budget.output),
                )
                # The held reply stays held until a retry returns: a retry that fails
                # (refused, overflowing again, recovery failing) leaves it as the answer.
                kept: _Held | None = None
                try:
                    response = await call_with_retry(
                        self.provider, request, self.retry, on_text, on_retry=on_retry
                    )
                except ContextOverflowError as exc:
                    overflows += 1
                    attempts = self.engine.config.compaction.max_attempts
                    if held is None:
                        if overflows > attempts:
                            exc.cause = exc.cause or _cause(view.messages)
                            self.engine.end_overflow_pressure(turn.session_key)
                            await self._record_error(transcript, exc)
                            raise
                        await self._recover(transcript, view_request, view, exc, events)
                        continue
                    if overflows > attempts:
                        self._log_kept(turn.session_key, exc)
                        kept = held
                    else:
                        try:
                            await self.engine.recover_overflow(
                                transcript, view_request, view, exc, events
                            )
                        except ContextError as failed:
                            self._log_kept(turn.session_key, failed)
                            kept = held
                        else:
                            continue
                except ProviderError as exc:
                    if held is None:
                        await self._record_error(transcript, exc)
                        raise
                    self._log_kept(turn.session_key, exc)
                    kept = held
                if kept is not None:
                    view, request, response, held = kept.view, kept.request, kept.response, None
                else:
                    calls += 1
                    total = total + response.usage
                    if held is not None:
                        # The retry answered: the cut-off reply is recorded, never resent.
                        await self._record_discarded(transcript, held.response)
                        held = None
                    if (
                        response.stop_reason == STOP_OVERFLOW
                        and overflows < self.engine.config.compaction.max_attempts
                    ):
                        # The window filled mid-answer: a cut-off reply is no answer. Make
                        # room (compact, shrink) and ask again; the reply is held meanwhile.
                        overflows += 1
                        stopped = stopped_overflow(response, self.provider.name)
                        held = _Held(view, request, response, stopped)
                        try:
                            await self.engine.recover_overflow(
                                transcript, view_request, view, stopped, events, stopped=True
                            )
                        except ContextError as failed:
                            # No room to be made: the cut-off reply is the answer.
                            self._log_kept(turn.session_key, failed)
                            held = None
                        else:
                            continue
            last_usage = response.usage
            stop_reason = response.stop_reason
            stored = await append(
                response.message,
                usage=response.usage,
                meta={
                    "model": response.model or request.model,
                    "stop_reason": stop_reason,
                    # The runtime's clock (the TTL pruning compares against it).
                    "called_at": self.now().isoformat(),
                },
            )
            # The stored entry's message, not the response's: the next turn's view holds
            # that object, and its token count is then already known.
            self.engine.record_call(
                view_request, view, usage=response.usage, response=stored.message
            )
            if response.message.text:
                reply_parts.append(response.message.text)
            if stop_reason == STOP_OVERFLOW:
                # The window filled up mid-answer and recovery could not make room: keep
                # what was said, run no half-formed tool call. With nothing said, the
                # user is told.
                if not reply_parts:
                    empty = ContextOverflowError(
                        "the model's context window filled up before it could answer",
                        provider=self.provider.name,
                        prompt_only=True,
                        cause=_cause(view.messages),
                    )
                    await self._record_error(transcript, empty)
                    raise empty
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
                cap = tool_result_cap(
                    view.window,
                    min(self.agent.tool_result_max_chars, view.budget.tool_result_chars),
                )
                # The compacting state: a compaction of this session (e.g. /compact from
                # the admin API) finishes before a tool runs against the history.
                await self.engine.idle(turn.session_key)
                with events.busy("running " + ", ".join(dict.fromkeys(u.name for u in uses))):
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

    async def _with_images(
        self, messages: tuple[Message, ...], turn: TurnRequest, cache: dict[str, str | None]
    ) -> tuple[Message, ...]:
        """The view as the request sends it: stored pictures inline for a model that sees
        images, else placeholders (``core.media``); read on a worker thread."""
        if not has_stored_images(messages):
            return messages
        vision = getattr(self.provider, "vision", False) is True
        return await asyncio.to_thread(
            functools.partial(resolve_images, messages, turn.media, vision=vision, cache=cache)
        )

    async def _recall(
        self, transcript: SessionTranscript, turn: TurnRequest, request: ViewRequest
    ) -> Recall | None:
        """Recall for this turn's message; None when it found nothing to add or failed.
        The block is capped to the window's share (``core.context.budget``): 1,500
        tokens of notes would be most of a 2,048-token window."""
        assert self.recaller is not None
        try:
            live = transcript.live_entries()
            window = self.engine.session_budget(request).window
            return await self.recaller.recall(
                turn.user_text,
                scopes=turn.memory_scopes,
                previous=previous_user_text(live),
                live=await asyncio.to_thread(
                    LiveContext.from_entries, live, also=(request.system,)
                ),
                max_tokens=recall_tokens(window, self.recaller.budget_tokens),
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
        the workspace in a thread, unless it was checked just now), the tools on offer
        and the model."""
        prompt = self.prompt.recent()
        if prompt is None:
            prompt = await asyncio.to_thread(self.prompt.build)
        system = prompt.text
        specs = self.tools.specs() if self.offer_tools else ()
        return ViewRequest(
            session_key, system, tuple(specs), model or self.model or self.provider.model, chat_type
        )

    async def _recover(
        self,
        transcript: SessionTranscript,
        request: ViewRequest,
        view: PreparedView,
        exc: ContextOverflowError,
        events: TurnEvents,
    ) -> None:
        """The engine's overflow recovery; a failure there fails the turn, recorded."""
        try:
            await self.engine.recover_overflow(transcript, request, view, exc, events)
        except ContextError as failed:
            self.engine.end_overflow_pressure(request.session_key)
            await self._record_error(transcript, failed)
            raise

    def _log_kept(self, key: str, exc: CoreError) -> None:
        log.warning(
            "retry after a cut-off reply failed in session %s (%s: %s): the cut-off reply"
            " is kept as the answer",
            key,
            type(exc).__name__,
            getattr(exc, "message", str(exc)),
        )

    async def _record_discarded(
        self, transcript: SessionTranscript, response: ProviderResponse
    ) -> None:
        """Keep a cut-off reply in the transcript as a custom entry: the record says what
        the model wrote and what it cost, and the view, which never shows custom
        entries, does not send it again."""
        await asyncio.to_thread(
            transcript.append_custom,
            DISCARDED_REPLY_TYPE,
            {
                "text": response.message.text,
                "stop_reason": response.stop_reason,
                "usage": response.usage.to_dict(),
                "model": response.model,
            },
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
