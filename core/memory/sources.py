"""Which files the memory index reads, and under which path, source and scope.

- ``memory`` source: ``MEMORY.md`` (or ``memory.md``), ``memory/**/*.md`` and the
  configured extra paths (files, or directories searched for ``*.md``). Symlinks are
  skipped (a link could point anywhere) and entries are deduplicated by real path.
  Workspace files are stored by their workspace-relative path (``memory/2026-11-23.md``),
  extra paths outside the workspace by their absolute path. Scope: ``agent``.
- ``sessions`` source: every transcript ``sessions/<id>.jsonl`` (archived ones too),
  stored as ``sessions/<id>.jsonl``; its scope comes from its header.
- ``tasks`` source: task records (``core.memory.tasks``), one JSONL file per scope in
  the tasks directory beside memory.db, stored as ``tasks/<digest>.jsonl``; its scope
  comes from its records. One record is one chunk.

Transcripts come through a ``TranscriptSource``: ``FileTranscriptSource`` reads the
sessions directory; ``StoreTranscriptSource`` reads any ``TranscriptStore`` (the
PostgreSQL one keeps transcripts as rows). Either lists the same paths and yields the
same bytes, so the index, its citations and its chunks do not depend on the backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from parley.core.errors import TranscriptError
from parley.core.transcript_store import TranscriptInfo, TranscriptStore

AGENT_SCOPE = "agent"
MEMORY_SOURCE = "memory"
SESSIONS_SOURCE = "sessions"


def transcript_path(session_id: str) -> str:
    """The index path of a session's transcript, wherever it is stored (a file, a
    PostgreSQL row): what retention keeps or drops and erasure removes by."""
    return f"{SESSIONS_SOURCE}/{session_id}.jsonl"


TASKS_SOURCE = "tasks"
ROOT_MEMORY_FILES = ("MEMORY.md", "memory.md")
_SKIP_DIRS = frozenset({".git", "node_modules", ".venv", "venv", ".tox", "__pycache__"})
# A transcript header is one line; anything longer is not one we wrote.
_MAX_HEADER_BYTES = 64 * 1024

# Maps a transcript header (its JSON object) to the scope its chunks belong to.
ScopeResolver = Callable[[Mapping[str, Any]], str]


# A file's (mtime, size), or what stands for them: when it differs from the row's, the
# index re-reads the file (and re-chunks it only when its hash changed too).
Marker = tuple[float, int]


@dataclass(frozen=True, slots=True)
class SourceFile:
    path: str  # the key in the index and in citations
    # Where to read it. A transcript from a ``StoreTranscriptSource`` has no file: its
    # path here is the index key, and only its ``TranscriptSource`` reads it.
    abs_path: Path
    source: str
    scope: str | None  # None: read it from the transcript header
    session_id: str | None = None  # a transcript's, as its TranscriptSource lists it
    marker: Marker | None = None  # from the listing, when the source stamps it there


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


def task_files(paths: Sequence[Path], tasks_dir: Path) -> list[SourceFile]:
    """The task logs ``paths`` under ``tasks_dir`` as sources: ``tasks/<digest>.jsonl``,
    or ``tasks/<writer>/<digest>.jsonl`` when replicas share the directory."""
    return [
        SourceFile(
            f"{TASKS_SOURCE}/{path.relative_to(tasks_dir).as_posix()}", path, TASKS_SOURCE, None
        )
        for path in paths
    ]


class TranscriptSource(Protocol):
    """The transcripts the ``sessions`` source indexes. Every method blocks: the index
    calls them on worker threads."""

    def transcripts(self) -> list[SourceFile]:
        """Every transcript (archived ones too), in a stable order."""
        ...

    def marker(self, source: SourceFile) -> Marker | None:
        """Its change marker now, or None when it is gone."""
        ...

    def read(self, source: SourceFile, limit: int) -> bytes:
        """Its JSONL bytes (header line first), at most ``limit`` of them."""
        ...

    def read_range(self, source: SourceFile, start: int, limit: int) -> bytes:
        """Its bytes from offset ``start`` on, at most ``limit`` of them (a sync resuming
        where the previous one stopped reads only what is new)."""
        ...


class FileTranscriptSource:
    """Transcripts as files in the sessions directory (the SQLite backend's)."""

    def __init__(self, sessions_dir: Path) -> None:
        self.sessions_dir = sessions_dir

    def transcripts(self) -> list[SourceFile]:
        return transcript_files(self.sessions_dir)

    def marker(self, source: SourceFile) -> Marker | None:
        try:
            stat = source.abs_path.stat()
        except FileNotFoundError:
            return None
        return stat.st_mtime, stat.st_size

    def read(self, source: SourceFile, limit: int) -> bytes:
        with source.abs_path.open("rb") as handle:
            return handle.read(limit)

    def read_range(self, source: SourceFile, start: int, limit: int) -> bytes:
        return read_file_range(source.abs_path, start, limit)

    def __repr__(self) -> str:
        return f"<FileTranscriptSource {self.sessions_dir}>"


def stamp_marker(stamp: tuple[int, ...]) -> Marker:
    """A ``TranscriptInfo.stamp`` as a marker: a file's (size, mtime_ns) becomes its
    (mtime, size); a table's (line count,) becomes (0.0, line count). Either changes
    whenever the transcript does."""
    size = stamp[0] if stamp else 0
    mtime = stamp[1] / 1e9 if len(stamp) > 1 else 0.0
    return mtime, size


class StoreTranscriptSource:
    """Transcripts from a ``TranscriptStore`` (PostgreSQL's rows, or files through
    ``FileTranscriptStore``), listed under the same ``sessions/<id>.jsonl`` paths and
    read as the bytes an export of them writes."""

    def __init__(self, store: TranscriptStore) -> None:
        self.store = store

    def transcripts(self) -> list[SourceFile]:
        return [self._source(info) for info in self.store.list_transcripts()]

    def _source(self, info: TranscriptInfo) -> SourceFile:
        path = transcript_path(info.session_id)
        # The listing's stamp serves as the marker: one query lists them all, where
        # asking each transcript again would cost a round trip per transcript.
        return SourceFile(
            path, Path(path), SESSIONS_SOURCE, None, info.session_id, stamp_marker(info.stamp)
        )

    def marker(self, source: SourceFile) -> Marker | None:
        if source.marker is not None:
            return source.marker
        info = self.store.info(_session_id(source))
        return None if info is None else stamp_marker(info.stamp)

    def read(self, source: SourceFile, limit: int) -> bytes:
        # Read-only: the owner may be appending meanwhile; a line appended after the
        # listing only makes the next sync read this transcript again.
        parts: list[bytes] = []
        size = 0
        with self.store.open(_session_id(source), read_only=True) as transcript:
            for line in transcript.raw_lines():
                if size >= limit:
                    break
                parts.append(line)
                parts.append(b"\n")
                size += len(line) + 1
        return b"".join(parts)[:limit]

    def read_range(self, source: SourceFile, start: int, limit: int) -> bytes:
        # Rows, not a file: the lines before ``start`` are still fetched (skipped here
        # unparsed); what resuming saves is the chunking, by far the larger cost.
        parts: list[bytes] = []
        pos = size = 0
        with self.store.open(_session_id(source), read_only=True) as transcript:
            for raw in transcript.raw_lines():
                line = raw + b"\n"
                end = pos + len(line)
                if end > start:
                    piece = line[max(0, start - pos) :]
                    parts.append(piece)
                    size += len(piece)
                    if size >= limit:
                        break
                pos = end
        return b"".join(parts)[:limit]

    def __repr__(self) -> str:
        return f"<StoreTranscriptSource {self.store!r}>"


def read_file_range(path: Path, start: int, limit: int) -> bytes:
    """At most ``limit`` bytes of the file at ``path`` from offset ``start``."""
    with path.open("rb") as handle:
        handle.seek(start)
        return handle.read(max(0, limit))


def _session_id(source: SourceFile) -> str:
    if source.session_id is None:
        raise TranscriptError(f"{source.path}: not a transcript of this store")
    return source.session_id


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
