"""What the home holds, whoever it is of: the state stores (opened without the gateway's
session locks), every session with the scope of its words, the task logs, the checkpoint
folders; and the refusals while a gateway holds the home or its state is from an earlier
parley. Reads only. Internal to ``gateway.people``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.core.memory.tasks import parse_records
from parley.core.transcript_store import FileTranscriptStore, TranscriptStore
from parley.gateway.audiences import PersonLinks, scope_for_key, scope_resolver
from parley.gateway.config import LoadedConfig
from parley.gateway.home_upgrade.audiences import legacy_tasks_dir
from parley.gateway.memory import memory_db_path, tasks_dir
from parley.gateway.people.who import PersonError
from parley.gateway.routing import normalise_peer_id
from parley.gateway.storage.sessions import SessionRecord

_MAX_HEADER_BYTES = 64 * 1024
# The listener every replica's session locks keep on PostgreSQL (gateway/pg/session_locks.py).
_REPLICA_LISTEN = "LISTEN parley_session_unlocked"
# How long a replica's connection may outlive its stop (``refuse_running``).
REPLICA_EXIT_GRACE_SECONDS = 3.0
REPLICA_EXIT_POLL_SECONDS = 0.05
# Lines typed at the terminal chat (up-arrow history), in the home beside the transcripts:
# the words of the terminal's person (``terminal_person``), never anyone else's.
TERMINAL_HISTORY_FILE = "terminal_history"


def terminal_history(loaded: LoadedConfig) -> Path:
    return loaded.home / TERMINAL_HISTORY_FILE


def terminal_person(loaded: LoadedConfig) -> str:
    """The person id of whoever types at the terminal chat (``[channels.terminal]
    sender_id``, as its direct chat's key names it)."""
    return f"terminal:{normalise_peer_id(loaded.config.channels.terminal.sender_id)}"


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
class State:
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
async def open_state(loaded: LoadedConfig) -> AsyncIterator[State]:
    storage = loaded.config.storage
    if storage.backend == "postgres":
        from parley.gateway.storage.postgres.database import PgDatabase
        from parley.gateway.storage.postgres.inbox import PgInbox
        from parley.gateway.storage.postgres.pairing import PgPairingStore
        from parley.gateway.storage.postgres.schema_migrations import SCHEMA_VERSION, schema_version
        from parley.gateway.storage.postgres.session_registry import PgSessionRegistry
        from parley.gateway.storage.postgres.transcripts import PgTranscriptStore

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
            yield State(
                loaded,
                PgTranscriptStore(pg),
                PgSessionRegistry(pg),
                PgInbox(pg),
                PgPairingStore(pg),
                pg,
            )
        return
    from parley.gateway.storage.sqlite.database import Database
    from parley.gateway.storage.sqlite.inbox import SqliteInbox
    from parley.gateway.storage.sqlite.pairing import SqlitePairingStore
    from parley.gateway.storage.sqlite.session_registry import SqliteSessionRegistry

    transcripts = FileTranscriptStore(loaded.sessions_dir, fsync=storage.fsync)
    if not await asyncio.to_thread(loaded.state_db.exists):
        yield State(loaded, transcripts)  # nothing registered yet: nothing to open
        return
    async with Database(loaded.state_db, fsync=storage.fsync) as db:
        yield State(
            loaded, transcripts, SqliteSessionRegistry(db), SqliteInbox(db), SqlitePairingStore(db)
        )


def refuse_outdated(loaded: LoadedConfig) -> None:
    """Opening state written by an earlier parley would upgrade it: doctor's job."""
    from parley.gateway.home_upgrade.state import survey

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


async def refuse_running(loaded: LoadedConfig, state: State | None) -> None:
    """PostgreSQL: with the state open (this process's pool listens to nothing);
    SQLite: before opening it (this process's own connection would count)."""
    if state is not None:
        running = await state.pg.run(_pg_replicas)
        # A replica stopped a moment ago is still listed until its backend has seen
        # the closed socket and exited: milliseconds, longer on a busy server. Give
        # it that long before telling the operator to stop what is already stopped.
        deadline = asyncio.get_running_loop().time() + REPLICA_EXIT_GRACE_SECONDS
        while running and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(REPLICA_EXIT_POLL_SECONDS)
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


async def _all_sessions(state: State) -> list[SessionRecord]:
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
        headers[info.session_id] = read_header(store.path(info.session_id))
    return headers


def read_header(path: Path) -> Mapping[str, Any] | None:
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


async def sessions(state: State) -> list[SessionInfo]:
    """Every session the home knows of (a registry row, a transcript, or both), with
    the scope of its words."""
    records = {r.session_id: r for r in await _all_sessions(state)}
    if state.postgres:
        headers = await state.pg.run(_pg_headers)
    else:
        store = state.transcripts
        # Without PostgreSQL the transcripts are files (gateway.stores builds that store).
        assert isinstance(store, FileTranscriptStore)
        headers = await asyncio.to_thread(_file_headers, store)
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


def task_files(loaded: LoadedConfig) -> list[TaskFile]:
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


def checkpoint_folders(loaded: LoadedConfig) -> dict[str, list[Path]]:
    root = loaded.checkpoints_dir
    if not root.is_dir() or root.is_symlink():
        return {}
    return {
        folder.name: sorted(p for p in folder.iterdir() if p.is_file() or p.is_symlink())
        for folder in sorted(root.iterdir())
        if folder.is_dir() and not folder.is_symlink()
    }
