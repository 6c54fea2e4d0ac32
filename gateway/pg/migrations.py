"""Versioned schema migrations for the PostgreSQL backend.

Each entry migrates from version i to i + 1; never edit a released entry, append.
Applied at start (and by ``parley db migrate``) inside one transaction that first
takes a transaction-level advisory lock, so replicas starting at once apply each
migration exactly once: the others wait, then find it applied. A database migrated
by a newer parley is refused, not damaged.

Tables mirror state.db's columns and value formats (timestamps as ISO-8601 text in
UTC, JSON as text), so both backends share their row readers, and moving data
between them (``parley migrate``) copies values unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from gateway.errors import SchemaTooNewError, StateError

log = logging.getLogger("parley.gateway.pg")

# pg_advisory_xact_lock key for migrations: "parley" in ASCII, any constant will do.
MIGRATION_LOCK_KEY = 0x7061726C6579

MIGRATIONS: tuple[str, ...] = (
    # 1: sessions, DM pairing and the inbox (state.db's tables).
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
        input_tokens BIGINT NOT NULL DEFAULT 0,
        output_tokens BIGINT NOT NULL DEFAULT 0,
        cache_read_tokens BIGINT NOT NULL DEFAULT 0,
        cache_write_tokens BIGINT NOT NULL DEFAULT 0,
        context_tokens BIGINT NOT NULL DEFAULT 0,
        compaction_count BIGINT NOT NULL DEFAULT 0,
        turn_count BIGINT NOT NULL DEFAULT 0,
        entry_count BIGINT NOT NULL DEFAULT 0,
        last_entry_id TEXT,
        delivery_error TEXT,
        last_message_ids TEXT
    );
    CREATE UNIQUE INDEX sessions_one_active_per_key ON sessions (key) WHERE status = 'active';
    CREATE INDEX sessions_by_key ON sessions (key, created_at);
    CREATE INDEX sessions_by_update ON sessions (updated_at);

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

    CREATE TABLE inbox (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
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
    CREATE INDEX inbox_by_channel ON inbox (channel, id);
    """,
    # 2: transcripts: the JSONL file of each session as rows, one per line, in order.
    """
    CREATE TABLE transcripts (
        session_id TEXT PRIMARY KEY,
        header TEXT NOT NULL,
        created_at TEXT NOT NULL,
        line_count BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE transcript_lines (
        session_id TEXT NOT NULL REFERENCES transcripts ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        kind TEXT NOT NULL,
        line TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE INDEX transcript_compactions ON transcript_lines (session_id, seq)
        WHERE kind = 'compaction';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The applied version (0 for an empty database)."""
    exists = conn.execute("SELECT to_regclass('parley_schema') IS NOT NULL AS e").fetchone()
    if not _first(exists):
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) AS v FROM parley_schema").fetchone()
    return int(_first(row) or 0)


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Bring the schema to ``SCHEMA_VERSION``; the versions applied now (often none)."""
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS parley_schema ("
            " version INTEGER PRIMARY KEY,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"the database has schema version {current}; this parley knows up to "
                f"{SCHEMA_VERSION}. Upgrade parley (every replica)."
            )
        applied = []
        for target in range(current + 1, SCHEMA_VERSION + 1):
            log.info("migrating PostgreSQL to schema version %s", target)
            conn.execute(MIGRATIONS[target - 1])  # no parameters: several statements run
            conn.execute("INSERT INTO parley_schema (version) VALUES (%s)", (target,))
            applied.append(target)
        return applied
    except psycopg.Error as exc:
        raise StateError(f"migrating PostgreSQL failed: {exc}") from exc


def _first(row: Any) -> Any:
    if row is None:
        return None
    return next(iter(row.values())) if isinstance(row, dict) else row[0]
