"""MemoryIndex: one agent's long-term memory, kept in sync and searched.

Lifecycle: ``await index.start()`` opens memory.db (two connections, each on its own
thread: a writer for sync and a reader for search, so a long sync never stalls a
search), starts the start-up sync and the file watcher; ``await index.close()`` stops
them. Every SQLite call runs off the event loop.

Sync is incremental: a file whose (mtime, size) and then content hash are unchanged is
skipped; a changed file's chunks are replaced in one transaction, so a kill at any
moment leaves every file either fully old or fully new and the next sync resumes.
Embeddings come from the cache (by content hash) before the embedder is asked.

When what the rows depend on changes (embedder, model, dimensions, chunking,
tokenizer: ``IndexMeta``), the index is rebuilt into ``memory.db.reindex`` while the old
one keeps answering (keyword-only, since its vectors belong to another model), then
swapped in with one rename. A kill during the rebuild resumes it at the next start.
Another ``StoreBackend`` (PostgreSQL) keeps its rows elsewhere and swaps its own way;
transcripts come through a ``TranscriptSource`` (files, or a transcript store's rows).

Triggers: start-up, a search on a dirty index (an empty index waits for its first
sync), the watcher on memory files (polling, debounced), transcript appends (debounced,
or at once past a size/count threshold), compactions and new task records.

Forgetting (``core.memory.forgetting``): after a sync, once ``schedule_hours`` have
passed since the last run (kept in the store), and on demand (``forget``). Evicted
chunks leave tombstones that every later sync, and a rebuild, leaves out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from core.errors import EmbedderError, MemoryIndexError, TranscriptError
from core.memory.audience import Audience, Viewer, may_read, parse_scope, visible_scopes
from core.memory.backend import SHADOW_SUFFIX as SHADOW_SUFFIX  # re-exported
from core.memory.backend import (
    MemoryStoreProtocol,
    SqliteBackend,
    StoreBackend,
)
from core.memory.chunking import chunk_markdown, chunk_turns, header_agent_name, transcript_turns
from core.memory.decay import iso_timestamp
from core.memory.embedders import Embedder, ResilientEmbedder
from core.memory.forgetting import (
    FORGETTABLE_SOURCES,
    LAST_RUN_KEY,
    ForgettingReport,
    plan_forgetting,
)
from core.memory.notes import NOTES_SOURCE, Forgotten, NoteStore
from core.memory.query import cjk_index_text
from core.memory.search import SearchHit, SearchParams, SearchTrace, run_search
from core.memory.settings import MemorySettings
from core.memory.sources import (
    AGENT_SCOPE,
    MEMORY_SOURCE,
    SESSIONS_SOURCE,
    TASKS_SOURCE,
    FileTranscriptSource,
    Marker,
    ScopeResolver,
    SourceFile,
    TranscriptSource,
    memory_files,
    memory_path,
    read_header,
    task_files,
)
from core.memory.store import FileRow, IndexMeta, NewChunk, StoreCounts, Tombstone
from core.memory.tasks import TaskLog, TaskRecord, TaskStats, task_chunks, task_stats

log = logging.getLogger("parley.core.memory")

T = TypeVar("T")
TOKENIZER = "cl100k_base"
# Where unrelated text lands in cosine similarity, per embedder. e5 puts almost
# everything above 0.75 (measured on LoCoMo: the best chunk of an unrelated conversation
# scores 0.77-0.83, evidence 0.81-0.89), so its similarities are rescaled from 0.78;
# min_score then filters unrelated text for it as for embedders whose cosines spread
# over [0, 1] (MiniLM, OpenAI).
SIMILARITY_FLOORS: Mapping[str, float] = {"e5": 0.78}
# memory_get reads at most this much of a file.
MAX_GET_LINES = 2000
MAX_GET_CHARS = 200_000
# Bounds a file the index will read: bigger memory files are indexed up to this size.
MAX_FILE_BYTES = 64 * 1024 * 1024

UNSCOPED = "unscoped"
ProgressCallback = Callable[[int, int, str], None]  # (files done, files total, path)


class AsyncResource(Protocol):
    """What the index opens before its store and closes after it, when it owns the
    backend's connections (a PostgreSQL pool of its own)."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...


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
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class SearchResult:
    hits: list[SearchHit]
    mode: str  # hybrid | keyword | vector
    provider: str
    model: str
    fallback: str | None  # why vectors were not used, when they were not
    search_ms: float
    synced_first: bool
    trace: SearchTrace

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [h.to_dict() for h in self.hits],
            "mode": self.mode,
            "provider": self.provider,
            "model": self.model,
            "fallback": self.fallback,
            "search_ms": round(self.search_ms, 1),
        }


