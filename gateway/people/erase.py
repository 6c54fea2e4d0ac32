"""``erase_person``: what of the home is the person's (see the package's docstring), its
removal step by step, and the ``ErasureReport`` that says what went and what stayed."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parley.core.memory.audience import MAIN_PERSON, Audience, parse_scope
from parley.core.memory.notes import NoteStore
from parley.core.memory.sources import transcript_path
from parley.core.memory.tasks import scope_file_name
from parley.core.transcript_store import FileTranscriptStore
from parley.gateway.audiences import scope_resolver
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import GatewayError
from parley.gateway.home_upgrade.audiences import (
    MEMORY_DIR_NAME,
    FlushBlock,
    blocks_in,
    legacy_tasks_dir,
    rewrite_file,
    workspace_flush_blocks,
)
from parley.gateway.media.store import MediaStore
from parley.gateway.memory import memory_db_path, notes_dir, tasks_dir
from parley.gateway.people import inventory
from parley.gateway.people.inventory import SessionInfo, State, TaskFile
from parley.gateway.people.who import Person, resolve_person
from parley.gateway.routing import normalise_channel, normalise_peer_id
from parley.gateway.storage.pairing import PairingRequest

# Items named per line of output; the rest are counted.
LISTED = 8
GROUPS_NOTE = (
    "erasing a person does not rewrite group history: what they said in a group stays "
    "in that group's transcripts, notes and task records"
)


@dataclass
class ErasureReport:
    person: str
    dry_run: bool
    linked: list[str] = field(default_factory=list)  # the identity links' ids
    ids: list[str] = field(default_factory=list)  # person ids their data was filed under
    sessions: list[SessionInfo] = field(default_factory=list)
    transcripts: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    registry_rows: int = 0
    notes: list[str] = field(default_factory=list)
    task_logs: list[str] = field(default_factory=list)
    flush_blocks: list[str] = field(default_factory=list)  # legacy, in the workspace
    index_files: list[str] = field(default_factory=list)
    index_chunks: int = 0
    tombstones: int = 0
    inbox_rows: int = 0
    pairing: list[str] = field(default_factory=list)
    terminal_history: list[str] = field(default_factory=list)  # the file, if theirs
    group_sessions: int = 0  # kept
    notes_out: list[str] = field(default_factory=list)  # what the operator should know
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "person": self.person,
            "dry_run": self.dry_run,
            "linked_ids": self.linked,
            "ids": self.ids,
            "sessions": [
                {"session_id": s.session_id, "key": s.key, "status": s.status, "scope": s.scope}
                for s in self.sessions
            ],
            "transcripts": self.transcripts,
            "checkpoints": self.checkpoints,
            "registry_rows": self.registry_rows,
            "notes": self.notes,
            "task_logs": self.task_logs,
            "workspace_flush_blocks": self.flush_blocks,
            "index": {
                "files": self.index_files,
                "chunks": self.index_chunks,
                "tombstones": self.tombstones,
            },
            "inbox_rows": self.inbox_rows,
            "pairing": self.pairing,
            "terminal_history": self.terminal_history,
            "kept": {"group_sessions": self.group_sessions, "why": GROUPS_NOTE},
            "notes_for_operator": self.notes_out,
            "errors": self.errors,
        }

    def lines(self) -> list[str]:
        verb = "Would erase" if self.dry_run else "Erased"
        who = f"person {self.person}"
        if self.linked:
            who += f" (linked ids: {', '.join(self.linked)})"
        head = f"{verb} {who}"
        if self.dry_run:
            head += " (dry run: nothing was changed)"
        out = [head + ":"]
        if self.ids:
            out.append(f"  filed under     {_listed(self.ids)}")
        active = sum(1 for s in self.sessions if s.status == "active")
        archived = sum(1 for s in self.sessions if s.status == "archived")
        out.append(
            f"  sessions        {len(self.sessions)} ({active} active, {archived} archived)"
            + (": " + _listed([s.describe() for s in self.sessions]) if self.sessions else "")
        )
        out.append(f"  transcripts     {len(self.transcripts)}")
        out.append(f"  registry rows   {self.registry_rows}")
        out.append(f"  checkpoints     {len(self.checkpoints)} file(s)")
        out.append(f"  notes           {_counted(self.notes)}")
        out.append(f"  task logs       {_counted(self.task_logs)}")
        if self.flush_blocks:
            out.append(f"  legacy flushes  {_counted(self.flush_blocks)}")
        out.append(
            f"  memory index    {len(self.index_files)} file(s), {self.index_chunks} chunk(s), "
            f"{self.tombstones} forgetting tombstone(s)"
        )
        out.append(f"  inbox           {self.inbox_rows} message(s)")
        out.append(f"  pairing         {_counted(self.pairing)}")
        out.append(f"  terminal input  {_counted(self.terminal_history)}")
        out.append(f"Kept: {self.group_sessions} group session(s) on record. Note: {GROUPS_NOTE}.")
        out += [f"Note: {note}" for note in self.notes_out]
        out += [f"Error: {error}" for error in self.errors]
        return out


def _listed(items: list[str]) -> str:
    more = f" (+{len(items) - LISTED} more)" if len(items) > LISTED else ""
    return ", ".join(items[:LISTED]) + more


def _counted(items: list[str]) -> str:
    return f"{len(items)}" + (f": {_listed(items)}" if items else "")


async def erase_person(
    loaded: LoadedConfig, person: str, *, dry_run: bool = False
) -> ErasureReport:
    """Remove everything of ``person`` (see the package's docstring) and say what went;
    ``dry_run``: only say what would. Raises PersonError for no person, or for a home a
    gateway holds (unless ``dry_run``)."""
    target = resolve_person(loaded, person)
    await asyncio.to_thread(inventory.refuse_outdated, loaded)
    report = ErasureReport(target.id, dry_run, linked=list(target.linked))
    postgres = loaded.config.storage.backend == "postgres"
    if not dry_run and not postgres:
        await inventory.refuse_running(loaded, None)
    async with inventory.open_state(loaded) as state:
        if not dry_run and postgres:
            await inventory.refuse_running(loaded, state)
        sessions = await inventory.sessions(state)
        theirs = [s for s in sessions if target.owns(s.scope)]
        report.sessions = theirs
        report.group_sessions = sum(
            1 for s in sessions if (a := parse_scope(s.scope)) and a.kind == "conversation"
        )
        found_ids = {a.id for s in theirs if (a := parse_scope(s.scope))}
        files = await asyncio.to_thread(
            _local_files, loaded, target, {s.session_id for s in theirs}
        )
        found_ids |= files.ids
        report.ids = sorted(found_ids | ({target.id} if not target.canonical else set()))
        report.checkpoints = [str(p) for p in files.checkpoint_files]
        report.notes = files.note_paths
        report.task_logs = [t.display for t in files.task_files]
        report.flush_blocks = [b.where for b in files.blocks]
        report.transcripts = [
            state.transcripts.location(s.session_id) for s in theirs if s.transcript
        ]
        report.registry_rows = sum(1 for s in theirs if s.status != "no registry row")
        inbox_ids, pairing = await _state_rows(state, target, found_ids)
        report.inbox_rows = len(inbox_ids)
        report.pairing = [f"{r.channel} {r.sender_id} ({r.status})" for r in pairing]
        history = inventory.terminal_history(loaded)
        if _types_at_the_terminal(loaded, target) and await asyncio.to_thread(history.exists):
            report.terminal_history = [str(history)]
        index = (
            await _index_rows(loaded, state, target, theirs, files) if _has_index(loaded) else None
        )
        if index is not None:
            report.index_files, report.index_chunks, tombstones = index
            report.tombstones = len(tombstones)
        else:
            tombstones = []
        # The other agents' notes, task records and memory index: each their own.
        others = await _other_agents(loaded, state, target, theirs, report)
        if not dry_run:
            # Files first, the rows that lead to them last: a rerun after a kill still
            # finds what is left (a session without its transcript by its registry row).
            await asyncio.to_thread(_erase_files, loaded, target, files)
            for other in others:
                await asyncio.to_thread(_erase_files, other.loaded, target, other.files)
            if report.terminal_history:
                await asyncio.to_thread(history.unlink, missing_ok=True)
            await _erase_state(state, theirs, inbox_ids, pairing, report)
            if _has_index(loaded):
                await _resync(loaded, state, target, tombstones, report)
            for other in others:
                if _has_index(other.loaded):
                    await _resync(other.loaded, state, target, other.tombstones, report)
            if not state.postgres:
                await asyncio.to_thread(_vacuum, loaded, report)
                for other in others:
                    await asyncio.to_thread(_vacuum, other.loaded, report, state_db=False)
    report.notes_out += _leftovers(loaded, target, postgres=postgres)
    return report


def _types_at_the_terminal(loaded: LoadedConfig, target: Person) -> bool:
    """Is ``target`` the terminal chat's person (whose typed lines its history file
    keeps): that id, the name it is linked to, or ~main when every direct chat is one?"""
    if target.id == MAIN_PERSON:
        return loaded.config.session.dm_scope == "main"
    return target.owns(Audience.person(inventory.terminal_person(loaded)).scope)


@dataclass
class _LocalFiles:
    ids: set[str]
    checkpoint_dirs: list[Path]
    checkpoint_files: list[Path]
    audiences: list[Audience]
    note_paths: list[str]
    task_files: list[TaskFile]
    blocks: list[FlushBlock]


def _local_files(loaded: LoadedConfig, target: Person, session_ids: set[str]) -> _LocalFiles:
    """The person's files outside the state stores (blocking, reads only)."""
    ids: set[str] = set()
    folders: list[Path] = []
    checkpoint_files: list[Path] = []
    resolve = scope_resolver(target.links.names)
    for name, copies in inventory.checkpoint_folders(loaded).items():
        mine = name in session_ids
        if not mine:
            header = next((h for p in copies if (h := inventory.read_header(p)) is not None), None)
            mine = header is not None and target.owns(resolve(header))
        if mine:
            folders.append(loaded.checkpoints_dir / name)
            checkpoint_files += copies
    notes = NoteStore(notes_dir(loaded))
    audiences: list[Audience] = []
    note_paths: list[str] = []
    for note in notes.files():
        if target.owns(note.audience.scope):
            note_paths.append(note.path)
            if note.audience not in audiences:
                audiences.append(note.audience)
            ids.add(note.audience.id)
    task_files: list[TaskFile] = []
    wanted = {scope_file_name(f"person:{i}") for i in {*ids, target.id, *target.linked}}
    for task in inventory.task_files(loaded):
        owned = [s for s in task.scopes if target.owns(s)]
        if owned or (task.path.name in wanted and not task.scopes):
            task_files.append(task)
            ids |= {a.id for s in owned if (a := parse_scope(target.current_scope(s)))}
    blocks = [
        b
        for b in workspace_flush_blocks(loaded)
        if b.audience is not None and target.owns(b.audience.scope)
    ]
    ids |= {b.audience.id for b in blocks if b.audience is not None}
    return _LocalFiles(ids, folders, checkpoint_files, audiences, note_paths, task_files, blocks)


