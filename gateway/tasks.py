"""The gateway's background tasks, stopped one way: cancelled, then waited for, so
that nothing they hold (a connection, a lock, a file) outlives the stop."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and return once it has ended; its
    cancellation is not raised, whatever else it raised is."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
