"""The memory file watcher, on real files in temporary directories: file events
(inotify through watchfiles) and the polling fallback must see the same changes.

Driven by events, never by sleeping: each test waits (with a generous timeout) for the
watcher to be ready, then for the sync it asks for, or for the batch it classified.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import parley.core.memory.index.watch_notify as notify_module
from parley.core.memory.audience import Audience
from parley.core.memory.index.state import IndexState
from parley.core.memory.index.watch import MemoryFileWatcher
from parley.core.memory.index.watch_plan import Verdict, WatchPlan, plan_watch
from parley.core.memory.memory_config import MemorySettings, SyncSettings
from parley.core.memory.notes import NoteStore

WAIT = 15.0  # seconds: generous, for a loaded machine; a passing test takes far less
MODES = ["events", "polling"]


@dataclass
class Rig:
    workspace: Path
    outside: Path  # an extra directory outside the workspace
    notes: NoteStore
    state: IndexState
    requests: asyncio.Queue[str]
    watcher: MemoryFileWatcher

    @property
    def memory(self) -> Path:
        return self.workspace / "memory"

    async def synced(self) -> None:
        """Wait for the sync the last change asks for; the index must be dirty by then."""
        async with asyncio.timeout(WAIT):
            reason = await self.requests.get()
        assert reason == "watch"
        assert self.state.dirty
        self.state.dirty = False


def write(path: Path, text: str) -> None:
    """Written whole, then moved in (as the index test does): one event, no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.parent.parent / f".{path.name}.staged"
    staged.write_text(text, encoding="utf-8")
    staged.replace(path)


@asynccontextmanager
async def running(
    root: Path,
    mode: str,
    *,
    extra: Iterable[Path] = (),
    make_memory: bool = True,
    force_polling: bool | None = None,
) -> AsyncIterator[Rig]:
    """A watcher on a new workspace under ``root``, ready, in ``mode``; stopped after."""
    workspace, outside = root / "workspace", root / "outside"
    workspace.mkdir()
    outside.mkdir()
    if make_memory:
        (workspace / "memory").mkdir()
        (workspace / "memory" / "2026-01-01.md").write_text("First.\n")
    # A debounce long enough that one step's events (which may come in two batches on a
    # loaded machine) make one sync, so each step waits for its own.
    settings = MemorySettings(
        extra_paths=tuple(extra),
        sync=SyncSettings(
            on_start=False, watch=True, watch_poll_seconds=0.05, watch_debounce_seconds=0.25
        ),
    )
    state = IndexState(dirty=False)
    requests: asyncio.Queue[str] = asyncio.Queue()
    watcher = MemoryFileWatcher(
        settings,
        workspace=workspace,
        notes=NoteStore(root / "private" / "notes"),
        state=state,
        request_sync=requests.put_nowait,
        force_polling=(mode == "polling") if force_polling is None else force_polling,
    )
    task = asyncio.create_task(watcher.run())
    try:
        async with asyncio.timeout(WAIT):
            await watcher.ready.wait()
        assert watcher.mode == mode
        yield Rig(workspace, outside, watcher.notes, state, requests, watcher)
    finally:
        state.closed = True
        async with asyncio.timeout(WAIT):
            await task  # returns by itself once the index is closed
    assert requests.empty(), "a sync nobody waited for"


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "memory-watch"]


# -- the changes that count ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_create_modify_delete_in_memory(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as rig:
        write(rig.memory / "2026-01-02.md", "Booked the ferry.\n")
        await rig.synced()
        with (rig.memory / "2026-01-01.md").open("a") as handle:
            handle.write("More, later.\n")
        await rig.synced()
        (rig.memory / "2026-01-02.md").unlink()
        await rig.synced()


