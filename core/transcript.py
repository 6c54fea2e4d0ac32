"""Append-only JSONL transcripts: the source of truth for a session.

Layout of ``sessions/<session-id>.jsonl``: a header line
``{"type":"session","version":1,"id","key","created","meta"}``, then one entry per line
``{"id","parent_id","ts","type", ...payload}`` where ``type`` is ``message``,
``compaction`` or ``custom`` (see ``Transcript.append_*`` for the payloads). An unknown
type is kept (written by a newer version) and ignored by the model's view.

Durability: every append is one ``os.write`` of the whole line, newline included, on an
``O_APPEND`` descriptor. Once ``write`` has returned, the line belongs to the kernel: a
SIGKILL of the process cannot lose it, only a crash of the machine can. ``fsync=True``
closes that gap too, at the price of a disk flush (milliseconds) per append, which is
why it is off by default. What can tear a line is a kill *during* a large write (the
kernel stops between pages), a full disk, or power loss; the torn last line is repaired
the next time the file is opened, and a failed append truncates its own remains.

Cost: an open ``Transcript`` keeps the live window (from the latest compaction's first
kept entry to the end) in memory and appends to it, so a turn never re-reads the file.
Opening reads the file backwards in blocks only until it has found the latest
compaction and its first kept entry; the lines before are never parsed.

What is not about files (building and checking entries, the live window, the entry
payloads) sits in ``LiveWindow`` and ``TranscriptBase``, which the PostgreSQL backend
(``gateway/pg/transcripts.py``) shares, so both store byte-identical lines.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Self

from core.errors import TranscriptError
from core.fences import read_user_message
from core.messages import Message, Usage

log = logging.getLogger("parley.core.transcript")

TRANSCRIPT_VERSION = 1
ENTRY_MESSAGE = "message"
ENTRY_COMPACTION = "compaction"
ENTRY_CUSTOM = "custom"
DEFAULT_READ_BLOCK = 64 * 1024  # backward reads at open
DEFAULT_SCAN_BLOCK = 1024 * 1024  # forward reads (entries(), newline counting)
FILE_MODE = 0o600

_ENVELOPE = ("id", "parent_id", "ts", "type")
# Pre-filters: only lines that match are parsed while looking for the live window.
_COMPACTION_RE = re.compile(rb'"type"\s*:\s*"compaction"')

TailAction = Literal["none", "truncated", "completed", "ignored"]


def _iso(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _now_iso() -> str:
    return _iso(datetime.now(UTC))


def new_entry_id() -> str:
    """A fresh entry id (16 hex digits); a module function so tests can make ids fixed."""
    return secrets.token_hex(8)


def new_header(session_id: str, key: str, meta: Mapping[str, Any] | None) -> TranscriptHeader:
    """The header of a transcript created now."""
    return TranscriptHeader(session_id, key, _now_iso(), meta=dict(meta or {}))


def encode_header(header: TranscriptHeader) -> bytes:
    """The header's line as it is stored (no newline)."""
    return _encode(header.to_dict())


def _encode(record: Mapping[str, Any]) -> bytes:
    """One JSON line (no newline); raises TranscriptError for anything JSON cannot hold."""
    try:
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (seen in platform text) is not UTF-8; \u escapes keep it.
            return json.dumps(record, separators=(",", ":"), allow_nan=False).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        raise TranscriptError(f"transcript entry cannot be serialised: {exc}") from exc


