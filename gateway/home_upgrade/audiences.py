"""Upgrade a home written before audiences: private memory out of the agent-wide places.

Before audiences (commit 77c24f2) two kinds of private memory sat where everyone could
reach them:

- Memory flushes appended a block to ``<workspace>/memory/YYYY-MM-DD.md``::

      \\n## HH:MM — saved before compaction (<session key>)\\n\\n<notes>\\n

  Those files are the ``agent`` audience: every conversation's search found one
  person's notes. Each block is re-attributed from the session key in its heading
  (``gateway.audiences.scope_for_key``) and appended to that audience's private notes
  file of the same date (``core.memory.notes.NoteStore``, heading without the key, as
  flushes write it today), then removed from the workspace file; a file left with
  nothing but blank lines is deleted, operator-written text around the blocks stays.
  A key made while linked (its peer is an identity-links name) is that person's.
  A block runs from its heading to the next flush heading or the end of the file (the
  model's notes may hold headings of their own, so no other line can end it).
  A block without a key, or with a key that names no conversation, cannot be
  attributed: it stays agent-wide and is listed for the operator to judge.
- With PostgreSQL, task records lived under ``<workspace>/.parley/tasks/<writer>/``,
  where ``read_file`` could read them. They move to ``gateway.memory.tasks_dir`` with
  the same relative layout (a log already there for the same scope is merged, the older
  records first), and the emptied folders go.
- Task records everywhere (SQLite kept them beside memory.db already) were filed under
  ``dm:…``/``group:…`` scopes, which name no audience:
  ``gateway.home_upgrade.task_scopes`` files them again under the person or group their
  session key names.

``survey_audiences`` reads and changes nothing (``parley doctor``, and the gateway's
start, which logs a warning naming ``parley doctor --fix``). ``migrate_audiences``
(``parley doctor --fix``, gateway stopped) backs the home up first with the doctor's
hash-checked backup (``gateway.home_upgrade.state.backup``), then moves, then syncs the
memory index so the agent-wide chunks of the moved blocks go and the notes are indexed.

Crash safety: each block is appended to its notes file before the workspace file is
rewritten (atomically), and an append is skipped when the notes file already holds
that exact block, so a rerun after a kill finishes the job without duplicating a note.
A task log is merged by a rename over its target, and a rerun that finds the merged
target already starting with the legacy log only removes the legacy one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

from parley.core.files import write_atomically
from parley.core.memory.audience import Audience, parse_scope
from parley.core.memory.notes import MAX_NOTE_CHARS, NoteStore
from parley.gateway.audiences import PersonLinks, scope_for_key
from parley.gateway.config import LoadedConfig
from parley.gateway.home_upgrade.task_scopes import legacy_task_logs as scoped_before_audiences
from parley.gateway.home_upgrade.task_scopes import rescope_task_logs
from parley.gateway.memory import LEGACY_SHARED_TASKS_DIR, notes_dir, tasks_dir

# The logger keeps the name it had before the module moved: log filters may name it.
log = logging.getLogger("parley.gateway.audience_migration")

MEMORY_DIR_NAME = "memory"
# The heading every pre-audience flush wrote (core/flush.py before 77c24f2).
FLUSH_HEADING = re.compile(r"^## (\d{2}):(\d{2}) — saved before compaction(?: \((.*)\))?[ \t]*$")
_DATED = re.compile(r"^(\d{4})-(\d{2})-(\d{2})\.md$")
# Blocks and files named in one line of output; the rest are counted.
LISTED = 5
FILE_MODE = 0o600
DIR_MODE = 0o700

Severity = Literal["ok", "warning", "error"]
MOVES = (
    "moves them out: each flush block to the private notes of its person or conversation, "
    "the task logs to the private task folder, their records under their audience"
)


@dataclass(frozen=True, slots=True)
class FlushBlock:
    """One flush block of a workspace memory file (lines ``[start, end)``)."""

    path: Path
    display: str  # memory/2026-03-01.md
    start: int
    end: int
    time: str  # HH:MM
    key: str | None
    text: str  # the notes, stripped
    audience: Audience | None  # None: cannot be attributed

    @property
    def where(self) -> str:
        return f"{self.display} line {self.start + 1} ({self.time})"

    @property
    def why_not(self) -> str:
        if self.key is None:
            return "its heading names no session"
        return f"{self.key[:80]!r} is not a session key"


@dataclass(frozen=True, slots=True)
class AudienceSurvey:
    workspace: Path
    blocks: tuple[FlushBlock, ...] = ()  # attributable: --fix moves them
    stranded: tuple[FlushBlock, ...] = ()  # no audience: they stay agent-wide
    task_logs: tuple[Path, ...] = ()  # under the workspace's .parley/tasks
    # In the private task folder, holding records filed under pre-audience scopes.
    rescopable: tuple[Path, ...] = ()

    @property
    def pending(self) -> bool:
        return bool(self.blocks or self.task_logs or self.rescopable)

    def block_files(self) -> list[Path]:
        return sorted({block.path for block in self.blocks})


@dataclass
class AudienceMigrationReport:
    backup: Path | None = None
    moved: list[FlushBlock] = field(default_factory=list)
    stranded: list[FlushBlock] = field(default_factory=list)
    task_logs: list[str] = field(default_factory=list)  # relative paths moved
    records_rescoped: int = 0  # task records filed again under their audience
    files_removed: list[str] = field(default_factory=list)  # emptied workspace files
    synced: str | None = None  # what the index sync did, or why it did not run
    errors: list[str] = field(default_factory=list)


# -- reading (no writes) -------------------------------------------------------------------


def memory_dir(loaded: LoadedConfig) -> Path:
    return loaded.workspace / MEMORY_DIR_NAME


def legacy_tasks_dir(loaded: LoadedConfig) -> Path:
    return loaded.workspace / LEGACY_SHARED_TASKS_DIR


def link_names(loaded: LoadedConfig) -> frozenset[str]:
    return PersonLinks(loaded.config.session).names


def flush_blocks(path: Path, display: str, names: frozenset[str] = frozenset()) -> list[FlushBlock]:
    """The flush blocks of one workspace memory file, in file order."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return []
    return blocks_in(text.splitlines(keepends=True), path, display, names)