@dataclass
class _OtherAgent:
    loaded: LoadedConfig  # as the agent reads it (gateway.agents.loaded_for)
    files: _LocalFiles
    tombstones: list[Any]


async def _other_agents(
    loaded: LoadedConfig,
    state: State,
    target: Person,
    theirs: list[SessionInfo],
    report: ErasureReport,
) -> list[_OtherAgent]:
    """What each agent but the default holds of the person (its notes, task records,
    legacy flush blocks and index rows), added to ``report``. The sessions, transcripts
    and checkpoints are every agent's alike: counted once, by the caller."""
    from parley.gateway.agents import agent_specs, loaded_for

    found: list[_OtherAgent] = []
    ids = {s.session_id for s in theirs}
    for spec in agent_specs(loaded.config)[1:]:
        own = loaded_for(loaded, spec)
        files = await asyncio.to_thread(_local_files, own, target, ids)
        files.checkpoint_dirs, files.checkpoint_files = [], []
        report.notes += [f"{spec.id}: {p}" for p in files.note_paths]
        report.task_logs += [f"{spec.id}: {t.display}" for t in files.task_files]
        report.flush_blocks += [f"{spec.id}: {b.where}" for b in files.blocks]
        tombstones: list[Any] = []
        if _has_index(own):
            paths, chunks, tombstones = await _index_rows(own, state, target, theirs, files)
            report.index_files += [p for p in paths if p not in report.index_files]
            report.index_chunks += chunks
            report.tombstones += len(tombstones)
        found.append(_OtherAgent(own, files, tombstones))
    return found


