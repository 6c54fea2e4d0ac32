"""Everything parley keeps about one person: list it, or erase it (``parley people``).

A person is named as ``parley memory search --person`` names one:

- a canonical name of ``[session] identity_links`` (``alice``): every id linked to it,
  and everything the audience rule files under any of them (``PersonLinks``);
- one raw id, ``<channel>:<id>`` (``telegram:123``): that id only (with ``dm_scope =
  "per-peer"`` also the bare ``123`` that per-peer sessions from before audiences were
  filed under). An id linked to a name is erased alone: what the linked ids share is
  erased through the name;
- ``~main``: the one person of ``dm_scope = "main"``.

What ``erase_person`` removes, on either backend:

- the person's sessions, active and archived: every transcript whose header's audience
  (as ``gateway.audiences.scope_resolver`` reads it; a legacy header's from its key, a
  key made while linked being the linked person's) is one of the person's ids, and the
  registry rows of those sessions (a row whose transcript is gone is judged by its
  key); the transcript files, or their rows on PostgreSQL;
- the compaction checkpoints of those sessions (``<checkpoints>/<session id>/``), and any
  other checkpoint folder whose copies' header is the person's;
- their private notes (``NoteStore.erase`` per audience) and task logs (the files named
  by the digest of one of their scopes, or whose records say so, in every writer's
  folder, and in the workspace's legacy ``.parley/tasks``);
- flush blocks of their sessions still in the agent-wide ``<workspace>/memory`` files
  (a home not yet migrated by ``parley doctor --fix``);
- the inbox rows they sent (any chat, groups included: the row is their message) and
  their DM pairing requests or approvals;
- then the memory index is synced, so the chunks of every removed file go, and the
  forgetting tombstones of their chunks (which keep a preview of the text) are deleted;
  SQLite files are vacuumed so deleted rows do not linger in free pages.

What it does not touch: a group's transcripts, notes and task records are the group's.
Erasing a person does not rewrite group history; the output says so. Backups under
``<home>/backups`` and log files may still hold copies: the output names them.

It refuses to run while a gateway uses the home (state.db or memory.db held open by
another connection; on PostgreSQL, a replica's session-lock listener connected): erase
with every gateway stopped. ``dry_run`` lists what would go and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.memory.audience import MAIN_PERSON, Audience, AudienceError, parse_scope
from core.memory.notes import NoteStore
from core.memory.tasks import parse_records, scope_file_name
from core.transcript_store import FileTranscriptStore, TranscriptStore
from gateway.audience_migration import (
    MEMORY_DIR_NAME,
    FlushBlock,
    blocks_in,
    legacy_tasks_dir,
    rewrite_file,
    workspace_flush_blocks,
)
from gateway.audiences import PersonLinks, scope_for_key, scope_resolver
from gateway.config import LoadedConfig
from gateway.errors import GatewayError
from gateway.memory import memory_db_path, notes_dir, tasks_dir
from gateway.pairing import PairingRequest
from gateway.registry import SessionRecord
from gateway.routing import normalise_channel, normalise_peer_id

# Items named per line of output; the rest are counted.
LISTED = 8
_MAX_HEADER_BYTES = 64 * 1024
_RAW_ID = re.compile(r"[a-z0-9_.@+~-]{1,64}")
# The listener every replica's session locks keep on PostgreSQL (gateway/pg/session_locks.py).
_REPLICA_LISTEN = "LISTEN parley_session_unlocked"
GROUPS_NOTE = (
    "erasing a person does not rewrite group history: what they said in a group stays "
    "in that group's transcripts, notes and task records"
)


class PersonError(GatewayError):
    """Not a person, or not now (a gateway holds the home)."""


# -- who ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Person:
    """One person, and the rule that says whose scope is theirs."""

    id: str  # normalised: "alice", "telegram:123", "~main"
    agent_id: str
    links: PersonLinks
    linked: tuple[str, ...] = ()  # the ids the identity links give a canonical name
    per_peer: bool = False

    @property
    def canonical(self) -> bool:
        return self.id in self.links.names

    def owns(self, scope: str) -> bool:
        """Is ``scope`` (a stored one: legacy ``dm:``/``group:`` scopes are read as the
        audience their key names) one of this person's?"""
        audience = parse_scope(self.current_scope(scope))
        if audience is None or audience.kind != "person":
            return False
        if self.canonical:
            return self.links(audience.id) == self.id
        if audience.id == self.id:
            return True
        # Per-peer sessions from before audiences were filed under the bare peer (one
        # reading as a link name is that person's, never this id's: viewer_for's rule).
        bare = self.id.partition(":")[2]
        return (
            self.per_peer and bool(bare) and bare not in self.links.names and (audience.id == bare)
        )

    def current_scope(self, scope: str) -> str:
        """A scope of an index or task log from before audiences, as today's audience."""
        kind, sep, rest = scope.partition(":")
        if sep and kind in ("dm", "group") and rest:
            return scope_for_key(f"agent:{self.agent_id}:{rest}", self.links.names)
        return scope

    def senders(self, found: Iterable[str] = ()) -> set[tuple[str | None, str]]:
        """(channel or None for any, peer id) of the person, for the inbox and pairing:
        the linked ids (a canonical name), else the id itself, and the ``channel:peer``
        person ids found in their sessions. Never the canonical name as a peer (a key
        made while linked holds the name, which is nobody's platform id)."""
        ids = set(self.linked) if self.canonical else {self.id}
        ids |= {i for i in found if ":" in i}
        out: set[tuple[str | None, str]] = set()
        for person_id in ids:
            if person_id == MAIN_PERSON:
                continue
            channel, sep, peer = person_id.partition(":")
            if not sep:
                if person_id != self.id or not self.canonical:
                    out.add((None, person_id))
            elif not (self.canonical and peer == self.id and person_id not in self.linked):
                out.add((channel, peer))
        return out