def blocks_in(
    lines: list[str], path: Path, display: str, names: frozenset[str] = frozenset()
) -> list[FlushBlock]:
    headings = [(n, m) for n, line in enumerate(lines) if (m := FLUSH_HEADING.match(line))]
    blocks: list[FlushBlock] = []
    starts = [_block_start(lines, n) for n, _ in headings]
    for i, (heading, match) in enumerate(headings):
        end = starts[i + 1] if i + 1 < len(headings) else len(lines)
        key = match.group(3)
        key = key.strip() if key is not None else None
        audience = parse_scope(scope_for_key(key, names)) if key else None
        if audience is not None and audience.kind == "agent":
            audience = None
        blocks.append(
            FlushBlock(
                path=path,
                display=display,
                start=starts[i],
                end=end,
                time=f"{match.group(1)}:{match.group(2)}",
                key=key or None,
                text="".join(lines[heading + 1 : end]).strip(),
                audience=audience,
            )
        )
    return blocks


def _block_start(lines: list[str], heading: int) -> int:
    """A flush wrote one blank line before its heading: it belongs to the block."""
    if heading > 0 and not lines[heading - 1].strip():
        return heading - 1
    return heading


def workspace_flush_blocks(loaded: LoadedConfig) -> list[FlushBlock]:
    """Every flush block of ``<workspace>/memory/*.md`` (flushes wrote only there)."""
    folder = memory_dir(loaded)
    if not folder.is_dir() or folder.is_symlink():
        return []
    names = link_names(loaded)
    found: list[FlushBlock] = []
    for path in sorted(folder.glob("*.md")):
        if path.is_file() and not path.is_symlink():
            found += flush_blocks(path, f"{MEMORY_DIR_NAME}/{path.name}", names)
    return found


