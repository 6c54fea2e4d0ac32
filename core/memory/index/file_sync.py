"""Sync, file by file: bring one store up to date with the index's sources.

A file whose (mtime, size) and then content hash are unchanged is skipped. A transcript
that grew is chunked from where the previous sync stopped (``transcript_sync``): only
its open chunk and what was appended; every other changed file (Markdown memory files,
notes, task logs: small) is read and chunked whole. Its chunks are written (text and
keyword rows, with the resume point) in one transaction, so a kill at any moment leaves
every file either fully old or fully new and the next sync resumes; they are findable
by keyword at once. Their vectors come after, from the vector pass (``vectors``), which
embeds the pending chunks of every file in batches. Chunks that forgetting evicted
(tombstones) stay out. A file that fails is reported in the ``SyncReport`` and leaves the
index dirty; the others carry on.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parley.core.errors import MemoryIndexError, TranscriptError
from parley.core.memory.audience import parse_scope
from parley.core.memory.chunking import Chunk, chunk_markdown
from parley.core.memory.chunking.resume import ResumePoint
from parley.core.memory.embedders import ResilientEmbedder
from parley.core.memory.forgetting import FORGETTABLE_SOURCES
from parley.core.memory.index.discovery import IndexSources
from parley.core.memory.index.state import IndexState
from parley.core.memory.index.transcript_sync import (
    MAX_FILE_BYTES,
    TranscriptUpdate,
    chunk_whole_transcript,
    new_chunks,
    resume_transcript,
)
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.rows import FileRow, IndexMeta, NewChunk
from parley.core.memory.sources import (
    AGENT_SCOPE,
    SESSIONS_SOURCE,
    TASKS_SOURCE,
    Marker,
    ScopeResolver,
    SourceFile,
)
from parley.core.memory.store_protocol import MemoryStoreProtocol
from parley.core.memory.tasks import task_chunks

UNSCOPED = "unscoped"
# A source whose rows stay once its file is gone (``MemoryIndex.keep_removed``): the
# store's state holds this key for it.
KEPT_PREFIX = "kept_source:"


def kept_key(path: str) -> str:
    return f"{KEPT_PREFIX}{path}"


ProgressCallback = Callable[[int, int, str], None]  # (files done, files total, path)


@dataclass(slots=True)
class SyncReport:
    reason: str
    files_seen: int = 0
    files_indexed: int = 0
    files_resumed: int = 0  # of those, transcripts chunked from where they had stopped
    files_unchanged: int = 0
    files_deleted: int = 0
    files_kept: int = 0  # kept sources whose files are gone, carried over by a rebuild
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
            if await w(store.state, kept_key(path)) is not None:
                continue  # removed by retention; its chunks stay searchable
            await w(store.delete_file, path)
            report.files_deleted += 1
        report.files_seen = len(sources)
        # What a person asked to keep (notes, MEMORY.md) before the transcripts and task
        # logs, which are many and grow: a search waits for a sync only so long
        # (search_wait_seconds), and a /remember must be findable by the next search
        # even when a long transcript is still being embedded behind it.
        ordered = sorted(sources, key=lambda s: s.source in FORGETTABLE_SOURCES)
        # Every source's (mtime, size) in one worker call: a sync runs after every turn
        # and most files have not changed, so per file it must cost a stat, not a thread
        # hop (with thousands of transcripts the hops were most of a sync's cost).
        markers = await asyncio.to_thread(self._markers, ordered)
        for done, source in enumerate(ordered, start=1):
            if self._state.closed:
                raise asyncio.CancelledError
            row = rows.get(source.path)
            marker = markers[source.path]
            try:
                if isinstance(marker, OSError):
                    raise marker
                await self._sync_file(store, meta, source, row, marker, report)
            except (OSError, MemoryIndexError, TranscriptError, store.info.module.Error) as exc:
                # The driver's own error classes too (a full or read-only disk). The file
                # stays as it was; the index stays dirty, so the next search retries it.
                report.errors.append(f"{source.path}: {exc}")
                self._state.dirty = True
            if progress is not None:
                progress(done, len(sources), source.path)

    def _markers(self, sources: Sequence[SourceFile]) -> dict[str, Marker | OSError | None]:
        """(mtime, size) of each source now: None when gone, the error when it cannot
        be read (that file fails, the others go on); blocking."""
        markers: dict[str, Marker | OSError | None] = {}
        for source in sources:
            try:
                markers[source.path] = self.sources.marker(source)
            except OSError as exc:
                markers[source.path] = exc
        return markers

    async def _sync_file(
        self,
        store: MemoryStoreProtocol,
        meta: IndexMeta,
        source: SourceFile,
        row: FileRow | None,
        marker: Marker | None,
        report: SyncReport,
    ) -> None:
        w = self._threads.w
        if marker is None:
            if row is not None and await w(store.state, kept_key(source.path)) is None:
                await w(store.delete_file, source.path)
                report.files_deleted += 1
            return
        mtime, size = marker
        if row is not None and row.mtime == mtime and row.size == size:
            report.files_unchanged += 1
            return
        # Chunks are written without vectors: the vector pass adds them after.
        wants_vectors = meta.embedder != "none" and self.embedder is not None
        point = ResumePoint.decode(row.hash) if row is not None else None
        if row is not None and point is not None and source.source == SESSIONS_SOURCE:
            update = await asyncio.to_thread(
                resume_transcript,
                self.sources,
                source,
                point,
                row.scope,
                self.settings.chunking,
                self.scope_for,
            )
            if update is True:
                await w(store.touch_file, source.path, mtime, size)
                report.files_unchanged += 1
                return
            if isinstance(update, TranscriptUpdate):
                chunks = await self._remembered(store, source, update.chunks)
                file = FileRow(
                    source.path, source.source, update.scope, update.digest, mtime, size,
                    0, wants_vectors,
                )  # fmt: skip
                await w(store.replace_tail, file, update.from_line or 0, chunks)
                report.files_indexed += 1
                report.files_resumed += 1
                report.chunks_written += len(chunks)
                return
        data = await asyncio.to_thread(self.sources.read, source, MAX_FILE_BYTES)
        chunks, scope, digest = await asyncio.to_thread(self.chunk_file, source, data)
        if row is not None and row.hash == digest:
            await w(store.touch_file, source.path, mtime, size)
            report.files_unchanged += 1
            return
        chunks = await self._remembered(store, source, chunks)
        pending = wants_vectors and bool(chunks)
        file = FileRow(source.path, source.source, scope, digest, mtime, size, len(chunks), pending)
        await w(store.replace_file, file, chunks, None)
        report.files_indexed += 1
        report.chunks_written += len(chunks)

    async def _remembered(
        self, store: MemoryStoreProtocol, source: SourceFile, chunks: list[NewChunk]
    ) -> list[NewChunk]:
        """``chunks`` less those forgetting evicted: evicted chunks stay evicted."""
        if source.source not in FORGETTABLE_SOURCES or not chunks:
            return chunks
        forgotten = await self._threads.w(store.forgotten_hashes, source.path)
        return [c for c in chunks if c.hash not in forgotten]

    def chunk(self, source: SourceFile, data: bytes) -> tuple[list[NewChunk], str]:
        """Chunks of one whole file and its scope (runs in a worker thread: CPU-bound)."""
        chunks, scope, _ = self.chunk_file(source, data)
        return chunks, scope

    def chunk_file(self, source: SourceFile, data: bytes) -> tuple[list[NewChunk], str, str]:
        """Chunks of one whole file, its scope, and the hash its file row keeps: for a
        transcript, where the next sync resumes (else the content's sha256)."""
        chunking = self.settings.chunking
        digest = hashlib.sha256(data).hexdigest()
        raw: Sequence[Chunk | NewChunk]
        if source.source == SESSIONS_SOURCE:
            result, scope = chunk_whole_transcript(data, chunking, self.scope_for)
            if result.point is not None:
                digest = result.point.encode()
            return new_chunks(result.chunks), scope, digest
        text = data.decode("utf-8", errors="replace")
        if source.source == TASKS_SOURCE:
            raw, found = task_chunks(text)
            # A log without a readable record cannot be attributed: nobody searches it.
            scope = found or UNSCOPED
        else:
            scope = source.scope or AGENT_SCOPE
            raw = chunk_markdown(
                text,
                max_tokens=chunking.file_tokens,
                overlap_tokens=chunking.file_overlap_tokens,
            )
        return new_chunks(raw), scope, digest
