"""What an idle gateway pays for watching its memory files: file events against polling.

A home holds ``--files`` memory files (default 10,000) spread over nested directories
(``memory/<20>/<10>/<n>.md``). In the same run, over the same files:

- the real gateway: `parley run` (PARLEY_HOME at that home, the terminal chat on a
  pipe kept open, the web server on port 0, keyword-only memory) is started once with
  file events and once with ``WATCHFILES_FORCE_POLLING=1`` (the polling fallback, the
  watcher as it was before: the baseline). Once its start-up sync is done (asked of the
  admin API) and it has settled, the CPU seconds it uses while idle for ``--seconds``
  are read from /proc/<pid>/stat. Then ``--samples`` times a file is written and the
  time until memory.db (or its WAL) changes is taken: write → index committed, through
  the debounce (the defaults: 1.5 s still; polling every 1 s);
- the watcher alone (``MemoryFileWatcher`` in this process, default settings): the time
  from a file write to the dirty flag and to the sync request, which the gateway does
  not show from outside, and its own idle CPU over ``--seconds`` / 3.

Prints one JSON object; ``ratio`` is polling ÷ events idle CPU (the gateway's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import MemberDescriptorType
from typing import Any

import aiohttp

from parley.core.memory.index.state import IndexState
from parley.core.memory.index.watch import MemoryFileWatcher
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.notes import NoteStore

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """
[providers]
default = "anthropic"

[providers.anthropic]
model = "claude-idle"

[logging]
level = "WARNING"
"""
TICK = os.sysconf("SC_CLK_TCK")
INSPECTOR = re.compile(r"http://127\.0\.0\.1:(\d+)/#token=(\S+)")


def make_files(workspace: Path, count: int) -> int:
    """The files, over 20 × 10 nested directories; how many directories in all."""
    memory = workspace / "memory"
    leaves = [memory / f"{a:02d}" / f"{b:02d}" for a in range(20) for b in range(10)]
    for leaf in leaves:
        leaf.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        text = f"# Note {n}\n\nThe ferry number {n} leaves from pier {n % 17}.\n"
        (leaves[n % len(leaves)] / f"{n:05d}.md").write_text(text, encoding="utf-8")
    return 1 + 20 + len(leaves)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def db_stamp(db: Path) -> int:
    stamps = []
    for path in (db, db.with_name(db.name + "-wal")):
        with contextlib.suppress(FileNotFoundError):
            stamps.append(path.stat().st_mtime_ns)
    return max(stamps, default=0)


async def seconds_until(check: Any, limit: float, every: float = 0.005) -> float:
    """Seconds until ``check()`` is true (a tight stat loop: these are latencies)."""
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > limit:
            raise TimeoutError
        await asyncio.sleep(every)
    return time.perf_counter() - start


def read_log(log: Path) -> str:
    return log.read_text(errors="replace")


async def gateway_run(home: Path, mode: str, seconds: float, samples: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        PARLEY_HOME=str(home),
        PARLEY_HTTP__PORT="0",
        PARLEY_MEMORY__EMBEDDER__PROVIDER="none",
        ANTHROPIC_API_KEY="unused",
        ANTHROPIC_BASE_URL="http://127.0.0.1:9",  # never called: nobody writes to it
    )
    env.pop("WATCHFILES_FORCE_POLLING", None)
    if mode == "polling":
        env["WATCHFILES_FORCE_POLLING"] = "1"
    log = home / f"gateway-{mode}.log"
    with log.open("wb") as out:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "parley.gateway.cli.main", "run",
            env=env, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        port, token = await inspector(log, child)
        started = time.perf_counter()
        await synced_once(port, token)
        startup = time.perf_counter() - started
        await asyncio.sleep(3)  # settle: the start-up sync's last writes, the first polls
        before, t0 = cpu_seconds(child.pid), time.perf_counter()
        await asyncio.sleep(seconds)
        idle = cpu_seconds(child.pid) - before
        wall = time.perf_counter() - t0
        latencies = []
        db = home / "memory" / "main" / "memory.db"
        for n in range(samples):
            stamp = db_stamp(db)
            path = home / "workspace" / "memory" / "07" / "03" / f"new-{mode}-{n}.md"
            path.write_text(f"Written at sample {n} of the {mode} run.\n", encoding="utf-8")
            latencies.append(await seconds_until(lambda s=stamp: db_stamp(db) != s, 60))
            await asyncio.sleep(2.0)  # the sync's last commit, before the next sample
        text = read_log(log)
        return {
            "idle_cpu_seconds": round(idle, 3),
            "idle_cpu_percent": round(100 * idle / wall, 3),
            "write_to_index_committed_ms_median": round(1000 * statistics.median(latencies)),
            "write_to_index_committed_ms": [round(1000 * x) for x in latencies],
            "startup_sync_seconds": round(startup, 1),
            "fallback_logged": "polling the memory files" in text,
        }
    finally:
        if child.returncode is None:
            child.terminate()
            await asyncio.wait_for(child.wait(), 60)


async def inspector(log: Path, child: asyncio.subprocess.Process) -> tuple[int, str]:
    for _ in range(1200):
        found = INSPECTOR.search(read_log(log))
        if found:
            return int(found.group(1)), found.group(2)
        if child.returncode is not None:
            raise RuntimeError(f"parley run exited: {read_log(log)[-2000:]}")
        await asyncio.sleep(0.1)
    raise TimeoutError("no Inspector line")


async def synced_once(port: int, token: str) -> None:
    """Until the start-up sync has finished (asked once a second)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for _ in range(900):
            async with http.get(f"http://127.0.0.1:{port}/api/memory/status") as response:
                body = await response.json()
            if body.get("last_sync") and not body.get("syncing"):
                return
            await asyncio.sleep(1)
    raise TimeoutError("the start-up sync did not finish")


