"""Bring a state directory written by an earlier parley up to this one's layout.

``survey`` reads ``$PARLEY_HOME`` without changing a byte (SQLite opened read-only) and
says what is out of date; ``migrate`` backs the home up, then runs this parley's own
upgrades. What can be out of date (see tests/gateway/fixtures/state/README.md for the
history behind each):

- state.db below ``gateway.storage.sqlite.database.SCHEMA_VERSION``: the gateway's
  migrations, run as its open runs them (one transaction per version).
- state.db at a version but without a column or table that version's migration now
  creates: migration 2 gained ``sessions.last_message_ids`` in place (commit 6661068),
  so a state.db made between 9711123 and 209179a says version 2 yet lacks it, and
  today's registry fails on it. Found by comparing with a database built from
  ``MIGRATIONS``, so a future in-place edit is caught the same way.
- memory.db's file layout (``PRAGMA user_version``) below the store's
  ``STORE_VERSION``: upgraded in place by the store's own open.
- memory.db built under an index schema (``IndexMeta.schema``) below
  ``core.memory.store.SCHEMA_VERSION``: rebuilt by the index itself, beside the live
  file and swapped in when whole.

The directory layout itself (state.db, sessions/, sessions/checkpoints/,
memory/<agent>/memory.db, workspace/ under ``~/.parley`` or ``$PARLEY_HOME``) has not
changed since the first commit, so no file needs moving. The one other place state
can be is the default home when ``PARLEY_HOME`` points elsewhere: that is reported,
never moved (two homes may both be in use).

Crash safety: the backup is made in a hidden directory and renamed into place once
every file is copied, compared and fsynced; nothing is migrated before that. Each
upgrade is atomic on its own (SQLite transactions; the memory rebuild is promoted by
rename), so a kill leaves each file old or new, the backup beside them, and the next
``--fix`` finishes the job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from parley.core.memory import store as memory_store
from parley.core.memory.rows import SCHEMA_VERSION as MEMORY_SCHEMA_VERSION
from parley.core.memory.store import META_KEY
from parley.core.transcript import TRANSCRIPT_VERSION
from parley.gateway.config import DEFAULT_HOME, LoadedConfig
from parley.gateway.errors import StateError
from parley.gateway.storage.sqlite.database import MIGRATIONS, Database
from parley.gateway.storage.sqlite.database import SCHEMA_VERSION as STATE_SCHEMA_VERSION

BACKUPS_DIR = "backups"
# Not state: logs can be large and are not read back; backups would nest.
_NOT_BACKED_UP = frozenset({BACKUPS_DIR, "logs"})
_COPY_BLOCK = 1 << 20
# memory.db's layout version; the store gains it with the forgotten table (issue 8's
# files read user_version 0, which the store takes for 1). Before that: always 1.
MEMORY_STORE_VERSION: int = getattr(memory_store, "STORE_VERSION", 1)

StepKind = Literal["state-repair", "state-schema", "memory-store", "memory-schema"]


class StateMigrationError(StateError):
    """The state cannot be migrated (newer than this parley, or the backup failed)."""


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    detail: str


@dataclass(frozen=True, slots=True)
class Survey:
    home: Path
    steps: tuple[Step, ...] = ()
    refusals: tuple[str, ...] = ()  # each a reason nothing may be migrated
    notes: tuple[str, ...] = ()  # worth knowing, nothing to do here
    current: tuple[str, ...] = ()  # what was found up to date

    def blocks(self, kind: str) -> bool:
        """Would opening this part with today's code change it (so a check must not)?"""
        return any(s.kind.startswith(kind) for s in self.steps) or any(
            r.startswith(kind) for r in self.refusals
        )


@dataclass(frozen=True, slots=True)
class MigrationReport:
    backup: Path | None  # None: nothing needed migrating
    done: tuple[str, ...]


# -- survey (read-only) -------------------------------------------------------------------


def survey(loaded: LoadedConfig) -> Survey:
    """What is out of date under ``loaded.home``; changes nothing (blocking)."""
    home = loaded.home
    steps: list[Step] = []
    refusals: list[str] = []
    notes: list[str] = []
    current: list[str] = []
    if loaded.config.storage.backend == "postgres":
        # Its schema is the state check's and `parley db migrate`'s business.
        return Survey(home, current=("state on PostgreSQL: see the state check",))
    _survey_state_db(loaded.state_db, steps, refusals, current)
    if loaded.config.memory.enabled:
        _survey_memory_db(_memory_db(loaded), steps, refusals, current)
    _survey_transcripts(loaded.sessions_dir, refusals, current)
    default = DEFAULT_HOME.expanduser()
    if not loaded.state_db.exists() and default != home and (default / "state.db").exists():
        notes.append(
            f"{home} holds no state.db but {default} does: set PARLEY_HOME={default} to "
            "use it, or move it yourself (--fix never moves state between homes)"
        )
    return Survey(home, tuple(steps), tuple(refusals), tuple(notes), tuple(current))


