"""What lies under the home, per kind, with its bytes: for the doctor and the disk cap.

Kinds: active and archived transcripts (by the registry's status; a file no session
names counts as ``other transcripts``), compaction checkpoints, media, the memory
database, state.db (each with its -wal and -shm), logs, and everything else. Symlinks
are never followed. On PostgreSQL the transcripts and the inbox live in the database,
not under the home: the doctor reports those tables' sizes apart, and the disk cap
counts only the home. Blocking: call on a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from parley.core.context.compaction.compactor import CHECKPOINTS_DIR_NAME
from parley.gateway.config import LoadedConfig
from parley.gateway.memory import memory_db_path

MEDIA_DIR_NAME = "media"
LOGS_DIR_NAME = "logs"
KINDS = (
    "active transcripts",
    "archived transcripts",
    "other transcripts",
    "checkpoints",
    "media",
    "memory db",
    "state db",
    "logs",
    "other",
)


@dataclass(slots=True)
class KindUse:
    files: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.files += 1
        self.bytes += size


@dataclass(slots=True)
class DiskUse:
    kinds: dict[str, KindUse] = field(default_factory=lambda: {k: KindUse() for k in KINDS})

    @property
    def total(self) -> int:
        return sum(k.bytes for k in self.kinds.values())


def media_dir(loaded: LoadedConfig) -> Path:
    return loaded.home / MEDIA_DIR_NAME


def checkpoints_root(loaded: LoadedConfig) -> Path:
    return loaded.sessions_dir / CHECKPOINTS_DIR_NAME


def walk_files(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every regular file under ``root`` (symlinks neither followed nor listed), with
    its stat; a file removed while walking is skipped."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    yield Path(entry.path), entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue


def disk_use(loaded: LoadedConfig, active: set[str], archived: set[str]) -> DiskUse:
    """Bytes under the home per kind; ``active`` and ``archived`` are the registry's
    session ids of each status."""
    use = DiskUse()
    sessions = loaded.sessions_dir.resolve()
    checkpoints = checkpoints_root(loaded).resolve()
    media = media_dir(loaded).resolve()
    logs = (loaded.home / LOGS_DIR_NAME).resolve()
    memory = memory_db_path(loaded).resolve()
    databases = {
        "memory db": {memory, *(_sidecars(memory))},
        "state db": {loaded.state_db.resolve(), *(_sidecars(loaded.state_db.resolve()))},
    }
    for path, stat in walk_files(loaded.home):
        real = path.resolve()
        kind = "other"
        if real.is_relative_to(checkpoints):
            kind = "checkpoints"
        elif real.is_relative_to(media):
            kind = "media"
        elif real.is_relative_to(logs):
            kind = "logs"
        elif real.parent == sessions and real.suffix == ".jsonl":
            kind = (
                "active transcripts"
                if real.stem in active
                else "archived transcripts"
                if real.stem in archived
                else "other transcripts"
            )
        else:
            for name, paths in databases.items():
                if real in paths:
                    kind = name
        use.kinds[kind].add(stat.st_size)
    return use


def _sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


def folder_bytes(folder: Path) -> tuple[int, int]:
    """(files, bytes) under ``folder``."""
    files = size = 0
    for _, stat in walk_files(folder):
        files += 1
        size += stat.st_size
    return files, size
