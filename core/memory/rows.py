"""The rows of a memory index, whatever store keeps them, and the hits a search returns.

Both stores (SQLite's ``core.memory.store.MemoryStore`` and the gateway's PostgreSQL
one) take and return these types, so the index, search, forgetting and ``parley
migrate`` never depend on which store holds the rows. Plain values only: no I/O, and
no import of any store.

- ``IndexMeta``: what the rows were built with (a difference means a rebuild).
- ``FileRow``, ``NewChunk``, ``ChunkRow``: an indexed file, a chunk to write, a chunk read;
  ``PendingChunk``: one still waiting for its vector.
- ``StoredChunk``, ``CacheEntry``: a chunk and a cached embedding as stored, for copying
  an index to another store without re-embedding.
- ``ForgettableChunk``, ``Tombstone``: what forgetting weighs, and what an eviction leaves.
- ``SourceCount``, ``StoreCounts``: status figures.
- ``SearchHit``: one search result, with its citation.
- ``vector_blob`` / ``blob_vector``: how a vector is stored as bytes (float32).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# 2: scopes name audiences (core.memory.audience); an index made under 1 filed direct
# chats under dm:… and notes agent-wide, so it is rebuilt.
SCHEMA_VERSION = 2
# How much of an evicted chunk's text its tombstone keeps (for ``memory pruned``).
PREVIEW_CHARS = 160


@dataclass(frozen=True, slots=True)
class IndexMeta:
    """What the rows of an index depend on; any difference means rebuilding them."""

    embedder: str  # provider name, "none" in FTS-only mode
    model: str
    provider_key: str
    dimensions: int
    chunking: dict[str, Any]
    tokenizer: str
    schema: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "embedder": self.embedder,
                "model": self.model,
                "provider_key": self.provider_key,
                "dimensions": self.dimensions,
                "chunking": self.chunking,
                "tokenizer": self.tokenizer,
                "schema": self.schema,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, raw: str) -> IndexMeta | None:
        try:
            data = json.loads(raw)
            return cls(
                embedder=str(data["embedder"]),
                model=str(data["model"]),
                provider_key=str(data["provider_key"]),
                dimensions=int(data["dimensions"]),
                chunking=dict(data["chunking"]),
                tokenizer=str(data["tokenizer"]),
                schema=int(data["schema"]),
            )
        except (ValueError, KeyError, TypeError):
            return None  # an unreadable meta row is a mismatch: rebuild


@dataclass(frozen=True, slots=True)
class FileRow:
    path: str
    source: str
    scope: str
    hash: str
    mtime: float
    size: int
    chunks: int = 0
    vectors_pending: bool = False
    indexed_at: float = 0.0


@dataclass(frozen=True, slots=True)
class NewChunk:
    start_line: int
    end_line: int
    text: str
    hash: str
    ts: str | None = None
    entry_ids: tuple[str, ...] = ()
    cjk_text: str = ""  # the bigrams for chunks_cjk; empty when the text has no CJK


@dataclass(frozen=True, slots=True)
class PendingChunk:
    """A chunk written without its vector yet: what the vector pass embeds."""

    id: int
    path: str
    scope: str
    hash: str
    text: str


@dataclass(frozen=True, slots=True)
class ChunkRow:
    id: int
    path: str
    source: str
    scope: str
    start_line: int
    end_line: int
    hash: str
    text: str
    ts: str | None
    entry_ids: tuple[str, ...]
    updated_at: float


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """A chunk as stored, with what its keyword and vector tables hold for it: what
    copying an index to another store needs (``parley migrate``), no re-embedding."""

    id: int
    start_line: int
    end_line: int
    hash: str
    text: str
    ts: str | None
    entry_ids: tuple[str, ...]
    created_at: float
    updated_at: float
    cjk_text: str  # chunks_cjk's text ("" when the chunk has no CJK)
    vector: np.ndarray | None  # None: no vector stored (keyword-only, or pending)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    provider: str
    model: str
    provider_key: str
    hash: str
    embedding: bytes  # float32, as stored
    dims: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class ForgettableChunk:
    """What the forgetting policies weigh of a chunk: when, what, where."""

    id: int
    path: str
    source: str
    scope: str
    start_line: int
    end_line: int
    hash: str
    text: str
    ts: str | None
    file_mtime: float


@dataclass(frozen=True, slots=True)
class Tombstone:
    """An evicted chunk: (path, hash) is never indexed again."""

    path: str
    hash: str
    scope: str
    source: str
    start_line: int
    end_line: int
    reason: str
    evicted_at: float
    preview: str

    @classmethod
    def of(cls, chunk: ForgettableChunk, reason: str, evicted_at: float) -> Tombstone:
        preview = " ".join(chunk.text.split())[:PREVIEW_CHARS]
        return cls(
            chunk.path, chunk.hash, chunk.scope, chunk.source, chunk.start_line,
            chunk.end_line, reason, evicted_at, preview,
        )  # fmt: skip


@dataclass(slots=True)
class SourceCount:
    source: str
    files: int = 0
    chunks: int = 0


@dataclass(slots=True)
class StoreCounts:
    files: int = 0
    chunks: int = 0
    vectors: int = 0
    pending_vector_files: int = 0
    cache_entries: int = 0
    forgotten: int = 0  # tombstones: chunks evicted by forgetting
    by_source: list[SourceCount] = field(default_factory=list)


def vector_blob(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=np.float32).tobytes()


def blob_vector(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.float32)


@dataclass(frozen=True, slots=True)
class SearchHit:
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    source: str
    scope: str
    entry_ids: tuple[str, ...] = ()
    ts: str | None = None
    vector_score: float | None = None
    text_score: float | None = None

    @property
    def citation(self) -> str:
        return f"{self.path}#L{self.start_line}-L{self.end_line}"

    def to_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "score": round(self.score, 4),
            "snippet": self.snippet,
            "source": self.source,
            "citation": self.citation,
        }