def _memory_db(loaded: LoadedConfig) -> Path:
    from parley.gateway.memory import memory_db_path

    return memory_db_path(loaded)


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    # Without a WAL beside it nothing else has the file open: immutable reads it without
    # creating the -wal and -shm files a read-only WAL reader leaves behind.
    wal = path.with_name(path.name + "-wal")
    mode = "mode=ro" if wal.exists() else "immutable=1"
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True)
    try:
        yield conn
    finally:
        conn.close()


def _survey_state_db(
    path: Path, steps: list[Step], refusals: list[str], current: list[str]
) -> None:
    if not path.exists():
        return
    try:
        with _read_only(path) as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            missing = _missing_schema(conn, version) if version <= STATE_SCHEMA_VERSION else []
    except sqlite3.DatabaseError as exc:
        refusals.append(f"state.db: {path} is not a readable SQLite database: {exc}")
        return
    if version > STATE_SCHEMA_VERSION:
        refusals.append(
            f"state.db: schema version {version} is newer than this parley's "
            f"({STATE_SCHEMA_VERSION}): upgrade parley"
        )
        return
    if missing:
        names = ", ".join(name for name, _ in missing)
        steps.append(
            Step(
                "state-repair",
                f"state.db: schema {version} lacks {names} (added to its migration later)",
            )
        )
    if version < STATE_SCHEMA_VERSION:
        steps.append(Step("state-schema", f"state.db: schema {version} → {STATE_SCHEMA_VERSION}"))
    elif not missing:
        current.append(f"state.db schema {version}")


def _reference(version: int) -> sqlite3.Connection:
    """An empty database as this parley's migrations 1..``version`` make it."""
    ref = sqlite3.connect(":memory:")
    for script in MIGRATIONS[:version]:
        ref.executescript(script)  # its own commits are harmless on a scratch database
    return ref


def _missing_schema(conn: sqlite3.Connection, version: int) -> list[tuple[str, str]]:
    """(name, DDL to add it) for each table, column or index that migrations
    1..``version`` create and ``conn`` lacks, in an order that applies cleanly."""
    ref = _reference(version)
    try:
        missing: list[tuple[str, str]] = []
        have = {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE sql IS NOT NULL")
        }
        objects = ref.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL "
            "ORDER BY type = 'index', rowid"  # tables first: indexes need their columns
        ).fetchall()
        for kind, name, table, sql in objects:
            if name not in have:
                missing.append((name if kind == "table" else f"index {name}", sql))
            elif kind == "table":
                ours = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')}
                for _, column, type_, notnull, default, _ in ref.execute(
                    f'PRAGMA table_info("{table}")'
                ):
                    if column in ours:
                        continue
                    ddl = f'ALTER TABLE "{table}" ADD COLUMN "{column}" {type_}'
                    if default is not None:
                        ddl += f" DEFAULT {default}" + (" NOT NULL" if notnull else "")
                    missing.append((f"{table}.{column}", ddl))
        return missing
    finally:
        ref.close()


def _survey_memory_db(
    path: Path, steps: list[Step], refusals: list[str], current: list[str]
) -> None:
    if not path.exists():
        return
    try:
        with _read_only(path) as conn:
            layout = max(1, int(conn.execute("PRAGMA user_version").fetchone()[0]))
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (META_KEY,)).fetchone()
    except sqlite3.DatabaseError:
        return  # not readable as an index at all: the memory check reports that
    if layout > MEMORY_STORE_VERSION:
        refusals.append(
            f"memory.db: layout version {layout} is newer than this parley's "
            f"({MEMORY_STORE_VERSION}): upgrade parley"
        )
        return
    if layout < MEMORY_STORE_VERSION:
        steps.append(Step("memory-store", f"memory.db: layout {layout} → {MEMORY_STORE_VERSION}"))
    try:
        version = int(json.loads(row[0])["schema"]) if row else None
    except (ValueError, KeyError, TypeError):
        version = None  # an unreadable meta row: the index rebuilds it at its next sync
    if version is None:
        return
    if version > MEMORY_SCHEMA_VERSION:
        refusals.append(
            f"memory.db: index schema {version} is newer than this parley's "
            f"({MEMORY_SCHEMA_VERSION}): upgrade parley"
        )
    elif version < MEMORY_SCHEMA_VERSION:
        steps.append(
            Step("memory-schema", f"memory.db: index schema {version} → {MEMORY_SCHEMA_VERSION}")
        )
    elif layout == MEMORY_STORE_VERSION:
        current.append(f"memory.db layout {layout}, index schema {version}")