def legacy_task_logs(loaded: LoadedConfig) -> list[Path]:
    root = legacy_tasks_dir(loaded)
    if not root.is_dir() or root.is_symlink():
        return []
    return sorted(p for p in root.rglob("*.jsonl") if p.is_file() and not p.is_symlink())


def survey_audiences(loaded: LoadedConfig) -> AudienceSurvey:
    """What awaits migration; reads only (blocking)."""
    blocks = workspace_flush_blocks(loaded)
    return AudienceSurvey(
        loaded.workspace,
        tuple(b for b in blocks if b.audience is not None),
        tuple(b for b in blocks if b.audience is None),
        tuple(legacy_task_logs(loaded)),
        tuple(
            scoped_before_audiences(tasks_dir(loaded), loaded.config.agent.id, link_names(loaded))
        ),
    )


# -- what doctor and the gateway say --------------------------------------------------------


def describe_pending(found: AudienceSurvey) -> str:
    parts: list[str] = []
    if found.blocks:
        by = Counter(b.audience.label for b in found.blocks if b.audience is not None)
        whose = ", ".join(f"{label}: {n}" for label, n in sorted(by.items()))
        parts.append(
            f"{len(found.blocks)} flush block(s) in {len(found.block_files())} file(s) under "
            f"{memory_dir_of(found)} are agent-wide, so every conversation can find them "
            f"({whose})"
        )
    if found.task_logs:
        parts.append(
            f"{len(found.task_logs)} task log(s) under {found.workspace / LEGACY_SHARED_TASKS_DIR}"
            " are in the workspace, where the file tools can read them"
        )
    if found.rescopable:
        parts.append(
            f"{len(found.rescopable)} task log(s) hold records filed before audiences, which "
            "no conversation can find (not even their own)"
        )
    return "; ".join(parts)


def describe_stranded(stranded: Iterable[FlushBlock]) -> str:
    items = list(stranded)
    listed = [f"{b.where}: {b.why_not}" for b in items[:LISTED]]
    more = f" (+{len(items) - LISTED} more)" if len(items) > LISTED else ""
    return (
        f"{len(items)} flush block(s) cannot be attributed to a person or conversation and "
        f"stay agent-wide: {'; '.join(listed)}{more}. Read them and move or delete them yourself"
    )


def memory_dir_of(found: AudienceSurvey) -> Path:
    return found.workspace / MEMORY_DIR_NAME


def log_legacy_memory(loaded: LoadedConfig) -> None:
    """At the gateway's start: warn about memory from before audiences, and about the
    setting that no longer does anything. Reads only; never raises (blocking)."""
    if loaded.config.memory.transcript_scope == "agent":
        log.warning(
            '[memory] transcript_scope = "agent" is no longer honoured: direct chats\' '
            'transcripts belong to their person; use dm_scope = "main" to share one '
            "person's chats across devices"
        )
    try:
        found = survey_audiences(loaded)
    except OSError as exc:
        log.warning("cannot look for memory from before audiences: %s", exc)
        return
    if found.pending:
        log.warning(
            "memory from before audiences: %s. `parley doctor --fix` (gateway stopped) backs "
            "up the home and %s",
            describe_pending(found),
            MOVES,
        )
    if found.stranded:
        log.warning("%s", describe_stranded(found.stranded))


async def audience_check(
    loaded: LoadedConfig, *, fix: bool, sync: bool = True
) -> list[tuple[Severity, str]]:
    """``parley doctor``'s findings (severity, detail); with ``fix``, migrate first.
    ``sync=False``: the memory index is not current (the migration check says why)."""
    if not fix:
        found = await asyncio.to_thread(survey_audiences, loaded)
        out: list[tuple[Severity, str]] = []
        if found.pending:
            out.append(
                (
                    "warning",
                    f"{describe_pending(found)}. `parley doctor --fix` backs up the home and "
                    f"{MOVES} (stop the gateway first)",
                )
            )
        if found.stranded:
            out.append(("warning", describe_stranded(found.stranded)))
        return out or [("ok", "no agent-wide flush notes or workspace task logs to migrate")]
    report = await migrate_audiences(loaded, sync=sync)
    return report_findings(report)