def person_id(text: str) -> str:
    """A person as typed, normalised as session keys normalise ids."""
    raw = text.strip()
    if raw.lower().startswith("person:"):
        raw = raw[len("person:") :]
    if not raw:
        raise PersonError("name a person: a linked name or <channel>:<id>")
    if raw.lower() == MAIN_PERSON:
        return MAIN_PERSON
    channel, sep, peer = raw.partition(":")
    if sep:
        if not peer:
            raise PersonError(f"not a person: {text[:80]!r} (expected <channel>:<id>)")
        return f"{normalise_channel(channel)}:{_peer(peer)}"
    return _peer(raw)


def _peer(raw: str) -> str:
    lowered = raw.lower()
    # Already a key segment (an escaped id as a listing shows it): keep it.
    return lowered if raw.isascii() and _RAW_ID.fullmatch(lowered) else normalise_peer_id(raw)


def resolve_person(loaded: LoadedConfig, text: str) -> Person:
    session = loaded.config.session
    links = PersonLinks(session)
    found = person_id(text)
    try:
        Audience.person(found)
    except AudienceError as exc:
        raise PersonError(f"not a person: {exc}") from exc
    linked: tuple[str, ...] = ()
    if found in links.names:
        for name, ids in session.identity_links.items():
            if normalise_peer_id(name) == found:
                linked = tuple(person_id(link) for link in ids)
    return Person(
        found,
        loaded.config.agent.id,
        links,
        linked,
        per_peer=session.dm_scope == "per-peer",
    )


# -- what there is ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: str
    key: str
    scope: str
    status: str  # "active", "archived", or "no registry row"
    transcript: bool
    channel: str = ""

    def describe(self) -> str:
        return f"{self.key} {self.session_id[:12]} ({self.status})"


@dataclass(frozen=True, slots=True)
class TaskFile:
    path: Path
    display: str
    scopes: frozenset[str]


@dataclass
class _State:
    """The state stores of the backend, opened without the gateway's session locks."""

    loaded: LoadedConfig
    transcripts: TranscriptStore
    registry: Any = None  # SessionRegistry | PgSessionRegistry; None: no state.db yet
    inbox: Any = None
    pairing: Any = None
    pg: Any = None  # PgDatabase

    @property
    def postgres(self) -> bool:
        return self.pg is not None

    @property
    def names(self) -> frozenset[str]:
        return PersonLinks(self.loaded.config.session).names


