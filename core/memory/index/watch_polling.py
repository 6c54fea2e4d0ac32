"""The polling watcher: where inotify cannot serve, the files' (mtime, size) every
``watch_poll_seconds``.

Its cost grows with the number of files (every poll stats each of them), which is why
it is only the fallback. A change marks the index dirty at once; a sync is asked for
once nothing has changed for ``watch_debounce_seconds``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from parley.core.memory.index.state import IndexState
from parley.core.memory.memory_config import SyncSettings

# Path → (mtime, size) of every watched file.
Snapshot = dict[str, tuple[float, int]]


async def poll_for_changes(
    snapshot: Callable[[], Snapshot],
    *,
    sync: SyncSettings,
    state: IndexState,
    request_sync: Callable[[str], object],
    baseline: Snapshot | None = None,
    on_ready: Callable[[], object] = lambda: None,
) -> None:
    """Poll until the index closes. ``baseline``: a snapshot taken earlier (by the event
    watcher this one replaces), so what changed since then is not missed."""
    last = baseline if baseline is not None else await asyncio.to_thread(snapshot)
    on_ready()
    changed_at: float | None = None
    while not state.closed:
        await asyncio.sleep(sync.watch_poll_seconds)
        try:
            now_seen = await asyncio.to_thread(snapshot)
        except OSError:
            continue
        now = time.monotonic()
        if now_seen != last:
            last, changed_at = now_seen, now
            state.dirty = True
        elif changed_at is not None and now - changed_at >= sync.watch_debounce_seconds:
            changed_at = None
            request_sync("watch")
