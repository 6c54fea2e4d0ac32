"""The admin API's request and response shapes (pydantic): handlers validate with
them, and the OpenAPI document is generated from them, so the two cannot drift."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SESSION_ID_PATTERN = r"^[0-9a-f]{32}$"


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """A shape with documented fields and room for more (transcript payloads)."""

    model_config = ConfigDict(extra="allow")


class ErrorBody(_Out):
    error: str = Field(description="a stable code: bad_request, unauthorized, not_found, ...")
    message: str = Field(description="what went wrong, for people")


class HealthCheck(_Out):
    ok: bool
    detail: str


class HealthChecks(_Out):
    state_db: HealthCheck
    channels: dict[str, HealthCheck]
    provider: HealthCheck


class Health(_Out):
    status: Literal["ok", "degraded"]
    live: bool
    ready: bool
    checks: HealthChecks


class TokenCounts(_Out):
    input: int
    output: int
    cache_read: int
    cache_write: int


class SessionSummary(_Out):
    id: str
    key: str
    agent_id: str
    channel: str
    account: str
    chat_type: str
    display_name: str | None
    status: Literal["active", "archived"]
    created_at: str
    updated_at: str
    archived_reason: str | None
    model: str | None
    turn_count: int
    entry_count: int
    context_tokens: int
    compaction_count: int


class CompactionFigures(_Out):
    """The session's compactions, from its whole transcript."""

    count: int
    by_strategy: dict[str, int] = Field(description="summary, selective, hierarchical, ...")
    by_trigger: dict[str, int] = Field(description="threshold, overflow, manual, messages, age")
    with_fallbacks: int = Field(description="made after at least one failed step")
    last_tokens_before: int | None
    last_tokens_after: int | None
    tokens_saved: int
    last_at: str | None


class SessionDetail(SessionSummary):
    peer: str
    parent_key: str | None
    archived_at: str | None
    settings: dict[str, Any]
    last_route: dict[str, Any] | None
    delivery_error: str | None
    last_entry_id: str | None
    tokens: TokenCounts
    cache_read_share: float | None = Field(
        description="cache_read / (input + cache_read + cache_write); null before any turn"
    )
    window_tokens: int
    context_utilisation: float = Field(
        description="context_tokens / window_tokens (above 1: the last request overflowed); "
        "context_tokens is the size recorded last: the model's report after a turn, the "
        "compactor's estimate after a compaction. The context endpoint's figures are the "
        "ones /status and /context show"
    )
    compactions: CompactionFigures


class SessionPage(_Out):
    items: list[SessionSummary]
    next_cursor: str | None


class TranscriptEntry(_Open):
    index: int = Field(description="0-based entry line in the file")
    id: str
    parent_id: str | None
    ts: str
    type: str = Field(description="message | compaction | custom")


class TranscriptPage(_Out):
    session_id: str
    total: int
    items: list[TranscriptEntry]
    next_cursor: str | None


class ContextSection(_Out):
    kind: Literal["system", "file", "tools", "summary", "history"]
    name: str
    tokens: int


class PrunedCounts(_Out):
    trimmed: int = Field(description="tool results soft-trimmed by cache-TTL pruning")
    cleared: int = Field(description="tool results replaced by a placeholder")
    dropped_turns: int = Field(description="user turns left out by the history turn limit")


class RecalledMemory(_Out):
    citation: str = Field(description="path#Lstart-Lend")
    tokens: int
    score: float | None


class RecallInfo(_Out):
    mode: str = Field(description='"auto" or "always" (memory.recall)')
    reason: str = Field(description="the rule that triggered it (core.memory.recall_rules)")
    tokens: int = Field(description="the injected block, markers included")
    skipped_present: int = Field(description="hits left out: already in the live context")
    hits: list[RecalledMemory]


class LastCallFigures(_Out):
    prompt_tokens: int = Field(description="what the model read, cache included")
    output_tokens: int = Field(description="what it wrote")
    tokens: int = Field(description="prompt_tokens + output_tokens")


