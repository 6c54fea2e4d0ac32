"""Session transcripts in PostgreSQL: the JSONL file of each session as rows.

``transcripts`` holds a session's header line and its line count; ``transcript_lines``
one row per entry line, ``seq`` being the line number the entry has in the file (the
header is line 1). Lines are built by the same code as the file backend's
(``core.transcript.LiveWindow``) and stored as the exact text the file would hold, so
an export is byte-identical and ``Entry`` objects, numbering and ``cycle_bytes`` match.

Each append is one transaction (the row, then ``line_count``) committed before the
append returns: as durable as the file's write. One writer per session is the
runtime's job (a per-session lock); a second writer that slips through finds its seq
taken, and its append fails with ``TranscriptConflictError`` instead of forking the
transcript.

Like ``Transcript``, an open ``PgTranscript`` keeps the live window in memory, so a
turn never re-reads the table; opening reads the header, the latest compaction (by a
partial index) and the rows from its first kept entry on. Every method that touches
the database blocks: call them from a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from parley.core.errors import TranscriptError
from parley.core.transcript import (
    ENTRY_COMPACTION,
    Entry,
    LiveWindow,
    LoadReport,
    TranscriptBase,
    TranscriptHeader,
    encode_header,
    new_header,
    parse_entry_or_none,
)
from parley.core.transcript_store import TranscriptInfo, check_session_id
from parley.gateway.errors import StateError
from parley.gateway.storage.postgres.database import Connection, PgDatabase

T = TypeVar("T")

HEADER_SEQ = 1  # the header's line number; entry lines start after it
FIRST_ENTRY_SEQ = 2
# Rows per query when paging through a transcript (entries(), export): ~0.5 MB of
# typical lines, so a long transcript is never held in memory whole.
SCAN_BATCH = 500


class TranscriptConflictError(TranscriptError):
    """Another writer appended to this session's transcript since it was opened."""


@dataclass(frozen=True, slots=True)
class _Row:
    seq: int
    line: str


@dataclass(frozen=True, slots=True)
class _Loaded:
    header_line: str
    line_count: int
    rows: list[_Row]  # the live window, oldest first
    compaction_seq: int | None
    missing_first_kept_id: str | None


def _on_worker_thread() -> None:
    # A query on the event loop would stall every chat for a round trip; fail loudly.
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError("PostgreSQL transcript I/O on the event loop; use asyncio.to_thread")


def _call(db: PgDatabase, what: str, fn: Callable[..., T], *args: Any) -> T:
    """``db.call`` with the database's own failures as TranscriptError, as the runtime
    expects of a transcript; the StateError in the chain marks them as storage's."""
    _on_worker_thread()
    try:
        return db.call(fn, *args)
    except TranscriptError:
        raise
    except StateError as exc:
        raise TranscriptError(f"{what}: {exc}") from exc
    except (psycopg.Error, PoolTimeout) as exc:
        state = StateError(f"PostgreSQL at {db.where}: {exc}")
        state.__cause__ = exc
        raise TranscriptError(f"{what}: {exc}") from state


# -- statements (run inside PgDatabase.call's transaction) --------------------------------


def _insert_header(conn: Connection, session_id: str, header_line: str, created: str) -> bool:
    row = conn.execute(
        "INSERT INTO transcripts (session_id, header, created_at, line_count)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (session_id) DO NOTHING RETURNING session_id",
        (session_id, header_line, created, HEADER_SEQ),
    ).fetchone()
    return row is not None


def insert_line(
    conn: Connection, session_id: str, seq: int, kind: str, line: str, kept_seq: int | None
) -> None:
    """Store line ``seq`` and advance ``line_count`` past it, or raise
    TranscriptConflictError when someone else stored that line first."""
    try:
        conn.execute(
            "INSERT INTO transcript_lines (session_id, seq, kind, line, kept_seq)"
            " VALUES (%s, %s, %s, %s, %s)",
            (session_id, seq, kind, line, kept_seq),
        )
    except pg_errors.UniqueViolation:
        raise TranscriptConflictError(
            f"transcript {session_id}: line {seq} was written by another writer; this "
            "one is out of date (two writers for one session) and must reopen"
        ) from None
    except pg_errors.ForeignKeyViolation:
        raise TranscriptError(f"transcript not found: {session_id}") from None
    updated = conn.execute(
        "UPDATE transcripts SET line_count = %s WHERE session_id = %s AND line_count = %s",
        (seq, session_id, seq - 1),
    )
    if updated.rowcount != 1:  # a gap or a jump: never leave the two disagreeing
        raise TranscriptConflictError(
            f"transcript {session_id}: its line count moved under this writer"
        )


