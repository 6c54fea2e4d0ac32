"""Config of the context engine: window, accounting, pruning, compaction, memory flush.

The ``[context]`` section. Defaults follow OpenClaw's numbers
(``shared/reference/openclaw-design.md`` sections 3-6) unless a comment says why not.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_CONTEXT_WINDOW = 200_000
# The smallest window that works: a 2,048-token llama.cpp server holds the system prompt
# (about 300-450 tokens, 750 with tools), a 512-token reply and a few turns of history
# (core.context.budget scales every figure down to it). Below 16,000 a warning says
# to expect frequent compaction.
WINDOW_HARD_MIN_TOKENS = 2_048
WINDOW_WARN_BELOW_TOKENS = 16_000
DEFAULT_RESERVE_TOKENS = 16_384
DEFAULT_RESERVE_FLOOR_TOKENS = 20_000
DEFAULT_SAFETY_MARGIN = 1.2
DEFAULT_MAX_MESSAGES = 500
DEFAULT_SLIDING_WINDOW_MESSAGES = 40
DEFAULT_SELECTIVE_TARGET_RATIO = 0.25
DEFAULT_HIERARCHICAL_RECENT_TASKS = 5

# How a compaction folds the old part (core/context/compaction/strategies/): every strategy
# keeps the ledger and the newest turns verbatim; they differ in the summary text.
CompactionStrategyName = Literal["summary", "selective", "hierarchical", "sliding-window"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelWindowConfig(_Strict):
    """One model's window and abilities, overriding what the server says and the built-in
    table (``[context.models."<id>"]``)."""

    context_tokens: int | None = Field(None, ge=1, le=10_000_000, description="usable window")
    context_window: int | None = Field(None, ge=1, le=10_000_000, description="advertised")
    # None: what the server says (llama.cpp /props), else yes.
    tools: bool | None = Field(None, description="offer tools to this model")
    # None: what the provider says (the embedded model cannot), else yes. False: compaction
    # folds history by a strategy that needs no model call.
    summaries: bool | None = Field(None, description="the model can write compaction summaries")


class PruningConfig(_Strict):
    """Cache-TTL pruning of old tool results (view only; decisions are recorded)."""

    mode: Literal["off", "cache-ttl"] = "cache-ttl"
    ttl_seconds: float = Field(300.0, gt=0, le=86_400, description="the provider cache's life")
    keep_last_assistants: int = Field(3, ge=0, le=100)
    soft_trim_ratio: float = Field(0.3, ge=0, le=1)
    hard_clear_ratio: float = Field(0.5, ge=0, le=1)
    min_prunable_tool_chars: int = Field(50_000, ge=0)
    soft_trim_max_chars: int = Field(4_000, ge=100)
    soft_trim_head_chars: int = Field(1_500, ge=0)
    soft_trim_tail_chars: int = Field(1_500, ge=0)
    hard_clear_enabled: bool = True
    hard_clear_placeholder: str = "[Old tool result content cleared]"
    # Beyond OpenClaw: prune a busy session too once its share passes hard_clear_ratio,
    # not only after the cache expired (OpenClaw #58284: a busy session never pruned).
    prune_on_share: bool = True
    tools_allow: tuple[str, ...] = Field((), description="globs; empty = every tool")
    tools_deny: tuple[str, ...] = Field((), description="globs; deny wins over allow")
    # Pictures people sent: shown to the model for this many completed turns after the
    # one they came with, then a placeholder naming them (core.context.pruning).
    keep_image_turns: int = Field(3, ge=0, le=100)


class CompactionConfig(_Strict):
    enabled: bool = True
    reserve_tokens: int = Field(DEFAULT_RESERVE_TOKENS, ge=0)
    reserve_tokens_floor: int = Field(DEFAULT_RESERVE_FLOOR_TOKENS, ge=0)
    keep_recent_tokens: int = Field(20_000, ge=0)
    keep_recent_turns: int = Field(3, ge=0, le=12)
    max_attempts: int = Field(3, ge=1, le=10, description="overflow: compact and retry")
    # A cheaper model for summaries; unset: the session's own model.
    model: str | None = None
    summary_max_tokens: int = Field(4_096, ge=256, le=64_000)
    summary_retries: int = Field(3, ge=1, le=10)
    custom_instructions: str = Field("", max_length=4_000)
    checkpoints_kept: int = Field(25, ge=0, le=1_000)
    strategy: CompactionStrategyName = "summary"
    # selective: the folded part is cut down to this share of the compaction threshold
    # (a quarter leaves room for the kept turns, capped at MAX_KEEP_SHARE, and growth).
    selective_target_ratio: float = Field(DEFAULT_SELECTIVE_TARGET_RATIO, gt=0, le=1)
    # hierarchical: finished tasks beyond this many most recent shrink to one line.
    hierarchical_recent_tasks: int = Field(DEFAULT_HIERARCHICAL_RECENT_TASKS, ge=0, le=100)
    # sliding-window (and the last resort of every strategy): messages kept verbatim.
    sliding_window_messages: int = Field(DEFAULT_SLIDING_WINDOW_MESSAGES, ge=2, le=10_000)
    # Triggers beyond the token threshold, checked only at the start of a user turn.
    max_messages: int = Field(
        DEFAULT_MAX_MESSAGES, ge=0, description="messages since the last compaction; 0 = off"
    )
    max_age_seconds: float | None = Field(
        None, gt=0, description="seconds since the last compaction; unset = off"
    )
    # Tried (same provider) when the summariser's own model fails after its retries.
    fallback_model: str | None = None


class FlushConfig(_Strict):
    """The silent turn that saves durable memories before a compaction."""

    enabled: bool = True
    soft_threshold_tokens: int = Field(4_000, ge=0)
    force_transcript_bytes: int = Field(2 * 1024 * 1024, ge=0)


class ContextConfig(_Strict):
    default_window: int = Field(DEFAULT_CONTEXT_WINDOW, ge=1_000)
    # Applies only downward: a cap below the model's window.
    agent_max_tokens: int | None = Field(None, ge=1_000)
    min_window_tokens: int = Field(WINDOW_HARD_MIN_TOKENS, ge=0)
    warn_below_tokens: int = Field(WINDOW_WARN_BELOW_TOKENS, ge=0)
    safety_margin: float = Field(DEFAULT_SAFETY_MARGIN, ge=1.0, le=3.0)
    dm_history_turns: int = Field(0, ge=0, description="user turns kept in DMs; 0 = all")
    group_history_turns: int = Field(0, ge=0, description="user turns kept in groups; 0 = all")
    # Messages in the view: 0 = derive from the window when no turn limit applies
    # (core.context.window.derived_history_messages), -1 = unlimited, N > 0 = at most N.
    history_messages: int = Field(0, ge=-1)
    file_max_chars: int = Field(20_000, ge=100)
    total_max_chars: int = Field(150_000, ge=100)
    models: dict[str, ModelWindowConfig] = Field(default_factory=dict)
    pruning: PruningConfig = PruningConfig()
    compaction: CompactionConfig = CompactionConfig()
    flush: FlushConfig = FlushConfig()

    @field_validator("models")
    @classmethod
    def _lower_keys(cls, value: dict[str, ModelWindowConfig]) -> dict[str, ModelWindowConfig]:
        return {k.strip().lower(): v for k, v in value.items()}
