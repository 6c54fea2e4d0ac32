"""What the index holds and how it is: its status, its scopes, its integrity.

``MemoryStatus`` is what ``/memory status``, ``parley memory status``, ``parley doctor``
and the admin API show: counts, the driver and embedder, whether vectors are on and
why not, the files not yet in sync, the last sync and the forgetting schedule. For a
conversation's viewer, the pending files listed are only those it may read (another
audience's note path or a transcript would name someone). ``visible_scopes`` applies
``core.memory.audience``'s rule to the scopes the index holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.core.errors import TranscriptError
from parley.core.memory.audience import Viewer, may_read, visible_scopes
from parley.core.memory.embedders import ResilientEmbedder
from parley.core.memory.forgetting import LAST_RUN_KEY
from parley.core.memory.index.discovery import IndexSources
from parley.core.memory.index.search import keyword_only_reason
from parley.core.memory.index.state import IndexState
from parley.core.memory.index.sync import SyncRunner
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.notes import NOTES_SOURCE
from parley.core.memory.rows import IndexMeta, StoreCounts
from parley.core.memory.sources import AGENT_SCOPE, SESSIONS_SOURCE, TASKS_SOURCE
from parley.core.memory.store_protocol import MemoryStoreProtocol, StoreBackend


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


class IndexStatus:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        workspace: Path,
        backend: StoreBackend,
        embedder: ResilientEmbedder | None,
        sources: IndexSources,
        threads: StoreThreads,
        state: IndexState,
        sync: SyncRunner,
        wanted_meta: Callable[[], IndexMeta],
    ) -> None:
        self.settings = settings
        self.workspace = workspace
        self.backend = backend
        self.embedder = embedder
        self.sources = sources
        self._threads = threads
        self._state = state
        self._sync = sync
        self._wanted_meta = wanted_meta

    async def scopes(self) -> list[str]:
        """Every scope with indexed files (for operators; conversations never list them)."""
        return await self._threads.w(self._threads.writer_store().scopes)

    async def visible_scopes(self, viewer: Viewer) -> tuple[str, ...]:
        """The scopes ``viewer`` may search: ``core.memory.audience``'s rule over every
        scope the index holds (ids linked to one person are found there)."""
        if not viewer.needs_known_scopes:
            # Its own audience and the agent's: no need to ask the index (this runs
            # before every turn, and the writer may be busy with a sync).
            return visible_scopes(viewer)
        known = self._state.known_scopes
        if known is None:
            async with self._threads.reader() as store:
                known = self._state.known_scopes = tuple(await self._threads.r(store.scopes))
        if viewer.operator:
            return tuple(sorted({AGENT_SCOPE, *known}))
        return visible_scopes(viewer, known)

    async def status(self, viewer: Viewer | None = None) -> MemoryStatus:
        """The index's health; for a conversation's ``viewer``, the pending files it
        lists are only those the viewer may read (another audience's note path or a
        transcript would name someone)."""
        w, state = self._threads.w, self._state
        store = self._threads.writer_store()
        counts = await w(store.counts)
        fts = await w(store.fts_available)
        dirty = await self._dirty_files(store)
        if viewer is not None and not viewer.operator:
            dirty = [path for path in dirty if self._may_list(viewer, path)]
        meta = state.live_meta or self._wanted_meta()
        embedder = self.embedder.status().as_dict() if self.embedder else None
        fallback = None
        if meta.embedder == "none":
            fallback = keyword_only_reason(self._threads, self.embedder)
        elif embedder and embedder.get("fallback"):
            fallback = "{from}: {reason}".format(**embedder["fallback"])
        elif embedder and embedder.get("failures"):
            fallback = (
                f"{meta.embedder} failing ({embedder['failures']} calls): new chunks are "
                f"keyword-only until it answers; last error: {embedder.get('last_error')}"
            )
        last_sync = self._sync.last
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
            reindexing=state.reindexing,
            reindex_pending=state.live_meta != self._wanted_meta(),
            syncing=self._sync.syncing,
            last_sync=last_sync.to_dict() if last_sync else None,
            embedder=embedder,
            cache_max_entries=self.settings.cache_max_entries,
            fallback=fallback,
            sources=tuple(self.settings.sources),
            forgetting_enabled=self.settings.forgetting.enabled,
            forgetting_last_run=await w(store.state, LAST_RUN_KEY),
        )

    def _may_list(self, viewer: Viewer, path: str) -> bool:
        if path.startswith(f"{NOTES_SOURCE}/"):
            note = self.sources.notes.resolve(path)
            return note is not None and may_read(viewer, note.audience.scope)
        # Transcripts and task logs are named by digests, not audiences: never listed.
        return not path.startswith((f"{SESSIONS_SOURCE}/", f"{TASKS_SOURCE}/"))

    async def integrity_check(self) -> list[str]:
        """Problems with the store (empty when healthy); runs on the writer's thread, so
        it sees a consistent file between two syncs' transactions."""
        store = self._threads.writer_store()
        return await self._threads.w(store.integrity_check)

    async def _dirty_files(self, store: MemoryStoreProtocol) -> list[str]:
        """Sources whose (mtime, size) differ from their row, then rows of gone files."""
        sources = await self.sources.files()
        rows = await self._threads.w(store.files)

        def changed() -> list[str]:
            out: list[str] = []
            for source in sources:
                row = rows.get(source.path)
                try:
                    marker = self.sources.marker(source)
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
