"""Which files the memory index reads, and under which path, source and scope.

- ``memory`` source: ``MEMORY.md`` (or ``memory.md``), ``memory/**/*.md`` and the
  configured extra paths (files, or directories searched for ``*.md``). Symlinks are
  skipped (a link could point anywhere) and entries are deduplicated by real path.
  Workspace files are stored by their workspace-relative path (``memory/2026-11-23.md``),
  extra paths outside the workspace by their absolute path. Scope: ``agent``.
- ``sessions`` source: every transcript ``sessions/<id>.jsonl`` (archived ones too),
  stored as ``sessions/<id>.jsonl``; its scope comes from its header.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGENT_SCOPE = "agent"
MEMORY_SOURCE = "memory"
SESSIONS_SOURCE = "sessions"
ROOT_MEMORY_FILES = ("MEMORY.md", "memory.md")
_SKIP_DIRS = frozenset({".git", "node_modules", ".venv", "venv", ".tox", "__pycache__"})
# A transcript header is one line; anything longer is not one we wrote.
_MAX_HEADER_BYTES = 64 * 1024

# Maps a transcript header (its JSON object) to the scope its chunks belong to.
ScopeResolver = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # the key in the index and in citations
    abs_path: Path
    source: str
    scope: str | None  # None: read it from the transcript header


def _walk_markdown(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.lower().endswith(".md"):
                yield Path(directory) / name


def _display(path: Path, workspace: Path) -> str:
    try:
        return path.relative_to(workspace).as_posix()
    except ValueError:
        return path.as_posix()


def memory_files(workspace: Path, extra_paths: Sequence[Path] = ()) -> list[SourceFile]:
    """The memory source's files, in a stable order (no symlinks, no duplicates)."""
    found: list[SourceFile] = []
    seen: set[Path] = set()
    workspace = workspace.resolve() if workspace.exists() else workspace.absolute()

    def add(path: Path) -> None:
        if path.is_symlink() or not path.is_file():
            return
        real = path.resolve()
        if real in seen:
            return
        seen.add(real)
        found.append(SourceFile(_display(path, workspace), path, MEMORY_SOURCE, AGENT_SCOPE))

    for name in ROOT_MEMORY_FILES:
        add(workspace / name)
    memory_dir = workspace / "memory"
    if memory_dir.is_dir() and not memory_dir.is_symlink():
        for path in _walk_markdown(memory_dir):
            add(path)
    for extra in extra_paths:
        # normpath: "../notes.md" must not stay "../notes.md" relative to the workspace.
        extra = Path(os.path.normpath(extra if extra.is_absolute() else workspace / extra))
        if extra.is_symlink():
            continue
        if extra.is_dir():
            for path in _walk_markdown(extra):
                add(path)
        elif extra.suffix.lower() == ".md":
            add(extra)
    return found


def transcript_files(sessions_dir: Path) -> list[SourceFile]:
    if not sessions_dir.is_dir():
        return []
    return [
        SourceFile(f"{SESSIONS_SOURCE}/{path.name}", path, SESSIONS_SOURCE, None)
        for path in sorted(sessions_dir.glob("*.jsonl"))
        if path.is_file() and not path.is_symlink()
    ]


def read_header(first_line: bytes) -> dict[str, Any] | None:
    """The transcript header object, or None when the first line is not one."""
    if len(first_line) > _MAX_HEADER_BYTES:
        return None
    try:
        header = json.loads(first_line)
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("type") != "session":
        return None
    return header


def memory_path(path: str, workspace: Path, extra_paths: Sequence[Path] = ()) -> Path | None:
    """Where ``memory_get`` may read ``path`` (it need not exist), or None when it may not.

    Allowed: ``MEMORY.md``/``memory.md``, ``memory/**/*.md`` (no ``..``, no symlink on
    the way), a configured extra file, or a ``.md`` file under a configured extra dir.
    """
    if not path or "\x00" in path:
        return None
    root = workspace.resolve() if workspace.exists() else workspace.absolute()
    candidate = Path(path)
    if not path.lower().endswith(".md"):
        return None
    if not candidate.is_absolute():
        if ".." in candidate.parts:
            return None
        relative = candidate.as_posix()
        if relative in ROOT_MEMORY_FILES or (
            candidate.parts[:1] == ("memory",) and len(candidate.parts) > 1
        ):
            target = root / candidate
            return None if _has_symlink(root, target) else target
        candidate = root / candidate
    candidate = Path(os.path.normpath(candidate))
    for extra in extra_paths:
        # Normalised as memory_files does, so what search cites is what get accepts.
        extra = Path(os.path.normpath(extra if extra.is_absolute() else root / extra))
        if candidate == extra or (extra.is_dir() and candidate.is_relative_to(extra)):
            return None if _has_symlink(extra.parent, candidate) else candidate
    return None


def _has_symlink(base: Path, target: Path) -> bool:
    """Is any component from ``base`` down to ``target`` a symlink?"""
    current = target
    while current != base and base in current.parents:
        if current.is_symlink():
            return True
        current = current.parent
    return False
