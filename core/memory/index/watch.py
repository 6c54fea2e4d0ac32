"""The watcher: hears of changes to the memory files people write, syncs once they are still.

Which files count: ``MEMORY.md`` (or ``memory.md``), ``memory/**/*.md``, the extra paths
(files, or directories searched for ``*.md``, inside the workspace or not) and the notes.
A change (a write, a new file, a delete, a new directory holding ``.md`` files) marks
the index dirty (a search then catches up at once), and once nothing has changed for
``watch_debounce_seconds`` the watcher asks for a sync.

How it hears: the file system's events (inotify on Linux, through watchfiles' Rust
backend, ``watch_notify``), so an idle index costs nothing however many files it has.
Where events cannot serve (the kernel's watch limit reached, no inotify, a watcher error
later, WSL, or ``WATCHFILES_FORCE_POLLING`` set, watchfiles' own switch) it says so in one
log line and polls every ``watch_poll_seconds`` instead (``watch_polling``), starting
from the snapshot the event watcher took when its watches were in place, so that no
change falls between the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path

from parley.core.memory.index.state import IndexState
from parley.core.memory.index.watch_notify import NotifyThread
from parley.core.memory.index.watch_plan import WatchPlan, plan_watch
from parley.core.memory.index.watch_polling import Snapshot, poll_for_changes
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.notes import NOTES_SOURCE, NoteStore
from parley.core.memory.sources import SourceFile, memory_files

log = logging.getLogger("parley.core.memory.index.watch")

# How long a stopping watcher waits for its thread (it sees the stop within a step).
_STOP_WAIT_SECONDS = 5.0


class _Stop:
    """The event watcher's stop signal, read on its thread: set, or the index closed."""

    def __init__(self, state: IndexState) -> None:
        self._state = state
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set or self._state.closed


class _NotifyFailed(Exception):
    def __init__(self, error: BaseException, baseline: Snapshot | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.baseline = baseline


class MemoryFileWatcher:
    def __init__(
        self,
        settings: MemorySettings,
        *,
        workspace: Path,
        notes: NoteStore,
        state: IndexState,
        request_sync: Callable[[str], object],
        force_polling: bool | None = None,
    ) -> None:
        """``force_polling``: None decides as watchfiles does (its environment variable,
        WSL); True or False decides here."""
        self.settings = settings
        self.workspace = workspace
        self.notes = notes
        self._state = state
        self._request_sync = request_sync
        self._force_polling = force_polling
        # "events" or "polling" once it runs; ready once it would see a change.
        self.mode: str | None = None
        self.ready = asyncio.Event()
        self._baseline: Snapshot | None = None
        self._changed_at: float | None = None  # on the loop's clock

    async def run(self) -> None:
        """Watch until the index closes (or this task is cancelled)."""
        reason = self._polling_reason()
        baseline: Snapshot | None = None
        if reason is None:
            try:
                await self._run_events()
                return
            except _NotifyFailed as failed:
                reason, baseline = f"file events unavailable ({failed})", failed.baseline
        sync = self.settings.sync
        log.warning(
            "memory watcher: %s; polling the memory files every %gs instead",
            reason,
            sync.watch_poll_seconds,
        )
        await poll_for_changes(
            self.snapshot,
            sync=sync,
            state=self._state,
            request_sync=self._request_sync,
            baseline=baseline,
            on_ready=lambda: self._ready("polling"),
        )

    def _polling_reason(self) -> str | None:
        if self._force_polling is not None:
            return "polling forced" if self._force_polling else None
        # watchfiles' own switch and rule (watchfiles.main._default_force_polling).
        value = os.environ.get("WATCHFILES_FORCE_POLLING", "")
        if value and value.lower() not in {"false", "disable", "disabled"}:
            return "WATCHFILES_FORCE_POLLING is set"
        uname = platform.uname()
        if uname.system.lower() == "linux" and "microsoft-standard" in uname.release.lower():
            return "WSL (its inotify misses changes made from Windows)"
        return None

    def _ready(self, mode: str) -> None:
        self.mode = mode
        self.ready.set()

    def _plan(self) -> WatchPlan:
        return plan_watch(self.workspace, self.settings.extra_paths, self.notes.root)

    async def _run_events(self) -> None:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        exited: asyncio.Future[BaseException | None] = loop.create_future()
        stop = _Stop(self._state)

        def on_ready(baseline: Snapshot) -> None:
            self._baseline = baseline
            self._ready("events")

        def on_change() -> None:
            self._state.dirty = True
            self._changed_at = loop.time()
            wake.set()

        def on_exit(error: BaseException | None) -> None:
            if not exited.done():
                exited.set_result(error)
            wake.set()

        watcher = NotifyThread(
            self._plan,
            stop=stop,
            loop=loop,
            baseline=self.snapshot,
            on_ready=on_ready,
            on_change=on_change,
            on_exit=on_exit,
            poll_delay_ms=int(self.settings.sync.watch_poll_seconds * 1000),
        )
        watcher.start()
        try:
            await self._debounce(wake, exited)
        finally:
            stop.set()
            # Its thread sees the stop within a step and closes its watches: wait for that
            # (asyncio.wait, not wait_for: a timeout must not cancel the future), then for
            # the thread itself, which only has to return by then.
            if not exited.done():
                await asyncio.wait({exited}, timeout=_STOP_WAIT_SECONDS)
            with contextlib.suppress(RuntimeError):  # the loop's executor is shut down
                await asyncio.to_thread(watcher.thread.join, _STOP_WAIT_SECONDS)
        error = exited.result() if exited.done() else None
        if error is not None:
            raise _NotifyFailed(error, self._baseline)

    async def _debounce(
        self, wake: asyncio.Event, exited: asyncio.Future[BaseException | None]
    ) -> None:
        """Ask for a sync once the changes have been still for the debounce; return when
        the thread ends (stopped, or failed)."""
        debounce = self.settings.sync.watch_debounce_seconds
        while not exited.done():
            due = None if self._changed_at is None else self._changed_at + debounce
            try:
                # Idle, nothing is due: no timer at all, the loop sleeps until woken.
                async with asyncio.timeout_at(due):
                    await wake.wait()
            except TimeoutError:
                self._changed_at = None
                self._request_sync("watch")
                continue
            wake.clear()

    def snapshot(self) -> Snapshot:
        """Path → (mtime, size) of every watched file now (blocking)."""
        snapshot: Snapshot = {}
        files = memory_files(self.workspace, self.settings.extra_paths)
        files += [SourceFile(n.path, n.abs_path, NOTES_SOURCE, None) for n in self.notes.files()]
        for source in files:
            with contextlib.suppress(OSError):
                stat = source.abs_path.stat()
                snapshot[source.path] = (stat.st_mtime, stat.st_size)
        return snapshot