def _load(conn: Connection, session_id: str) -> _Loaded:
    head = conn.execute(
        "SELECT header, line_count FROM transcripts WHERE session_id = %s", (session_id,)
    ).fetchone()
    if head is None:
        raise TranscriptError(f"transcript not found: {session_id}")
    # Bound every read by the count read first: rows past it are a concurrent
    # writer's, committed after (the count moves in the same transaction as its row).
    line_count = int(head["line_count"])
    compaction_seq: int | None = None
    start = FIRST_ENTRY_SEQ
    missing: str | None = None
    below = line_count + 1
    while True:  # the latest compaction that parses (a corrupt one is skipped, as in files)
        row = conn.execute(
            "SELECT seq, kept_seq, line FROM transcript_lines"
            " WHERE session_id = %s AND kind = 'compaction' AND seq < %s"
            " ORDER BY seq DESC LIMIT 1",
            (session_id, below),
        ).fetchone()
        if row is None:
            break
        entry = parse_entry_or_none(row["line"])
        if entry is None or entry.type != ENTRY_COMPACTION:
            below = row["seq"]
            continue
        compaction_seq = start = int(row["seq"])
        kept_id = entry.payload.get("first_kept_entry_id")
        if kept_id is not None:
            kept = _kept_row(conn, session_id, row["kept_seq"], kept_id)
            if kept is None:  # the summary still holds; the window starts at it
                missing = kept_id
            else:
                start = kept
        break
    rows = conn.execute(
        "SELECT seq, line FROM transcript_lines"
        " WHERE session_id = %s AND seq >= %s AND seq <= %s ORDER BY seq",
        (session_id, start, line_count),
    ).fetchall()
    return _Loaded(
        head["header"],
        line_count,
        [_Row(int(r["seq"]), r["line"]) for r in rows],
        compaction_seq,
        missing,
    )


def _kept_row(conn: Connection, session_id: str, kept_seq: Any, kept_id: str) -> int | None:
    if kept_seq is None:
        return None
    row = conn.execute(
        "SELECT line FROM transcript_lines WHERE session_id = %s AND seq = %s",
        (session_id, kept_seq),
    ).fetchone()
    entry = parse_entry_or_none(row["line"]) if row is not None else None
    return int(kept_seq) if entry is not None and entry.id == kept_id else None


def _lines(conn: Connection, session_id: str, first: int, last: int) -> list[_Row]:
    rows = conn.execute(
        "SELECT seq, line FROM transcript_lines"
        " WHERE session_id = %s AND seq BETWEEN %s AND %s ORDER BY seq",
        (session_id, first, last),
    ).fetchall()
    return [_Row(int(r["seq"]), r["line"]) for r in rows]


def _line_count(conn: Connection, session_id: str) -> int | None:
    row = conn.execute(
        "SELECT line_count FROM transcripts WHERE session_id = %s", (session_id,)
    ).fetchone()
    return None if row is None else int(row["line_count"])


def _all_counts(conn: Connection) -> list[tuple[str, int]]:
    rows = conn.execute("SELECT session_id, line_count FROM transcripts ORDER BY session_id")
    return [(r["session_id"], int(r["line_count"])) for r in rows]


# -- the transcript -----------------------------------------------------------------------


