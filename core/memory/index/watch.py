"""The watcher: polls the memory files people write and syncs once they are still.

Every ``watch_poll_seconds`` it takes the (mtime, size) of ``MEMORY.md``,
``memory/**/*.md``, the extra paths and the notes; a change marks the index dirty (a
search then catches up at once), and once nothing has changed for
``watch_debounce_seconds`` it asks for a sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from parley.core.memory.index.state import IndexState
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.notes import NOTES_SOURCE, NoteStore
from parley.core.memory.sources import SourceFile, memory_files


class MemoryFileWatcher:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        workspace: Path,
        notes: NoteStore,
        state: IndexState,
        request_sync: Callable[[str], object],
    ) -> None:
        self.settings = settings
        self.workspace = workspace
        self.notes = notes
        self._state = state
        self._request_sync = request_sync

    async def run(self) -> None:
        """Poll the memory files' (mtime, size); sync once they have been still a while."""
        sync = self.settings.sync
        last = await asyncio.to_thread(self.snapshot)
        changed_at: float | None = None
        while not self._state.closed:
            await asyncio.sleep(sync.watch_poll_seconds)
            try:
                snapshot = await asyncio.to_thread(self.snapshot)
            except OSError:
                continue
            now = time.monotonic()
            if snapshot != last:
                last, changed_at = snapshot, now
                self._state.dirty = True
            elif changed_at is not None and now - changed_at >= sync.watch_debounce_seconds:
                changed_at = None
                self._request_sync("watch")

    def snapshot(self) -> dict[str, tuple[float, int]]:
        """Path → (mtime, size) of every watched file now (blocking)."""
        snapshot: dict[str, tuple[float, int]] = {}
        files = memory_files(self.workspace, self.settings.extra_paths)
        files += [SourceFile(n.path, n.abs_path, NOTES_SOURCE, None) for n in self.notes.files()]
        for source in files:
            with contextlib.suppress(OSError):
                stat = source.abs_path.stat()
                snapshot[source.path] = (stat.st_mtime, stat.st_size)
        return snapshot