async def _state_rows(
    state: State, target: Person, found_ids: set[str]
) -> tuple[list[int], list[PairingRequest]]:
    if state.inbox is None:
        return [], []
    senders = target.senders(found_ids)
    inbox_ids: set[int] = set()
    for channel, peer in sorted(senders, key=lambda s: (s[0] or "", s[1])):
        inbox_ids.update(await state.inbox.items_from(channel, peer))
    pairing = [
        r
        for r in await state.pairing.list()
        if any(
            (channel is None or normalise_channel(r.channel) == channel)
            and normalise_peer_id(r.sender_id) == peer
            for channel, peer in senders
        )
    ]
    return sorted(inbox_ids), pairing


def _has_index(loaded: LoadedConfig) -> bool:
    if not loaded.config.memory.enabled:
        return False
    return loaded.config.storage.backend == "postgres" or memory_db_path(loaded).exists()


async def _index_rows(
    loaded: LoadedConfig,
    state: State,
    target: Person,
    theirs: list[SessionInfo],
    files: _LocalFiles,
) -> tuple[list[str], int, list[Any]]:
    """The person's indexed files, their chunk count, and their tombstones."""
    from parley.gateway.memory import build_memory_index

    index = build_memory_index(loaded, db=state.pg)
    paths = _index_paths(loaded, theirs, files)

    def read() -> tuple[list[str], int, list[Any]]:
        store = index.backend.open_live(vector=False)
        try:
            rows = store.files()
            tombstones = store.tombstones(None)
        finally:
            store.close()
        mine = [r for r in rows.values() if target.owns(r.scope) or r.path in paths]
        dead = [t for t in tombstones if target.owns(t.scope) or t.path in paths]
        return sorted(r.path for r in mine), sum(r.chunks for r in mine), dead

    try:
        return await asyncio.to_thread(read)
    finally:
        await index.close()  # never opened: this only closes its embedder