@dataclass(frozen=True)
class Entry:
    """One transcript line. ``payload`` holds every field but the envelope; treat it as
    read-only. A message entry's ``Message`` is parsed once, at construction, and read
    through ``core.fences.read_user_message``: a user's words neutralised, the gateway's
    blocks known by their fence (a legacy line's by the legacy rule)."""

    id: str
    parent_id: str | None
    ts: str
    type: str
    payload: dict[str, Any] = field(hash=False)
    _message: Message | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.type == ENTRY_MESSAGE:
            raw = self.payload.get("message")
            if not isinstance(raw, dict):
                raise TranscriptError("message entry without a message object")
            try:
                message = read_user_message(Message.from_dict(raw))
            except (KeyError, TypeError, ValueError) as exc:
                raise TranscriptError(f"unreadable message in entry {self.id}: {exc}") from exc
            object.__setattr__(self, "_message", message)
        elif self.type == ENTRY_COMPACTION:
            if not isinstance(self.payload.get("summary"), str):
                raise TranscriptError("compaction entry without a summary")
            kept = self.payload.get("first_kept_entry_id")
            if kept is not None and not isinstance(kept, str):
                raise TranscriptError("compaction entry with a bad first_kept_entry_id")

    @property
    def message(self) -> Message:
        if self._message is None:
            raise TranscriptError(f"entry {self.id} is a {self.type} entry, not a message")
        return self._message

    @property
    def usage(self) -> Usage | None:
        raw = self.payload.get("usage")
        return Usage.from_dict(raw) if isinstance(raw, dict) else None

    @property
    def meta(self) -> dict[str, Any]:
        raw = self.payload.get("meta")
        return raw if isinstance(raw, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent_id": self.parent_id,
            "ts": self.ts,
            "type": self.type,
            **self.payload,
        }

    def to_json(self) -> str:
        return _encode(self.to_dict()).decode("utf-8")

    @classmethod
    def from_json(cls, line: bytes | str) -> Entry:
        """Parse one line; raises TranscriptError when it is not a well-formed entry."""
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise TranscriptError(f"not JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise TranscriptError("entry is not a JSON object")
        entry_id, parent, ts, kind = (raw.pop(k, None) for k in _ENVELOPE)
        if not isinstance(entry_id, str) or not entry_id:
            raise TranscriptError("entry without an id")
        if parent is not None and not isinstance(parent, str):
            raise TranscriptError("entry with a bad parent_id")
        if not isinstance(ts, str) or not isinstance(kind, str) or kind == "session":
            raise TranscriptError("entry without a timestamp or type")
        return cls(entry_id, parent, ts, kind, raw)


@dataclass(frozen=True, slots=True)
class TranscriptHeader:
    id: str
    key: str
    created: str
    version: int = TRANSCRIPT_VERSION
    meta: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "session",
            "version": self.version,
            "id": self.id,
            "key": self.key,
            "created": self.created,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, line: bytes) -> TranscriptHeader:
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise TranscriptError(f"transcript header is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("type") != "session":
            raise TranscriptError("first line is not a transcript header")
        version = raw.get("version")
        if version != TRANSCRIPT_VERSION:
            raise TranscriptError(f"unsupported transcript version: {version!r}")
        sid, key, created = raw.get("id"), raw.get("key"), raw.get("created")
        if not (isinstance(sid, str) and isinstance(key, str) and isinstance(created, str)):
            raise TranscriptError("transcript header lacks id, key or created")
        meta = raw.get("meta")
        return cls(sid, key, created, version, meta if isinstance(meta, dict) else {})


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What ``Transcript.open`` found and repaired. Corrupt lines are only detected in
    the region it parsed (the live window); ``entries()`` skips any others silently."""

    torn_tail_bytes: int = 0  # bytes after the last newline
    torn_tail_action: TailAction = "none"  # "ignored": opened read-only, file untouched
    corrupt_lines: tuple[int, ...] = ()  # 1-based line numbers; the header is line 1
    missing_first_kept_id: str | None = None  # live window then starts at the compaction
    lines_parsed: int = 0
    bytes_read: int = 0

    @property
    def clean(self) -> bool:
        return (
            self.torn_tail_action == "none"
            and not self.corrupt_lines
            and self.missing_first_kept_id is None
        )


Reader = Callable[[int, int], bytes]  # (offset, size) -> exactly that many bytes


def _pread(fd: int, offset: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise TranscriptError("transcript file shrank while being read")
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _lines_backward(read: Reader, start: int, end: int, block: int) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, line) from last to first for the newline-terminated region
    [start, end), without the newlines."""
    if end <= start:
        return
    pos = end - 1  # the region's final newline; what remains is newline-separated
    pieces: list[bytes] = []  # a line longer than a block, newest piece first
    while pos > start:
        lo = max(start, pos - block)
        buf = read(lo, pos - lo)
        hi = len(buf)
        nl = buf.rfind(b"\n", 0, hi)
        while nl >= 0:
            pieces.append(buf[nl + 1 : hi])
            yield lo + nl + 1, b"".join(reversed(pieces))
            pieces.clear()
            hi = nl
            nl = buf.rfind(b"\n", 0, hi)
        pieces.append(buf[:hi])
        pos = lo
    yield start, b"".join(reversed(pieces))


def _lines_forward(read: Reader, start: int, end: int, block: int) -> Iterator[bytes]:
    """Yield the lines of [start, end), without newlines; an unterminated tail is not
    yielded."""
    carry: list[bytes] = []
    pos = start
    while pos < end:
        buf = read(pos, min(block, end - pos))
        pos += len(buf)
        lo = 0
        nl = buf.find(b"\n")
        while nl >= 0:
            carry.append(buf[lo:nl])
            yield b"".join(carry)
            carry.clear()
            lo = nl + 1
            nl = buf.find(b"\n", lo)
        if lo < len(buf):
            carry.append(buf[lo:])


def _count_newlines(read: Reader, end: int) -> int:
    count = 0
    for pos in range(0, end, DEFAULT_SCAN_BLOCK):
        count += read(pos, min(DEFAULT_SCAN_BLOCK, end - pos)).count(b"\n")
    return count


def _last_newline(read: Reader, size: int, block: int) -> int:
    """Offset of the last newline in the first ``size`` bytes, or -1."""
    pos = size
    while pos > 0:
        lo = max(0, pos - block)
        nl = read(lo, pos - lo).rfind(b"\n")
        if nl >= 0:
            return lo + nl
        pos = lo
    return -1


def parse_entry_or_none(line: bytes | str) -> Entry | None:
    """The entry on ``line``, or None for a corrupt line (which still takes its slot)."""
    try:
        return Entry.from_json(line)
    except TranscriptError:
        return None


@dataclass(frozen=True, slots=True)
class PendingAppend:
    """An entry built and checked but not yet stored: ``line`` is what gets written
    (without the newline), ``entry`` what a reopen would parse from it."""

    line: bytes
    entry: Entry
    keep_from: int | None  # a compaction's first kept live entry (index), if any


class LiveWindow:
    """The live window (from the latest compaction's first kept entry to the end) kept
    in memory, and the bookkeeping every append does to it, whatever stores the lines.
    Not locked: its owner holds its own lock around every call."""

    def __init__(self, entries: list[Entry], cycle_bytes: int = 0) -> None:
        self._entries = entries
        self._view: tuple[Entry, ...] | None = None
        self.last: Entry | None = entries[-1] if entries else None
        self.cycle_bytes = cycle_bytes  # bytes written after the latest compaction entry

    def __len__(self) -> int:
        return len(self._entries)

    def view(self) -> tuple[Entry, ...]:
        if self._view is None:
            self._view = tuple(self._entries)
        return self._view

    def prepare(
        self, kind: str, payload: dict[str, Any], *, ts: datetime | None = None
    ) -> PendingAppend:
        """Build the next entry; raises TranscriptError (nothing changed) when it cannot
        be stored."""
        keep_from: int | None = None
        if kind == ENTRY_COMPACTION:
            keep_from = self._kept_index(payload["first_kept_entry_id"])
        record = {
            "id": new_entry_id(),
            "parent_id": self.last.id if self.last else None,
            "ts": _now_iso() if ts is None else _iso(ts),
            "type": kind,
            **payload,
        }
        line = _encode(record)
        # Parse what will be stored, so memory holds exactly what a reopen would.
        return PendingAppend(line, Entry.from_json(line), keep_from)

    def commit(self, pending: PendingAppend) -> None:
        """Take in an entry once it is stored."""
        entry = pending.entry
        if pending.keep_from is not None:
            self._entries = self._entries[pending.keep_from :]
        elif entry.type == ENTRY_COMPACTION:
            self._entries = []
        self._entries.append(entry)
        self._view = None
        self.last = entry
        if entry.type == ENTRY_COMPACTION:
            self.cycle_bytes = 0
        else:
            self.cycle_bytes += len(pending.line) + 1

    def _kept_index(self, first_kept: str | None) -> int | None:
        if first_kept is None:
            return None
        for index in range(len(self._entries) - 1, -1, -1):
            if self._entries[index].id == first_kept:
                return index
        raise TranscriptError(f"first_kept_entry_id {first_kept!r} is not a live entry")


class TranscriptBase:
    """What every transcript backend shares: the entry payloads and the reading helpers
    built on ``numbered_entries``, and what answers from the live window in memory.
    Subclasses set ``_header``, ``_report``, ``_window`` and ``_lock`` and store lines
    in ``_append``."""

    _header: TranscriptHeader
    _report: LoadReport
    _window: LiveWindow
    _lock: threading.RLock

    @property
    def header(self) -> TranscriptHeader:
        return self._header

    @property
    def load_report(self) -> LoadReport:
        return self._report

    @property
    def last_entry(self) -> Entry | None:
        with self._lock:
            return self._window.last

    @property
    def cycle_bytes(self) -> int:
        """Bytes of the entries after the latest compaction (the whole transcript
        without one): what the memory flush's size trigger measures."""
        with self._lock:
            return self._window.cycle_bytes

    def live_entries(self) -> Sequence[Entry]:
        """The entries the model's view is built from; never re-reads storage."""
        with self._lock:
            return self._window.view()

    def entries(self, offset: int = 0, limit: int | None = None) -> Iterator[Entry]:
        """Every entry in file order, read from storage (for inspection and export).

        ``offset`` and ``limit`` count entry lines, like ``entry_count``, so pages line
        up with it; a corrupt line takes its slot but is not yielded.
        """
        for _, entry in self.numbered_entries(offset, limit):
            yield entry

    def numbered_entries(
        self, offset: int = 0, limit: int | None = None
    ) -> Iterator[tuple[int, Entry]]:
        raise NotImplementedError

    def append_message(
        self,
        message: Message,
        *,
        usage: Usage | None = None,
        meta: Mapping[str, Any] | None = None,
        ts: datetime | None = None,
    ) -> Entry:
        """Append a message; ``ts`` (default: now) is for imports that keep their own times."""
        payload: dict[str, Any] = {"message": message.to_dict()}
        if usage is not None:
            payload["usage"] = usage.to_dict()
        if meta:
            payload["meta"] = dict(meta)
        return self._append(ENTRY_MESSAGE, payload, ts=ts)

    def append_compaction(
        self,
        summary: str,
        *,
        first_kept_entry_id: str | None,
        tokens_before: int,
        tokens_after: int,
        trigger: str,
        details: Mapping[str, Any] | None = None,
    ) -> Entry:
        """Record a compaction. ``first_kept_entry_id`` must name a live entry (the
        window then runs from it), or be None (the window starts at this entry)."""
        payload = {
            "summary": summary,
            "first_kept_entry_id": first_kept_entry_id,
            "tokens_before": int(tokens_before),
            "tokens_after": int(tokens_after),
            "trigger": trigger,
            "details": dict(details or {}),
        }
        return self._append(ENTRY_COMPACTION, payload)

    def append_custom(self, custom_type: str, data: Mapping[str, Any]) -> Entry:
        """Record something for the runtime or inspectors; never sent to the model."""
        return self._append(ENTRY_CUSTOM, {"custom_type": custom_type, "data": dict(data)})

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _append(self, kind: str, payload: dict[str, Any], *, ts: datetime | None = None) -> Entry:
        raise NotImplementedError


class Transcript(TranscriptBase):
    """One session's transcript file, open for appending (one writer per session).

    Thread-safe: the runner calls it from worker threads. Build it with ``create`` or
    ``open``; close it with ``close`` (or use it as a context manager).
    """

    def __init__(
        self,
        fd: int,
        path: Path,
        header: TranscriptHeader,
        *,
        header_end: int,
        size: int,
        live: list[Entry],
        live_start: int,
        live_lines: int,
        report: LoadReport,
        fsync: bool,
        read_only: bool,
        cycle_bytes: int = 0,
    ) -> None:
        self._fd: int | None = fd
        self._path = path
        self._header = header
        self._header_end = header_end
        self._size = size
        self._window = LiveWindow(live, cycle_bytes)
        self._live_start = live_start  # byte offset of the live region found at open
        self._lines_since_start = live_lines  # lines from _live_start on, appends included
        self._prefix_newlines: int | None = 1 if live_start == header_end else None
        self._report = report
        self._fsync = fsync
        self._read_only = read_only
        self._lock = threading.RLock()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        session_id: str,
        key: str,
        meta: Mapping[str, Any] | None = None,
        *,
        fsync: bool = False,
    ) -> Transcript:
        """Create a new transcript (mode 0600); refuses to overwrite an existing file.

        The header is written to a scratch file first and linked into place (which
        fails if the name exists): a kill mid-way leaves no transcript without its
        header, only a scratch file, never one that poisons its session for good."""
        path = Path(path)
        header = new_header(session_id, key, meta)
        line = encode_header(header) + b"\n"
        scratch = path.with_name(f".{path.name}.{os.getpid()}.creating")
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            fd = os.open(scratch, flags, FILE_MODE)
        except OSError as exc:
            raise TranscriptError(f"cannot create transcript {path}: {exc}") from exc
        try:
            os.fchmod(fd, FILE_MODE)  # the umask may not be restrictive enough
            if os.write(fd, line) != len(line):
                raise TranscriptError(f"short write creating transcript {path}")
            if fsync:
                os.fsync(fd)
            os.link(scratch, path)
            scratch.unlink()
            if fsync:
                _fsync_dir(path.parent)
        except BaseException as exc:
            os.close(fd)
            scratch.unlink(missing_ok=True)
            if isinstance(exc, FileExistsError):
                raise TranscriptError(f"transcript already exists: {path}") from None
            if isinstance(exc, OSError):
                raise TranscriptError(f"cannot create transcript {path}: {exc}") from exc
            raise
        return cls(
            fd,
            path,
            header,
            header_end=len(line),
            size=len(line),
            live=[],
            live_start=len(line),
            live_lines=0,
            report=LoadReport(),
            fsync=fsync,
            read_only=False,
        )

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        fsync: bool = False,
        read_only: bool = False,
        block_size: int = DEFAULT_READ_BLOCK,
    ) -> Transcript:
        """Open an existing transcript, repairing a torn last line.

        ``read_only=True`` never modifies the file (for inspectors reading a transcript
        another process may be writing): a torn tail is left alone and ignored.
        """
        path = Path(path)
        flags = (os.O_RDONLY if read_only else os.O_RDWR | os.O_APPEND) | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise TranscriptError(f"transcript not found: {path}") from None
        except OSError as exc:
            raise TranscriptError(f"cannot open transcript {path}: {exc}") from exc
        try:
            return _load(fd, path, fsync=fsync, read_only=read_only, block=block_size)
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError):
                raise TranscriptError(f"cannot read transcript {path}: {exc}") from exc
            raise

    # -- reading ------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def location(self) -> str:
        """Where the transcript is stored, for messages."""
        return str(self._path)

    @property
    def closed(self) -> bool:
        return self._fd is None

    @property
    def entry_count(self) -> int:
        """Entry lines in the file (a corrupt line counts: it occupies a line)."""
        with self._lock:
            return self._lines_before_live() - 1 + self._lines_since_start

    def numbered_entries(
        self, offset: int = 0, limit: int | None = None
    ) -> Iterator[tuple[int, Entry]]:
        """``entries`` with each entry's 0-based line number among the entry lines."""
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("offset and limit must not be negative")
        with self._lock:
            self._check_open()
            end = self._size
        stop = None if limit is None else offset + limit
        lines = _lines_forward(self._read, self._header_end, end, DEFAULT_SCAN_BLOCK)
        for index, line in enumerate(lines):
            if stop is not None and index >= stop:
                return
            if index >= offset and (entry := parse_entry_or_none(line)) is not None:
                yield index, entry

    def raw_lines(self) -> Iterator[bytes]:
        """The stored lines, header first, without newlines: what an export writes. A
        torn last line a read-only open ignored is left out."""
        with self._lock:
            self._check_open()
            header_end, end = self._header_end, self._size
        yield self._read(0, header_end).removesuffix(b"\n")
        yield from _lines_forward(self._read, header_end, end, DEFAULT_SCAN_BLOCK)

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    def __repr__(self) -> str:
        return f"<Transcript {self._path} id={self._header.id} live={len(self._window)}>"

    # -- internals ----------------------------------------------------------------------

    def _append(self, kind: str, payload: dict[str, Any], *, ts: datetime | None = None) -> Entry:
        with self._lock:
            fd = self._check_open()
            if self._read_only:
                raise TranscriptError(f"transcript opened read-only: {self._path}")
            pending = self._window.prepare(kind, payload, ts=ts)
            self._write(fd, pending.line + b"\n")
            self._window.commit(pending)
            self._lines_since_start += 1
            if self._fsync:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise TranscriptError(f"entry written but not synced: {exc}") from exc
            return pending.entry

    def _write(self, fd: int, data: bytes) -> None:
        try:
            written = os.write(fd, data)
        except OSError as exc:
            self._rollback(fd)
            raise TranscriptError(f"cannot append to {self._path}: {exc}") from exc
        if written != len(data):
            # A full disk: never leave half a line for the next append to glue onto.
            self._rollback(fd)
            raise TranscriptError(f"short write appending to {self._path}")
        self._size += written

    def _rollback(self, fd: int) -> None:
        try:
            os.ftruncate(fd, self._size)
        except OSError:
            log.warning("cannot truncate %s after a failed append", self._path, exc_info=True)

    def _check_open(self) -> int:
        if self._fd is None:
            raise TranscriptError(f"transcript is closed: {self._path}")
        return self._fd

    def _read(self, offset: int, size: int) -> bytes:
        # Under the lock, so a concurrent close cannot hand the fd number to another file.
        with self._lock:
            return _pread(self._check_open(), offset, size)

    def _lines_before_live(self) -> int:
        if self._prefix_newlines is None:
            self._prefix_newlines = _count_newlines(self._read, self._live_start)
        return self._prefix_newlines


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load(fd: int, path: Path, *, fsync: bool, read_only: bool, block: int) -> Transcript:
    """Repair the tail, read the header, then find and parse the live window backwards."""
    bytes_read = 0
    parsed = 0

    def read(offset: int, size: int) -> bytes:
        nonlocal bytes_read
        bytes_read += size
        return _pread(fd, offset, size)

    def parse(line: bytes) -> Entry | None:
        nonlocal parsed
        parsed += 1
        return parse_entry_or_none(line)

    size = os.fstat(fd).st_size
    if size == 0:
        raise TranscriptError(f"transcript is empty (no header): {path}")
    end = size
    tail_bytes = 0
    action: TailAction = "none"
    if read(size - 1, 1) != b"\n":
        tail_start = _last_newline(read, size, block) + 1
        tail = read(tail_start, size - tail_start)
        tail_bytes = len(tail)
        if tail_start == 0:  # not even the header made it to disk whole
            header = _header_or_error(tail, path, torn=True)
            if read_only:
                action = "ignored"
            else:
                _append_newline(fd, path)
                action, end = "completed", size + 1
            return Transcript(
                fd,
                path,
                header,
                header_end=end,
                size=end,
                live=[],
                live_start=end,
                live_lines=0,
                report=LoadReport(tail_bytes, action, bytes_read=bytes_read),
                fsync=fsync,
                read_only=read_only,
            )
        if read_only:
            action, end = "ignored", tail_start
        elif parse(tail) is not None:  # the write completed but for its newline
            _append_newline(fd, path)
            action, end = "completed", size + 1
        else:
            os.ftruncate(fd, tail_start)
            action, end = "truncated", tail_start
        log.warning("transcript %s: torn last line (%d bytes) %s", path, tail_bytes, action)

    first = next(_lines_forward(read, 0, end, block))
    header = _header_or_error(first, path, torn=False)
    header_end = len(first) + 1

    # Walk back to the latest compaction, then on to its first kept entry.
    region: list[tuple[int, bytes]] = []  # newest first
    found: dict[int, Entry | None] = {}  # lines parsed while searching, by region index
    compaction_at: int | None = None
    kept_id: str | None = None
    kept_re: re.Pattern[bytes] | None = None
    missing: str | None = None
    for offset, line in _lines_backward(read, header_end, end, block):
        region.append((offset, line))
        if compaction_at is None:
            if _COMPACTION_RE.search(line):
                entry = found[len(region) - 1] = parse(line)
                if entry is not None and entry.type == ENTRY_COMPACTION:
                    compaction_at = len(region) - 1
                    kept_id = entry.payload.get("first_kept_entry_id")
                    if kept_id is None:
                        break
                    kept_re = re.compile(rb'"id"\s*:\s*"' + re.escape(kept_id.encode()) + rb'"')
        elif kept_re is not None and kept_re.search(line):
            entry = found[len(region) - 1] = parse(line)
            if entry is not None and entry.id == kept_id:
                break
    else:
        if kept_re is not None and compaction_at is not None:
            # The kept entry is gone (corrupt or never written): the summary still holds.
            log.warning("transcript %s: first kept entry %s not found", path, kept_id)
            missing = kept_id
            del region[compaction_at + 1 :]

    live: list[Entry] = []
    corrupt: list[int] = []  # indexes into the region, oldest first
    for index in range(len(region) - 1, -1, -1):
        entry = found[index] if index in found else parse(region[index][1])
        if entry is None:
            corrupt.append(len(region) - 1 - index)
        else:
            live.append(entry)
    live_start = region[-1][0] if region else end
    corrupt_lines: tuple[int, ...] = ()
    if corrupt:
        before = _count_newlines(read, live_start)
        corrupt_lines = tuple(before + 1 + i for i in corrupt)
        log.warning("transcript %s: skipped corrupt lines %s", path, corrupt_lines)
    report = LoadReport(tail_bytes, action, corrupt_lines, missing, parsed, bytes_read)
    if compaction_at is not None and compaction_at < len(region):
        offset, line = region[compaction_at]
        cycle_bytes = end - (offset + len(line) + 1)
    else:
        cycle_bytes = end - header_end
    return Transcript(
        fd,
        path,
        header,
        header_end=header_end,
        size=end,
        live=live,
        live_start=live_start,
        live_lines=len(region),
        report=report,
        fsync=fsync,
        read_only=read_only,
        cycle_bytes=cycle_bytes,
    )


def _header_or_error(line: bytes, path: Path, *, torn: bool) -> TranscriptHeader:
    try:
        return TranscriptHeader.from_json(line)
    except TranscriptError as exc:
        state = "torn" if torn else "unreadable"
        raise TranscriptError(f"transcript header is {state} in {path}: {exc}") from exc


def _append_newline(fd: int, path: Path) -> None:
    if os.write(fd, b"\n") != 1:
        raise TranscriptError(f"cannot complete the last line of {path}")
