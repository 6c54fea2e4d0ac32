"""The context engine: what the model sees on each call, and keeping it inside the window.

``prepare`` runs before every provider call of a turn:

1. the view (``core.context.view``): ``build_history`` over the live window (summary
   first, repaired, turn limits for the chat type), then every recorded pruning decision
   re-applied, so the view is byte-identical to the previous call's up to its newest entry;
2. cache-TTL pruning: when the provider's cache has expired, or (beyond OpenClaw) the
   view's share of the window passes ``hard_clear_ratio``, a new decision is made and
   recorded as a custom entry, which keeps the pruned view sticky;
3. accounting: the session's ``ContextAccountant`` gives the context size (the last
   call's reported input plus a calibrated, margined estimate of what came after);
4. the guard, against ONE threshold (``window − reserve − max_output``) shared by all
   three steps: the memory flush when within ``soft_threshold_tokens`` of it (once per
   compaction cycle), a compaction when past it, and a deterministic trim of the view
   (``core.context.trim``) when the request would still not fit the window. A request
   whose estimate exceeds
   the window is never sent; when nothing can make it fit, ``ContextBudgetError`` says
   how many tokens were needed and how many fit.

Beyond the token threshold, ``prepare`` compacts when ``compaction.max_messages``
messages were written since the last compaction or ``compaction.max_age_seconds``
passed (``core.context.compaction.triggers``), only at the start of a user turn. The
view's message limit is ``history_messages``, derived from the window when neither it
nor a turn limit is configured (``core.context.window.derived_history_messages``); it
hides old messages from the model, and the next compaction folds them from the
transcript.
While a compaction runs the session is ``compacting``; ``idle`` waits it out.

``recover_overflow`` is the reactive path when the provider still says "too long":
calibrate from the numbers in the error, flush if this cycle has not, compact, and
shrink the trim budget, so each of the runner's bounded attempts sends less.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from parley.core.context.compaction.compactor import (
    TRIGGER_MANUAL,
    TRIGGER_OVERFLOW,
    TRIGGER_THRESHOLD,
    CompactionOutcome,
    Compactor,
)
from parley.core.context.compaction.gate import CompactionGate
from parley.core.context.compaction.summarizer import Summarizer
from parley.core.context.compaction.triggers import due_trigger
from parley.core.context.config import ContextConfig
from parley.core.context.flush import (
    FlushOutcome,
    FlushTarget,
    MemoryFlusher,
    flush_due,
    flushed_this_cycle,
)
from parley.core.context.pruning import PRUNE_CUSTOM_TYPE, PruneDecision, decide
from parley.core.context.session_state import SessionState, SessionStates
from parley.core.context.trim import fit_view
from parley.core.context.view import (
    ContextView,
    build_view,
    inspect_view,
    last_call_at,
    max_messages,
)
from parley.core.context.window import (
    WindowInfo,
    check_window,
    compaction_threshold,
    resolve_window,
)
from parley.core.errors import ContextBudgetError, ContextOverflowError
from parley.core.messages import Message, ToolSpec, Usage
from parley.core.providers.base import Provider
from parley.core.providers.provider_config import RetryConfig
from parley.core.tokens import (
    Calibration,
    ContextAccountant,
    ContextSize,
    TokenCounter,
    default_counter,
)
from parley.core.transcript import ENTRY_MESSAGE, Entry
from parley.core.transcript_store import SessionTranscript

log = logging.getLogger("parley.core.context")

# After an overflow the trim budget shrinks at least this much per attempt.
OVERFLOW_SHRINK = 0.85


@dataclass(frozen=True, slots=True)
class PreparedView:
    messages: tuple[Message, ...]
    size: ContextSize
    view_key: str
    window: int
    threshold: int


@dataclass(slots=True)
class TurnEvents:
    """What the engine did during one turn (for the turn result, /status and logs)."""

    compactions: list[CompactionOutcome] = field(default_factory=list)
    flushes: list[FlushOutcome] = field(default_factory=list)
    prunes: int = 0
    trims: int = 0
    usage: Usage = field(default_factory=Usage)  # summariser and flush calls


@dataclass(frozen=True, slots=True)
class ViewRequest:
    """The parts of a request that do not come from the transcript."""

    session_key: str
    system: str
    tools: tuple[ToolSpec, ...]
    model: str
    chat_type: str = "direct"


class ContextEngine:
    def __init__(
        self,
        *,
        config: ContextConfig,
        provider: Provider,
        retry: RetryConfig,
        max_output: int,
        flush_target: FlushTarget | None = None,
        checkpoints_dir: Path | None = None,
        counter: TokenCounter | None = None,
        calibration: Calibration | None = None,
        summary_provider: Provider | None = None,
        zone: Callable[[], tzinfo] = lambda: UTC,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config = config
        self.provider = provider
        self.max_output = max_output
        self.counter = counter or default_counter()
        self.calibration = calibration or Calibration()
        self.now = now
        self._states = SessionStates(
            lambda model: ContextAccountant(
                self.counter,
                self.calibration,
                provider=self.provider.name,
                model=model,
                safety_margin=self.config.safety_margin,
            )
        )
        self._warned: set[str] = set()  # models already warned about a small window
        compaction = config.compaction
        # summary_retries counts retries: the first attempt comes on top, and each
        # retry waits call_with_retry's exponential backoff (with jitter).
        summary_retry = retry.model_copy(
            update={"max_attempts": min(10, compaction.summary_retries + 1)}
        )

        def summarizer_for(model: str | None) -> Summarizer:
            return Summarizer(
                summary_provider or provider,
                model=model,
                counter=self.counter,
                retry=summary_retry,
                max_output_tokens=compaction.summary_max_tokens,
                custom_instructions=compaction.custom_instructions,
            )

        self.compactor = Compactor(
            summarizer=summarizer_for(compaction.model),
            fallback_summarizer=(
                summarizer_for(compaction.fallback_model) if compaction.fallback_model else None
            ),
            count=self.counter.entry,
            count_message=self.counter.message,
            count_text=self.counter.text,
            config=compaction,
            checkpoints_dir=checkpoints_dir,
        )
        self.gate = CompactionGate()
        self.flusher = MemoryFlusher(
            provider=provider,
            retry=retry,
            config=config.flush,
            target=flush_target,
            zone=zone,
            now=now,
        )

    # -- window -------------------------------------------------------------------------

    def window(self, model: str) -> WindowInfo:
        return resolve_window(
            model, self.config, provider_window=getattr(self.provider, "context_window", None)
        )

    def threshold(self, window: int) -> int:
        return compaction_threshold(window, self.config.compaction, self.max_output)

    def _limits(self, request: ViewRequest) -> tuple[SessionState, int, int]:
        """The session's state, its window (the provider's reported one when smaller than
        configured) and the threshold: one resolution for every path."""
        info = self.check(request.model)
        state = self._state(request.session_key, request.model)
        window = min(info.tokens, state.window_cap or info.tokens)
        return state, window, self.threshold(window)

    def check(self, model: str) -> WindowInfo:
        """Refuse a run on a window below the hard minimum, before any provider call."""
        info = self.window(model)
        minimum = self.config.min_window_tokens
        own = getattr(self.provider, "context_window", None)
        warn_below = 0 if model in self._warned else self.config.warn_below_tokens
        if own is not None and model == self.provider.model:
            # The embedded model's window is fixed by its file; refusing it would make
            # the out-of-the-box chat unusable, so its own size is the minimum, and a
            # warning on every start would only tell the user what the banner says.
            minimum = min(minimum, own)
            warn_below = 0
        check_window(info, min_tokens=minimum, warn_below=warn_below)
        if info.tokens < self.config.warn_below_tokens:
            self._warned.add(model)
        return info

    # -- per-session state --------------------------------------------------------------

    def _state(self, key: str, model: str) -> SessionState:
        return self._states.get(key, model)

    def forget(self, key: str) -> None:
        self._states.forget(key)

    def compacting(self, session_key: str) -> bool:
        """Whether a compaction of the session is running right now."""
        return self.gate.compacting(session_key)

    async def idle(self, session_key: str) -> None:
        """Return at once when the session is not compacting, else when it stops."""
        await self.gate.idle(session_key)

    def end_overflow_pressure(self, key: str) -> None:
        """A turn lost to the window: its overflow retries shrank the trim budget, and
        only a successful call restores it. Restore it now, or the next message, one
        that fits the window but not the shrunken budget, is refused without a call,
        and so is every later one. The learned window and calibration stay."""
        state = self._states.peek(key)
        if state is not None:
            state.budget_scale = 1.0

    # -- the view -----------------------------------------------------------------------

    def max_messages(self, chat_type: str, window: int) -> int:
        """The view's message limit (0 = none): see ``core.context.view.max_messages``."""
        return max_messages(self.config, chat_type, window)

    def view(
        self, entries: Sequence[Entry], chat_type: str, *, window: int | None = None
    ) -> tuple[list[Message], str]:
        """The model's view of ``entries`` with recorded prunes applied, and its key.
        ``window`` sizes the derived message limit (default: ``default_window``)."""
        messages, key, _ = build_view(self.config, entries, chat_type, window)
        return messages, key

    def inspect_view(
        self, entries: Sequence[Entry], chat_type: str, *, window: int | None = None
    ) -> ContextView:
        """``view`` plus the counts of what pruning and the history limits left out."""
        return inspect_view(self.config, entries, chat_type, window)

    async def _prune(
        self,
        transcript: SessionTranscript,
        messages: list[Message],
        decisions: Sequence[PruneDecision],
        window: int,
        events: TurnEvents,
    ) -> bool:
        settings = self.config.pruning
        if settings.mode == "off":
            return False
        decision = decide(
            messages,
            now=self.now(),
            last_call_at=last_call_at(transcript.live_entries()),
            window_tokens=window,
            settings=settings,
            already=decisions,
        )
        if decision is None:
            return False
        await asyncio.to_thread(transcript.append_custom, PRUNE_CUSTOM_TYPE, decision.to_dict())
        events.prunes += 1
        log.info(
            "pruned session=%s reason=%s soft=%d hard=%d ratio %.2f→%.2f",
            transcript.header.key,
            decision.reason,
            len(decision.soft),
            len(decision.hard),
            decision.ratio_before,
            decision.ratio_after,
        )
        return True

    # -- prepare ------------------------------------------------------------------------

    async def prepare(
        self, transcript: SessionTranscript, request: ViewRequest, events: TurnEvents
    ) -> PreparedView:
        state, window, threshold = self._limits(request)
        limit = window - self.max_output

        messages, key, decisions = build_view(
            self.config, transcript.live_entries(), request.chat_type, window
        )
        if await self._prune(transcript, messages, decisions, window, events):
            messages, key = self.view(transcript.live_entries(), request.chat_type, window=window)
        size = self._measure(state, request, messages, key)

        if flush_due(
            transcript.live_entries(),
            tokens=size.tokens,
            threshold=threshold,
            live_bytes=transcript.cycle_bytes,
            config=self.config.flush,
        ):
            await self._flush(transcript, request, messages, limit, TRIGGER_THRESHOLD, events)

        if size.tokens > threshold and self._may_compact(state, transcript):
            outcome = await self._compact(
                transcript, request, window, threshold, size.tokens, TRIGGER_THRESHOLD, events
            )
            if outcome.compacted:
                messages, key = self.view(
                    transcript.live_entries(), request.chat_type, window=window
                )
                size = self._measure(state, request, messages, key)
            else:
                state.compaction_blocked_at = _last_entry_id(transcript)
        elif self._may_compact(state, transcript) and (
            trigger := due_trigger(
                transcript.live_entries(),
                self.config.compaction,
                self.now(),
                history_limit=self.max_messages(request.chat_type, window),
            )
        ):
            outcome = await self._compact_due(
                transcript, request, messages, window, threshold, size.tokens, trigger, events
            )
            if outcome.compacted:
                messages, key = self.view(
                    transcript.live_entries(), request.chat_type, window=window
                )
                size = self._measure(state, request, messages, key)
            else:
                state.compaction_blocked_at = _last_entry_id(transcript)

        budget = int(limit * state.budget_scale)
        if size.tokens > budget:
            messages, trimmed = self._fit(state, request, messages, budget)
            events.trims += trimmed
            key = f"{key}|trim:{trimmed}"
            size = self._measure(state, request, messages, key)
            log.warning(
                "session %s: view trimmed by %d item(s) to fit %d tokens",
                request.session_key,
                trimmed,
                budget,
            )
        return PreparedView(tuple(messages), size, key, window, threshold)

    def _measure(
        self, state: SessionState, request: ViewRequest, messages: Sequence[Message], key: str
    ) -> ContextSize:
        return state.accountant.measure(
            system=request.system, messages=messages, tools=request.tools, view_key=key
        )

    def _may_compact(self, state: SessionState, transcript: SessionTranscript) -> bool:
        if not self.config.compaction.enabled:
            return False
        return state.compaction_blocked_at is None or state.compaction_blocked_at != _last_entry_id(
            transcript
        )

    def record_call(
        self,
        request: ViewRequest,
        view: PreparedView,
        *,
        usage: Usage,
        response: Message,
    ) -> None:
        """Feed the provider's reported usage to the session's accountant."""
        state = self._state(request.session_key, request.model)
        state.accountant.record_call(
            system=request.system,
            messages=view.messages,
            tools=request.tools,
            usage=usage,
            response=response,
            view_key=view.view_key,
            request_estimate=view.size.request_estimate or None,
        )
        state.budget_scale = 1.0

    # -- flush and compaction -----------------------------------------------------------

    async def _flush(
        self,
        transcript: SessionTranscript,
        request: ViewRequest,
        messages: Sequence[Message],
        budget: int,
        trigger: str,
        events: TurnEvents,
    ) -> None:
        """The memory flush over the view trimmed to ``budget``. A view that cannot be
        made to fit gets no flush: the compaction that follows must still run. Without
        a flush target (no private notes) there is nowhere to write: no flush."""
        if self.flusher.target is None:
            return
        state = self._state(request.session_key, request.model)
        try:
            fitted, _ = self._fit(state, request, messages, budget)
        except ContextBudgetError:
            log.warning("session %s: no memory flush, the view does not fit", request.session_key)
            return
        outcome = await self.flusher.run(
            transcript,
            system=request.system,
            tools=request.tools,
            messages=fitted,
            model=request.model,
            max_output=min(self.max_output, 2048),
            trigger=trigger,
        )
        events.flushes.append(outcome)
        events.usage = events.usage + outcome.usage

    async def _compact(
        self,
        transcript: SessionTranscript,
        request: ViewRequest,
        window: int,
        threshold: int,
        tokens_before: int,
        trigger: str,
        events: TurnEvents,
        focus: str = "",
    ) -> CompactionOutcome:
        base = self.counter.text(request.system) + self.counter.tools(request.tools)
        async with self.gate.hold(request.session_key):
            outcome = await self.compactor.compact(
                transcript,
                trigger=trigger,
                window=window,
                threshold=threshold,
                base_tokens=base,
                tokens_before=tokens_before,
                focus=focus,
            )
        events.compactions.append(outcome)
        events.usage = events.usage + outcome.usage
        if outcome.compacted:
            state = self._state(request.session_key, request.model)
            state.accountant.reset()
            state.compaction_blocked_at = None
        return outcome

    async def _compact_due(
        self,
        transcript: SessionTranscript,
        request: ViewRequest,
        messages: Sequence[Message],
        window: int,
        threshold: int,
        view_tokens: int,
        trigger: str,
        events: TurnEvents,
    ) -> CompactionOutcome:
        """A count or age compaction: flushed first like ``/compact`` (once per cycle),
        since the session may be far below the flush's own token trigger."""
        async with self.gate.hold(request.session_key):
            entries = transcript.live_entries()
            if isinstance(self.compactor.plan(entries, threshold=threshold, trigger=trigger), str):
                return CompactionOutcome("skipped", trigger, "nothing to fold")
            if self.config.flush.enabled and not flushed_this_cycle(entries):
                limit = window - self.max_output
                await self._flush(transcript, request, messages, limit, trigger, events)
            # The view may be cut by the history limit; the fold covers the whole live
            # window, and the figures recorded should say so.
            base = self.counter.text(request.system) + self.counter.tools(request.tools)
            live = base + sum(
                self.counter.entry(e) for e in transcript.live_entries() if e.type == ENTRY_MESSAGE
            )
            return await self._compact(
                transcript, request, window, threshold, max(view_tokens, live), trigger, events
            )

    async def compact_now(
        self, transcript: SessionTranscript, request: ViewRequest, *, focus: str = ""
    ) -> tuple[CompactionOutcome, TurnEvents]:
        """``/compact [focus]``: flush first (once per cycle), then compact regardless of size."""
        events = TurnEvents()
        state, window, threshold = self._limits(request)
        messages, key = self.view(transcript.live_entries(), request.chat_type, window=window)
        size = self._measure(state, request, messages, key)
        skip = self.compactor.plan(
            transcript.live_entries(), threshold=threshold, trigger=TRIGGER_MANUAL
        )
        if isinstance(skip, str):  # known without a model call: no flush for nothing
            return CompactionOutcome("skipped", TRIGGER_MANUAL, skip), events
        async with self.gate.hold(request.session_key):
            if self.config.flush.enabled and not flushed_this_cycle(transcript.live_entries()):
                limit = window - self.max_output
                await self._flush(transcript, request, messages, limit, TRIGGER_MANUAL, events)
            outcome = await self._compact(
                transcript, request, window, threshold, size.tokens, TRIGGER_MANUAL, events, focus
            )
        return outcome, events

    async def recover_overflow(
        self,
        transcript: SessionTranscript,
        request: ViewRequest,
        view: PreparedView,
        exc: ContextOverflowError,
        events: TurnEvents,
    ) -> None:
        """The provider refused the request as too long: make the next attempt smaller."""
        state = self._state(request.session_key, request.model)
        estimated = self.counter.request(request.system, view.messages, request.tools)
        if exc.observed_tokens:
            # The error's count is the truth about this request: calibrate on it.
            self.calibration.observe(
                self.provider.name,
                request.model,
                estimated=estimated,
                reported=exc.observed_tokens,
            )
        window = view.window
        if exc.limit and exc.limit < window:
            # The provider's window is smaller than configured: believe the provider.
            state.window_cap = window = exc.limit
        threshold = self.threshold(window)
        entries = transcript.live_entries()
        if self.config.flush.enabled and not flushed_this_cycle(entries):
            half = int(window * 0.5)
            await self._flush(transcript, request, view.messages, half, TRIGGER_OVERFLOW, events)
        limit = window
        observed = exc.observed_tokens or math.ceil(view.size.tokens * 1.25)
        compacted = False
        if self.config.compaction.enabled:
            outcome = await self._compact(
                transcript,
                request,
                window,
                threshold,
                observed,
                TRIGGER_OVERFLOW,
                events,
            )
            compacted = outcome.compacted
        state.accountant.reset()
        if not compacted:
            scale = min(OVERFLOW_SHRINK, (limit - self.max_output) / max(observed, 1))
            state.budget_scale = max(0.05, state.budget_scale * scale)
        log.warning(
            "context overflow in session %s (%s / %s tokens): %s",
            request.session_key,
            exc.observed_tokens,
            exc.limit,
            "compacted" if compacted else f"trimming to {state.budget_scale:.2f} of the window",
        )

    # -- deterministic trim -------------------------------------------------------------

    def _fit(
        self,
        state: SessionState,
        request: ViewRequest,
        messages: Sequence[Message],
        budget: int,
    ) -> tuple[list[Message], int]:
        """Make the view fit ``budget`` tokens without a model (``core.context.trim``)."""

        def total(ms: Sequence[Message]) -> int:
            return state.accountant.estimate(
                system=request.system, messages=ms, tools=request.tools
            )

        return fit_view(messages, budget, total, self.counter.text)


def _last_entry_id(transcript: SessionTranscript) -> str | None:
    last = transcript.last_entry
    return last.id if last is not None else None
