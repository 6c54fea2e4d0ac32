"""Where session transcripts live: the seam between the runtime and its storage.

The gateway creates, opens, lists and exports transcripts through a
``TranscriptStore``. ``FileTranscriptStore`` is today's ``sessions/<id>.jsonl`` files;
the PostgreSQL store (``gateway/storage/postgres/transcripts.py``) keeps the same lines
as rows. Both hand out objects with ``Transcript``'s API (``SessionTranscript``), so nothing above
them knows which it holds, and an export writes the same bytes from either.

Every method here does blocking I/O: call them from a worker thread
(``asyncio.to_thread``), as the runtime already does for ``Transcript``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol, Self

from parley.core.errors import TranscriptError
from parley.core.files import atomic_file
from parley.core.messages import Message, Usage
from parley.core.transcript import FILE_MODE, Entry, LoadReport, Transcript, TranscriptHeader

# What may name a transcript: the registry's hex ids and the LoCoMo bench's
# "conv-26-s01". Nothing that could climb out of the sessions directory.
_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_SUFFIX = ".jsonl"


def check_session_id(session_id: str) -> str:
    """``session_id`` if it can name a transcript; TranscriptError otherwise."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise TranscriptError(f"not a session id: {session_id!r}")
    return session_id


class SessionTranscript(Protocol):
    """One open session transcript, whichever backend holds it (see ``Transcript``
    for the meaning of each member). Thread-safe; one writer per session."""

    @property
    def header(self) -> TranscriptHeader: ...
    @property
    def location(self) -> str: ...
    @property
    def load_report(self) -> LoadReport: ...
    @property
    def last_entry(self) -> Entry | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def entry_count(self) -> int: ...
    @property
    def cycle_bytes(self) -> int: ...

    def live_entries(self) -> Sequence[Entry]: ...
    def entries(self, offset: int = 0, limit: int | None = None) -> Iterator[Entry]: ...
    def numbered_entries(
        self, offset: int = 0, limit: int | None = None
    ) -> Iterator[tuple[int, Entry]]: ...
    def appended_since(self, count: int) -> tuple[int, list[Entry]] | None: ...
    def raw_lines(self) -> Iterator[bytes]: ...
    def append_message(
        self,
        message: Message,
        *,
        usage: Usage | None = None,
        meta: Mapping[str, Any] | None = None,
        ts: datetime | None = None,
        tokens: Mapping[str, int] | None = None,
    ) -> Entry: ...
    def append_compaction(
        self,
        summary: str,
        *,
        first_kept_entry_id: str | None,
        tokens_before: int,
        tokens_after: int,
        trigger: str,
        details: Mapping[str, Any] | None = None,
    ) -> Entry: ...
    def append_custom(self, custom_type: str, data: Mapping[str, Any]) -> Entry: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc_info: object) -> None: ...


@dataclass(frozen=True, slots=True)
class TranscriptInfo:
    session_id: str
    # Changes whenever the transcript does; for caches of read-only opens. A file's
    # (size, mtime_ns); a table's line count (its rows are only ever appended).
    stamp: tuple[int, ...]
    location: str


class TranscriptStore(Protocol):
    """Creates, opens and finds session transcripts. Raises TranscriptError for a
    transcript that is missing, already exists, or cannot be read or written."""

    def location(self, session_id: str) -> str:
        """Where the session's transcript is (or would be) kept, for messages."""
        ...

    def create(
        self, session_id: str, key: str, meta: Mapping[str, Any] | None = None
    ) -> SessionTranscript:
        """A new, empty transcript open for appending; refuses an existing one."""
        ...

    def open(self, session_id: str, *, read_only: bool = False) -> SessionTranscript:
        """An existing transcript. ``read_only=True`` changes nothing in storage (for
        inspectors, while the owner may be writing) and refuses appends."""
        ...

    def exists(self, session_id: str) -> bool: ...

    def info(self, session_id: str) -> TranscriptInfo | None:
        """The transcript's stamp, or None when there is none."""
        ...

    def list_transcripts(self) -> list[TranscriptInfo]:
        """Every transcript, archived sessions' too, ordered by session id."""
        ...


class FileTranscriptStore:
    """Transcripts as ``<sessions_dir>/<session_id>.jsonl`` (see core/transcript.py)."""

    def __init__(self, sessions_dir: Path, *, fsync: bool = False) -> None:
        self.sessions_dir = sessions_dir
        self.fsync = fsync

    def path(self, session_id: str) -> Path:
        return self.sessions_dir / f"{check_session_id(session_id)}{_SUFFIX}"

    def location(self, session_id: str) -> str:
        return str(self.path(session_id))

    def create(
        self, session_id: str, key: str, meta: Mapping[str, Any] | None = None
    ) -> Transcript:
        return Transcript.create(self.path(session_id), session_id, key, meta, fsync=self.fsync)

    def open(self, session_id: str, *, read_only: bool = False) -> Transcript:
        return Transcript.open(self.path(session_id), fsync=self.fsync, read_only=read_only)

    def exists(self, session_id: str) -> bool:
        return self.path(session_id).exists()

    def info(self, session_id: str) -> TranscriptInfo | None:
        path = self.path(session_id)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        return TranscriptInfo(session_id, (stat.st_size, stat.st_mtime_ns), str(path))

    def list_transcripts(self) -> list[TranscriptInfo]:
        if not self.sessions_dir.is_dir():
            return []
        found = []
        for path in sorted(self.sessions_dir.glob(f"*{_SUFFIX}")):
            # As the memory source does: a symlink could point anywhere.
            if path.is_symlink() or not _SESSION_ID.fullmatch(path.stem):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed since the listing
                continue
            if path.is_file():
                found.append(TranscriptInfo(path.stem, (stat.st_size, stat.st_mtime_ns), str(path)))
        return found

    def __repr__(self) -> str:
        return f"<FileTranscriptStore {self.sessions_dir}>"


# -- export ---------------------------------------------------------------------------


def write_jsonl(transcript: SessionTranscript, out: BinaryIO) -> int:
    """Write the transcript as its JSONL file (header first, a newline after every
    line) to ``out``; returns the bytes written. Either backend writes the same bytes
    for the same appends."""
    written = 0
    for line in transcript.raw_lines():
        out.write(line)
        out.write(b"\n")
        written += len(line) + 1
    return written


def write_jsonl_file(transcript: SessionTranscript, target: Path) -> int:
    """``write_jsonl`` into the file ``target`` (mode 0600), replacing it atomically: a
    failed export leaves no half-written file behind."""
    with atomic_file(target, FILE_MODE) as out:
        written = write_jsonl(transcript, out)
    return written


def export_transcript(store: TranscriptStore, session_id: str, target: Path) -> int:
    """Write the session's JSONL file to ``target`` from either store. It opens the
    transcript read-only, so a live session may go on meanwhile: the export holds what
    was stored when it was opened, never part of a line."""
    with store.open(session_id, read_only=True) as transcript:
        return write_jsonl_file(transcript, target)