def report_findings(report: AudienceMigrationReport) -> list[tuple[Severity, str]]:
    out: list[tuple[Severity, str]] = [("error", error) for error in report.errors]
    done: list[str] = []
    if report.moved:
        by = Counter(b.audience.label for b in report.moved if b.audience is not None)
        whose = ", ".join(f"{label}: {n}" for label, n in sorted(by.items()))
        done.append(f"moved {len(report.moved)} flush block(s) to private notes ({whose})")
    if report.files_removed:
        done.append(f"removed emptied {', '.join(report.files_removed)}")
    if report.task_logs:
        done.append(f"moved {len(report.task_logs)} task log(s) out of the workspace")
    if report.records_rescoped:
        done.append(f"filed {report.records_rescoped} task record(s) under their audience")
    if done:
        where = f"backed up to {report.backup}; " if report.backup else ""
        synced = f"; index: {report.synced}" if report.synced else ""
        severity: Severity = "error" if report.errors else "ok"
        out.append((severity, where + "; ".join(done) + synced))
    if report.stranded:
        out.append(("warning", describe_stranded(report.stranded)))
    if not out:
        out.append(("ok", "no agent-wide flush notes or workspace task logs to migrate"))
    return out


# -- migrating ---------------------------------------------------------------------------


async def migrate_audiences(
    loaded: LoadedConfig, *, sync: bool = True, now: datetime | None = None
) -> AudienceMigrationReport:
    """Back up, move the flush blocks and task logs, sync the index. Nothing pending:
    nothing is written (no backup either)."""
    from parley.gateway.home_upgrade.state import StateMigrationError, backup

    found = await asyncio.to_thread(survey_audiences, loaded)
    report = AudienceMigrationReport(stranded=list(found.stranded))
    if not found.pending:
        return report
    outside = tuple(
        path
        for path in (*found.block_files(), *found.task_logs, *found.rescopable)
        if not path.absolute().is_relative_to(loaded.home.absolute())
    )
    try:
        report.backup = await asyncio.to_thread(backup, loaded.home, outside, now)
    except StateMigrationError as exc:
        report.errors.append(str(exc))
        return report
    try:
        await asyncio.to_thread(_move_blocks, loaded, found, report)
        await asyncio.to_thread(_move_task_logs, loaded, found, report)
        report.records_rescoped = await asyncio.to_thread(
            rescope_task_logs, tasks_dir(loaded), loaded.config.agent.id, link_names(loaded)
        )
    except OSError as exc:
        report.errors.append(f"moving failed part way ({exc}); the backup holds the old files")
    # Where the stranded blocks are now that the others are gone.
    report.stranded = list((await asyncio.to_thread(survey_audiences, loaded)).stranded)
    if not sync:
        report.synced = "not synced (see migration)"
    elif not loaded.config.memory.enabled:
        report.synced = "memory is off"
    else:
        report.synced = await _sync_index(loaded)
    return report


def _move_blocks(
    loaded: LoadedConfig, found: AudienceSurvey, report: AudienceMigrationReport
) -> None:
    notes = NoteStore(notes_dir(loaded))
    names = link_names(loaded)
    for path in found.block_files():
        # Read again: the file is rewritten from what it holds now, not from the survey.
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines(keepends=True)
        blocks = blocks_in(lines, path, f"{MEMORY_DIR_NAME}/{path.name}", names)
        movable = [b for b in blocks if b.audience is not None]
        day = _day_of(path)
        for block in movable:
            assert block.audience is not None
            if block.text:
                _append_once(notes, block.audience, day, block.time, block.text)
            report.moved.append(block)
        gone = {n for b in movable for n in range(b.start, b.end)}
        kept = "".join(line for n, line in enumerate(lines) if n not in gone)
        if kept.strip():
            rewrite_file(path, kept.rstrip("\n") + "\n")
        else:
            path.unlink()
            report.files_removed.append(f"{MEMORY_DIR_NAME}/{path.name}")


