"""Task records: what a turn that used tools was asked to do, and how it went.

A turn that ran tools leaves a ``TaskRecord`` (the request, the tools and how often,
the outcome, the tool errors, when and how long). ``TaskLog`` appends records as JSON
lines, one file per memory scope (``tasks/<digest of the scope>.jsonl``, 0600): the
index keeps one scope per file, so a scope's records stay out of other scopes'
searches, and the digest keeps scopes (which are data) out of file names. The index's
``tasks`` source reads these files and makes one chunk of each record
(``task_chunks``), so ``memory_search`` finds past work like any other memory; those
chunks are derived memory, subject to forgetting.

Outcome:

- ``error``: the turn ended in an error (a ``turn_error`` entry), or its last tool
  result was an error (the work did not get past it);
- ``partial``: some tool results were errors, but the last one was not;
- ``ok``: no tool result was an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from parley.core.memory.rows import NewChunk
from parley.core.memory.sources import AGENT_SCOPE
from parley.core.messages import ToolResultBlock
from parley.core.transcript import ENTRY_CUSTOM, ENTRY_MESSAGE, Entry

log = logging.getLogger("parley.core.memory")

Outcome = Literal["ok", "error", "partial"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "partial", "error")
TURN_ERROR = "turn_error"  # the custom entry core.runner writes when a turn fails
# Clips: a record is one chunk, and a chunk should stay a few hundred tokens.
MAX_REQUEST_CHARS = 400
MAX_ERROR_CHARS = 240
MAX_ERRORS = 5
TOP_ERRORS = 5
FILE_MODE = 0o600
DIR_MODE = 0o700

_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_HEX_ID = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I)
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_QUOTED = re.compile(r"(['\"])[^'\"]{1,200}\1")


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class TaskRecord:
    request: str
    tools: dict[str, int]  # tool name -> calls, in order of first use
    outcome: Outcome
    errors: tuple[str, ...]
    started_at: datetime
    duration_seconds: float
    scope: str = AGENT_SCOPE

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "tools": dict(self.tools),
            "outcome": self.outcome,
            "errors": list(self.errors),
            "started_at": self.started_at.isoformat(),
            "duration_seconds": round(self.duration_seconds, 3),
            "scope": self.scope,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TaskRecord:
        """Raises ValueError (or KeyError/TypeError) on a record that is not one."""
        outcome = raw["outcome"]
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        started = datetime.fromisoformat(raw["started_at"])
        return cls(
            request=str(raw["request"]),
            tools={str(k): int(v) for k, v in dict(raw["tools"]).items()},
            outcome=outcome,
            errors=tuple(str(e) for e in raw.get("errors", ())),
            started_at=started if started.tzinfo else started.replace(tzinfo=UTC),
            duration_seconds=float(raw["duration_seconds"]),
            scope=str(raw.get("scope") or AGENT_SCOPE),
        )

    def as_text(self) -> str:
        """The chunk text search matches and cites."""
        tools = ", ".join(f"{name} ×{count}" for name, count in self.tools.items())
        when = self.started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        lines = [
            f"Task: {self.request}",
            f"Tools: {tools}",
            f"Outcome: {self.outcome}",
        ]
        if self.errors:
            lines.append("Errors: " + " | ".join(self.errors))
        lines.append(f"When: {when} ({self.duration_seconds:.1f} s)")
        return "\n".join(lines)


def task_record_from_turn(
    user_text: str,
    entries: Sequence[Entry],
    started_at: datetime,
    finished_at: datetime,
    *,
    scope: str = AGENT_SCOPE,
) -> TaskRecord | None:
    """The record of a turn from the entries it appended; None when it used no tools."""
    tools: Counter[str] = Counter()
    results: list[ToolResultBlock] = []
    turn_errors: list[str] = []
    for entry in entries:
        if entry.type == ENTRY_MESSAGE:
            message = entry.message
            for use in message.tool_uses:
                tools[use.name] += 1
            results += [b for b in message.content if isinstance(b, ToolResultBlock)]
        elif entry.type == ENTRY_CUSTOM and entry.custom_type == TURN_ERROR:
            data = entry.payload.get("data")
            text = data.get("message") if isinstance(data, dict) else None
            turn_errors.append(str(text or "the turn failed"))
    if not tools:
        return None
    failed = [r for r in results if r.is_error]
    if turn_errors or (results and results[-1].is_error):
        outcome: Outcome = "error"
    elif failed:
        outcome = "partial"
    else:
        outcome = "ok"
    errors = [_clip(r.content, MAX_ERROR_CHARS) for r in failed]
    errors += [_clip(t, MAX_ERROR_CHARS) for t in turn_errors]
    return TaskRecord(
        request=_clip(user_text, MAX_REQUEST_CHARS),
        tools=dict(tools),  # Counter keeps first-seen order
        outcome=outcome,
        errors=tuple(errors[-MAX_ERRORS:]),  # the last errors say where the work stopped
        started_at=started_at,
        duration_seconds=max(0.0, (finished_at - started_at).total_seconds()),
        scope=scope,
    )


def scope_file_name(scope: str) -> str:
    return hashlib.sha256(scope.encode("utf-8")).hexdigest()[:16] + ".jsonl"


class TaskLog:
    """Appends task records to ``<directory>/<digest of scope>.jsonl``. Blocking: call
    it on a worker thread.

    ``writer``: several gateway replicas share one directory (on the shared workspace
    volume), each appending under ``<directory>/<writer>/`` only, so no two processes
    ever append to one file; reads and the index take every writer's files.
    """

    def __init__(self, directory: Path, *, writer: str | None = None) -> None:
        self.directory = directory
        self.writer = writer
        self._lock = threading.Lock()

    def path_for(self, scope: str) -> Path:
        folder = self.directory / self.writer if self.writer else self.directory
        return folder / scope_file_name(scope)

    def files(self, scopes: Iterable[str] | None = None) -> list[Path]:
        """Every writer's log files (of ``scopes``, when given), in a stable order."""
        if not self.directory.is_dir():
            return []
        wanted = None if scopes is None else {scope_file_name(s) for s in scopes}
        found = [*self.directory.glob("*.jsonl"), *self.directory.glob("*/*.jsonl")]
        return sorted(
            path
            for path in found
            if path.is_file() and not path.is_symlink() and (wanted is None or path.name in wanted)
        )

    def append(self, record: TaskRecord) -> Path:
        line = (json.dumps(record.to_dict(), ensure_ascii=False) + "\n").encode("utf-8")
        path = self.path_for(record.scope)
        with self._lock:
            path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
            try:
                os.write(fd, line)  # one write of the whole line: readers never see half
            finally:
                os.close(fd)
        return path

    def records(self, scopes: Iterable[str] | None = None) -> list[TaskRecord]:
        """Every record (of ``scopes``, when given), oldest first per file."""
        out: list[TaskRecord] = []
        for path in self.files(scopes):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                continue
            out += [record for _, record in parse_records(text)]
        return out