@contextlib.asynccontextmanager
async def _open_state(loaded: LoadedConfig) -> AsyncIterator[_State]:
    storage = loaded.config.storage
    if storage.backend == "postgres":
        from gateway.pg.database import PgDatabase
        from gateway.pg.inbox import PgInbox
        from gateway.pg.migrations import SCHEMA_VERSION, schema_version
        from gateway.pg.pairing import PgPairingStore
        from gateway.pg.registry import PgSessionRegistry
        from gateway.pg.transcripts import PgTranscriptStore

        assert storage.url is not None  # the config refuses postgres without one
        # Not migrated here: an erase (or a dry run) changes nothing but the person's rows.
        url = storage.url.get_secret_value()
        async with PgDatabase(url, pool_size=2, migrate_at_open=False) as pg:
            version = await pg.run(schema_version)
            if version != SCHEMA_VERSION:
                raise PersonError(
                    f"{pg.where} has schema version {version}, this parley {SCHEMA_VERSION}: "
                    "run `parley db migrate` first"
                    if version < SCHEMA_VERSION
                    else f"{pg.where} has schema version {version}, newer than this parley's"
                )
            yield _State(
                loaded,
                PgTranscriptStore(pg),
                PgSessionRegistry(pg),
                PgInbox(pg),
                PgPairingStore(pg),
                pg,
            )
        return
    from gateway.db import Database
    from gateway.inbox import Inbox
    from gateway.pairing import PairingStore
    from gateway.registry import SessionRegistry

    transcripts = FileTranscriptStore(loaded.sessions_dir, fsync=storage.fsync)
    if not await asyncio.to_thread(loaded.state_db.exists):
        yield _State(loaded, transcripts)  # nothing registered yet: nothing to open
        return
    async with Database(loaded.state_db, fsync=storage.fsync) as db:
        yield _State(loaded, transcripts, SessionRegistry(db), Inbox(db), PairingStore(db))


def _refuse_outdated(loaded: LoadedConfig) -> None:
    """Opening state written by an earlier parley would upgrade it: doctor's job."""
    from gateway.state_migration import survey

    found = survey(loaded)
    if found.steps or found.refusals:
        raise PersonError(
            "the state is from an earlier parley: run `parley doctor --fix` first "
            "(see `parley doctor`)"
        )


def _sqlite_in_use(path: Path) -> bool:
    """Does another connection (a running gateway) hold this SQLite file open? An
    exclusive lock cannot be had while any other connection has it open in WAL mode."""
    if not path.exists():
        return False
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("COMMIT")
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()
    return False


def _pg_replicas(conn: Any) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND query = %s",
        (_REPLICA_LISTEN,),
    ).fetchone()
    return int(row["n"]) if row else 0


async def _refuse_running(loaded: LoadedConfig, state: _State | None) -> None:
    """PostgreSQL: with the state open (this process's pool listens to nothing);
    SQLite: before opening it (this process's own connection would count)."""
    if state is not None:
        running = await state.pg.run(_pg_replicas)
        if running:
            raise PersonError(
                f"{running} gateway replica(s) are connected to {state.pg.where}: stop every "
                "replica first (or use --dry-run to only list what would go)"
            )
        return
    for path in (loaded.state_db, memory_db_path(loaded)):
        if await asyncio.to_thread(_sqlite_in_use, path):
            raise PersonError(
                f"{path} is in use (a running gateway?): stop it first "
                "(or use --dry-run to only list what would go)"
            )


async def _all_sessions(state: _State) -> list[SessionRecord]:
    if state.registry is None:
        return []
    records: list[SessionRecord] = []
    cursor: str | None = None
    while True:
        page = await state.registry.list(limit=500, cursor=cursor)
        records += page.sessions
        if page.next_cursor is None:
            return records
        cursor = page.next_cursor


def _file_headers(store: FileTranscriptStore) -> dict[str, Mapping[str, Any] | None]:
    headers: dict[str, Mapping[str, Any] | None] = {}
    for info in store.list_transcripts():
        headers[info.session_id] = _read_header(store.path(info.session_id))
    return headers


def _read_header(path: Path) -> Mapping[str, Any] | None:
    try:
        with path.open("rb") as handle:
            first = handle.readline(_MAX_HEADER_BYTES)
        raw = json.loads(first)
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _pg_headers(conn: Any) -> dict[str, Mapping[str, Any] | None]:
    headers: dict[str, Mapping[str, Any] | None] = {}
    for row in conn.execute("SELECT session_id, header FROM transcripts").fetchall():
        try:
            raw = json.loads(row["header"])
        except ValueError:
            raw = None
        headers[row["session_id"]] = raw if isinstance(raw, dict) else None
    return headers


