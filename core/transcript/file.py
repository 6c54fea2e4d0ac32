"""The transcript file: ``sessions/<session-id>.jsonl``, appended to and read back.

The header line, then one entry line per append, in the format of
``core.transcript.entries`` (see ``Transcript.append_*`` for the payloads).

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
compaction and its first kept entry; the lines before are never parsed. A page of
``entries(offset, limit)`` starts from a sparse index of line offsets
(``core.transcript.line_index``), built by the first page past what it knows and kept
up by every append, so the last page of a long file costs what the first one does.

What is not about files (building and checking entries, the live window, the entry
payloads) sits in ``core.transcript.base``, which the PostgreSQL backend shares, so
both store byte-identical lines.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from parley.core.errors import TranscriptError
from parley.core.transcript.base import (
    LiveWindow,
    LoadReport,
    TailAction,
    TranscriptBase,
    new_header,
)
from parley.core.transcript.entries import (
    ENTRY_COMPACTION,
    Entry,
    TranscriptHeader,
    encode_header,
    parse_entries_or_none,
    parse_entry_or_none,
)
from parley.core.transcript.line_index import STRIDE, LineIndex, scan

log = logging.getLogger("parley.core.transcript")

DEFAULT_READ_BLOCK = 64 * 1024  # backward reads at open
DEFAULT_SCAN_BLOCK = 1024 * 1024  # forward reads (entries(), newline counting)
PAGE_READ_BLOCK = 64 * 1024  # forward reads of a page: a few dozen lines, not a megabyte
# Appended entries kept for ``appended_since``: a turn writes a few (a tool loop more).
APPENDS_KEPT = 64
INDEX_STRIDE = STRIDE  # entry lines between two marks of the line index
FILE_MODE = 0o600

# Pre-filters: only lines that match are parsed while looking for the live window.
_COMPACTION_RE = re.compile(rb'"type"\s*:\s*"compaction"')


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
        # The newest entries this object appended: the file's last lines (``appended_since``).
        self._appended: deque[Entry] = deque(maxlen=APPENDS_KEPT)
        self._prefix_newlines: int | None = 1 if live_start == header_end else None
        # Where entry lines start, for pages past the first (built on the first such page).
        self._index = LineIndex(header_end, INDEX_STRIDE)
        self._report = report
        self._fsync = fsync
        self._read_only = read_only
        self._lock = threading.RLock()
        # (device, inode, size, mtime) of the file when ``suspend`` let go of it.
        self._suspended_at: tuple[int, int, int, int] | None = None

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
        first, start = self._seek(offset, end)
        stop = None if limit is None else offset + limit
        block = DEFAULT_SCAN_BLOCK if limit is None or limit > 1000 else PAGE_READ_BLOCK
        for index, line in enumerate(_lines_forward(self._read, start, end, block), first):
            if stop is not None and index >= stop:
                return
            if index >= offset and (entry := parse_entry_or_none(line)) is not None:
                yield index, entry

    def appended_since(self, count: int) -> tuple[int, list[Entry]] | None:
        # Not waiting for the lock: a worker thread may hold it through a write and its
        # fsync, or through counting the lines before the window.
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._prefix_newlines is None:
                return None  # counting the lines before the window reads the file
            total = self._prefix_newlines - 1 + self._lines_since_start
            wanted = total - count
            if wanted < 0 or wanted > len(self._appended):
                return None  # lines it does not have, or did not append lately
            # The kept appends are the file's last lines, one after another.
            start = len(self._appended) - wanted
            return total, list(itertools.islice(self._appended, start, None))
        finally:
            self._lock.release()

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
            self._suspended_at = None
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    @property
    def live_bytes(self) -> int:
        """Bytes of the file from where the live window started when it was opened (a
        compaction since then dropped the entries before its kept ones from memory, not
        from this count). Parsed, the window takes several times this in memory."""
        with self._lock:
            return self._size - self._live_start

    def suspend(self) -> None:
        """Let go of the file but keep the live window (closed until ``resume``). A
        gateway keeps more sessions warm than it keeps files open: picking a session up
        again then reads nothing, where a reopen parses its whole live window again (and
        every message's token count with it), a cost that grows with the session."""
        with self._lock:
            if self._fd is None:
                return
            stat = os.fstat(self._fd)
            self._suspended_at = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            fd, self._fd = self._fd, None
            os.close(fd)

    def resume(self) -> bool:
        """Take the file up again after ``suspend``. False, and still closed, when it
        is not exactly as it was left (another writer appended, it was rewritten or
        removed): then it must be opened afresh."""
        with self._lock:
            if self._fd is not None:
                return True
            left = self._suspended_at
            if left is None:
                return False
            flags = (os.O_RDONLY if self._read_only else os.O_RDWR | os.O_APPEND) | os.O_CLOEXEC
            try:
                fd = os.open(self._path, flags)
            except OSError:
                return False
            try:
                stat = os.fstat(fd)
            except OSError:
                os.close(fd)
                return False
            now = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if now != left:  # the size in it is ``_size``: nothing appends while suspended
                os.close(fd)
                return False
            self._fd, self._suspended_at = fd, None
            return True

    def __repr__(self) -> str:
        return f"<Transcript {self._path} id={self._header.id} live={len(self._window)}>"

    # -- internals ----------------------------------------------------------------------

    def _append(self, kind: str, payload: dict[str, Any], *, ts: datetime | None = None) -> Entry:
        with self._lock:
            fd = self._check_open()
            if self._read_only:
                raise TranscriptError(f"transcript opened read-only: {self._path}")
            pending = self._window.prepare(kind, payload, ts=ts)
            start = self._size
            self._write(fd, pending.line + b"\n")
            self._window.commit(pending)
            self._index.note(start, self._size - start)
            self._appended.append(pending.entry)
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

    def _seek(self, line: int, end: int) -> tuple[int, int]:
        """The (line number, byte offset) nearest at or before entry line ``line`` that
        the index knows, extending it first when ``line`` lies beyond it.

        The extension runs to ``end``, not only to ``line``: the index then reaches the
        end of the file, and every later append keeps it there without another scan.
        It reads outside the lock (``_read`` takes it per block), so appends go on
        meanwhile; the next page past them finds those lines."""
        with self._lock:
            if line <= self._index.lines or self._index.end >= end:
                return self._index.seek(line)
            frontier = self._index.frontier
        found = scan(self._read, frontier, self._index.stride, end, None, DEFAULT_SCAN_BLOCK)
        with self._lock:
            # Refused when another reader's scan got there first: its index serves.
            self._index.extend(found)
            return self._index.seek(line)

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
    unparsed = [i for i in range(len(region) - 1, -1, -1) if i not in found]
    parsed += len(unparsed)
    # One parse for the whole window (parse_entries_or_none: shared key strings).
    fresh = parse_entries_or_none([region[i][1] for i in unparsed])
    found.update(zip(unparsed, fresh, strict=True))
    for index in range(len(region) - 1, -1, -1):
        entry = found[index]
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