@pytest.mark.parametrize("mode", MODES)
async def test_the_root_memory_file(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as rig:
        write(rig.workspace / "MEMORY.md", "The ferry leaves at nine.\n")
        await rig.synced()
        (rig.workspace / "MEMORY.md").unlink()
        await rig.synced()


@pytest.mark.parametrize("mode", MODES)
async def test_a_directory_made_after_the_start_is_watched(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as rig:
        # The file is written at once, before any watch on the new directories can exist.
        deep = rig.memory / "2026" / "01"
        deep.mkdir(parents=True)
        (deep / "03.md").write_text("Naxos.\n")
        await rig.synced()
        # Once planned again, the new directory is watched like the others.
        write(deep / "04.md", "Paros.\n")
        await rig.synced()
        shutil.rmtree(rig.memory / "2026")
        await rig.synced()


@pytest.mark.parametrize("mode", MODES)
async def test_a_directory_moved_away_counts(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as rig:
        write(rig.memory / "trip" / "plan.md", "Ferry.\n")
        await rig.synced()
        (rig.memory / "trip").rename(rig.outside / "trip")  # one event, for the directory
        await rig.synced()


@pytest.mark.parametrize("mode", MODES)
async def test_a_memory_directory_that_appears_later(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode, make_memory=False) as rig:
        write(rig.memory / "2026-02-01.md", "Started a memory.\n")
        await rig.synced()
        write(rig.memory / "2026-02-02.md", "And another.\n")
        await rig.synced()


@pytest.mark.parametrize("mode", MODES)
async def test_extra_paths_outside_the_workspace(tmp_path: Path, mode: str) -> None:
    extra_dir, extra_file = tmp_path / "outside" / "wiki", tmp_path / "elsewhere" / "todo.md"
    async with running(tmp_path, mode, extra=[extra_dir, extra_file]) as rig:
        # Neither exists yet: each is seen when it appears.
        write(extra_dir / "ferries.md", "Blue Star.\n")
        await rig.synced()
        write(extra_dir / "sub" / "ports.md", "Piraeus.\n")
        await rig.synced()
        write(extra_file, "- book the ferry\n")
        await rig.synced()
        write(extra_file, "- booked\n")  # replaced by a rename, as editors save
        await rig.synced()


@pytest.mark.parametrize("mode", MODES)
async def test_notes(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as rig:
        alice = Audience.person("alice")
        await asyncio.to_thread(rig.notes.remember, alice, datetime.now(UTC), "Likes ferries")
        await rig.synced()
        await asyncio.to_thread(rig.notes.remember, alice, datetime.now(UTC), "Hates buses")
        await rig.synced()


# -- what does not count ------------------------------------------------------------------


async def test_files_that_do_not_count_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch's verdict is caught as the watcher's thread reaches it."""
    verdicts: queue.Queue[tuple[set[str], Verdict]] = queue.Queue()
    real = notify_module.classify

    def spy(plan: WatchPlan, changes: Iterable[tuple[int, str]]) -> Verdict:
        changes = list(changes)
        verdict = real(plan, changes)
        verdicts.put(({os.path.basename(path) for _, path in changes}, verdict))
        return verdict

    monkeypatch.setattr(notify_module, "classify", spy)
    async with running(tmp_path, "events") as rig:
        for name in ("notes.txt", ".2026-01-01.md.swp", "4913"):
            (rig.memory / name).write_text("not memory\n")
        (rig.memory / ".git").mkdir()  # not walked by the index: not watched either
        (rig.workspace / "README.md").write_text("not memory either\n")
        seen: set[str] = set()
        async with asyncio.timeout(WAIT):
            while not {"notes.txt", ".2026-01-01.md.swp", "4913", ".git", "README.md"} <= seen:
                names, verdict = await asyncio.to_thread(verdicts.get)
                seen |= names
                assert verdict == Verdict(), names
        assert not rig.state.dirty
        write(rig.memory / "2026-01-05.md", "This one counts.\n")
        await rig.synced()


def test_the_plan_skips_what_the_index_does_not_read(tmp_path: Path) -> None:
    workspace, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    (workspace / "memory" / "a" / "b").mkdir(parents=True)
    (workspace / "memory" / ".git" / "objects").mkdir(parents=True)
    (workspace / "memory" / "node_modules").mkdir()
    (elsewhere / "deep").mkdir(parents=True)
    (workspace / "memory" / "link").symlink_to(elsewhere, target_is_directory=True)
    (workspace / "src").mkdir()  # the rest of the workspace is none of the watcher's business

    plan = plan_watch(workspace, (Path("../missing/dir"),), tmp_path / "notes")

    memory = workspace.resolve() / "memory"
    assert plan.dirs == {
        str(workspace.resolve()),
        str(memory),
        str(memory / "a"),
        str(memory / "a" / "b"),
        str(tmp_path),  # the nearest existing ancestor of ../missing/dir and of notes/
    }
    assert str(tmp_path / "missing" / "dir") in plan.anchors


# -- falling back to polling ----------------------------------------------------------------


class _Refused:
    """Stands for RustNotify where the kernel refuses a watch (the limit reached)."""

    def __init__(self, *args: Any) -> None:
        raise OSError("OS file watch limit reached.")


async def test_a_refused_start_falls_back_to_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(notify_module, "RustNotify", _Refused)
    caplog.set_level(logging.WARNING, logger="parley.core.memory.index.watch")
    async with running(tmp_path, "polling", force_polling=False) as rig:
        write(rig.memory / "2026-01-02.md", "Seen by polling.\n")
        await rig.synced()
        assert not watch_threads()  # the failed start left nothing behind
    [record] = [r for r in caplog.records if "polling" in r.getMessage()]
    assert record.name == "parley.core.memory.index.watch"
    assert "file events unavailable (OS file watch limit reached.)" in record.getMessage()


async def test_a_failure_later_falls_back_without_missing_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first watcher is made, the one a new directory calls for is refused: polling
    takes over from the snapshot taken at the start, so the new file is still seen."""
    real = notify_module.RustNotify
    made: list[object] = []

    def first_only(*args: Any) -> object:
        if made:
            raise OSError("OS file watch limit reached.")
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(notify_module, "RustNotify", first_only)
    caplog.set_level(logging.WARNING, logger="parley.core.memory.index.watch")
    async with running(tmp_path, "events") as rig:
        (rig.memory / "new").mkdir()
        (rig.memory / "new" / "2026-01-03.md").write_text("Written as the watcher fails.\n")
        await rig.synced()
        assert rig.watcher.mode == "polling"
        write(rig.memory / "new" / "2026-01-04.md", "Polled.\n")
        await rig.synced()
    assert sum("polling" in r.getMessage() for r in caplog.records) == 1


_LIMIT_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys
    from pathlib import Path
    from parley.core.memory.index.state import IndexState
    from parley.core.memory.index.watch import MemoryFileWatcher
    from parley.core.memory.memory_config import MemorySettings, SyncSettings
    from parley.core.memory.notes import NoteStore

    async def main(root: Path) -> None:
        sync = SyncSettings(watch_poll_seconds=0.05, watch_debounce_seconds=0.1)
        state, requests = IndexState(dirty=False), asyncio.Queue()
        watcher = MemoryFileWatcher(
            MemorySettings(sync=sync), workspace=root / "ws", notes=NoteStore(root / "n"),
            state=state, request_sync=requests.put_nowait,
        )
        task = asyncio.create_task(watcher.run())
        async with asyncio.timeout(30):
            await watcher.ready.wait()
            (root / "ws" / "memory" / "d3" / "x.md").write_text("seen\\n")
            print(watcher.mode, await requests.get(), state.dirty, flush=True)
        state.closed = True
        await task

    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(Path(sys.argv[1])))
    """
)


def test_the_kernel_watch_limit_falls_back_to_polling(tmp_path: Path) -> None:
    """For real: in a user namespace of its own, the watcher's process may hold 3 inotify
    watches (max_user_watches for it), fewer than the directories it needs."""
    limit = "echo 3 > /proc/sys/user/max_inotify_watches"
    if (
        not shutil.which("unshare")
        or subprocess.run(
            ["unshare", "-U", "-r", "sh", "-c", limit], capture_output=True, check=False
        ).returncode
    ):
        pytest.skip("no user namespace to lower the inotify limit in")
    for index in range(6):
        (tmp_path / "ws" / "memory" / f"d{index}").mkdir(parents=True)
    script = tmp_path / "limit.py"
    script.write_text(_LIMIT_SCRIPT)
    command = f'{limit} && exec "$0" "$1" "$2"'
    done = subprocess.run(
        ["unshare", "-U", "-r", "sh", "-c", command, sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["polling", "watch", "True"]
    assert "file events unavailable (OS file watch limit reached" in done.stderr
    assert done.stderr.count("polling the memory files") == 1


# -- stopping -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_closing_the_index_stops_the_watcher(tmp_path: Path, mode: str) -> None:
    async with running(tmp_path, mode) as rig:
        assert len(watch_threads()) == (1 if mode == "events" else 0)
        rig.state.closed = True
    # running() awaited the task, which ended by itself; its thread is gone with it.
    assert not watch_threads()


async def test_cancelling_the_watcher_stops_its_thread(tmp_path: Path) -> None:
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    watcher = MemoryFileWatcher(
        MemorySettings(),
        workspace=tmp_path / "ws",
        notes=NoteStore(tmp_path / "notes"),
        state=IndexState(),
        request_sync=lambda reason: None,
        force_polling=False,
    )
    task = asyncio.create_task(watcher.run())
    async with asyncio.timeout(WAIT):
        await watcher.ready.wait()
    assert len(watch_threads()) == 1
    task.cancel()
    async with asyncio.timeout(WAIT):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not watch_threads()  # joined before the task ended
