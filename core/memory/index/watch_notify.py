"""The event-driven watcher's thread: watchfiles' Rust backend over the planned directories.

``RustNotify`` (watchfiles' documented backend, the ``notify`` crate: inotify on Linux)
is used directly rather than through ``watchfiles.watch``: that lets a new plan's
watcher be made before the old one is closed (nothing falls between them), and tells
when the watches are in place. Its ``watch`` call sleeps ``step`` ms at a time with the
GIL released and looks at the stop signal between sleeps: an idle watcher costs a few
microseconds per step, whatever the number of files.

Everything blocking (walking the trees, adding the watches, looking at new
directories, the baseline snapshot) runs on this thread; the event loop hears of it
through ``call_soon_threadsafe`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol

from watchfiles._rust_notify import RustNotify

from parley.core.memory.index.watch_plan import Verdict, WatchPlan, classify, counted_files

# Between two looks at the changes and at the stop signal: the idle cost (one GIL
# round a step) against how soon a change and a stop are seen (a change: two steps).
STEP_MS = 50
# A batch is handed over at most this long after its first change, even while changes
# keep coming (watchfiles' own ``debounce``): the index's debounce is the loop's job.
BATCH_MS = 200
# A directory can go between the walk and its watch (FileNotFoundError): plan again.
_OPEN_TRIES = 3


class StopSignal(Protocol):
    def is_set(self) -> bool: ...


class NotifyThread:
    """Watches the planned directories on its own thread until ``stop`` is set.

    ``on_ready(baseline)`` once the first watches are in place (``baseline`` is what
    the ``baseline`` callable returned, on this thread); ``on_change()`` after each batch
    in which a counted file changed; ``on_exit(error)`` at the end, with the exception
    that ended it (None when stopped). All three are called on ``loop``.
    """

    def __init__(
        self,
        plan: Callable[[], WatchPlan],
        *,
        stop: StopSignal,
        loop: asyncio.AbstractEventLoop,
        baseline: Callable[[], Any],
        on_ready: Callable[[Any], object],
        on_change: Callable[[], object],
        on_exit: Callable[[BaseException | None], object],
        poll_delay_ms: int,
    ) -> None:
        self._plan = plan
        self._stop = stop
        self._loop = loop
        self._baseline = baseline
        self._on_ready = on_ready
        self._on_change = on_change
        self._on_exit = on_exit
        self._poll_delay_ms = poll_delay_ms
        # Daemon: a watcher never holds up the interpreter's exit.
        self.thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _post(self, callback: Callable[..., object], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
            self._loop.call_soon_threadsafe(callback, *args)

    def _run(self) -> None:
        error: BaseException | None = None
        notify: RustNotify | None = None
        try:
            plan, notify = self._open()
            self._post(self._on_ready, self._baseline())
            while not self._stop.is_set():
                # No timeout (0): the stop signal is looked at every step anyway.
                raw = notify.watch(BATCH_MS, STEP_MS, 0, self._stop)
                if isinstance(raw, str):
                    continue  # "stop" ends the loop; "signal" only reaches the main thread
                verdict = classify(plan, raw)
                changed = verdict.changed
                while verdict.replan and not self._stop.is_set():
                    plan, notify, verdict = self._replan(plan, notify)
                    changed = changed or verdict.changed
                if changed:
                    self._post(self._on_change)
        except Exception as exc:  # handed to the loop, which falls back to polling
            error = exc
        finally:
            if notify is not None:
                notify.close()
            self._post(self._on_exit, error)

    def _open(self) -> tuple[WatchPlan, RustNotify]:
        for attempt in range(_OPEN_TRIES):
            plan = self._plan()
            try:
                # Not recursive: the plan names every directory (see watch_plan). Not
                # forced to poll, and the permission errors raise: a refused watch must
                # not go unnoticed. poll_delay_ms only serves where the library falls
                # back to polling by itself (no inotify in the kernel: ENOSYS).
                notify = RustNotify(
                    sorted(plan.dirs), False, False, self._poll_delay_ms, False, False
                )
            except FileNotFoundError:
                if attempt == _OPEN_TRIES - 1:
                    raise
                continue
            return plan, notify
        raise AssertionError("unreachable")

    def _replan(
        self, old_plan: WatchPlan, old: RustNotify
    ) -> tuple[WatchPlan, RustNotify, Verdict]:
        """Watch what the tree holds now. The new watcher is made before the old one is
        closed, and what the old one saw meanwhile is classified against the new plan."""
        plan, notify = self._open()
        try:
            drained = old.watch(1, 1, 1, None)
        except BaseException:
            notify.close()  # the caller closes the old one
            raise
        old.close()
        fresh = plan.dirs - old_plan.dirs
        gone = old_plan.tree_dirs - plan.tree_dirs  # they may have held .md files
        # A new directory's files may have been written before its watch was added.
        changed = bool(gone) or counted_files(plan, fresh)
        verdict = classify(plan, drained) if isinstance(drained, set) else Verdict()
        return plan, notify, Verdict(changed or verdict.changed, verdict.replan)
