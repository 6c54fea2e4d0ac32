"""Task records written before audiences, filed again under their person or group.

Before audiences a task record's scope was ``dm:<key rest>`` or ``group:<key rest>``
(the session key without ``agent:<id>:``), and its log was named by a digest of that
scope. Such a scope names no audience (``core.memory.audience.parse_scope``): only the
operator's view found those records, and their owners lost their own earlier work. Each
record is given the scope its session key names today (``gateway.audiences
.scope_for_key``) and appended to that scope's log in the same writer folder; the old
log goes once its records are all copied. Records whose scope cannot be read as a key
(``agent``, from ``transcript_scope = "agent"``) stay where they are, for the operator.

A rerun after a kill does not copy twice: records already at the end of their new log
are not appended again. Blocking throughout: call it on a worker thread.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from parley.core.files import write_atomically
from parley.core.memory.audience import parse_scope
from parley.core.memory.tasks import TaskLog, TaskRecord, parse_records, scope_file_name
from parley.gateway.audiences import UNSCOPED, scope_for_key
from parley.gateway.routing import normalise_agent_id

LEGACY_KINDS = ("dm", "group")


def new_scope(scope: str, agent_id: str, names: frozenset[str]) -> str | None:
    """The audience scope a pre-audience task scope stands for (None: it names none)."""
    if parse_scope(scope) is not None:
        return None  # already an audience
    kind, _, rest = scope.partition(":")
    if kind not in LEGACY_KINDS or not rest:
        return None
    found = scope_for_key(f"agent:{normalise_agent_id(agent_id)}:{rest}", names)
    return None if found == UNSCOPED else found


def legacy_task_logs(tasks_dir: Path, agent_id: str, names: frozenset[str]) -> list[Path]:
    """Logs holding a record that a pre-audience scope files nowhere; reads only."""
    out: list[Path] = []
    for path in TaskLog(tasks_dir).files():
        records = parse_records(path.read_text(encoding="utf-8", errors="replace"))
        if any(new_scope(r.scope, agent_id, names) for _, r in records):
            out.append(path)
    return out


def rescope_task_logs(tasks_dir: Path, agent_id: str, names: frozenset[str]) -> int:
    """File every pre-audience record under its audience; the records moved. Lines that
    are not records, and records that name no audience, stay in their log as they are."""
    moved = 0
    for path in legacy_task_logs(tasks_dir, agent_id, names):
        by_target: dict[Path, list[TaskRecord]] = {}
        kept: list[bytes] = []
        for line in path.read_bytes().splitlines(keepends=True):
            parsed = parse_records(line.decode("utf-8", errors="replace"))
            scope = new_scope(parsed[0][1].scope, agent_id, names) if parsed else None
            if scope is None:
                if line.strip():
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
                continue
            target = path.parent / scope_file_name(scope)
            record = dataclasses.replace(parsed[0][1], scope=scope)
            by_target.setdefault(target, []).append(record)
        for target, group in by_target.items():
            _append_once(target, _lines(group))
            moved += len(group)
        if kept:
            write_atomically(path, b"".join(kept))
        else:
            path.unlink()
    return moved


def _lines(records: list[TaskRecord]) -> bytes:
    return b"".join(
        (json.dumps(r.to_dict(), ensure_ascii=False) + "\n").encode("utf-8") for r in records
    )


def _append_once(target: Path, data: bytes) -> None:
    current = target.read_bytes() if target.is_file() else b""
    if current.endswith(data):
        return  # copied before a kill
    if current and not current.endswith(b"\n"):
        current += b"\n"
    write_atomically(target, current + data)