# The slot that holds IndexState's flag (what ``IndexState.dirty`` is on the class): the
# property below reads and writes the value there.
_DIRTY_SLOT: MemberDescriptorType = vars(IndexState)["dirty"]


class TimedState(IndexState):
    """Notes when the watcher marks the index dirty."""

    __slots__ = ("marks",)
    marks: list[float]

    @property
    def dirty(self) -> bool:
        return bool(_DIRTY_SLOT.__get__(self))

    @dirty.setter
    def dirty(self, value: bool) -> None:
        if value and hasattr(self, "marks"):
            self.marks.append(time.perf_counter())
        _DIRTY_SLOT.__set__(self, value)


async def watcher_alone(home: Path, mode: str, seconds: float, samples: int) -> dict[str, Any]:
    state = TimedState(dirty=False)
    state.marks = []
    requests: list[float] = []
    requested = asyncio.Event()

    def request_sync(reason: str) -> None:
        requests.append(time.perf_counter())
        requested.set()

    watcher = MemoryFileWatcher(
        MemorySettings(),
        workspace=home / "workspace",
        notes=NoteStore(home / "memory" / "main" / "notes"),
        state=state,
        request_sync=request_sync,
        force_polling=mode == "polling",
    )
    task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(watcher.ready.wait(), 120)
    await asyncio.sleep(2)
    before, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    idle, wall = time.process_time() - before, time.perf_counter() - t0
    to_dirty, to_request = [], []
    for n in range(samples):
        state.marks.clear()
        requested.clear()
        path = home / "workspace" / "memory" / "11" / "05" / f"alone-{mode}-{n}.md"
        written = time.perf_counter()
        path.write_text(f"Sample {n}.\n", encoding="utf-8")
        await asyncio.wait_for(requested.wait(), 60)
        to_dirty.append(state.marks[0] - written)
        to_request.append(requests[-1] - written)
    state.closed = True
    await asyncio.wait_for(task, 30)
    return {
        "mode": watcher.mode,
        "idle_cpu_seconds": round(idle, 3),
        "idle_cpu_percent": round(100 * idle / wall, 3),
        "write_to_dirty_ms_median": round(1000 * statistics.median(to_dirty), 1),
        "write_to_sync_request_ms_median": round(1000 * statistics.median(to_request)),
        "write_to_dirty_ms": [round(1000 * x, 1) for x in to_dirty],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="parley-watch-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "parley.toml").write_text(CONFIG, encoding="utf-8")
        started = time.perf_counter()
        directories = make_files(home / "workspace", args.files)
        made = time.perf_counter() - started
        gateway = {}
        # Polling first: its start indexes the files; the events run starts on a
        # finished index, as a restarted gateway does (both measure idle after that).
        for mode in ("polling", "events"):
            gateway[mode] = await gateway_run(home, mode, args.seconds, args.samples)
        alone = {}
        for mode in ("polling", "events"):
            alone[mode] = await watcher_alone(home, mode, args.seconds / 3, args.samples)
    events, polling = gateway["events"]["idle_cpu_seconds"], gateway["polling"]["idle_cpu_seconds"]
    return {
        "bench": "watch_idle",
        "files": args.files,
        "directories": directories,
        "seconds": args.seconds,
        "gateway": gateway,
        "ratio": round(polling / events, 1) if events else None,
        "ratio_note": "polling ÷ events: idle CPU seconds of the whole `parley run` process",
        "watcher_alone": alone,
        "watcher_alone_ratio": (
            round(alone["polling"]["idle_cpu_seconds"] / alone["events"]["idle_cpu_seconds"], 1)
            if alone["events"]["idle_cpu_seconds"]
            else None
        ),
        "files_made_seconds": round(made, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


if __name__ == "__main__":
    # The watcher alone says once that it polls (as asked): stdout is for the JSON only.
    logging.getLogger("parley").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="idle window per mode")
    parser.add_argument("--samples", type=int, default=5, help="writes timed per mode")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
