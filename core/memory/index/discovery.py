"""What the index reads: its source files now, their (mtime, size), and their bytes.

The sources are the configured ones (``[memory] sources``): the operator's memory files
(never one inside the private notes or task records, which would make them
everyone's), the transcripts (through the ``TranscriptSource``: files or a store's
rows), the task logs and the notes. Every method but ``files`` blocks: call it on a
worker thread.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path

from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.notes import NOTES_SOURCE, NoteStore
from parley.core.memory.sources import (
    MEMORY_SOURCE,
    SESSIONS_SOURCE,
    TASKS_SOURCE,
    Marker,
    SourceFile,
    TranscriptSource,
    memory_files,
    read_file_range,
    task_files,
)
from parley.core.memory.tasks import TaskLog


class IndexSources:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        workspace: Path,
        transcripts: TranscriptSource,
        task_log: TaskLog,
        notes: NoteStore,
    ) -> None:
        self.settings = settings
        self.workspace = workspace
        self.transcripts = transcripts
        self.task_log = task_log
        self.notes = notes

    async def files(self) -> list[SourceFile]:
        """Every source file there is now (listed on a worker thread)."""
        return await asyncio.to_thread(self._discover)

    def _discover(self) -> list[SourceFile]:
        found: list[SourceFile] = []
        if MEMORY_SOURCE in self.settings.sources:
            # Agent-wide files only: an extra path reaching into the private notes or
            # task records would make them everyone's.
            private = self.private_roots()
            found += [
                f
                for f in memory_files(self.workspace, self.settings.extra_paths)
                if not inside(f.abs_path, private)
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

    def private_roots(self) -> tuple[Path, ...]:
        """The notes and the task records, resolved (blocking)."""
        return (self.notes.root.resolve(), self.task_log.directory.resolve())

    def marker(self, source: SourceFile) -> Marker | None:
        """(mtime, size) of a source now (None: gone); blocking."""
        if source.source == SESSIONS_SOURCE:
            return self.transcripts.marker(source)
        try:
            stat = os.stat(source.abs_path)
        except FileNotFoundError:
            return None
        return stat.st_mtime, stat.st_size

    def read(self, source: SourceFile, limit: int) -> bytes:
        """At most ``limit`` bytes of a source, from its start; blocking."""
        if source.source == SESSIONS_SOURCE:
            return self.transcripts.read(source, limit)
        with source.abs_path.open("rb") as handle:
            return handle.read(limit)

    def read_range(self, source: SourceFile, start: int, limit: int) -> bytes:
        """At most ``limit`` bytes of a source from offset ``start``; blocking."""
        if source.source == SESSIONS_SOURCE:
            return self.transcripts.read_range(source, start, limit)
        return read_file_range(source.abs_path, start, limit)


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """Is ``path`` (resolved here) under one of the resolved ``roots``?"""
    real = path.resolve()
    return any(real.is_relative_to(root) for root in roots)
