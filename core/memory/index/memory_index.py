"""``MemoryIndex``: one agent's long-term memory, kept in sync and searched.

The one object the rest of parley holds. It owns the collaborators (the backend, the
transcript source, the task log, the notes, the embedder), opens and closes the index
(``start``: open, the start-up sync and the watcher; ``open``: the store only, for the
CLI; ``close``), and hands each job to its part of this package: the worker threads
(``workers``), sync (``sync``, ``file_sync``), rebuild, the forgetting schedule, the
watcher and the other sync triggers, search, status, and ``memory_get`` with the notes
(``access``). The parts share one ``IndexState``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.backend import SqliteBackend
from parley.core.memory.embedders import ResilientEmbedder
from parley.core.memory.forgetting import ForgettingReport
from parley.core.memory.index.access import MemoryAccess
from parley.core.memory.index.discovery import IndexSources
from parley.core.memory.index.file_sync import (
    FileSync,
    ProgressCallback,
    SyncReport,
    default_scope_resolver,
    kept_key,
)
from parley.core.memory.index.forgetting_schedule import ForgettingSchedule
from parley.core.memory.index.rebuild import Rebuild
from parley.core.memory.index.search import IndexSearch, SearchResult
from parley.core.memory.index.state import IndexState, wanted_meta
from parley.core.memory.index.status import IndexStatus, MemoryStatus
from parley.core.memory.index.sync import SyncRunner
from parley.core.memory.index.triggers import SyncTriggers
from parley.core.memory.index.vectors import VectorPass
from parley.core.memory.index.watch import MemoryFileWatcher
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.notes import Forgotten, NoteStore
from parley.core.memory.rows import IndexMeta, Tombstone
from parley.core.memory.sources import FileTranscriptSource, ScopeResolver, TranscriptSource
from parley.core.memory.store_protocol import MemoryStoreProtocol, StoreBackend
from parley.core.memory.tasks import TaskLog, TaskRecord, TaskStats, task_stats

T = TypeVar("T")


class AsyncResource(Protocol):
    """What the index opens before its store and closes after it, when it owns the
    backend's connections (a PostgreSQL pool of its own)."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...


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
        self._state = IndexState()
        self._threads = StoreThreads()
        self._watch_task: asyncio.Task[None] | None = None

        # The parts. Those that ask for a sync go through ``self.request_sync`` (looked
        # up at each call), so every request, whoever makes it, takes the same path.
        def request_sync(reason: str) -> asyncio.Task[SyncReport]:
            return self.request_sync(reason)

        state, threads = self._state, self._threads
        sources = IndexSources(
            settings,
            workspace=workspace,
            transcripts=self.transcripts,
            task_log=self.task_log,
            notes=self.notes,
        )
        files = FileSync(
            settings,
            sources=sources,
            embedder=embedder,
            scope_for=self.scope_for,
            threads=threads,
            state=state,
        )
        self._forgetting = ForgettingSchedule(
            settings.forgetting, threads=threads, state=state, now=now
        )
        self._vectors = VectorPass(
            settings,
            embedder=embedder,
            threads=threads,
            state=state,
            sync_lock=lambda: self._sync.lock,
        )
        rebuild = Rebuild(
            self.backend, files=files, vectors=self._vectors, threads=threads, state=state
        )
        self._sync = SyncRunner(
            files=files,
            rebuild=rebuild,
            forgetting=self._forgetting,
            vectors=self._vectors,
            threads=threads,
            state=state,
            wanted_meta=self.wanted_meta,
            wants_vectors=self._wants_vectors,
        )
        self._triggers = SyncTriggers(settings, state=state, request_sync=request_sync)
        self._watcher = MemoryFileWatcher(
            settings,
            workspace=workspace,
            notes=self.notes,
            state=state,
            request_sync=request_sync,
        )
        self._search = IndexSearch(
            settings,
            embedder=embedder,
            threads=threads,
            state=state,
            request_sync=request_sync,
            now=now,
        )
        self._status = IndexStatus(
            settings,
            workspace=workspace,
            backend=self.backend,
            embedder=embedder,
            sources=sources,
            threads=threads,
            state=state,
            sync=self._sync,
            wanted_meta=self.wanted_meta,
        )
        self._access = MemoryAccess(
            sources, threads=threads, now=now, notes_changed=self.notes_changed
        )

    @property
    def on_search(self) -> Callable[[float], None] | None:
        """Called with each search's seconds (the gateway's latency histogram)."""
        return self._search.on_search

    @on_search.setter
    def on_search(self, callback: Callable[[float], None] | None) -> None:
        self._search.on_search = callback

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.open()
        if self.settings.sync.on_start:
            self.request_sync("start")
        if self.settings.sync.watch:
            self._watch_task = asyncio.create_task(self._watcher.run(), name="memory-watch")

    async def open(self) -> None:
        """Open memory.db without starting background work (the CLI uses this)."""
        if self._resource is not None:
            await self._resource.open()
        state, w = self._state, self._threads.w
        await self._threads.open(self.backend, vector=self._wants_vectors())
        store = self._threads.writer_store()
        state.live_meta = await w(store.meta)
        counts = await w(store.counts)
        state.empty = counts.files == 0
        if state.live_meta is None and counts.files == 0:
            # A new (or meta-less) index: adopt the wanted meta. A meta-less index with
            # rows was built under an unknown one: the first sync rebuilds it.
            await w(store.set_meta, self.wanted_meta())
            state.live_meta = self.wanted_meta()

    async def close(self) -> None:
        self._state.closed = True
        self._triggers.cancel()
        await self._vectors.cancel()
        for task in (self._watch_task, self._sync.task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._threads.close_stores()
        if self._resource is not None:
            await self._resource.close()
        if self.embedder is not None:
            await self.embedder.close()
        self._threads.shutdown()

    # The writer's thread and store, under the names the tests reach them by.
    async def _w(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self._threads.w(fn, *args, **kwargs)

    def _store(self) -> MemoryStoreProtocol:
        return self._threads.writer_store()

    @property
    def _wstore(self) -> MemoryStoreProtocol | None:
        return self._threads.wstore

    # -- meta ----------------------------------------------------------------------------

    def _wants_vectors(self) -> bool:
        return self.embedder is not None and self.embedder.primary.provider != "none"

    @property
    def _vectors_on(self) -> bool:
        store = self._threads.wstore
        return self._wants_vectors() and store is not None and store.info.vector_available

    def wanted_meta(self) -> IndexMeta:
        """The meta the rows should be built with now (a live index built with another
        is rebuilt by the next sync)."""
        chunking = self.settings.chunking.model_dump()
        vectors = self.embedder.primary if self._vectors_on and self.embedder is not None else None
        return wanted_meta(chunking, vectors)

    # -- sync and forgetting -------------------------------------------------------------

    def request_sync(self, reason: str) -> asyncio.Task[SyncReport]:
        """Start a background sync, or ask the running one to go round once more."""
        return self._sync.request(reason)

    async def sync(
        self,
        *,
        reason: str = "manual",
        force: bool = False,
        progress: ProgressCallback | None = None,
        scheduled_forgetting: bool = True,
        wait_vectors: bool = True,
    ) -> SyncReport:
        """Bring the index up to date (``force``: rebuild it), then run the forgetting
        schedule if it is due (``scheduled_forgetting=False``: not now, e.g. before a
        dry run, which must change nothing). ``wait_vectors=False``: return once the
        chunks are written (keyword-findable); their vectors come in the background, or
        from the next sync that waits (for callers that only remove or re-scope text)."""
        return await self._sync.sync(
            reason=reason,
            force=force,
            progress=progress,
            scheduled_forgetting=scheduled_forgetting,
            wait_vectors=wait_vectors,
        )

    async def forget(self, *, dry_run: bool = False) -> ForgettingReport:
        """Apply the forgetting policies now (``dry_run``: only say what they evict)."""
        async with self._sync.lock:
            return await self._forgetting.run(dry_run=dry_run)

    async def forgotten(self, limit: int | None = 20) -> list[Tombstone]:
        """Evictions, newest first."""
        return await self._forgetting.forgotten(limit)

    # -- triggers ------------------------------------------------------------------------

    def notify_transcript(self, appended_bytes: int = 0, appended_messages: int = 1) -> None:
        """A transcript grew: sync after the debounce, or now past the thresholds."""
        self._triggers.transcript_grew(appended_bytes, appended_messages)

    def notify_compaction(self) -> None:
        self._triggers.compacted()

    def notes_changed(self) -> None:
        """A note was written or removed: sync soon (as a transcript that grew)."""
        self._triggers.notes_changed()

    async def record_task(self, record: TaskRecord) -> None:
        """Append a task record and have the index pick it up."""
        await asyncio.to_thread(self.task_log.append, record)
        self._triggers.task_recorded()

    async def task_stats(self, scopes: Sequence[str] | None = None) -> TaskStats:
        """Counts by outcome and the most frequent errors (of ``scopes``, or all)."""
        return await asyncio.to_thread(lambda: task_stats(self.task_log.records(scopes)))

    # -- search, memory_get and notes ----------------------------------------------------

    async def search(
        self,
        query: str,
        *,
        scopes: Sequence[str],
        max_results: int | None = None,
        min_score: float | None = None,
        catch_up: bool = True,
    ) -> SearchResult:
        return await self._search.search(
            query, scopes=scopes, max_results=max_results, min_score=min_score, catch_up=catch_up
        )

    async def catch_up(self) -> bool:
        """Sync now if anything changed (bounded by ``search_wait_seconds``), as a
        search would; for callers that list scopes before searching them."""
        return await self._search.catch_up()

    async def read(
        self, path: str, from_line: int = 1, lines: int | None = None, *, viewer: Viewer
    ) -> str:
        """Lines of a memory file or of a note ``viewer`` may read (``memory_get``)."""
        return await self._access.read(path, from_line, lines, viewer=viewer)

    async def remember(self, audience: Audience, text: str) -> str:
        """Store a durable note in ``audience``'s own memory; its citation."""
        return await self._access.remember(audience, text)

    async def forget_note(self, audience: Audience, needle: str) -> list[Forgotten]:
        """Remove ``audience``'s note lines that ``needle`` names (text or citation);
        they leave the index before this returns."""
        return await self._access.forget_note(audience, needle)

    # -- sources removed on purpose (retention) -------------------------------------------

    async def keep_removed(self, paths: Sequence[str]) -> None:
        """Keep these sources' rows (still searchable) once their files are gone: call
        it before removing them (retention removes old archived transcripts). A rebuild
        carries them over (``index.kept``)."""
        # Under the sync lock: a rebuild copies the kept marks into the index it swaps
        # in, so a mark written into the old one meanwhile would be lost with it.
        async with self._sync.lock:
            store = self._store()
            for path in paths:
                await self._w(store.set_state, kept_key(path), "1")

    async def drop_removed(self, paths: Sequence[str]) -> int:
        """Remove these sources' rows now (their files are gone or going); how many
        of them were indexed."""
        store = self._store()
        async with self._sync.lock:
            rows = await self._w(store.files)
            dropped = 0
            for path in paths:
                if path in rows:
                    await self._w(store.delete_file, path)
                    dropped += 1
        return dropped

    # -- status --------------------------------------------------------------------------

    async def scopes(self) -> list[str]:
        """Every scope with indexed files (for operators; conversations never list them)."""
        return await self._status.scopes()

    async def visible_scopes(self, viewer: Viewer) -> tuple[str, ...]:
        """The scopes ``viewer`` may search (``core.memory.audience``'s rule)."""
        return await self._status.visible_scopes(viewer)

    async def status(self, viewer: Viewer | None = None) -> MemoryStatus:
        """The index's health (for a conversation's ``viewer``, only what it may see)."""
        return await self._status.status(viewer)

    async def integrity_check(self) -> list[str]:
        """Problems with the store (empty when healthy)."""
        return await self._status.integrity_check()
