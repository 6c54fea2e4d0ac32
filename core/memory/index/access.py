"""What a conversation reads and writes outside search: ``memory_get``'s lines, and the
notes ``/remember`` writes and ``/forget`` removes.

``memory_get`` reads memory files, extra paths and the notes of audiences the viewer
may read; a note of another audience is refused exactly like a path that does not
exist, so the answer tells nothing about it. A note removed leaves the index before the
call returns (no search or recall finds it meanwhile), then a sync indexes what is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from parley.core.errors import MemoryIndexError
from parley.core.memory.audience import Audience, Viewer, may_read
from parley.core.memory.index.discovery import IndexSources, inside
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.notes import Forgotten
from parley.core.memory.sources import memory_path

# memory_get reads at most this much of a file.
MAX_GET_LINES = 2000
MAX_GET_CHARS = 200_000


class MemoryAccess:
    def __init__(
        self,
        sources: IndexSources,
        *,
        threads: StoreThreads,
        now: Callable[[], datetime],
        notes_changed: Callable[[], None],
    ) -> None:
        self.sources = sources
        self.notes = sources.notes
        self._threads = threads
        self._now = now
        self._notes_changed = notes_changed

    async def read(
        self, path: str, from_line: int = 1, lines: int | None = None, *, viewer: Viewer
    ) -> str:
        """Lines of a memory file (memory files, extra paths, and the notes of audiences
        ``viewer`` may read). A note of another audience is refused exactly as a path
        that does not exist would be: the answer tells nothing about it."""
        sources = self.sources

        def locate() -> Path | None:
            note = self.notes.resolve(path)
            if note is not None:
                return note.abs_path if may_read(viewer, note.audience.scope) else None
            found = memory_path(path, sources.workspace, sources.settings.extra_paths)
            return None if found is None or inside(found, sources.private_roots()) else found

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
        self._notes_changed()
        return citation

    async def forget_note(self, audience: Audience, needle: str) -> list[Forgotten]:
        """Remove ``audience``'s note lines that ``needle`` names (text or citation).

        Forgotten means forgotten now: the changed files' rows leave the index before
        this returns, so no search or recall finds the lines meanwhile; the next sync
        (asked for here) indexes what is left of those files again. A sync that read a
        file before the change and writes after it is followed by that next sync."""
        removed = await asyncio.to_thread(self.notes.forget, audience, needle)
        if removed:
            store = self._threads.writer_store()
            for forgotten in removed:
                await self._threads.w(store.delete_file, forgotten.path)
            self._notes_changed()
        return removed


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