def _day_of(path: Path) -> datetime:
    match = _DATED.match(path.name)
    if match:
        with contextlib.suppress(ValueError):
            return datetime(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    return datetime.fromtimestamp(path.stat().st_mtime)


def note_heading(time: str) -> str:
    """What ``NoteStore.append_flush`` writes before a flush's notes (no session key)."""
    return f"## {time} — saved before compaction"


def _append_once(notes: NoteStore, audience: Audience, day: datetime, time: str, text: str) -> None:
    hour, minute = (int(part) for part in time.split(":"))
    when = day.replace(hour=hour % 24, minute=minute % 60)
    pieces = _pieces(text, MAX_NOTE_CHARS)
    existing = notes.folder(audience) / f"{when:%Y-%m-%d}.md"
    held = existing.read_text(encoding="utf-8", errors="replace") if existing.is_file() else ""
    for piece in pieces:
        if f"{note_heading(time)}\n\n{piece}\n" in held:
            continue  # a rerun after a kill: this block is already there
        notes.append_flush(audience, when, piece)


def _pieces(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut at line ends where it can
    (a note is clipped at that size: a longer block becomes several notes)."""
    pieces: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        while len(line) > limit:
            if current:
                pieces.append(current.strip())
                current = ""
            pieces.append(line[:limit].strip())
            line = line[limit:]
        if len(current) + len(line) > limit:
            pieces.append(current.strip())
            current = ""
        current += line
    if current.strip():
        pieces.append(current.strip())
    return [p for p in pieces if p]


def rewrite_file(path: Path, text: str) -> None:
    """Replace a file's text atomically, keeping its mode."""
    write_atomically(path, text.encode("utf-8"), path.stat().st_mode & 0o777)


def _move_task_logs(
    loaded: LoadedConfig, found: AudienceSurvey, report: AudienceMigrationReport
) -> None:
    root = legacy_tasks_dir(loaded)
    target_root = tasks_dir(loaded)
    for source in found.task_logs:
        relative = source.relative_to(root)
        target = target_root / relative
        target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if not target.exists():
            shutil.move(source, target)
            os.chmod(target, FILE_MODE)
        else:
            old = source.read_bytes()
            current = target.read_bytes()
            if not current.startswith(old):  # else: merged before a kill, source left over
                if old and not old.endswith(b"\n"):
                    old += b"\n"
                write_atomically(target, old + current)
            source.unlink()
        report.task_logs.append(relative.as_posix())
    _remove_empty_dirs(root)
    parley = root.parent
    with contextlib.suppress(OSError):
        if parley.is_dir() and not any(parley.iterdir()):
            parley.rmdir()


def _remove_empty_dirs(root: Path) -> None:
    if not root.is_dir() or root.is_symlink():
        return
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty
    with contextlib.suppress(OSError):
        root.rmdir()


async def _sync_index(loaded: LoadedConfig) -> str:
    from parley.core.errors import CoreError
    from parley.gateway.errors import GatewayError
    from parley.gateway.memory import build_memory_index

    index = build_memory_index(loaded)
    try:
        await index.open()
        result = await index.sync(reason="audience migration", scheduled_forgetting=False)
    except (CoreError, GatewayError, OSError) as exc:
        return f"sync failed ({exc}): the gateway's start syncs it"
    finally:
        await index.close()
    if result.errors:
        return "synced with errors: " + "; ".join(result.errors[:3])
    return f"synced ({result.files_indexed} file(s) indexed, {result.files_deleted} removed)"