@dataclass(frozen=True, slots=True)
class MemoryStatus:
    db_path: str
    workspace: str
    driver: dict[str, Any]
    requested_provider: str
    provider: str
    model: str
    dimensions: int
    vector_available: bool
    vector_error: str | None
    fts_available: bool
    counts: StoreCounts
    dirty_files: list[str]
    reindexing: bool
    reindex_pending: bool  # what the rows depend on changed: the next sync rebuilds
    syncing: bool
    last_sync: dict[str, Any] | None
    embedder: dict[str, Any] | None
    cache_max_entries: int
    fallback: str | None
    sources: tuple[str, ...]
    forgetting_enabled: bool = False
    forgetting_last_run: str | None = None  # ISO 8601; None: never ran

    def to_dict(self) -> dict[str, Any]:
        return {
            "db_path": self.db_path,
            "workspace": self.workspace,
            "driver": self.driver,
            "requested_provider": self.requested_provider,
            "provider": self.provider,
            "model": self.model,
            "dimensions": self.dimensions,
            "vector": {"available": self.vector_available, "error": self.vector_error},
            "fts": {"available": self.fts_available},
            "files": self.counts.files,
            "chunks": self.counts.chunks,
            "vectors": self.counts.vectors,
            "files_awaiting_vectors": self.counts.pending_vector_files,
            "by_source": [
                {"source": s.source, "files": s.files, "chunks": s.chunks}
                for s in self.counts.by_source
            ],
            "dirty": bool(self.dirty_files),
            "dirty_files": self.dirty_files,
            "reindexing": self.reindexing,
            "reindex_pending": self.reindex_pending,
            "syncing": self.syncing,
            "last_sync": self.last_sync,
            "embedder": self.embedder,
            "cache": {"entries": self.counts.cache_entries, "max_entries": self.cache_max_entries},
            "fallback": self.fallback,
            "sources": list(self.sources),
            "forgetting": {
                "enabled": self.forgetting_enabled,
                "last_run": self.forgetting_last_run,
                "forgotten": self.counts.forgotten,
            },
        }


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


