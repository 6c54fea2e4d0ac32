"""state.db: one SQLite file (WAL) owned by one worker thread.

Every statement runs on that thread, so the event loop never blocks on SQLite and
the connection is never shared between threads. The schema is versioned with
``PRAGMA user_version`` and migrated forward at open; a database written by a newer
parley is refused rather than damaged.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from parley.gateway.errors import SchemaTooNewError, StateError
from parley.gateway.file_modes import owner_only_sqlite

log = logging.getLogger("parley.gateway.db")

T = TypeVar("T")

# Each entry migrates from version i to i + 1. Never edit a released entry: append.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        channel TEXT NOT NULL,
        account TEXT NOT NULL,
        chat_type TEXT NOT NULL,
        peer TEXT NOT NULL,
        parent_key TEXT,
        display_name TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('active', 'archived')),
        archived_reason TEXT,
        archived_at TEXT,
        model TEXT,
        settings TEXT NOT NULL DEFAULT '{}',
        last_route TEXT,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cache_read_tokens INTEGER NOT NULL DEFAULT 0,
        cache_write_tokens INTEGER NOT NULL DEFAULT 0,
        context_tokens INTEGER NOT NULL DEFAULT 0,
        compaction_count INTEGER NOT NULL DEFAULT 0,
        turn_count INTEGER NOT NULL DEFAULT 0,
        entry_count INTEGER NOT NULL DEFAULT 0,
        last_entry_id TEXT,
        delivery_error TEXT
    );
    CREATE UNIQUE INDEX sessions_one_active_per_key ON sessions (key) WHERE status = 'active';
    CREATE INDEX sessions_by_key ON sessions (key, created_at);
    CREATE INDEX sessions_by_update ON sessions (updated_at);

    CREATE TABLE inbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        channel TEXT NOT NULL,
        account TEXT NOT NULL,
        platform_message_id TEXT NOT NULL,
        received_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('received', 'replied', 'delivered', 'failed', 'rejected')),
        session_id TEXT,
        reply TEXT,
        error TEXT,
        UNIQUE (channel, account, platform_message_id)
    );
    CREATE INDEX inbox_open ON inbox (status, id) WHERE status IN ('received', 'replied');
    """,
    # 2: DM pairing (dm_policy = "pairing"): one row per person and channel; the
    # platform ids of the last delivered reply, on the session.
    """
    CREATE TABLE pairing (
        channel TEXT NOT NULL,
        sender_id TEXT NOT NULL,
        account TEXT NOT NULL,
        sender_name TEXT,
        code TEXT NOT NULL UNIQUE,
        status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        notified_at TEXT,
        decided_at TEXT,
        PRIMARY KEY (channel, sender_id)
    );
    ALTER TABLE sessions ADD COLUMN last_message_ids TEXT;
    """,
    # 3: knowing what went out (issue 19's send window). With each stored reply, the
    # channel's send mark and the items it answers together; the platform ids of every
    # message sent, written with the reply's final status, so a restart can tell the
    # bot's unrecorded messages (a send a kill cut off from its record) from the rest.
    """
    ALTER TABLE inbox ADD COLUMN send_mark TEXT;
    ALTER TABLE inbox ADD COLUMN reply_for TEXT;
    CREATE TABLE sent_messages (
        channel TEXT NOT NULL,
        account TEXT NOT NULL,
        platform_message_id TEXT NOT NULL,
        inbox_id INTEGER NOT NULL,
        PRIMARY KEY (channel, account, platform_message_id)
    ) WITHOUT ROWID;
    CREATE INDEX sent_messages_by_item ON sent_messages (inbox_id);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
# Columns a released migration gained after it had shipped (6661068 added
# last_message_ids to migration 2, which 9711123 had released without it): a database
# that ran the first form says version 2 but lacks them. Added on open when missing.
LATE_COLUMNS: tuple[tuple[str, str, str], ...] = (("sessions", "last_message_ids", "TEXT"),)


class Database:
    """Async facade over one SQLite connection living on a dedicated thread."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self._fsync = fsync
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    async def __aenter__(self) -> Database:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parley-db")
        try:
            await self.run(self._open_sync)
        except BaseException:
            self._executor.shutdown(wait=True)
            self._executor = None
            raise

    async def close(self) -> None:
        if self._executor is None:
            return
        try:
            await self.run(self._close_sync)
        finally:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the database thread (``fn`` may use ``self.conn``)."""
        if self._executor is None:
            raise StateError("state.db is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StateError("state.db is not open")
        return self._conn

    def _open_sync(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open {self.path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            if created:  # owner-only whatever the umask; its -wal and -shm follow its mode
                owner_only_sqlite(self.path)
            # NORMAL in WAL mode survives a killed process; FULL also survives power loss.
            conn.execute(f"PRAGMA synchronous={'FULL' if self._fsync else 'NORMAL'}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=5000")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{self.path} is not a readable SQLite database: {exc}") from exc
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"{self.path} has schema version {version}; this parley knows up to "
                f"{SCHEMA_VERSION}. Upgrade parley, or point PARLEY_HOME elsewhere."
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            log.info("migrating %s to schema version %s", self.path, target)
            try:
                conn.execute("BEGIN IMMEDIATE")
                for statement in _split_sql(MIGRATIONS[target - 1]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={target}")
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                conn.execute("ROLLBACK")
                raise StateError(
                    f"migrating {self.path} to version {target} failed: {exc}"
                ) from exc
        self._add_late_columns(conn)

    def _add_late_columns(self, conn: sqlite3.Connection) -> None:
        for table, column, kind in LATE_COLUMNS:
            present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if present and column not in present:
                log.info("adding %s.%s to %s", table, column, self.path)
                try:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                except sqlite3.Error as exc:
                    raise StateError(
                        f"adding {table}.{column} to {self.path} failed: {exc}"
                    ) from exc

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def integrity_check(self) -> list[str]:
        """Run on the db thread via ``run``; returns problems (empty when healthy)."""
        rows = self.conn.execute("PRAGMA integrity_check").fetchall()
        problems = [r[0] for r in rows if r[0] != "ok"]
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            problems.append(f"schema version {version}, expected {SCHEMA_VERSION}")
        return problems


def delete_rows_in(
    conn: sqlite3.Connection, table: str, column: str, values: list[Any], batch: int
) -> int:
    """Delete the rows whose ``column`` is one of ``values``, in one transaction, ``batch``
    at a time (SQLite bounds the parameters of one statement); how many went. ``table``
    and ``column`` are the caller's constants, never input. On the database thread."""
    deleted = 0
    conn.execute("BEGIN")
    try:
        for start in range(0, len(values), batch):
            chunk = values[start : start + batch]
            marks = ", ".join("?" * len(chunk))
            sql = f"DELETE FROM {table} WHERE {column} IN ({marks})"
            deleted += conn.execute(sql, chunk).rowcount
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return deleted


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit our transaction)."""
    return [s.strip() for s in script.split(";") if s.strip()]
