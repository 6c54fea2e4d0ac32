"""Shared pieces of the memory index tests: a workspace on disk, transcripts written with
the real ``Transcript``, an index opened and closed around a test, and a consistency check
of memory.db read with a connection of its own."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from parley.core.memory.driver import open_connection
from parley.core.memory.embedders import Embedder, ResilientEmbedder
from parley.core.memory.index import MemoryIndex
from parley.core.memory.memory_config import MemorySettings, SyncSettings
from parley.core.memory.store_protocol import StoreBackend
from parley.core.messages import Message
from parley.core.transcript import Transcript

QUIET_SYNC = SyncSettings(on_start=False, watch=False)


def quiet_settings(**overrides: Any) -> MemorySettings:
    """Settings without background triggers: tests call ``sync()`` themselves."""
    overrides.setdefault("sync", QUIET_SYNC)
    return MemorySettings(**overrides)


@dataclass(frozen=True, slots=True)
class Layout:
    workspace: Path
    sessions: Path
    db: Path

    def write(self, relative: str, text: str) -> Path:
        path = self.workspace / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def transcript(
        self,
        session_id: str,
        turns: Sequence[tuple[str, str]],
        *,
        scope: str | None = None,
        ts: datetime | None = None,
    ) -> Path:
        """``sessions/<session_id>.jsonl`` with ``turns`` of (role, text), stamped ``ts``
        (default: now; chunks carry their time in their text, so it moves embeddings)."""
        self.sessions.mkdir(parents=True, exist_ok=True)
        path = self.sessions / f"{session_id}.jsonl"
        meta = {"memory_scope": scope} if scope is not None else {}
        with Transcript.create(path, session_id, f"key:{session_id}", meta) as transcript:
            for role, text in turns:
                message = Message.user(text) if role == "user" else Message.assistant(text)
                transcript.append_message(message, ts=ts)
        return path

    def append(self, session_id: str, turns: Sequence[tuple[str, str]]) -> None:
        with Transcript.open(self.sessions / f"{session_id}.jsonl") as transcript:
            for role, text in turns:
                message = Message.user(text) if role == "user" else Message.assistant(text)
                transcript.append_message(message)


def make_layout(root: Path) -> Layout:
    layout = Layout(root / "workspace", root / "sessions", root / "state" / "memory.db")
    layout.workspace.mkdir(parents=True)
    return layout


def bump_mtime(path: Path, seconds: float = 10.0) -> None:
    """Move a file's mtime on, as an edit a while later would (without a real wait)."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + int(seconds * 1e9)))


@asynccontextmanager
async def open_index(
    layout: Layout,
    settings: MemorySettings,
    embedder: ResilientEmbedder | None,
    *,
    now: Callable[[], datetime] | None = None,
    backend: StoreBackend | None = None,
) -> AsyncIterator[MemoryIndex]:
    """An index on ``layout`` (memory.db, or ``backend``'s rows), started, then closed."""
    extra: dict[str, Any] = {"now": now} if now is not None else {}
    if backend is not None:
        extra["backend"] = backend
    index = MemoryIndex(
        settings,
        db_path=layout.db,
        workspace=layout.workspace,
        sessions_dir=layout.sessions,
        embedder=embedder,
        **extra,
    )
    await index.start()
    try:
        yield index
    finally:
        await index.close()


class HeldSync:
    """Holds an index's sync once, as it is about to sync its file number ``after``
    (0-based), until ``release`` is set: a test can cancel a sync between two files, or
    act while one runs (the sync no longer waits for the embedder, which comes after)."""

    def __init__(self, index: MemoryIndex, *, after: int) -> None:
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        files = index._sync._files
        original = files._sync_file
        count = 0

        async def holding(*args: Any, **kwargs: Any) -> None:
            nonlocal count
            count += 1
            if count == after + 1:
                self.held.set()
                await self.release.wait()
            await original(*args, **kwargs)

        files._sync_file = holding  # type: ignore[method-assign]


class KeepOpen:
    """Lends a loaded model to one index: the index closes its embedder, this does not."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.model = inner.model
        self.dimensions = inner.dimensions
        self.provider_key = inner.provider_key
        self.max_batch = inner.max_batch

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self.inner.embed_queries(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self.inner.embed_passages(texts)

    async def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class DbFacts:
    files: dict[str, tuple[int, bool]]  # path -> (chunks, vectors_pending)
    chunk_ids: set[int]
    chunk_paths: set[str]
    chunks_per_path: dict[str, int]
    fts_ids: set[int]
    cjk_ids: set[int]
    vec_ids: set[int] | None  # None: no chunks_vec table
    vec_scopes: dict[int, str]
    chunk_scopes: dict[int, str]
    texts: list[str]
    meta: str | None


def read_db(db: Path) -> DbFacts:
    """What memory.db holds, read over a connection of its own."""
    conn, info = open_connection(db)
    try:
        files = {
            str(p): (int(n), bool(v))
            for p, n, v in conn.execute("SELECT path, chunks, vectors_pending FROM files")
        }
        rows = conn.execute("SELECT id, path, scope, text FROM chunks").fetchall()
        per_path: dict[str, int] = {}
        for _, path, _, _ in rows:
            per_path[path] = per_path.get(path, 0) + 1
        has_vec = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'chunks_vec'").fetchone()
        vec_ids: set[int] | None = None
        vec_scopes: dict[int, str] = {}
        if has_vec:
            assert info.vector_available
            vec_scopes = {
                int(i): str(s) for i, s in conn.execute("SELECT rowid, scope FROM chunks_vec")
            }
            vec_ids = set(vec_scopes)
        meta = conn.execute("SELECT value FROM meta WHERE key = 'index'").fetchone()
        return DbFacts(
            files=files,
            chunk_ids={int(r[0]) for r in rows},
            chunk_paths={str(r[1]) for r in rows},
            chunks_per_path=per_path,
            fts_ids={int(r[0]) for r in conn.execute("SELECT rowid FROM chunks_fts")},
            cjk_ids={int(r[0]) for r in conn.execute("SELECT rowid FROM chunks_cjk")},
            vec_ids=vec_ids,
            vec_scopes=vec_scopes,
            chunk_scopes={int(r[0]): str(r[2]) for r in rows},
            texts=[str(r[3]) for r in rows],
            meta=None if meta is None else str(meta[0]),
        )
    finally:
        conn.close()


def assert_consistent(db: Path, *, vectors: bool = True) -> DbFacts:
    """Every file's chunks are all there, in every table, and nothing else is."""
    facts = read_db(db)
    assert sum(n for n, _ in facts.files.values()) == len(facts.chunk_ids)
    for path, (count, _) in facts.files.items():
        assert facts.chunks_per_path.get(path, 0) == count, path
    assert facts.chunk_paths <= set(facts.files)
    assert facts.fts_ids == facts.chunk_ids
    assert facts.cjk_ids <= facts.chunk_ids
    if vectors:
        assert facts.vec_ids is not None
        pending = {p for p, (_, waiting) in facts.files.items() if waiting}
        assert not pending
        assert facts.vec_ids == facts.chunk_ids
        for chunk_id, scope in facts.vec_scopes.items():
            assert facts.chunk_scopes[chunk_id] == scope
    return facts