class ContextFigures(_Out):
    """The figures `/status` and `/context` print, from the same report."""

    window_tokens: int
    window_source: str = Field(description="the window and where it came from, in words")
    next_request_tokens: int = Field(
        description="parley's estimate of the next request: system prompt, tools, history"
    )
    share: float = Field(description="next_request_tokens / window_tokens")
    last_call: LastCallFigures | None = Field(
        description="the last call as the model reported it; null before one, and after "
        "a compaction until the next"
    )
    lines: list[str] = Field(description="the figures as `/status` and `/context` word them")


class ContextBreakdown(_Out):
    session_id: str
    status: Literal["active", "archived"]
    total_tokens: int = Field(description="figures.next_request_tokens")
    window_tokens: int
    share: float
    figures: ContextFigures
    sections: list[ContextSection] = Field(description="sums to total_tokens; the bar")
    pruned: PrunedCounts
    report: dict[str, Any] = Field(description="the same object as `/context json`")
    recall: RecallInfo | None = Field(
        None, description="what automatic memory recall put into the last user message"
    )


class CompactionItem(_Out):
    entry_id: str
    ts: str
    trigger: str
    tokens_before: int
    tokens_after: int
    summary: str
    ledger: Any = Field(description="what the compaction promised to keep (ids, paths, ...)")
    first_kept_entry_id: str | None


class CompactionList(_Out):
    session_id: str
    items: list[CompactionItem]


class CompactRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    focus: str = Field("", max_length=2000, description="what the summary must keep")


class EmptyRequest(BaseModel):
    """No fields: an empty body, or ``{}``."""

    model_config = ConfigDict(extra="forbid")


class CompactResult(_Out):
    session_id: str
    outcome: Literal["compacted", "skipped", "failed"]
    message: str
    tokens_before: int | None
    tokens_after: int | None


class ResetResult(_Out):
    session_id: str
    status: Literal["archived"]
    archived_reason: str


class MemoryStatusBody(_Open):
    enabled: bool


class TaskErrorCount(_Out):
    error: str = Field(description="normalised: numbers and ids stripped")
    count: int


class MemoryStatsBody(_Out):
    enabled: bool
    scopes: list[str] | None = Field(description="the scopes counted; null: every scope")
    total: int = 0
    by_outcome: dict[str, int] = Field(default_factory=dict, description="ok, partial, error")
    top_errors: list[TaskErrorCount] = Field(default_factory=list)
    tools: dict[str, int] = Field(default_factory=dict, description="calls per tool")


class MemoryHit(_Out):
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    source: str
    scope: str
    audience: str = Field(description='who may read it: "agent-wide", "person …", "conversation …"')
    ts: str | None


class MemorySearchBody(_Out):
    query: str
    mode: str = Field(description="hybrid | keyword | vector")
    notes: list[str] = Field(description="why vectors were not used, when they were not")
    scopes: list[str]
    items: list[MemoryHit]


# -- query strings -----------------------------------------------------------------------


class _Query(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SessionListQuery(_Query):
    channel: str | None = Field(None, min_length=1, max_length=64)
    agent: str | None = Field(None, min_length=1, max_length=64)
    status: Literal["active", "archived"] | None = None
    q: str | None = Field(None, min_length=1, max_length=200, description="text in key or name")
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, min_length=1, max_length=512)


class TranscriptQuery(_Query):
    limit: int = Field(100, ge=1, le=500)
    cursor: str | None = Field(None, min_length=1, max_length=20, pattern=r"^[0-9]+$")


class MemoryStatusQuery(_Query):
    agent: str | None = Field(
        None, min_length=1, max_length=64, description="an agent's id; default: the default agent"
    )


class MemoryStatsQuery(_Query):
    agent: str | None = Field(
        None, min_length=1, max_length=64, description="an agent's id; default: the default agent"
    )
    scope: str | None = Field(
        None, min_length=1, max_length=300, description="one scope; default: every scope"
    )


class MemorySearchQuery(_Query):
    q: str = Field(min_length=1, max_length=1000)
    agent: str | None = Field(
        None, min_length=1, max_length=64, description="an agent's id; default: the default agent"
    )
    scope: str | None = Field(
        None, min_length=1, max_length=300, description="one scope; default: every scope"
    )
    limit: int = Field(8, ge=1, le=50)