def _index_paths(loaded: LoadedConfig, theirs: list[SessionInfo], files: _LocalFiles) -> set[str]:
    """The index paths of the person's files (their scopes say the same for today's
    rows; a legacy row of a transcript may carry a scope of no audience)."""
    paths = {transcript_path(s.session_id) for s in theirs}
    paths |= set(files.note_paths)
    for task in files.task_files:
        for root in (tasks_dir(loaded), legacy_tasks_dir(loaded)):
            with contextlib.suppress(ValueError):
                paths.add(f"tasks/{task.path.relative_to(root).as_posix()}")
    return paths


def _erase_files(loaded: LoadedConfig, target: Person, files: _LocalFiles) -> None:
    notes = NoteStore(notes_dir(loaded))
    for audience in files.audiences:
        notes.erase(audience)
    for task in files.task_files:
        task.path.unlink(missing_ok=True)
    for folder in files.checkpoint_dirs:
        shutil.rmtree(folder, ignore_errors=True)
    # The pictures they sent in their direct chats (a group's stay with the group, like
    # its transcript).
    for audience, folder in MediaStore(loaded.media_dir).audience_folders():
        if audience.kind == "person" and target.owns(audience.scope):
            shutil.rmtree(folder, ignore_errors=True)
    for path in sorted({b.path for b in files.blocks}):
        _remove_blocks(path, target)