class PgTranscript(TranscriptBase):
    """One session's transcript in PostgreSQL, with ``Transcript``'s API and meaning.

    Thread-safe. ``entry_count``, ``live_entries``, ``last_entry`` and ``cycle_bytes``
    answer from memory; ``entries``, ``numbered_entries`` and ``raw_lines`` query.
    """

    def __init__(
        self,
        db: PgDatabase,
        session_id: str,
        header: TranscriptHeader,
        *,
        header_line: str,
        line_count: int,
        live: list[tuple[int, Entry]],
        cycle_bytes: int,
        report: LoadReport,
        read_only: bool,
    ) -> None:
        self._db = db
        self._session_id = session_id
        self._header = header
        self._header_line = header_line
        self._line_count = line_count
        self._window = LiveWindow([entry for _, entry in live], cycle_bytes)
        # The seq of each live entry by id: a compaction records its kept entry's seq.
        self._live_seqs = {entry.id: seq for seq, entry in live}
        self._report = report
        self._read_only = read_only
        self._closed = False
        self._lock = threading.RLock()

    @classmethod
    def load(cls, db: PgDatabase, session_id: str, *, read_only: bool = False) -> PgTranscript:
        where = _location(db, session_id)
        loaded = _call(db, f"cannot read transcript {where}", _load, session_id)
        try:
            header = TranscriptHeader.from_json(loaded.header_line.encode("utf-8"))
        except TranscriptError as exc:
            raise TranscriptError(f"transcript header is unreadable in {where}: {exc}") from exc
        live: list[tuple[int, Entry]] = []
        corrupt: list[int] = []
        cycle_bytes = 0
        bytes_read = len(loaded.header_line.encode("utf-8")) + 1
        for row in loaded.rows:
            size = len(row.line.encode("utf-8")) + 1
            bytes_read += size
            if loaded.compaction_seq is None or row.seq > loaded.compaction_seq:
                cycle_bytes += size
            entry = parse_entry_or_none(row.line)
            if entry is None:
                corrupt.append(row.seq)  # seq is the file's line number
            else:
                live.append((row.seq, entry))
        report = LoadReport(
            corrupt_lines=tuple(corrupt),
            missing_first_kept_id=loaded.missing_first_kept_id,
            lines_parsed=len(loaded.rows),
            bytes_read=bytes_read,
        )
        return cls(
            db,
            session_id,
            header,
            header_line=loaded.header_line,
            line_count=loaded.line_count,
            live=live,
            cycle_bytes=cycle_bytes,
            report=report,
            read_only=read_only,
        )

    # -- reading ------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def location(self) -> str:
        return _location(self._db, self._session_id)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def entry_count(self) -> int:
        """Entry lines stored (the header is not one)."""
        with self._lock:
            return self._line_count - HEADER_SEQ

    def numbered_entries(
        self, offset: int = 0, limit: int | None = None
    ) -> Iterator[tuple[int, Entry]]:
        """``entries`` with each entry's 0-based line number among the entry lines."""
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("offset and limit must not be negative")
        with self._lock:
            self._check_open()
            last = self._line_count
        if limit is not None:
            last = min(last, offset + limit + HEADER_SEQ)
        for row in self._scan(FIRST_ENTRY_SEQ + offset, last):
            if (entry := parse_entry_or_none(row.line)) is not None:
                yield row.seq - FIRST_ENTRY_SEQ, entry

    def raw_lines(self) -> Iterator[bytes]:
        """The lines of the JSONL file, header first, without newlines."""
        with self._lock:
            self._check_open()
            last = self._line_count
        yield self._header_line.encode("utf-8")
        for row in self._scan(FIRST_ENTRY_SEQ, last):
            yield row.line.encode("utf-8")

    def is_current(self) -> bool:
        """Does the table hold no more lines than this object has seen? False once
        another replica has appended to the session (reopen to read its entries)."""
        with self._lock:
            count = _call(
                self._db, f"cannot read transcript {self.location}", _line_count, self._session_id
            )
            return count == self._line_count

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        # Nothing to release: connections go back to the pool after every statement.
        with self._lock:
            self._closed = True

    def __repr__(self) -> str:
        return f"<PgTranscript {self.location} live={len(self._window)}>"

    # -- internals ----------------------------------------------------------------------

    def _append(self, kind: str, payload: dict[str, Any], *, ts: datetime | None = None) -> Entry:
        with self._lock:
            self._check_open()
            if self._read_only:
                raise TranscriptError(f"transcript opened read-only: {self.location}")
            pending = self._window.prepare(kind, payload, ts=ts)
            seq = self._line_count + 1
            kept_seq = None
            if pending.keep_from is not None:
                kept_seq = self._live_seqs[payload["first_kept_entry_id"]]
            _call(
                self._db,
                f"cannot append to {self.location}",
                insert_line,
                self._session_id,
                seq,
                kind,
                # _encode's bytes are UTF-8 (or ASCII): the text decodes back to them.
                pending.line.decode("utf-8"),
                kept_seq,
            )
            self._window.commit(pending)
            self._line_count = seq
            if kind == ENTRY_COMPACTION:  # the window shrank: forget what left it
                kept = {entry.id for entry in self._window.view()}
                self._live_seqs = {i: s for i, s in self._live_seqs.items() if i in kept}
            self._live_seqs[pending.entry.id] = seq
            return pending.entry

    def _scan(self, first: int, last: int) -> Iterator[_Row]:
        """Rows ``first..last`` in batches; a close meanwhile stops the scan with an error."""
        while first <= last:
            upto = min(last, first + SCAN_BATCH - 1)
            with self._lock:
                self._check_open()
            rows = _call(
                self._db,
                f"cannot read transcript {self.location}",
                _lines,
                self._session_id,
                first,
                upto,
            )
            yield from rows
            first = upto + 1

    def _check_open(self) -> None:
        if self._closed:
            raise TranscriptError(f"transcript is closed: {self.location}")


