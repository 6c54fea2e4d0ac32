"""Private notes: what the bot writes down about a person or a conversation.

Each audience (``core.memory.audience``) has its own folder under one private root,
outside the workspace, so that no file tool can list or read it::

    <root>/person/telegram%3A123/2026-11-26.md      memory flushes, one file a day
    <root>/person/telegram%3A123/remembered.md      /remember and the remember tool
    <root>/conversation/telegram%3A-100/…

They are indexed as the ``notes`` source under ``notes/<kind>/<folder>/<file>``, their
scope read from the path, and ``memory_get`` reads them only for a viewer the audience
rule admits. Note headers carry a time and a kind, never a session key or a platform id.
Every function here blocks: call it on a worker thread.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from parley.core.files import write_atomically
from parley.core.memory.audience import Audience, parse_folder

NOTES_SOURCE = "notes"
REMEMBERED_FILE = "remembered.md"
DIR_MODE = 0o700
FILE_MODE = 0o600
MAX_NOTE_CHARS = 8_000
# A citation of a note: notes/<kind>/<folder>/<file>#L<a>[-L<b>]
_CITATION_RE = re.compile(r"^(notes/[^#\s]+\.md)#L(\d+)(?:-L(\d+))?$")


class NoteError(ValueError):
    """A note that cannot be written, or a path that is not one of ours."""


@dataclass(frozen=True, slots=True)
class NoteFile:
    path: str  # notes/<kind>/<folder>/<name>: the index key and citation path
    abs_path: Path
    audience: Audience


@dataclass(frozen=True, slots=True)
class Forgotten:
    path: str
    lines: tuple[str, ...]


class NoteStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()

    def folder(self, audience: Audience) -> Path:
        return self.root / audience.folder

    def display(self, audience: Audience, name: str) -> str:
        return f"{NOTES_SOURCE}/{audience.folder}/{name}"

    # -- writing ---------------------------------------------------------------------------

    def append_flush(self, audience: Audience, when: datetime, text: str) -> str:
        """Append a flush's notes to the audience's file of the day; its display path."""
        header = f"\n## {when:%H:%M} — saved before compaction\n\n"
        name = f"{when:%Y-%m-%d}.md"
        self._append(audience, name, header + text.strip()[:MAX_NOTE_CHARS] + "\n")
        return self.display(audience, name)

    def remember(self, audience: Audience, when: datetime, text: str) -> str:
        """One durable note (a bullet) in the audience's remembered.md; its citation."""
        body = " ".join(text.split())[:MAX_NOTE_CHARS]
        if not body:
            raise NoteError("nothing to remember")
        line = f"- {body} ({when:%Y-%m-%d})\n"
        path = self._append(audience, REMEMBERED_FILE, line)
        with path.open("rb") as handle:
            number = sum(1 for _ in handle)
        return f"{self.display(audience, REMEMBERED_FILE)}#L{number}"

    def _append(self, audience: Audience, name: str, text: str) -> Path:
        folder = self.folder(audience)
        with self._lock:
            folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            path = folder / name
            if path.is_symlink() or folder.is_symlink():
                raise NoteError(f"refusing to write through a symlink: {path}")
            # O_APPEND: two sessions of one audience interleave whole notes, never bytes.
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(path, flags, FILE_MODE)
            try:
                os.write(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
        return path

    def forget(self, audience: Audience, needle: str) -> list[Forgotten]:
        """Remove the note lines of ``audience`` that ``needle`` names: a citation
        (``notes/…/x.md#L3-L4``) of one of its own files, or text the line contains
        (case-insensitive). Headings are never removed. Returns what went."""
        needle = needle.strip()
        if not needle:
            raise NoteError("say what to forget: some of its text or its citation")
        cited = _CITATION_RE.match(needle)
        removed: list[Forgotten] = []
        with self._lock:
            for note in self._files_of(audience):
                if cited and cited.group(1) != note.path:
                    continue
                lines = note.abs_path.read_text(encoding="utf-8", errors="replace").splitlines(
                    keepends=True
                )
                keep: list[str] = []
                gone: list[str] = []
                for number, line in enumerate(lines, start=1):
                    if _matches(line, number, needle, cited):
                        gone.append(line.rstrip("\n"))
                    else:
                        keep.append(line)
                if gone:
                    write_atomically(note.abs_path, "".join(keep).encode("utf-8"))
                    removed.append(Forgotten(note.path, tuple(gone)))
        return removed

    def erase(self, audience: Audience) -> list[str]:
        """Delete every note of ``audience``; the display paths removed."""
        removed: list[str] = []
        with self._lock:
            for note in self._files_of(audience):
                note.abs_path.unlink(missing_ok=True)
                removed.append(note.path)
            folder = self.folder(audience)
            if folder.is_dir() and not folder.is_symlink():
                for leftover in folder.iterdir():
                    if leftover.is_file() or leftover.is_symlink():
                        leftover.unlink()
                folder.rmdir()
        return removed

    # -- reading ---------------------------------------------------------------------------

    def files(self) -> list[NoteFile]:
        """Every note file of every audience, in a stable order (no symlinks)."""
        return list(self._walk())

    def _files_of(self, audience: Audience) -> list[NoteFile]:
        """The audience's own folder only (no walk over everyone else's)."""
        if (self.root / audience.kind).is_symlink():
            return []
        return list(self._in_folder(self.folder(audience), audience))

    def _walk(self) -> Iterator[NoteFile]:
        for kind in ("conversation", "person"):
            base = self.root / kind
            if not base.is_dir() or base.is_symlink():
                continue
            for folder in sorted(base.iterdir()):
                audience = parse_folder(kind, folder.name)
                # Only the folder the audience itself names: a hand-made twin that
                # decodes to it would be cited by search and refused by resolve.
                if audience is None or audience.folder != f"{kind}/{folder.name}":
                    continue
                yield from self._in_folder(folder, audience)

    def _in_folder(self, folder: Path, audience: Audience) -> Iterator[NoteFile]:
        if folder.is_symlink() or not folder.is_dir():
            return
        for path in sorted(folder.glob("*.md")):
            if path.is_file() and not path.is_symlink():
                yield NoteFile(f"{NOTES_SOURCE}/{audience.folder}/{path.name}", path, audience)

    def resolve(self, path: str) -> NoteFile | None:
        """The note a display path names (it need not exist yet), or None when it is not
        a note path: ``notes/<kind>/<folder>/<name>.md`` exactly, nothing else."""
        parts = path.split("/")
        if len(parts) != 4 or parts[0] != NOTES_SOURCE or not parts[3].endswith(".md"):
            return None
        _, kind, folder, name = parts
        if name.startswith(".") or "\\" in name or "\x00" in path:
            return None
        audience = parse_folder(kind, folder)
        if audience is None or audience.folder != f"{kind}/{folder}":
            return None
        target = self.root / kind / folder / name
        if target.is_symlink() or target.parent.is_symlink():
            return None
        return NoteFile(path, target, audience)


def _matches(line: str, number: int, needle: str, cited: re.Match[str] | None) -> bool:
    if line.startswith("#") or not line.strip():
        return False
    if cited:
        first = int(cited.group(2))
        last = int(cited.group(3) or first)
        return first <= number <= last
    return needle.casefold() in line.casefold()