def _survey_transcripts(sessions: Path, refusals: list[str], current: list[str]) -> None:
    # Only version 1 has ever been written; anything else came from a newer parley.
    if not sessions.is_dir():
        return
    newer: list[str] = []
    count = 0
    for path in sorted(sessions.glob("*.jsonl")):
        with path.open("rb") as f:
            first = f.readline()
        try:
            version = json.loads(first).get("version")
        except (ValueError, AttributeError):
            continue  # a torn or broken header is the transcripts check's finding
        count += 1
        if version != TRANSCRIPT_VERSION:
            newer.append(f"{path.name} (version {version})")
    if newer:
        refusals.append(
            f"transcripts: {', '.join(newer[:5])} not version {TRANSCRIPT_VERSION}, the one "
            "this parley reads: upgrade parley"
        )
    elif count:
        current.append(f"{count} transcripts version {TRANSCRIPT_VERSION}")


# -- backup --------------------------------------------------------------------------------


def backup(home: Path, extra: tuple[Path, ...] = (), now: datetime | None = None) -> Path:
    """Copy ``home`` (and ``extra`` files outside it) to ``home/backups/<UTC stamp>``,
    byte for byte, compared and fsynced; the directory appears only when complete."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    root = home / BACKUPS_DIR
    target = root / stamp
    n = 1
    while target.exists():
        n += 1
        target = root / f"{stamp}-{n}"
    partial = root / f".{target.name}.partial"
    try:
        root.mkdir(exist_ok=True)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        for source in _state_files(home):
            _copy(source, partial / source.relative_to(home))
        for source in extra:
            if source.exists():
                # Under its absolute path: two files outside the home may share a name.
                _copy(source, partial / "external" / source.absolute().relative_to("/"))
        for folder in sorted({p for p in partial.rglob("*") if p.is_dir()} | {partial}):
            _fsync_dir(folder)
        partial.rename(target)
        _fsync_dir(root)
    except OSError as exc:
        with contextlib.suppress(OSError):
            shutil.rmtree(partial)
        raise StateMigrationError(
            f"backing up {home} to {target} failed ({exc}): nothing was migrated"
        ) from exc
    return target


def _state_files(home: Path) -> Iterator[Path]:
    for entry in sorted(home.iterdir()):
        if entry.name in _NOT_BACKED_UP:
            continue
        if entry.is_dir() and not entry.is_symlink():
            yield from (p for p in sorted(entry.rglob("*")) if p.is_file())
        elif entry.is_file():
            yield entry


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with source.open("rb") as src, target.open("xb") as dst:
        while block := src.read(_COPY_BLOCK):
            digest.update(block)
            dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())
    shutil.copystat(source, target)
    if _sha256(target) != digest.hexdigest():
        raise OSError(f"{target} differs from {source} after copying")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_COPY_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- migrate -------------------------------------------------------------------------------


async def migrate(loaded: LoadedConfig, *, now: datetime | None = None) -> MigrationReport:
    """Back up, then upgrade what ``survey`` found. Nothing to do: no backup either."""
    import asyncio

    found = await asyncio.to_thread(survey, loaded)
    if found.refusals:
        raise StateMigrationError("; ".join(found.refusals) + ": nothing was migrated")
    if not found.steps:
        return MigrationReport(None, ())
    memory_db = _memory_db(loaded)
    outside = () if memory_db.is_relative_to(loaded.home) else (memory_db,)
    target = await asyncio.to_thread(backup, loaded.home, outside, now)
    done: list[str] = []
    for step in found.steps:
        if step.kind == "state-repair":
            await asyncio.to_thread(_repair_state_db, loaded.state_db)
        elif step.kind == "state-schema":
            # The gateway's own open migrates, one transaction per version.
            async with Database(loaded.state_db, fsync=True):
                pass
        elif step.kind == "memory-store":
            await _open_memory(loaded, rebuild=False)
        else:
            await _open_memory(loaded, rebuild=True)
        done.append(step.detail)
    return MigrationReport(target, tuple(done))


def _repair_state_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute("BEGIN IMMEDIATE")  # all of it or none of it
        try:
            for _, ddl in _missing_schema(conn, version):
                conn.execute(ddl)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


async def _open_memory(loaded: LoadedConfig, *, rebuild: bool) -> None:
    """The store's open upgrades the file's layout; a sync rebuilds the rows."""
    from parley.gateway.memory import build_memory_index

    index = build_memory_index(loaded)
    await index.open()
    try:
        if rebuild:
            # The stored meta's schema differs from the wanted one, so this is a full
            # rebuild into memory.db.reindex, renamed over memory.db when whole.
            await index.sync(reason="migration")
    finally:
        await index.close()