# -- the store ----------------------------------------------------------------------------


def _location(db: PgDatabase, session_id: str) -> str:
    return f"{db.where}#transcripts/{session_id}"


class PgTranscriptStore:
    """Every session's transcript in the shared PostgreSQL (a ``TranscriptStore``)."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db

    def location(self, session_id: str) -> str:
        return _location(self.db, check_session_id(session_id))

    def create(
        self, session_id: str, key: str, meta: Mapping[str, Any] | None = None
    ) -> PgTranscript:
        where = self.location(session_id)
        header = new_header(session_id, key, meta)
        line = encode_header(header).decode("utf-8")
        created = _call(
            self.db,
            f"cannot create transcript {where}",
            _insert_header,
            session_id,
            line,
            header.created,
        )
        if not created:
            raise TranscriptError(f"transcript already exists: {where}")
        return PgTranscript(
            self.db,
            session_id,
            header,
            header_line=line,
            line_count=HEADER_SEQ,
            live=[],
            cycle_bytes=0,
            report=LoadReport(),
            read_only=False,
        )

    def open(self, session_id: str, *, read_only: bool = False) -> PgTranscript:
        return PgTranscript.load(self.db, check_session_id(session_id), read_only=read_only)

    def exists(self, session_id: str) -> bool:
        return self.info(session_id) is not None

    def info(self, session_id: str) -> TranscriptInfo | None:
        where = self.location(session_id)
        count = _call(self.db, f"cannot read transcript {where}", _line_count, session_id)
        return None if count is None else TranscriptInfo(session_id, (count,), where)

    def list_transcripts(self) -> list[TranscriptInfo]:
        counts = _call(self.db, f"cannot list transcripts in {self.db.where}", _all_counts)
        return [TranscriptInfo(sid, (count,), _location(self.db, sid)) for sid, count in counts]

    def sizes(self, session_ids: list[str]) -> dict[str, int]:
        """Bytes each of these transcripts holds (its header and lines, as the file
        would); a session without one is left out."""
        return _call(self.db, f"cannot size transcripts in {self.db.where}", _sizes, session_ids)

    def delete(self, session_ids: list[str]) -> int:
        """Delete these transcripts (their lines go with them); how many there were."""
        return _call(self.db, f"cannot delete transcripts in {self.db.where}", _delete, session_ids)

    def __repr__(self) -> str:
        return f"<PgTranscriptStore {self.db.where}>"


def _sizes(conn: Connection, session_ids: list[str]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT t.session_id, octet_length(t.header) + 1"
        " + COALESCE((SELECT sum(octet_length(l.line) + 1) FROM transcript_lines l"
        " WHERE l.session_id = t.session_id), 0) AS size"
        " FROM transcripts t WHERE t.session_id = ANY(%s)",
        (session_ids,),
    ).fetchall()
    return {r["session_id"]: int(r["size"]) for r in rows}


def _delete(conn: Connection, session_ids: list[str]) -> int:
    # transcript_lines go with them (ON DELETE CASCADE).
    cursor = conn.execute("DELETE FROM transcripts WHERE session_id = ANY(%s)", (session_ids,))
    return int(cursor.rowcount)