class MemoryIndex:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        db_path: Path,
        workspace: Path,
        sessions_dir: Path,
        embedder: ResilientEmbedder | None,
        scope_for: ScopeResolver | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        backend: StoreBackend | None = None,
        transcripts: TranscriptSource | None = None,
        resource: AsyncResource | None = None,
        tasks_dir: Path | None = None,
        tasks_writer: str | None = None,
        notes_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.db_path = db_path
        # Where the rows live: memory.db by default, PostgreSQL when the gateway says so.
        self.backend: StoreBackend = backend or SqliteBackend(db_path, settings.driver)
        self.workspace = workspace
        self.sessions_dir = sessions_dir
        # The sessions source: the transcript files by default, a store's rows otherwise.
        self.transcripts: TranscriptSource = transcripts or FileTranscriptSource(sessions_dir)
        # Task records and notes are private to their audience: they live beside
        # memory.db by default, never in the workspace the file tools can read.
        self.task_log = TaskLog(tasks_dir or db_path.parent / "tasks", writer=tasks_writer)
        self.notes = NoteStore(notes_dir or db_path.parent / "notes")
        self._resource = resource
        self.embedder = embedder
        self.scope_for = scope_for or default_scope_resolver
        self._now = now
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="parley-memory-write")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="parley-memory-read")
        self._wstore: MemoryStoreProtocol | None = None
        self._rstore: MemoryStoreProtocol | None = None
        self._live_meta: IndexMeta | None = None
        self._sync_lock = asyncio.Lock()
        self._reader_lock = asyncio.Lock()
        self._sync_task: asyncio.Task[SyncReport] | None = None
        self._again = False
        self._dirty = True  # nothing is known to be in sync until the first sync
        self._synced_once = False
        self._empty = True  # no file indexed yet: a search waits for the first sync
        self._reindexing = False
        self._last_sync: SyncReport | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._transcript_timer: asyncio.TimerHandle | None = None
        self._pending_bytes = 0
        self._pending_messages = 0
        self._closed = False
        self._known_scopes: tuple[str, ...] | None = None  # cleared by every sync
        # Called with each search's seconds (the gateway's latency histogram).
        self.on_search: Callable[[float], None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.open()
        if self.settings.sync.on_start:
            self.request_sync("start")
        if self.settings.sync.watch:
            self._watch_task = asyncio.create_task(self._watch(), name="memory-watch")

    async def open(self) -> None:
        """Open memory.db without starting background work (the CLI uses this)."""
        if self._resource is not None:
            await self._resource.open()
        vector = self._wants_vectors()
        self._wstore = await self._w(self.backend.open_live, vector=vector)
        self._rstore = await self._r(self.backend.open_live, vector=vector)
        self._live_meta = await self._w(self._wstore.meta)
        counts = await self._w(self._wstore.counts)
        self._empty = counts.files == 0
        if self._live_meta is None and counts.files == 0:
            # A new (or meta-less) index: adopt the wanted meta. A meta-less index with
            # rows was built under an unknown one: the first sync rebuilds it.
            await self._w(self._wstore.set_meta, self.wanted_meta())
            self._live_meta = self.wanted_meta()

    async def close(self) -> None:
        self._closed = True
        if self._transcript_timer is not None:
            self._transcript_timer.cancel()
        for task in (self._watch_task, self._sync_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._wstore is not None:
            await self._w(self._wstore.close)
        if self._rstore is not None:
            await self._r(self._rstore.close)
        self._wstore = self._rstore = None
        if self._resource is not None:
            await self._resource.close()
        if self.embedder is not None:
            await self.embedder.close()
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)

    async def _w(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, lambda: fn(*args, **kwargs))

    async def _r(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, lambda: fn(*args, **kwargs))

    def _store(self) -> MemoryStoreProtocol:
        if self._wstore is None:
            raise MemoryIndexError("the memory index is not open")
        return self._wstore

    # -- meta ----------------------------------------------------------------------------

    def _wants_vectors(self) -> bool:
        return self.embedder is not None and self.embedder.primary.provider != "none"

    @property
    def _vectors_on(self) -> bool:
        store = self._wstore
        return self._wants_vectors() and store is not None and store.info.vector_available

    def wanted_meta(self) -> IndexMeta:
        chunking = self.settings.chunking.model_dump()
        if not self._vectors_on or self.embedder is None:
            return IndexMeta("none", "", "", 0, chunking, TOKENIZER)
        primary: Embedder = self.embedder.primary
        return IndexMeta(
            primary.provider, primary.model, primary.provider_key, primary.dimensions,
            chunking, TOKENIZER,
        )  # fmt: skip

    # -- sync ----------------------------------------------------------------------------

    def request_sync(self, reason: str) -> asyncio.Task[SyncReport]:
        """Start a background sync, or ask the running one to go round once more."""
        self._dirty = True
        if self._sync_task is not None and not self._sync_task.done():
            self._again = True
            return self._sync_task
        self._sync_task = asyncio.create_task(self._sync_loop(reason), name="memory-sync")
        return self._sync_task

    async def _sync_loop(self, reason: str) -> SyncReport:
        while True:
            self._again = False
            try:
                report = await self.sync(reason=reason)
            except Exception as exc:  # a background sync must not die silently
                log.exception("memory sync failed")
                report = SyncReport(reason=reason, errors=[str(exc)])
            if not self._again or self._closed:
                return report
            reason = "follow-up"

    async def sync(
        self,
        *,
        reason: str = "manual",
        force: bool = False,
        progress: ProgressCallback | None = None,
        scheduled_forgetting: bool = True,
    ) -> SyncReport:
        """Bring the index up to date (``force``: rebuild it), then run the forgetting
        schedule if it is due (``scheduled_forgetting=False``: not now, e.g. before a
        dry run, which must change nothing)."""
        async with self._sync_lock:
            started = time.perf_counter()
            # Cleared first, so that changes noticed during this sync mark it dirty again;
            # restored when the sync does not finish.
            self._dirty = False
            store = self._store()
            wanted = self.wanted_meta()
            try:
                if force or self._live_meta != wanted:
                    report = await self._reindex(wanted, reason, progress)
                else:
                    report = SyncReport(reason=reason)
                    await self._sync_into(store, wanted, report, progress)
            except BaseException:
                self._dirty = True
                raise
            if report.files_indexed or report.files_unchanged:
                self._empty = False
            if scheduled_forgetting:
                await self._forget_if_due(report)
            report.seconds = round(time.perf_counter() - started, 3)
            self._known_scopes = None
            self._last_sync = report
            self._synced_once = True
            for error in report.errors:
                log.warning("memory sync (%s): %s", reason, error)
            return report

    async def _sources(self) -> list[SourceFile]:
        def discover() -> list[SourceFile]:
            found: list[SourceFile] = []
            if MEMORY_SOURCE in self.settings.sources:
                # Agent-wide files only: an extra path reaching into the private notes or
                # task records would make them everyone's.
                private = self._private_roots()
                found += [
                    f
                    for f in memory_files(self.workspace, self.settings.extra_paths)
                    if not _inside(f.abs_path, private)
                ]
            if SESSIONS_SOURCE in self.settings.sources:
                found += self.transcripts.transcripts()
            if TASKS_SOURCE in self.settings.sources:
                found += task_files(self.task_log.files(), self.task_log.directory)
            if NOTES_SOURCE in self.settings.sources:
                found += [
                    SourceFile(n.path, n.abs_path, NOTES_SOURCE, n.audience.scope)
                    for n in self.notes.files()
                ]
            return found

        return await asyncio.to_thread(discover)

    async def _sync_into(
        self,
        store: MemoryStoreProtocol,
        meta: IndexMeta,
        report: SyncReport,
        progress: ProgressCallback | None,
    ) -> None:
        sources = await self._sources()
        rows = await self._w(store.files)
        wanted = {s.path for s in sources}
        for path in sorted(rows.keys() - wanted):
            await self._w(store.delete_file, path)
            report.files_deleted += 1
        report.files_seen = len(sources)
        for done, source in enumerate(sources, start=1):
            if self._closed:
                raise asyncio.CancelledError
            try:
                await self._sync_file(store, meta, source, rows.get(source.path), report)
            except (OSError, MemoryIndexError, TranscriptError, store.info.module.Error) as exc:
                # The driver's own error classes too (a full or read-only disk). The file
                # stays as it was; the index stays dirty, so the next search retries it.
                report.errors.append(f"{source.path}: {exc}")
                self._dirty = True
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
        marker = await asyncio.to_thread(self._marker, source)
        if marker is None:
            if row is not None:
                await self._w(store.delete_file, source.path)
                report.files_deleted += 1
            return
        mtime, size = marker
        retry_vectors = row is not None and row.vectors_pending and meta.embedder != "none"
        if row is not None and row.mtime == mtime and row.size == size and not retry_vectors:
            report.files_unchanged += 1
            return
        data = await asyncio.to_thread(self._read, source, MAX_FILE_BYTES)
        digest = hashlib.sha256(data).hexdigest()
        if row is not None and row.hash == digest:
            if retry_vectors:
                await self._fill_vectors(store, meta, row, report)
            await self._w(store.touch_file, source.path, mtime, size)
            report.files_unchanged += 1
            return
        chunks, scope = await asyncio.to_thread(self._chunk, source, data)
        if source.source in FORGETTABLE_SOURCES:
            # Evicted chunks stay evicted: a transcript that grows is re-chunked whole.
            forgotten = await self._w(store.forgotten_hashes, source.path)
            chunks = [c for c in chunks if c.hash not in forgotten]
        vectors, pending = await self._vectors(
            store, meta, [(c.hash, c.text) for c in chunks], report
        )
        file = FileRow(source.path, source.source, scope, digest, mtime, size, len(chunks), pending)
        await self._w(store.replace_file, file, chunks, vectors)
        report.files_indexed += 1
        report.chunks_written += len(chunks)
        report.vectors_pending += int(pending)

    def _marker(self, source: SourceFile) -> Marker | None:
        """(mtime, size) of a source now (None: gone); blocking."""
        if source.source == SESSIONS_SOURCE:
            return self.transcripts.marker(source)
        try:
            stat = os.stat(source.abs_path)
        except FileNotFoundError:
            return None
        return stat.st_mtime, stat.st_size

    def _read(self, source: SourceFile, limit: int) -> bytes:
        if source.source == SESSIONS_SOURCE:
            return self.transcripts.read(source, limit)
        return _read_prefix(source.abs_path, limit)

    def _chunk(self, source: SourceFile, data: bytes) -> tuple[list[NewChunk], str]:
        """Chunks of one file and its scope (runs in a worker thread: CPU-bound)."""
        text = data.decode("utf-8", errors="replace")
        chunking = self.settings.chunking
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
        hashes = [h for h, _ in items]
        key = (meta.embedder, meta.model, meta.provider_key)
        dims = meta.dimensions
        cached = await self._w(store.cached_vectors, *key, hashes, dims)
        live = self._wstore
        if live is not None and live is not store and len(cached) < len(hashes):
            # A rebuild (e.g. new chunking) reuses the live index's vectors of the same model.
            wanted = [h for h in hashes if h not in cached]
            cached.update(await self._w(live.cached_vectors, *key, wanted, dims))
        report.cache_hits += sum(1 for h in hashes if h in cached)
        missing = list(dict.fromkeys(h for h in hashes if h not in cached))
        if missing:
            by_hash = dict(items)
            try:
                result = await self.embedder.embed([by_hash[h] for h in missing], kind="passage")
            except EmbedderError as exc:
                report.errors.append(f"embedding failed, keyword-only for now: {exc}")
                return None, True
            if not _made_by(result.embedder, meta):
                # A fallback model answered: its vectors cannot share a table with these.
                return None, True
            fresh = list(zip(missing, result.vectors, strict=True))
            report.embedded += len(fresh)
            cached.update(fresh)
            await self._w(
                store.cache_vectors, *key, fresh, max_entries=self.settings.cache_max_entries
            )
        await self._w(store.ensure_vectors, len(next(iter(cached.values()))))
        return np.stack([cached[h] for h in hashes]), False

    async def _fill_vectors(
        self, store: MemoryStoreProtocol, meta: IndexMeta, row: FileRow, report: SyncReport
    ) -> None:
        existing = await self._w(store.chunk_texts, row.path)
        vectors, pending = await self._vectors(
            store, meta, [(h, t) for _, h, t in existing], report
        )
        if vectors is not None and not pending:
            items = [(chunk_id, vectors[i]) for i, (chunk_id, _, _) in enumerate(existing)]
            await self._w(store.add_vectors, row.path, row.scope, items)

    async def _reindex(
        self, wanted: IndexMeta, reason: str, progress: ProgressCallback | None
    ) -> SyncReport:
        """Build the whole index anew beside the live one, then swap it in."""
        report = SyncReport(reason=reason, reindexed=True)
        backend = self.backend
        vector = self._wants_vectors()
        self._reindexing = True
        try:
            shadow = await self._w(backend.open_shadow, vector=vector)
            try:
                if await self._w(shadow.meta) != wanted:  # else: resume a killed rebuild
                    await self._w(shadow.close)
                    await self._w(backend.discard_shadow)
                    shadow = await self._w(backend.open_shadow, vector=vector)
                    await self._w(shadow.set_meta, wanted)
                # What was forgotten stays forgotten in the new index.
                tombstones = await self._w(self._store().tombstones)
                await self._w(shadow.add_tombstones, tombstones)
                last_run = await self._w(self._store().state, LAST_RUN_KEY)
                if last_run is not None:  # and the schedule keeps its rhythm
                    await self._w(shadow.set_state, LAST_RUN_KEY, last_run)
                await self._sync_into(shadow, wanted, report, progress)
                await self._w(shadow.checkpoint)
            finally:
                await self._w(shadow.close)
            await self._swap_in(vector)
            self._live_meta = wanted
        finally:
            self._reindexing = False
        return report

    async def _swap_in(self, vector: bool) -> None:
        async with self._reader_lock:
            if self._rstore is not None:
                await self._r(self._rstore.close)
            await self._w(self._store().close)
            self._wstore = self._rstore = None
            await self._w(self.backend.promote_shadow)
            self._wstore = await self._w(self.backend.open_live, vector=vector)
            self._rstore = await self._r(self.backend.open_live, vector=vector)

    # -- forgetting ----------------------------------------------------------------------

    async def forget(self, *, dry_run: bool = False) -> ForgettingReport:
        """Apply the forgetting policies now (``dry_run``: only say what they evict)."""
        async with self._sync_lock:
            return await self._forget(dry_run=dry_run)

    async def _forget(self, *, dry_run: bool) -> ForgettingReport:
        store = self._store()
        now = self._now()
        chunks = await self._w(store.forgettable_chunks, FORGETTABLE_SOURCES)
        evictions = await asyncio.to_thread(plan_forgetting, chunks, self.settings.forgetting, now)
        report = ForgettingReport(dry_run=dry_run, ran_at=now, evictions=evictions)
        if dry_run:
            return report
        stamp = now.timestamp()
        report.evicted = await self._w(
            store.evict_chunks, [(e.chunk.id, e.tombstone(stamp)) for e in evictions]
        )
        for e in evictions:
            log.info(
                "memory forgot %s#L%d-L%d (scope %s, %s): %s",
                e.chunk.path, e.chunk.start_line, e.chunk.end_line, e.chunk.scope,
                e.policy, e.reason,
            )  # fmt: skip
        await self._w(store.set_state, LAST_RUN_KEY, now.isoformat())
        return report

    async def _forget_if_due(self, report: SyncReport) -> None:
        """The scheduled run, after a sync (the caller holds the sync lock)."""
        settings = self.settings.forgetting
        if not settings.enabled or settings.schedule_hours <= 0 or self._closed:
            return
        store = self._store()
        try:
            last = await self._w(store.state, LAST_RUN_KEY)
            last_run = iso_timestamp(last)
            if last_run is not None:
                elapsed = self._now().timestamp() - last_run
                if elapsed < settings.schedule_hours * 3600:
                    return
            report.forgotten = (await self._forget(dry_run=False)).evicted
        except (ValueError, MemoryIndexError, store.info.module.Error) as exc:
            # Forgetting is housekeeping: the sync itself succeeded.
            report.errors.append(f"forgetting failed: {exc}")

    async def forgotten(self, limit: int | None = 20) -> list[Tombstone]:
        """Evictions, newest first."""
        return await self._w(self._store().tombstones, limit)

    # -- task records --------------------------------------------------------------------

    async def record_task(self, record: TaskRecord) -> None:
        """Append a task record and have the index pick it up."""
        await asyncio.to_thread(self.task_log.append, record)
        if self._closed or TASKS_SOURCE not in self.settings.sources:
            return
        # Debounced like the transcript the same turn grew (one sync picks up both);
        # a search meanwhile sees the index dirty and catches up first.
        self._dirty = True
        delay = self.settings.sync.transcript_debounce_seconds
        if delay <= 0:
            self._flush_transcripts()
        elif self._transcript_timer is None:
            loop = asyncio.get_running_loop()
            self._transcript_timer = loop.call_later(delay, self._flush_transcripts)

    async def task_stats(self, scopes: Sequence[str] | None = None) -> TaskStats:
        """Counts by outcome and the most frequent errors (of ``scopes``, or all)."""
        return await asyncio.to_thread(lambda: task_stats(self.task_log.records(scopes)))

    # -- triggers ------------------------------------------------------------------------

    def notify_transcript(self, appended_bytes: int = 0, appended_messages: int = 1) -> None:
        """A transcript grew: sync after the debounce, or now past the thresholds."""
        sync = self.settings.sync
        if self._closed or SESSIONS_SOURCE not in self.settings.sources:
            return
        self._dirty = True
        self._pending_bytes += appended_bytes
        self._pending_messages += appended_messages
        if (
            self._pending_bytes >= sync.transcript_delta_bytes
            or self._pending_messages >= sync.transcript_delta_messages
            or sync.transcript_debounce_seconds <= 0
        ):
            self._flush_transcripts()
            return
        if self._transcript_timer is not None:
            self._transcript_timer.cancel()
        loop = asyncio.get_running_loop()
        self._transcript_timer = loop.call_later(
            sync.transcript_debounce_seconds, self._flush_transcripts
        )

    def _flush_transcripts(self) -> None:
        if self._transcript_timer is not None:
            self._transcript_timer.cancel()
            self._transcript_timer = None
        self._pending_bytes = self._pending_messages = 0
        if not self._closed:
            self.request_sync("transcript")

    def notify_compaction(self) -> None:
        if not self._closed and self.settings.sync.after_compaction:
            self._flush_transcripts()

    async def _watch(self) -> None:
        """Poll the memory files' (mtime, size); sync once they have been still a while."""
        sync = self.settings.sync
        last = await asyncio.to_thread(self._memory_snapshot)
        changed_at: float | None = None
        while not self._closed:
            await asyncio.sleep(sync.watch_poll_seconds)
            try:
                snapshot = await asyncio.to_thread(self._memory_snapshot)
            except OSError:
                continue
            now = time.monotonic()
            if snapshot != last:
                last, changed_at = snapshot, now
                self._dirty = True
            elif changed_at is not None and now - changed_at >= sync.watch_debounce_seconds:
                changed_at = None
                self.request_sync("watch")

    def _memory_snapshot(self) -> dict[str, tuple[float, int]]:
        snapshot: dict[str, tuple[float, int]] = {}
        files = memory_files(self.workspace, self.settings.extra_paths)
        files += [SourceFile(n.path, n.abs_path, NOTES_SOURCE, None) for n in self.notes.files()]
        for source in files:
            with contextlib.suppress(OSError):
                stat = source.abs_path.stat()
                snapshot[source.path] = (stat.st_mtime, stat.st_size)
        return snapshot

    # -- search --------------------------------------------------------------------------

    async def search(
        self,
        query: str,
        *,
        scopes: Sequence[str],
        max_results: int | None = None,
        min_score: float | None = None,
        catch_up: bool = True,
    ) -> SearchResult:
        started = time.perf_counter()
        # ``catch_up=False`` (automatic recall, before every turn) answers from what is
        # indexed: syncing first would defeat the transcript debounce and make every turn
        # wait for a sync, for turns the live context already holds.
        synced_first = await self._catch_up() if catch_up else False
        meta = self._live_meta
        fallback: str | None = None
        query_vector: np.ndarray | None = None
        provider = meta.embedder if meta else "none"
        model = meta.model if meta else ""
        if meta is None or meta.embedder == "none" or self.embedder is None:
            fallback = self._keyword_only_reason()
        elif self._reindexing:
            fallback = "reindexing: keyword search until the new index is ready"
        else:
            try:
                result = await self.embedder.embed([query], kind="query")
                if _made_by(result.embedder, meta):
                    query_vector = result.vectors[0]
                else:
                    fallback = (
                        f"{meta.embedder} unavailable; {result.embedder.provider} cannot search it"
                    )
            except EmbedderError as exc:
                fallback = f"embedder failed, keyword-only: {exc}"
        params = SearchParams.from_settings(
            self.settings.search,
            max_results=max_results,
            min_score=min_score,
            similarity_floor=SIMILARITY_FLOORS.get(provider, 0.0),
        )
        async with self._reader_lock:
            store = self._rstore
            if store is None:
                raise MemoryIndexError("the memory index is not open")
            hits, trace = await self._r(
                run_search, store, query, query_vector, list(scopes), params, now=self._now()
            )
        if query_vector is None and fallback is None and trace.mode == "keyword":
            fallback = "the index holds no vectors yet"
        elapsed = time.perf_counter() - started
        if self.on_search is not None:
            self.on_search(elapsed)
        return SearchResult(
            hits=hits,
            mode=trace.mode,
            provider=provider,
            model=model,
            fallback=fallback,
            search_ms=elapsed * 1000,
            synced_first=synced_first,
            trace=trace,
        )

    async def catch_up(self) -> bool:
        """Sync now if anything changed (bounded by ``search_wait_seconds``), as a
        search would; for callers that list scopes before searching them."""
        return await self._catch_up()

    async def _catch_up(self) -> bool:
        """Sync before a search when the index is dirty; wait for an empty one."""
        if not self.settings.sync.on_search:
            return False
        if not self._dirty and self._synced_once:
            return False
        task = self.request_sync("search")
        if self._reindexing and not self._empty:
            return False  # a rebuild takes long: answer from the old index meanwhile
        wait: float | None = self.settings.sync.search_wait_seconds
        if self._empty:
            wait = None  # an empty index answers nothing useful: wait for it
        try:
            await asyncio.wait_for(asyncio.shield(task), wait)
        except TimeoutError:
            return False
        return True

    def _keyword_only_reason(self) -> str:
        store = self._wstore
        if store is not None and not store.info.vector_available:
            return f"vector search unavailable: {store.info.vector_error}"
        if self.embedder is None or self.embedder.primary.provider == "none":
            return "no embedder configured: keyword search only"
        return "the index holds no vectors yet"

    # -- memory_get ----------------------------------------------------------------------

    async def read(
        self, path: str, from_line: int = 1, lines: int | None = None, *, viewer: Viewer
    ) -> str:
        """Lines of a memory file (memory files, extra paths, and the notes of audiences
        ``viewer`` may read). A note of another audience is refused exactly as a path
        that does not exist would be: the answer tells nothing about it."""

        def locate() -> Path | None:
            note = self.notes.resolve(path)
            if note is not None:
                return note.abs_path if may_read(viewer, note.audience.scope) else None
            found = memory_path(path, self.workspace, self.settings.extra_paths)
            return None if found is None or _inside(found, self._private_roots()) else found

        target = await asyncio.to_thread(locate)
        if target is None:
            raise MemoryIndexError(
                f"{path!r} is not a memory file you can read (MEMORY.md, memory/**/*.md, "
                "an extra path, or a notes/ path a search of this conversation cited)"
            )
        count = min(lines or MAX_GET_LINES, MAX_GET_LINES)
        return await asyncio.to_thread(_read_lines, target, max(1, from_line), count)

    async def remember(self, audience: Audience, text: str) -> str:
        """Store a durable note in ``audience``'s own memory; its citation."""
        citation = await asyncio.to_thread(self.notes.remember, audience, self._now(), text)
        self.notes_changed()
        return citation

    async def forget_note(self, audience: Audience, needle: str) -> list[Forgotten]:
        """Remove ``audience``'s note lines that ``needle`` names (text or citation).

        Forgotten means forgotten now: the changed files' rows leave the index before
        this returns, so no search or recall finds the lines meanwhile; the next sync
        (asked for here) indexes what is left of those files again. A sync that read a
        file before the change and writes after it is followed by that next sync."""
        removed = await asyncio.to_thread(self.notes.forget, audience, needle)
        if removed:
            store = self._store()
            for forgotten in removed:
                await self._w(store.delete_file, forgotten.path)
            self.notes_changed()
        return removed

    def _private_roots(self) -> tuple[Path, ...]:
        """The notes and the task records, resolved (blocking)."""
        return (self.notes.root.resolve(), self.task_log.directory.resolve())

    def notes_changed(self) -> None:
        """A note was written or removed: sync soon (as a transcript that grew)."""
        if not self._closed and NOTES_SOURCE in self.settings.sources:
            self._flush_transcripts()

    # -- status --------------------------------------------------------------------------

    async def scopes(self) -> list[str]:
        """Every scope with indexed files (for operators; conversations never list them)."""
        return await self._w(self._store().scopes)

    async def visible_scopes(self, viewer: Viewer) -> tuple[str, ...]:
        """The scopes ``viewer`` may search: ``core.memory.audience``'s rule over every
        scope the index holds (ids linked to one person are found there)."""
        if not viewer.needs_known_scopes:
            # Its own audience and the agent's: no need to ask the index (this runs
            # before every turn, and the writer may be busy with a sync).
            return visible_scopes(viewer)
        known = self._known_scopes
        if known is None:
            async with self._reader_lock:
                store = self._rstore
                if store is None:
                    raise MemoryIndexError("the memory index is not open")
                known = self._known_scopes = tuple(await self._r(store.scopes))
        if viewer.operator:
            return tuple(sorted({AGENT_SCOPE, *known}))
        return visible_scopes(viewer, known)

    async def status(self, viewer: Viewer | None = None) -> MemoryStatus:
        """The index's health; for a conversation's ``viewer``, the pending files it
        lists are only those the viewer may read (another audience's note path or a
        transcript would name someone)."""
        store = self._store()
        counts = await self._w(store.counts)
        fts = await self._w(store.fts_available)
        dirty = await self._dirty_files(store)
        if viewer is not None and not viewer.operator:
            dirty = [path for path in dirty if self._may_list(viewer, path)]
        meta = self._live_meta or self.wanted_meta()
        embedder = self.embedder.status().as_dict() if self.embedder else None
        fallback = None
        if meta.embedder == "none":
            fallback = self._keyword_only_reason()
        elif embedder and embedder.get("fallback"):
            fallback = "{from}: {reason}".format(**embedder["fallback"])
        elif embedder and embedder.get("failures"):
            fallback = (
                f"{meta.embedder} failing ({embedder['failures']} calls): new chunks are "
                f"keyword-only until it answers; last error: {embedder.get('last_error')}"
            )
        return MemoryStatus(
            db_path=self.backend.where,
            workspace=str(self.workspace),
            driver=store.info.describe(),
            requested_provider=(
                self.embedder.requested_provider if self.embedder is not None else "none"
            ),
            provider=meta.embedder,
            model=meta.model,
            dimensions=meta.dimensions,
            vector_available=store.info.vector_available and meta.embedder != "none",
            vector_error=store.info.vector_error,
            fts_available=fts,
            counts=counts,
            dirty_files=dirty,
            reindexing=self._reindexing,
            reindex_pending=self._live_meta != self.wanted_meta(),
            syncing=self._sync_task is not None and not self._sync_task.done(),
            last_sync=self._last_sync.to_dict() if self._last_sync else None,
            embedder=embedder,
            cache_max_entries=self.settings.cache_max_entries,
            fallback=fallback,
            sources=tuple(self.settings.sources),
            forgetting_enabled=self.settings.forgetting.enabled,
            forgetting_last_run=await self._w(store.state, LAST_RUN_KEY),
        )

    def _may_list(self, viewer: Viewer, path: str) -> bool:
        if path.startswith(f"{NOTES_SOURCE}/"):
            note = self.notes.resolve(path)
            return note is not None and may_read(viewer, note.audience.scope)
        # Transcripts and task logs are named by digests, not audiences: never listed.
        return not path.startswith((f"{SESSIONS_SOURCE}/", f"{TASKS_SOURCE}/"))

    async def integrity_check(self) -> list[str]:
        """Problems with memory.db (empty when healthy); runs on the writer's thread, so
        it sees a consistent file between two syncs' transactions."""
        store = self._store()
        return await self._w(store.integrity_check)

    async def _dirty_files(self, store: MemoryStoreProtocol) -> list[str]:
        sources = await self._sources()
        rows = await self._w(store.files)

        def changed() -> list[str]:
            out: list[str] = []
            for source in sources:
                row = rows.get(source.path)
                try:
                    marker = self._marker(source)
                except (OSError, TranscriptError):
                    continue
                if marker is None:
                    continue
                if row is None or (row.mtime, row.size) != marker:
                    out.append(source.path)
            present = {s.path for s in sources}
            out += sorted(p for p in rows if p not in present)
            return out

        return await asyncio.to_thread(changed)


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    """Is ``path`` (resolved here) under one of the resolved ``roots``?"""
    real = path.resolve()
    return any(real.is_relative_to(root) for root in roots)


def _made_by(embedder: Embedder, meta: IndexMeta) -> bool:
    """Did the model the index was built with make these vectors (not a fallback)?"""
    return (embedder.provider, embedder.model, embedder.provider_key) == (
        meta.embedder,
        meta.model,
        meta.provider_key,
    )


def _read_prefix(path: Path, limit: int) -> bytes:
    with path.open("rb") as handle:
        return handle.read(limit)


def _read_lines(path: Path, start: int, count: int) -> str:
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    out: list[str] = []
    size = 0
    with handle:
        for number, line in enumerate(handle, start=1):
            if number < start:
                continue
            if len(out) >= count or size + len(line) > MAX_GET_CHARS:
                break
            out.append(line)
            size += len(line)
    return "".join(out)
