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
4. the guard, against ONE threshold (``window − reserve − output``) shared by all
   three steps: the memory flush when within ``soft_threshold_tokens`` of it (once per
   compaction cycle), a compaction when past it, and a deterministic trim of the view
   (``core.context.trim``) when the request would still not fit the window less the
   reply's reserve. A request whose estimate exceeds that is never sent; when nothing
   can make it fit, ``ContextBudgetError`` says how many tokens were needed, how many
   fit, and whether the history, the newest message or the system prompt is too big.

Every size comes from ``core.context.budget`` (``ContextBudget``, one per window).

Beyond the token threshold, ``prepare`` compacts at the start of a user turn when
``compaction.max_messages`` were written or ``max_age_seconds`` passed since the last
compaction, or the view's message limit (``history_messages``, else derived from the
window) hides messages (``core.context.compaction.triggers``). While a compaction runs
the session is ``compacting``; ``idle`` waits it out.

``recover_overflow`` is the reactive path when the provider still says "too long", or
a reply stopped because the window filled: calibrate from the numbers in the error
(prompt-only ones from a llama.cpp-like server), flush if this cycle has not, compact,
and shrink the trim budget, so each of the runner's bounded attempts sends less.

A model that cannot write summaries (``context.models.<id>.summaries = false``, or the
provider's ``supports_summaries``) compacts with a strategy that needs no model call
(``NO_MODEL_STRATEGY``) and gets no memory flush: its notes would be copies or loops.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from parley.core.context.budget import (
    ContextBudget,
    context_budget,
    keep_under_history_limit,
    plausible_count,
    shrunk_scale,
)
from parley.core.context.compaction.compactor import (
    TRIGGER_HISTORY,
    TRIGGER_MANUAL,
    TRIGGER_OVERFLOW,
    TRIGGER_THRESHOLD,
    CompactionOutcome,
    build_compactor,
)
from parley.core.context.compaction.gate import CompactionGate
from parley.core.context.compaction.strategies import strategy_without_model
from parley.core.context.compaction.triggers import due_trigger
from parley.core.context.config import ContextConfig
from parley.core.context.flush import (
    FLUSH_PROMPT,
    FlushTarget,
    MemoryFlusher,
    flush_due,
    flushed_this_cycle,
)
from parley.core.context.requests import PreparedView, TurnEvents, ViewRequest
from parley.core.context.session_state import SessionState, SessionStates
from parley.core.context.stored_counts import StoredCounts
from parley.core.context.trim import fit_view, newest_turn_start
from parley.core.context.view import (
    ContextView,
    build_view,
    inspect_view,
    max_messages,
    record_prune,
)
from parley.core.context.window import (
    WindowInfo,
    can_summarise,
    check_window,
    model_window,
    prompt_only_window,
)
from parley.core.errors import ContextBudgetError, ContextOverflowError
from parley.core.messages import Message, Usage
from parley.core.model_profile import is_embedded
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

__all__ = ["ContextEngine", "PreparedView", "TurnEvents", "ViewRequest"]

log = logging.getLogger("parley.core.context")


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
        summaries_by_default: bool = True,
    ) -> None:
        self.config = config
        self.provider = provider
        self.summary_provider = summary_provider or provider
        self.max_output = max_output
        self.counter = counter or default_counter()
        self.calibration = calibration or Calibration()
        self.now = now
        # Whether a model nobody said anything about writes summaries (the model profile's
        # choice; config and the provider's own word come first).
        self.summaries_by_default = summaries_by_default
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
        self._stored_counts = StoredCounts(self.counter)
        self.compactor = build_compactor(
            config.compaction,
            provider=self.summary_provider,
            counter=self.counter,
            retry=retry,
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
        """``model``'s window. The provider's discovered window is its own model's: a
        session on another model id gets the table, the config or the default."""
        return model_window(model, self.config, self.provider)

    @property
    def prompt_only(self) -> bool:
        """Whether the provider's server counts only the prompt against its window."""
        return prompt_only_window(self.provider)

    def budget(self, window: int, request: ViewRequest | None = None) -> ContextBudget:
        """Every figure the engine plans with for ``window`` (``core.context.budget``),
        the fold figures sized to ``request``'s system prompt and tools."""
        base = margin = 0.0
        if request is not None:
            base = self.counter.text(request.system) + self.counter.tools(request.tools)
            ratio = self.calibration.ratio(self.provider.name, request.model)
            margin = self.config.safety_margin * ratio
        return context_budget(
            window,
            self.config,
            self.max_output,
            base_tokens=int(base),
            margin=margin,
        )

    def threshold(self, window: int) -> int:
        return self.budget(window).threshold

    def summaries(self, model: str) -> bool:
        """Whether compaction may ask a model for summaries (and the flush for notes)."""
        name = self.config.compaction.model or model
        return can_summarise(
            self.config, self.summary_provider, name, default=self.summaries_by_default
        )

    def _strategy(self, model: str) -> str | None:
        """The compaction strategy to use instead of the configured one, if any."""
        if self.summaries(model):
            return None
        return strategy_without_model(self.config.compaction.strategy)

    def _limits(self, request: ViewRequest) -> tuple[SessionState, ContextBudget]:
        """The session's state and the figures of its window (the provider's reported
        one when smaller than configured): one resolution for every path."""
        info = self.check(request.model)
        state = self._state(request.session_key, request.model)
        window = min(info.tokens, state.window_cap or info.tokens)
        return state, self.budget(window, request)

    def session_window(self, key: str | None, model: str) -> int:
        """The session's effective window in tokens: the model's resolved window, or
        the smaller one a provider's refusal taught the session (``recover_overflow``).
        The one figure every report of the session's window shows."""
        tokens = self.window(model).tokens
        state = self._states.peek(key) if key is not None else None
        if state is not None and state.model == model and state.window_cap:
            tokens = min(tokens, state.window_cap)
        return tokens

    def session_budget(self, request: ViewRequest) -> ContextBudget:
        """The figures of the session's window now (refused below the minimum)."""
        return self._limits(request)[1]

    def check(self, model: str) -> WindowInfo:
        """Refuse a run on a window below the hard minimum, before any provider call."""
        info = self.window(model)
        minimum = self.config.min_window_tokens
        own = getattr(self.provider, "context_window", None)
        warn_below = 0 if model in self._warned else self.config.warn_below_tokens
        if isinstance(own, int) and is_embedded(self.provider) and model == self.provider.model:
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

    @property
    def vision(self) -> bool:
        """Whether the model sees images (else the view shows pictures as placeholders)."""
        return getattr(self.provider, "vision", False) is True

    def max_messages(self, chat_type: str, window: int) -> int:
        """The view's message limit (0 = none): see ``core.context.view.max_messages``."""
        return max_messages(self.config, chat_type, window)

    def view(
        self, entries: Sequence[Entry], chat_type: str, *, window: int | None = None
    ) -> tuple[list[Message], str]:
        """The model's view of ``entries`` with recorded prunes applied, and its key.
        ``window`` sizes the derived message limit (default: ``default_window``)."""
        messages, key, _ = build_view(self.config, entries, chat_type, window, vision=self.vision)
        return messages, key

    def inspect_view(
        self, entries: Sequence[Entry], chat_type: str, *, window: int | None = None
    ) -> ContextView:
        """``view`` plus the counts of what pruning and the history limits left out."""
        return inspect_view(self.config, entries, chat_type, window, vision=self.vision)

    # -- prepare ------------------------------------------------------------------------

    async def prepare(
        self, transcript: SessionTranscript, request: ViewRequest, events: TurnEvents
    ) -> PreparedView:
        state, budget = self._limits(request)
        window, threshold = budget.window, budget.threshold
        # A window read again from its file: its messages' counts are in their entries.
        self._stored_counts.take_new(transcript)

        messages, key, decisions = build_view(
            self.config, transcript.live_entries(), request.chat_type, window, vision=self.vision
        )
        if await record_prune(
            transcript, messages, decisions, self.config, window=window, now=self.now()
        ):
            events.prunes += 1
            messages, key = self.view(transcript.live_entries(), request.chat_type, window=window)
        size = self._measure(state, request, messages, key)

        if flush_due(
            transcript.live_entries(),
            tokens=size.tokens,
            threshold=threshold,
            live_bytes=transcript.cycle_bytes,
            config=self.config.flush,
        ):
            await self._flush(transcript, request, messages, budget, TRIGGER_THRESHOLD, events)

        # Positive whatever happened before: the limit leaves three quarters of the
        # window at least, and an overflow shrinks it to MIN_BUDGET_SCALE of that at most.
        trim_budget = max(1, int(budget.limit * state.budget_scale))
        outcome: CompactionOutcome | None = None
        if size.tokens > threshold and self._may_compact(state, transcript):
            # A newest message that does not fit alone is refused below: folding the
            # history first would cost a summary and save nothing.
            if self._fits_alone(state, request, messages, trim_budget):
                outcome = await self._compact(
                    transcript, request, budget, size.tokens, TRIGGER_THRESHOLD, events
                )
        elif self._may_compact(state, transcript) and (
            trigger := due_trigger(
                transcript.live_entries(),
                self.config.compaction,
                self.now(),
                history_limit=(history_limit := self.max_messages(request.chat_type, window)),
            )
        ):
            outcome = await self._compact_due(
                transcript,
                request,
                messages,
                budget,
                size.tokens,
                trigger,
                events,
                history_limit=history_limit,
            )
        if outcome is not None and outcome.compacted:
            messages, key = self.view(transcript.live_entries(), request.chat_type, window=window)
            size = self._measure(state, request, messages, key)
        elif outcome is not None:
            state.compaction_blocked_at = _last_entry_id(transcript)

        if size.tokens > trim_budget:
            messages, trimmed = self._fit(state, request, messages, trim_budget)
            events.trims += trimmed
            key = f"{key}|trim:{trimmed}"
            size = self._measure(state, request, messages, key)
            log.warning(
                "session %s: view trimmed by %d item(s) to fit %d tokens",
                request.session_key,
                trimmed,
                trim_budget,
            )
        return PreparedView(tuple(messages), size, key, window, threshold, budget)

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
        budget: ContextBudget,
        trigger: str,
        events: TurnEvents,
        *,
        view_tokens: int | None = None,
    ) -> None:
        """The memory flush over the view trimmed to fit beside the flush prompt and its
        answer (``view_tokens``: a tighter cap). A view that cannot be made to fit gets no
        flush: the compaction that follows must still run. Without a flush target (no
        private notes) there is nowhere to write, and a model that cannot summarise
        would write copies or loops: no flush."""
        if self.flusher.target is None or not self.summaries(request.model):
            return
        state = self._state(request.session_key, request.model)
        room = budget.window - budget.flush_output - self.counter.text(FLUSH_PROMPT) - 16
        fit_to = min(room, view_tokens) if view_tokens is not None else room
        try:
            fitted, _ = self._fit(state, request, messages, max(1, fit_to))
        except ContextBudgetError:
            log.warning("session %s: no memory flush, the view does not fit", request.session_key)
            return
        with events.busy("saving notes to memory"):
            outcome = await self.flusher.run(
                transcript,
                system=request.system,
                tools=request.tools,
                messages=fitted,
                model=request.model,
                max_output=budget.flush_output,
                trigger=trigger,
            )
        events.flushes.append(outcome)
        events.usage = events.usage + outcome.usage

    async def _compact(
        self,
        transcript: SessionTranscript,
        request: ViewRequest,
        budget: ContextBudget,
        tokens_before: int,
        trigger: str,
        events: TurnEvents,
        focus: str = "",
    ) -> CompactionOutcome:
        base = self.counter.text(request.system) + self.counter.tools(request.tools)
        with events.busy("compacting the conversation"):
            async with self.gate.hold(request.session_key):
                outcome = await self.compactor.compact(
                    transcript,
                    trigger=trigger,
                    window=budget.window,
                    threshold=budget.threshold,
                    base_tokens=base,
                    tokens_before=tokens_before,
                    focus=focus,
                    budget=budget,
                    strategy=self._strategy(request.model),
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
        budget: ContextBudget,
        view_tokens: int,
        trigger: str,
        events: TurnEvents,
        *,
        history_limit: int = 0,
    ) -> CompactionOutcome:
        """A count, age or history compaction: flushed first like ``/compact`` (once per
        cycle), since the session may be far below the flush's own token trigger."""
        async with self.gate.hold(request.session_key):
            entries = transcript.live_entries()
            if trigger == TRIGGER_HISTORY:
                budget = keep_under_history_limit(budget, entries, history_limit, self.counter)
            plan = self.compactor.plan(
                entries, threshold=budget.threshold, trigger=trigger, budget=budget
            )
            if isinstance(plan, str):
                return CompactionOutcome("skipped", trigger, "nothing to fold")
            if self.config.flush.enabled and not flushed_this_cycle(entries):
                await self._flush(transcript, request, messages, budget, trigger, events)
            # The view may be cut by the history limit; the fold covers the whole live
            # window, and the figures recorded should say so.
            base = self.counter.text(request.system) + self.counter.tools(request.tools)
            live = base + sum(
                self.counter.entry(e) for e in transcript.live_entries() if e.type == ENTRY_MESSAGE
            )
            return await self._compact(
                transcript, request, budget, max(view_tokens, live), trigger, events
            )

    async def compact_now(
        self, transcript: SessionTranscript, request: ViewRequest, *, focus: str = ""
    ) -> tuple[CompactionOutcome, TurnEvents]:
        """``/compact [focus]``: flush first (once per cycle), then compact regardless of size."""
        events = TurnEvents()
        state, budget = self._limits(request)
        messages, key = self.view(
            transcript.live_entries(), request.chat_type, window=budget.window
        )
        size = self._measure(state, request, messages, key)
        skip = self.compactor.plan(
            transcript.live_entries(),
            threshold=budget.threshold,
            trigger=TRIGGER_MANUAL,
            budget=budget,
        )
        if isinstance(skip, str):  # known without a model call: no flush for nothing
            return CompactionOutcome("skipped", TRIGGER_MANUAL, skip), events
        async with self.gate.hold(request.session_key):
            if self.config.flush.enabled and not flushed_this_cycle(transcript.live_entries()):
                await self._flush(transcript, request, messages, budget, TRIGGER_MANUAL, events)
            outcome = await self._compact(
                transcript, request, budget, size.tokens, TRIGGER_MANUAL, events, focus
            )
        return outcome, events

    async def recover_overflow(
        self,
        transcript: SessionTranscript,
        request: ViewRequest,
        view: PreparedView,
        exc: ContextOverflowError,
        events: TurnEvents,
        *,
        stopped: bool = False,
    ) -> None:
        """The provider refused the request as too long, or (``stopped``) its reply
        stopped because the window filled: make the next attempt smaller.

        Only a refusal with believable numbers teaches the session a smaller window, and
        never one below ``min_window_tokens``: a stopped reply's "limit" is just where it
        stopped (prompt plus what was written), and learning it would shrink the
        session's window for good."""
        state = self._state(request.session_key, request.model)
        prompt_only = exc.prompt_only if exc.prompt_only is not None else self.prompt_only
        estimated = self.counter.request(request.system, view.messages, request.tools)
        # A count far from the estimate describes some other request (a reply's usage
        # of one token): its numbers are not believed.
        trusted = not exc.observed_tokens or plausible_count(exc.observed_tokens, estimated)
        if exc.observed_tokens and trusted:
            # The error's count is the truth about this request: calibrate on it.
            self.calibration.observe(
                self.provider.name,
                request.model,
                estimated=estimated,
                reported=exc.observed_tokens,
            )
        window = view.window
        if exc.limit and trusted and not stopped:
            # The provider's window is smaller than configured: believe the provider.
            cap = max(exc.limit, self.config.min_window_tokens)
            if cap < window:
                state.window_cap = window = cap
        budget = self.budget(window, request)
        entries = transcript.live_entries()
        if self.config.flush.enabled and not flushed_this_cycle(entries):
            await self._flush(
                transcript,
                request,
                view.messages,
                budget,
                TRIGGER_OVERFLOW,
                events,
                view_tokens=window // 2,
            )
        observed = exc.observed_tokens or math.ceil(view.size.tokens * 1.25)
        compacted = False
        if self.config.compaction.enabled:
            outcome = await self._compact(
                transcript, request, budget, observed, TRIGGER_OVERFLOW, events
            )
            compacted = outcome.compacted
        state.accountant.reset()
        if not compacted:
            limit = exc.limit if exc.limit and trusted else window
            state.budget_scale = shrunk_scale(state.budget_scale, budget, observed, limit)
        log.warning(
            "context overflow in session %s (%s / %s tokens%s): %s",
            request.session_key,
            exc.observed_tokens,
            exc.limit,
            ", prompt only" if prompt_only else "",
            "compacted" if compacted else f"trimming to {state.budget_scale:.2f} of the limit",
        )

    # -- deterministic trim -------------------------------------------------------------

    def _fits_alone(
        self, state: SessionState, request: ViewRequest, messages: Sequence[Message], budget: int
    ) -> bool:
        """Whether the newest turn, with the system prompt and tools, fits ``budget``."""
        newest = list(messages[newest_turn_start(messages) :])
        total = state.accountant.estimate(
            system=request.system, messages=newest, tools=request.tools
        )
        return total <= budget

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
