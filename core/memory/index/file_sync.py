"""Sync, file by file: bring one store up to date with the index's sources.

A file whose (mtime, size) and then content hash are unchanged is skipped; a changed
one is read, chunked (Markdown lines, transcript turns, or one chunk per task record),
embedded (from the cache by content hash first, the live index's cache during a
rebuild, then the embedder) and its chunks replaced in one transaction, so a kill at
any moment leaves every file either fully old or fully new and the next sync resumes.
Chunks that forgetting evicted (tombstones) stay out. A file that fails is reported in
the ``SyncReport`` and leaves the index dirty; the others carry on.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parley.core.errors import EmbedderError, MemoryIndexError, TranscriptError
from parley.core.memory.audience import parse_scope
from parley.core.memory.chunking import (
    Chunk,
    chunk_markdown,
    chunk_turns,
    header_agent_name,
    transcript_turns,
)
from parley.core.memory.embedders import ResilientEmbedder
from parley.core.memory.forgetting import FORGETTABLE_SOURCES
from parley.core.memory.index.discovery import IndexSources
from parley.core.memory.index.state import IndexState, made_by
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.query import cjk_index_text
from parley.core.memory.rows import FileRow, IndexMeta, NewChunk
from parley.core.memory.sources import (
    AGENT_SCOPE,
    SESSIONS_SOURCE,
    TASKS_SOURCE,
    ScopeResolver,
    SourceFile,
    read_header,
)
from parley.core.memory.store_protocol import MemoryStoreProtocol
from parley.core.memory.tasks import task_chunks

# Bounds a file the index will read: bigger memory files are indexed up to this size.
MAX_FILE_BYTES = 64 * 1024 * 1024
UNSCOPED = "unscoped"
ProgressCallback = Callable[[int, int, str], None]  # (files done, files total, path)


@dataclass(slots=True)
class SyncReport:
    reason: str
    files_seen: int = 0
    files_indexed: int = 0
    files_unchanged: int = 0
    files_deleted: int = 0
    chunks_written: int = 0
    embedded: int = 0
    cache_hits: int = 0
    vectors_pending: int = 0
    reindexed: bool = False
    forgotten: int = 0  # chunks the scheduled forgetting evicted after this sync
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def default_scope_resolver(header: Mapping[str, Any]) -> str:
    """Scope from a transcript header's ``meta.memory_scope`` (the gateway writes it):
    a person's or a conversation's. Anything else (none, agent-wide, a scope of an older
    index) cannot be attributed to one audience: it stays out of every conversation's
    search rather than leak into one. The gateway passes a resolver that also derives
    the audience from the session key."""
    meta = header.get("meta")
    scope = meta.get("memory_scope") if isinstance(meta, dict) else None
    audience = parse_scope(scope) if isinstance(scope, str) else None
    if audience is None or audience.kind == "agent":
        return UNSCOPED
    return audience.scope


class FileSync:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        sources: IndexSources,
        embedder: ResilientEmbedder | None,
        scope_for: ScopeResolver,
        threads: StoreThreads,
        state: IndexState,
    ) -> None:
        self.settings = settings
        self.sources = sources
        self.embedder = embedder
        self.scope_for = scope_for
        self._threads = threads
        self._state = state

    async def sync_into(
        self,
        store: MemoryStoreProtocol,
        meta: IndexMeta,
        report: SyncReport,
        progress: ProgressCallback | None,
    ) -> None:
        """Make ``store`` (the live index, or a rebuild's shadow) match the sources."""
        w = self._threads.w
        sources = await self.sources.files()
        rows = await w(store.files)
        wanted = {s.path for s in sources}
        for path in sorted(rows.keys() - wanted):
            await w(store.delete_file, path)
            report.files_deleted += 1
        report.files_seen = len(sources)
        # What a person asked to keep (notes, MEMORY.md) before the transcripts and task
        # logs, which are many and grow: a search waits for a sync only so long
        # (search_wait_seconds), and a /remember must be findable by the next search
        # even when a long transcript is still being embedded behind it.
        ordered = sorted(sources, key=lambda s: s.source in FORGETTABLE_SOURCES)
        for done, source in enumerate(ordered, start=1):
            if self._state.closed:
                raise asyncio.CancelledError
            try:
                await self._sync_file(store, meta, source, rows.get(source.path), report)
            except (OSError, MemoryIndexError, TranscriptError, store.info.module.Error) as exc:
                # The driver's own error classes too (a full or read-only disk). The file
                # stays as it was; the index stays dirty, so the next search retries it.
                report.errors.append(f"{source.path}: {exc}")
                self._state.dirty = True
            if progress is not None:
                progress(done, len(sources), source.path)

    async def _sync_file(
        self,
        store: MemoryStoreProtocol,
        meta: IndexMeta,
        source: SourceFile,
        row: FileRow | None,
        report: SyncReport,
    ) -> None:
        w = self._threads.w
        marker = await asyncio.to_thread(self.sources.marker, source)
        if marker is None:
            if row is not None:
                await w(store.delete_file, source.path)
                report.files_deleted += 1
            return
        mtime, size = marker
        retry_vectors = row is not None and row.vectors_pending and meta.embedder != "none"
        if row is not None and row.mtime == mtime and row.size == size and not retry_vectors:
            report.files_unchanged += 1
            return
        data = await asyncio.to_thread(self.sources.read, source, MAX_FILE_BYTES)
        digest = hashlib.sha256(data).hexdigest()
        if row is not None and row.hash == digest:
            if retry_vectors:
                await self._fill_vectors(store, meta, row, report)
            await w(store.touch_file, source.path, mtime, size)
            report.files_unchanged += 1
            return
        chunks, scope = await asyncio.to_thread(self.chunk, source, data)
        if source.source in FORGETTABLE_SOURCES:
            # Evicted chunks stay evicted: a transcript that grows is re-chunked whole.
            forgotten = await w(store.forgotten_hashes, source.path)
            chunks = [c for c in chunks if c.hash not in forgotten]
        vectors, pending = await self._vectors(
            store, meta, [(c.hash, c.text) for c in chunks], report
        )
        file = FileRow(source.path, source.source, scope, digest, mtime, size, len(chunks), pending)
        await w(store.replace_file, file, chunks, vectors)
        report.files_indexed += 1
        report.chunks_written += len(chunks)
        report.vectors_pending += int(pending)

    def chunk(self, source: SourceFile, data: bytes) -> tuple[list[NewChunk], str]:
        """Chunks of one file and its scope (runs in a worker thread: CPU-bound)."""
        text = data.decode("utf-8", errors="replace")
        chunking = self.settings.chunking
        raw: Sequence[Chunk | NewChunk]
        if source.source == TASKS_SOURCE:
            raw, found = task_chunks(text)
            # A log without a readable record cannot be attributed: nobody searches it.
            scope = found or UNSCOPED
        elif source.source == SESSIONS_SOURCE:
            lines = text.split("\n")
            header = read_header(lines[0].encode()) if lines else None
            scope = self.scope_for(header or {})
            # The header is parsed once, here: its agent name labels the turns after it.
            first = 1 if header is None else 2
            turns = transcript_turns(
                ((i, line) for i, line in enumerate(lines[first - 1 :], start=first)),
                agent_name=header_agent_name(header) if header is not None else None,
            )
            raw = chunk_turns(
                turns,
                max_tokens=chunking.transcript_tokens,
                overlap_turns=chunking.transcript_overlap_turns,
            )
        else:
            scope = source.scope or AGENT_SCOPE
            raw = chunk_markdown(
                text,
                max_tokens=chunking.file_tokens,
                overlap_tokens=chunking.file_overlap_tokens,
            )
        chunks = [
            NewChunk(
                c.start_line, c.end_line, c.text, c.hash, c.ts, c.entry_ids, cjk_index_text(c.text)
            )
            for c in raw
        ]
        return chunks, scope

    async def _vectors(
        self,
        store: MemoryStoreProtocol,
        meta: IndexMeta,
        items: Sequence[tuple[str, str]],
        report: SyncReport,
    ) -> tuple[np.ndarray | None, bool]:
        """Vectors row for row of ``items`` ((content hash, text) pairs: the chunker's
        sha256 is the cache key), and vectors_pending: None and True when the embedder
        failed."""
        if meta.embedder == "none" or self.embedder is None or not items:
            return None, False
        w = self._threads.w
        hashes = [h for h, _ in items]
        key = (meta.embedder, meta.model, meta.provider_key)
        dims = meta.dimensions
        cached = await w(store.cached_vectors, *key, hashes, dims)
        live = self._threads.wstore
        if live is not None and live is not store and len(cached) < len(hashes):
            # A rebuild (e.g. new chunking) reuses the live index's vectors of the same model.
            wanted = [h for h in hashes if h not in cached]
            cached.update(await w(live.cached_vectors, *key, wanted, dims))
        report.cache_hits += sum(1 for h in hashes if h in cached)
        missing = list(dict.fromkeys(h for h in hashes if h not in cached))
        if missing:
            by_hash = dict(items)
            try:
                result = await self.embedder.embed([by_hash[h] for h in missing], kind="passage")
            except EmbedderError as exc:
                report.errors.append(f"embedding failed, keyword-only for now: {exc}")
                return None, True
            if not made_by(result.embedder, meta):
                # A fallback model answered: its vectors cannot share a table with these.
                return None, True
            fresh = list(zip(missing, result.vectors, strict=True))
            report.embedded += len(fresh)
            cached.update(fresh)
            await w(store.cache_vectors, *key, fresh, max_entries=self.settings.cache_max_entries)
        await w(store.ensure_vectors, len(next(iter(cached.values()))))
        return np.stack([cached[h] for h in hashes]), False

    async def _fill_vectors(
        self, store: MemoryStoreProtocol, meta: IndexMeta, row: FileRow, report: SyncReport
    ) -> None:
        """Vectors for a file indexed while the embedder was down (its text unchanged)."""
        w = self._threads.w
        existing = await w(store.chunk_texts, row.path)
        vectors, pending = await self._vectors(
            store, meta, [(h, t) for _, h, t in existing], report
        )
        if vectors is not None and not pending:
            items = [(chunk_id, vectors[i]) for i, (chunk_id, _, _) in enumerate(existing)]
            await w(store.add_vectors, row.path, row.scope, items)