async def _sessions(state: _State) -> list[SessionInfo]:
    """Every session the home knows of (a registry row, a transcript, or both), with
    the scope of its words."""
    records = {r.session_id: r for r in await _all_sessions(state)}
    if state.postgres:
        headers = await state.pg.run(_pg_headers)
    else:
        headers = await asyncio.to_thread(_file_headers, state.transcripts)
    names = state.names
    resolve = scope_resolver(names)
    found: list[SessionInfo] = []
    for session_id in sorted(set(records) | set(headers)):
        record = records.get(session_id)
        header = headers.get(session_id)
        key = record.key if record else str((header or {}).get("key") or "")
        scope = resolve(header) if header is not None else scope_for_key(key, names)
        status = record.status if record else "no registry row"
        channel = record.channel if record else ""
        found.append(SessionInfo(session_id, key, scope, status, session_id in headers, channel))
    return found


def _task_files(loaded: LoadedConfig) -> list[TaskFile]:
    """Every task log: the private folder's (every writer's) and the workspace's legacy
    ones, each with the scopes its records name."""
    found: list[TaskFile] = []
    for root in (tasks_dir(loaded), legacy_tasks_dir(loaded)):
        if not root.is_dir() or root.is_symlink():
            continue
        for path in sorted([*root.glob("*.jsonl"), *root.glob("*/*.jsonl")]):
            if not path.is_file() or path.is_symlink():
                continue
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            scopes = frozenset(record.scope for _, record in parse_records(text))
            found.append(TaskFile(path, _shown(loaded, path), scopes))
    return found


def _shown(loaded: LoadedConfig, path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(loaded.home))
    return str(path)


def _checkpoint_folders(loaded: LoadedConfig) -> dict[str, list[Path]]:
    root = loaded.checkpoints_dir
    if not root.is_dir() or root.is_symlink():
        return {}
    return {
        folder.name: sorted(p for p in folder.iterdir() if p.is_file() or p.is_symlink())
        for folder in sorted(root.iterdir())
        if folder.is_dir() and not folder.is_symlink()
    }


# -- erase --------------------------------------------------------------------------------


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
    """Remove everything of ``person`` (see the module's docstring) and say what went;
    ``dry_run``: only say what would. Raises PersonError for no person, or for a home a
    gateway holds (unless ``dry_run``)."""
    target = resolve_person(loaded, person)
    await asyncio.to_thread(_refuse_outdated, loaded)
    report = ErasureReport(target.id, dry_run, linked=list(target.linked))
    postgres = loaded.config.storage.backend == "postgres"
    if not dry_run and not postgres:
        await _refuse_running(loaded, None)
    async with _open_state(loaded) as state:
        if not dry_run and postgres:
            await _refuse_running(loaded, state)
        sessions = await _sessions(state)
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
        index = (
            await _index_rows(loaded, state, target, theirs, files) if _has_index(loaded) else None
        )
        if index is not None:
            report.index_files, report.index_chunks, tombstones = index
            report.tombstones = len(tombstones)
        else:
            tombstones = []
        if not dry_run:
            # Files first, the rows that lead to them last: a rerun after a kill still
            # finds what is left (a session without its transcript by its registry row).
            await asyncio.to_thread(_erase_files, loaded, target, files)
            await _erase_state(state, theirs, inbox_ids, pairing, report)
            if _has_index(loaded):
                await _resync(loaded, state, target, tombstones, report)
            if not state.postgres:
                await asyncio.to_thread(_vacuum, loaded, report)
    report.notes_out += _leftovers(loaded, target, postgres=postgres)
    return report


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
    for name, copies in _checkpoint_folders(loaded).items():
        mine = name in session_ids
        if not mine:
            header = next((h for p in copies if (h := _read_header(p)) is not None), None)
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
    for task in _task_files(loaded):
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


