"""What asks for a sync besides start-up, the watcher and a search: the conversations.

A transcript that grows, a compaction, a task record and a note written or removed
mark the index dirty and ask for a sync, debounced (``transcript_debounce_seconds``:
one sync picks up a turn's transcript lines and its task record), or at once past
``transcript_delta_bytes`` / ``transcript_delta_messages``. A search meanwhile sees the
index dirty and catches up first. Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from parley.core.memory.index.state import IndexState
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.notes import NOTES_SOURCE
from parley.core.memory.sources import SESSIONS_SOURCE, TASKS_SOURCE


class SyncTriggers:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        state: IndexState,
        request_sync: Callable[[str], object],
    ) -> None:
        self.settings = settings
        self._state = state
        self._request_sync = request_sync
        self._timer: asyncio.TimerHandle | None = None
        self._pending_bytes = 0
        self._pending_messages = 0

    def transcript_grew(self, appended_bytes: int = 0, appended_messages: int = 1) -> None:
        """A transcript grew: sync after the debounce, or now past the thresholds."""
        sync = self.settings.sync
        if self._state.closed or SESSIONS_SOURCE not in self.settings.sources:
            return
        self._state.dirty = True
        self._pending_bytes += appended_bytes
        self._pending_messages += appended_messages
        if (
            self._pending_bytes >= sync.transcript_delta_bytes
            or self._pending_messages >= sync.transcript_delta_messages
            or sync.transcript_debounce_seconds <= 0
        ):
            self.flush()
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(sync.transcript_debounce_seconds, self.flush)

    def task_recorded(self) -> None:
        """A task record was appended to its log."""
        if self._state.closed or TASKS_SOURCE not in self.settings.sources:
            return
        # Debounced like the transcript the same turn grew (one sync picks up both);
        # a search meanwhile sees the index dirty and catches up first.
        self._state.dirty = True
        delay = self.settings.sync.transcript_debounce_seconds
        if delay <= 0:
            self.flush()
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(delay, self.flush)

    def compacted(self) -> None:
        if not self._state.closed and self.settings.sync.after_compaction:
            self.flush()

    def notes_changed(self) -> None:
        """A note was written or removed: sync soon (as a transcript that grew)."""
        if not self._state.closed and NOTES_SOURCE in self.settings.sources:
            self.flush()

    def flush(self) -> None:
        """Sync now: the debounce is over (or was skipped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending_bytes = self._pending_messages = 0
        if not self._state.closed:
            self._request_sync("transcript")

    def cancel(self) -> None:
        """Drop a pending debounce (the index is closing)."""
        if self._timer is not None:
            self._timer.cancel()
