"""What every transcript backend shares: new entries, the live window, the append API.

``LiveWindow`` keeps the live window (from the latest compaction's first kept entry to
the end) in memory and builds each new entry (its id, parent and timestamp) exactly as
a reopen would parse it; ``TranscriptBase`` answers from that window and offers the
entry payloads (``append_message``, ``append_compaction``, ``append_custom``). The file
backend (``core.transcript.file``) and the PostgreSQL one
(``gateway/storage/postgres/transcripts.py``) both build on them, so both store
byte-identical lines.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Self

from parley.core.errors import TranscriptError
from parley.core.messages import Message, Usage
from parley.core.transcript.entries import (
    ENTRY_COMPACTION,
    ENTRY_CUSTOM,
    ENTRY_MESSAGE,
    Entry,
    TranscriptHeader,
    encode_record,
    iso_timestamp,
)

TailAction = Literal["none", "truncated", "completed", "ignored"]


def _now_iso() -> str:
    return iso_timestamp(datetime.now(UTC))


def new_entry_id() -> str:
    """A fresh entry id (16 hex digits); a module function so tests can make ids fixed."""
    return secrets.token_hex(8)


def new_header(session_id: str, key: str, meta: Mapping[str, Any] | None) -> TranscriptHeader:
    """The header of a transcript created now."""
    return TranscriptHeader(session_id, key, _now_iso(), meta=dict(meta or {}))


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
            "ts": _now_iso() if ts is None else iso_timestamp(ts),
            "type": kind,
            **payload,
        }
        line = encode_record(record)
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

    def appended_since(self, count: int) -> tuple[int, list[Entry]] | None:
        """``entry_count`` and the entries on entry lines ``count`` onwards, from memory
        and without waiting (for storage or for a writer): when this object appended
        every one of them lately and knows its line count without reading storage. None
        otherwise: read them (``numbered_entries``). This base knows none."""
        return None

    def append_message(
        self,
        message: Message,
        *,
        usage: Usage | None = None,
        meta: Mapping[str, Any] | None = None,
        ts: datetime | None = None,
        tokens: Mapping[str, int] | None = None,
    ) -> Entry:
        """Append a message; ``ts`` (default: now) is for imports that keep their own times.
        ``tokens``: the message's token count by encoder (``TokenCounter.stamp``), kept so
        that a reader of the window need not count it again."""
        payload: dict[str, Any] = {"message": message.to_dict()}
        if usage is not None:
            payload["usage"] = usage.to_dict()
        if meta:
            payload["meta"] = dict(meta)
        if tokens:
            payload["tokens"] = dict(tokens)
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