async def _state_rows(
    state: _State, target: Person, found_ids: set[str]
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
    state: _State,
    target: Person,
    theirs: list[SessionInfo],
    files: _LocalFiles,
) -> tuple[list[str], int, list[Any]]:
    """The person's indexed files, their chunk count, and their tombstones."""
    from gateway.memory import build_memory_index

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
    paths = {f"sessions/{s.session_id}.jsonl" for s in theirs}
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
    state: _State,
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
    state: _State,
    target: Person,
    tombstones: list[Any],
    report: ErasureReport,
) -> None:
    """Sync the index (the rows of every removed file go), drop the person's tombstones,
    and check that nothing of theirs is left in it."""
    from core.errors import CoreError
    from gateway.memory import build_memory_index

    index = build_memory_index(loaded, db=state.pg)
    try:
        await index.open()
        result = await index.sync(reason="erase", scheduled_forgetting=False)
        report.errors += [f"index sync: {e}" for e in result.errors]

        def check() -> list[str]:
            store = index.backend.open_live(vector=False)
            try:
                return sorted(r.path for r in store.files().values() if target.owns(r.scope))
            finally:
                store.close()

        left = await asyncio.to_thread(check)
    except (CoreError, GatewayError, OSError) as exc:
        report.errors.append(f"the memory index could not be synced: {exc}")
        return
    finally:
        await index.close()
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


def _vacuum(loaded: LoadedConfig, report: ErasureReport) -> None:
    """Rewrite the SQLite files so the deleted rows' bytes do not stay in free pages
    (nor their words in the full-text indexes' segments)."""
    for path in (loaded.state_db, memory_db_path(loaded)):
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


# -- list ---------------------------------------------------------------------------------


@dataclass
class KnownPerson:
    person: str  # the canonical person (an identity-links name, or the id itself)
    ids: set[str] = field(default_factory=set)
    sessions: int = 0
    notes: int = 0
    task_logs: int = 0
    pairing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "person": self.person,
            "ids": sorted(self.ids),
            "sessions": self.sessions,
            "notes": self.notes,
            "task_logs": self.task_logs,
            "pairing": self.pairing,
        }


async def list_people(loaded: LoadedConfig) -> list[KnownPerson]:
    """Every person the home holds something of (and every identity-links name), with
    the ids their data is filed under and how much of it there is. Reads only."""
    await asyncio.to_thread(_refuse_outdated, loaded)
    session = loaded.config.session
    links = PersonLinks(session)
    agent = Person("", loaded.config.agent.id, links)
    people: dict[str, KnownPerson] = {}

    def entry(person_id: str) -> KnownPerson:
        canonical = links(person_id)
        return people.setdefault(canonical, KnownPerson(canonical))

    for name, ids in session.identity_links.items():
        entry(normalise_peer_id(name)).ids.update(person_id(link) for link in ids)
    async with _open_state(loaded) as state:
        for info in await _sessions(state):
            audience = parse_scope(info.scope)
            if audience is not None and audience.kind == "person":
                found = entry(audience.id)
                found.ids.add(audience.id)
                found.sessions += 1
        requests = await state.pairing.list() if state.pairing is not None else []
    for request in requests:
        raw = f"{normalise_channel(request.channel)}:{normalise_peer_id(request.sender_id)}"
        found = entry(raw)
        found.ids.add(raw)
        found.pairing.append(f"{request.channel} {request.sender_id} ({request.status})")

    def local() -> None:
        for note in NoteStore(notes_dir(loaded)).files():
            if note.audience.kind == "person":
                found = entry(note.audience.id)
                found.ids.add(note.audience.id)
                found.notes += 1
        for task in _task_files(loaded):
            for scope in {agent.current_scope(s) for s in task.scopes}:
                audience = parse_scope(scope)
                if audience is not None and audience.kind == "person":
                    found = entry(audience.id)
                    found.ids.add(audience.id)
                    found.task_logs += 1

    await asyncio.to_thread(local)
    for known in people.values():
        if known.person in links.names:
            known.ids.discard(known.person)  # a name is no platform id
    return sorted(people.values(), key=lambda p: p.person)


def format_people(people: list[KnownPerson]) -> str:
    if not people:
        return "no people yet"
    rows = [("PERSON", "IDS", "SESSIONS", "NOTES", "TASK LOGS", "PAIRING")]
    for p in people:
        rows.append(
            (
                p.person,
                ", ".join(sorted(p.ids)) or "-",
                str(p.sessions),
                str(p.notes),
                str(p.task_logs),
                "; ".join(p.pairing) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


__all__ = [
    "ErasureReport",
    "KnownPerson",
    "Person",
    "PersonError",
    "erase_person",
    "format_people",
    "list_people",
    "resolve_person",
]
