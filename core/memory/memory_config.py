"""The ``[memory]`` config section: sources, chunking, sync triggers, search defaults,
automatic recall.

Automatic recall (``core.memory.recall``) searches memory before each turn and puts the
best hits in the user turn: ``recall = "auto"`` does so when the message looks like it
refers to earlier work, files, people, dates, preferences or decisions (the rules are in
``core.memory.recall_rules``), ``"always"`` on every turn, ``"off"`` never.
``recall_budget_tokens`` caps the injected block (cl100k tokens, markers included).

Search defaults were tuned on the LoCoMo dev split (``parley bench locomo``, see
docs/benchmarks.md); OpenClaw's own numbers are noted where ours differ and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parley.core.memory.driver import DriverChoice
from parley.core.memory.embedders import EmbedderSettings
from parley.core.memory.recall import DEFAULT_RECALL_BUDGET_TOKENS, DEFAULT_RECALL_MODE, RecallMode


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChunkingSettings(_Strict):
    # Memory files: OpenClaw's 400/80 token line chunks.
    file_tokens: int = Field(400, ge=32, le=4000)
    file_overlap_tokens: int = Field(80, ge=0, le=1000)
    # Transcripts: small turn-aware chunks, so that several distinct moments fit the
    # budget a model reads (measured: 4-turn windows beat 1,600-char chunks by far).
    transcript_tokens: int = Field(160, ge=32, le=2000)
    transcript_overlap_turns: int = Field(1, ge=0, le=8)

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingSettings:
        if self.file_overlap_tokens >= self.file_tokens:
            raise ValueError("file_overlap_tokens must be smaller than file_tokens")
        return self


class SyncSettings(_Strict):
    on_start: bool = True
    on_search: bool = True
    # How long a search waits for a dirty index to catch up before answering from what
    # is there (an empty index always waits for its first sync).
    search_wait_seconds: float = Field(5.0, ge=0, le=600)
    watch: bool = True
    watch_debounce_seconds: float = Field(1.5, ge=0.05, le=60)
    watch_poll_seconds: float = Field(1.0, ge=0.05, le=60)
    # Short: a sync after a turn chunks only what the turn appended (it resumes where the
    # last one stopped) and leaves the embedding to the vector pass, so a fact is findable
    # by keyword within a second of its turn; the debounce still gathers one turn's lines
    # and its task record into one sync.
    transcript_debounce_seconds: float = Field(0.5, ge=0, le=600)
    # Sync at once (no debounce) when this much transcript has piled up.
    transcript_delta_bytes: int = Field(100_000, ge=0)
    transcript_delta_messages: int = Field(50, ge=0)
    after_compaction: bool = True


class SearchSettings(_Strict):
    max_results: int = Field(8, ge=1, le=50)
    min_score: float = Field(0.2, ge=0, le=1)
    vector_weight: float = Field(0.7, ge=0, le=1)
    text_weight: float = Field(0.3, ge=0, le=1)
    candidate_multiplier: int = Field(4, ge=1, le=20)
    snippet_chars: int = Field(700, ge=100, le=4000)
    mmr: bool = False
    mmr_lambda: float = Field(0.7, ge=0, le=1)
    temporal_decay: bool = False
    half_life_days: float = Field(30.0, gt=0, le=3650)

    @model_validator(mode="after")
    def _weights(self) -> SearchSettings:
        if self.vector_weight + self.text_weight <= 0:
            raise ValueError("vector_weight + text_weight must be positive")
        return self


class ScopeForgetting(_Strict):
    """A scope's own forgetting limits (``[memory.forgetting.scopes."<pattern>"]``):
    only the keys written here override the section's; ``None`` turns a policy off."""

    max_age_days: float | None = Field(None, gt=0)
    min_importance: float | None = Field(None, ge=0, le=1)
    max_chunks_per_scope: int | None = Field(None, ge=1)


class ForgettingSettings(_Strict):
    """Forgetting of derived memory (transcript chunks, task records; never the
    memory files people write). Age and importance are off by default: what is
    forgotten is gone from search, so an operator opts in. Capacity bounds a scope at
    a size no conversation reaches by accident, evicting the least important, oldest
    chunks first."""

    enabled: bool = True
    max_age_days: float | None = Field(None, gt=0)
    # core.importance scores: 0.15 is chatter ("ok", "thanks"), 0.40 plain content.
    min_importance: float | None = Field(None, ge=0, le=1)
    max_chunks_per_scope: int | None = Field(20_000, ge=1)
    # How often the index applies the policies after a sync (0: only on demand).
    schedule_hours: float = Field(24.0, ge=0)
    # Keys are scopes or fnmatch patterns ("person:*", "conversation:*"); the most specific
    # (longest) matching pattern wins.
    scopes: dict[str, ScopeForgetting] = Field(default_factory=dict)


class MemorySettings(_Strict):
    enabled: bool = True
    # Default: $PARLEY_HOME/memory/<agent id>/memory.db
    db_path: Path | None = None
    driver: DriverChoice = "auto"
    sources: tuple[Literal["memory", "sessions", "tasks", "notes"], ...] = (
        "memory",
        "sessions",
        "tasks",
        "notes",
    )
    extra_paths: tuple[Path, ...] = ()
    # Where the bot keeps what it writes about a person or a conversation (notes/, and
    # tasks/ for task records), outside the workspace so no file tool reaches it.
    # Default: beside memory.db. Several replicas must point it at a shared volume.
    private_dir: Path | None = None
    # Kept so that older configs still load: a direct chat's transcripts always belong to
    # its person now ("agent" is no longer honoured: the gateway says so at start).
    transcript_scope: Literal["peer", "agent"] = "peer"
    cache_max_entries: int = Field(100_000, ge=0)
    recall: RecallMode = DEFAULT_RECALL_MODE
    recall_budget_tokens: int = Field(DEFAULT_RECALL_BUDGET_TOKENS, ge=64, le=32_000)
    embedder: EmbedderSettings = EmbedderSettings()
    chunking: ChunkingSettings = ChunkingSettings()
    sync: SyncSettings = SyncSettings()
    search: SearchSettings = SearchSettings()
    forgetting: ForgettingSettings = ForgettingSettings()