def parse_records(text: str) -> list[tuple[int, TaskRecord]]:
    """(line number, record) of a task log; unreadable lines (a torn last line) are
    skipped."""
    found: list[tuple[int, TaskRecord]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            found.append((number, TaskRecord.from_dict(json.loads(line))))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.debug("task log line %d is not a record", number)
    return found


def task_chunks(text: str) -> tuple[list[NewChunk], str | None]:
    """One chunk per record (cited as ``tasks/<file>#L<n>``), and the file's scope
    (its first record's; None when it holds none)."""
    records = parse_records(text)
    chunks = []
    for number, record in records:
        body = record.as_text()
        digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
        chunks.append(NewChunk(number, number, body, digest, record.started_at.isoformat()))
    return chunks, (records[0][1].scope if records else None)


def normalise_error(text: str) -> str:
    """An error text with what differs between occurrences (ids, numbers, quoted
    names) stripped, so the same failure counts as one."""
    text = _UUID.sub("<id>", text)
    text = _HEX_ID.sub("<id>", text)
    text = _QUOTED.sub("<…>", text)
    text = _NUMBER.sub("<n>", text)
    return _clip(text, 120)


@dataclass(frozen=True, slots=True)
class TaskStats:
    total: int
    by_outcome: dict[str, int]
    top_errors: list[tuple[str, int]]  # (normalised error, occurrences), most first
    tools: dict[str, int] = field(default_factory=dict)  # calls per tool, most first

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_outcome": dict(self.by_outcome),
            "top_errors": [{"error": e, "count": n} for e, n in self.top_errors],
            "tools": dict(self.tools),
        }


def task_stats(records: Iterable[TaskRecord], top: int = TOP_ERRORS) -> TaskStats:
    outcomes: Counter[str] = Counter({o: 0 for o in OUTCOMES})
    errors: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    total = 0
    for record in records:
        total += 1
        outcomes[record.outcome] += 1
        errors.update(normalise_error(e) for e in record.errors)
        tools.update(record.tools)
    # Ties broken by text, so the list is the same from one call to the next.
    ranked = sorted(errors.items(), key=lambda item: (-item[1], item[0]))
    return TaskStats(
        total=total,
        by_outcome={o: outcomes[o] for o in OUTCOMES},
        top_errors=ranked[:top],
        tools=dict(sorted(tools.items(), key=lambda item: (-item[1], item[0]))),
    )


def format_task_stats(stats: TaskStats) -> str:
    """``/memory stats`` and ``parley memory stats``: a few plain lines."""
    if stats.total == 0:
        return "No task records yet (a turn that uses tools leaves one)."
    outcomes = ", ".join(f"{n} {o}" for o, n in stats.by_outcome.items())
    lines = [f"Tasks: {stats.total} ({outcomes})"]
    if stats.tools:
        lines.append("Tools: " + ", ".join(f"{t} ×{n}" for t, n in list(stats.tools.items())[:8]))
    if stats.top_errors:
        lines.append("Most frequent errors:")
        lines += [f"  {n}× {e}" for e, n in stats.top_errors]
    return "\n".join(lines)