def _remove_blocks(path: Path, target: Person) -> None:
    """Drop the person's flush blocks from a workspace memory file (read again now)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    blocks = blocks_in(lines, path, f"{MEMORY_DIR_NAME}/{path.name}", target.links.names)
    gone = {
        n
        for b in blocks
        if b.audience is not None and target.owns(b.audience.scope)
        for n in range(b.start, b.end)
    }
    kept = "".join(line for n, line in enumerate(lines) if n not in gone)
    if kept.strip():
        rewrite_file(path, kept.rstrip("\n") + "\n")
    else:
        path.unlink()


def _pg_delete_transcripts(conn: Any, session_ids: list[str]) -> int:
    # transcript_lines go with them (ON DELETE CASCADE).
    cursor = conn.execute("DELETE FROM transcripts WHERE session_id = ANY(%s)", (session_ids,))
    return int(cursor.rowcount)


async def _erase_state(
    state: State,
    theirs: list[SessionInfo],
    inbox_ids: list[int],
    pairing: list[PairingRequest],
    report: ErasureReport,
) -> None:
    ids = [s.session_id for s in theirs]
    with_transcript = [s.session_id for s in theirs if s.transcript]
    if state.postgres:
        if with_transcript:
            await state.pg.run(_pg_delete_transcripts, with_transcript)
    else:
        store = state.transcripts
        assert isinstance(store, FileTranscriptStore)
        for session_id in with_transcript:
            await asyncio.to_thread(store.path(session_id).unlink, missing_ok=True)
    if state.registry is not None and ids:
        report.registry_rows = await state.registry.delete(ids)
    if state.inbox is not None and inbox_ids:
        report.inbox_rows = await state.inbox.delete_items(inbox_ids)
    for request in pairing:
        await state.pairing.revoke(request.channel, request.sender_id)


async def _resync(
    loaded: LoadedConfig,
    state: State,
    target: Person,
    tombstones: list[Any],
    report: ErasureReport,
) -> None:
    """Sync the index (the rows of every removed file go), drop the person's tombstones,
    and check that nothing of theirs is left in it."""
    from parley.core.errors import CoreError
    from parley.gateway.memory import build_memory_index

    index = build_memory_index(loaded, db=state.pg)

    def check() -> list[str]:
        store = index.backend.open_live(vector=False)
        try:
            return sorted(r.path for r in store.files().values() if target.owns(r.scope))
        finally:
            store.close()

    try:
        try:
            await index.open()
            # A transcript retention removed with its chunks kept has no file left for
            # the sync to miss: its rows go here, through the index.
            await index.drop_removed([p for p in report.index_files if p.startswith("sessions/")])
            result = await index.sync(reason="erase", scheduled_forgetting=False)
            report.errors += [f"index sync: {e}" for e in result.errors]
        finally:
            await index.close()
        # Checked once the index is closed: ``vector=False`` may open the file through
        # another SQLite library than the index's, and two libraries must never have the
        # same file open in one process (core/memory/driver.py).
        left = await asyncio.to_thread(check)
    except (CoreError, GatewayError, OSError) as exc:
        report.errors.append(f"the memory index could not be synced: {exc}")
        return
    if left:
        report.errors.append("still indexed: " + _listed(left))
    if tombstones:
        if state.postgres:
            await state.pg.run(_pg_drop_tombstones, loaded.config.agent.id, tombstones)
        else:
            await asyncio.to_thread(_sqlite_drop_tombstones, memory_db_path(loaded), tombstones)


def _pg_drop_tombstones(conn: Any, name: str, tombstones: list[Any]) -> None:
    for t in tombstones:
        conn.execute(
            "DELETE FROM memory_forgotten WHERE name = %s AND path = %s AND hash = %s",
            (name, t.path, t.hash),
        )


def _sqlite_drop_tombstones(path: Path, tombstones: list[Any]) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "DELETE FROM forgotten WHERE path = ? AND hash = ?",
            [(t.path, t.hash) for t in tombstones],
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


# memory.db's full-text indexes: a deleted row's terms stay in their segments until merged.
_FTS_TABLES = ("chunks_fts", "chunks_cjk")


def _vacuum(loaded: LoadedConfig, report: ErasureReport, *, state_db: bool = True) -> None:
    """Rewrite the SQLite files so the deleted rows' bytes do not stay in free pages
    (nor their words in the full-text indexes' segments)."""
    paths = (loaded.state_db, memory_db_path(loaded)) if state_db else (memory_db_path(loaded),)
    for path in paths:
        if not path.exists():
            continue
        conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        try:
            for table in _FTS_TABLES:
                found = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
                ).fetchone()
                if found:
                    conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            report.notes_out.append(f"could not vacuum {path} ({exc}): run VACUUM on it")
        finally:
            conn.close()


def _leftovers(loaded: LoadedConfig, target: Person, *, postgres: bool) -> list[str]:
    notes: list[str] = []
    if target.id == MAIN_PERSON:
        notes.append(
            '~main is every direct chat of dm_scope = "main": inbox rows and pairing name '
            "each sender and were left; erase each sender's <channel>:<id> for those"
        )
    elif not target.canonical and target.links(target.id) != target.id:
        notes.append(
            f"{target.id} is linked to {target.links(target.id)!r}: only what was filed under "
            f"{target.id} went; erase {target.links(target.id)} for every linked id"
        )
    if not loaded.config.memory.enabled and memory_db_path(loaded).exists():
        notes.append(
            f"memory is off ([memory] enabled = false): {memory_db_path(loaded)} was not "
            "synced and may still hold their chunks; delete it, or turn memory on and run "
            "`parley memory index`"
        )
    backups = loaded.home / "backups"
    if backups.is_dir():
        count = sum(1 for p in backups.iterdir() if p.is_dir() and not p.name.startswith("."))
        if count:
            notes.append(
                f"{count} backup(s) under {backups} were made before and may hold their data: "
                "delete them to finish"
            )
    logs = loaded.home / "logs"
    if logs.is_dir() and any(logs.iterdir()):
        notes.append(f"log files under {logs} may name their ids (session keys)")
    if postgres:
        notes.append(
            "PostgreSQL keeps deleted rows' bytes in its files until they are reused: "
            "VACUUM FULL the sessions, inbox, pairing, transcripts, transcript_lines, "
            "memory_files, memory_chunks and memory_forgotten tables to rewrite them now"
        )
    return notes
