"""Versioned schema migrations for the PostgreSQL backend.

Each entry migrates from version i to i + 1; never edit a released entry, append.
(One edit was made, and is safe: version 3 first also created pg_trgm, which nothing
uses; servers without it could not migrate. Databases that have it keep it.)
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

from parley.gateway.errors import SchemaTooNewError, StateError

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
    # 2: transcripts: each session's JSONL file as rows, byte for byte. The header line
    # is transcripts.header; entry lines are transcript_lines, seq being the line number
    # in the file (the header is line 1, so entries start at 2). line_count (header
    # included) is updated with each insert: the next seq, entry_count and a listing
    # stamp without counting rows. A compaction row's kept_seq is the seq of its first
    # kept entry, so opening finds the live window by index instead of by scanning.
    """
    CREATE TABLE transcripts (
        session_id TEXT PRIMARY KEY,
        header TEXT NOT NULL,
        created_at TEXT NOT NULL,
        line_count BIGINT NOT NULL DEFAULT 1 CHECK (line_count >= 1)
    );
    CREATE TABLE transcript_lines (
        session_id TEXT NOT NULL REFERENCES transcripts ON DELETE CASCADE,
        seq BIGINT NOT NULL CHECK (seq >= 2),
        kind TEXT NOT NULL,
        line TEXT NOT NULL,
        kept_seq BIGINT,
        PRIMARY KEY (session_id, seq)
    );
    CREATE INDEX transcript_compactions ON transcript_lines (session_id, seq)
        WHERE kind = 'compaction';
    """,
    # 3: long-term memory (memory.db's tables, issue 8): one row per index in
    # memory_indexes (an agent's live index, and the shadow a full rebuild fills), the
    # rest keyed by that row, so a rebuild becomes live by flipping two rows.
    """
    CREATE EXTENSION IF NOT EXISTS vector;

    -- FTS5's ``porter unicode61`` keeps stop words; PostgreSQL's english config drops
    -- them. The same stemmer without a stop list keeps queries of common words working
    -- and document lengths (BM25) comparable. Hyphenated compounds are not indexed
    -- whole: unicode61 splits them into their parts, and so do the part mappings.
    CREATE TEXT SEARCH DICTIONARY parley_english_stem (TEMPLATE = snowball, LANGUAGE = english);
    CREATE TEXT SEARCH CONFIGURATION parley_english (COPY = english);
    ALTER TEXT SEARCH CONFIGURATION parley_english
        ALTER MAPPING FOR asciiword, word, hword_asciipart, hword_part WITH parley_english_stem;
    ALTER TEXT SEARCH CONFIGURATION parley_english DROP MAPPING FOR asciihword, hword;

    -- The number of tokens a tsvector was made of (BM25's document length).
    CREATE FUNCTION parley_ts_tokens(tsvector) RETURNS integer
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
        RETURN (SELECT coalesce(sum(cardinality(positions)), 0)::integer FROM unnest($1));

    CREATE TABLE memory_indexes (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('live', 'shadow', 'retired')),
        meta TEXT,
        dims INTEGER,
        created_at DOUBLE PRECISION NOT NULL
    );
    CREATE UNIQUE INDEX memory_indexes_one_live ON memory_indexes (name) WHERE role = 'live';
    CREATE UNIQUE INDEX memory_indexes_one_shadow ON memory_indexes (name)
        WHERE role = 'shadow';

    CREATE TABLE memory_files (
        index_id BIGINT NOT NULL REFERENCES memory_indexes ON DELETE CASCADE,
        path TEXT NOT NULL,
        source TEXT NOT NULL DEFAULT 'memory',
        scope TEXT NOT NULL,
        hash TEXT NOT NULL,
        mtime DOUBLE PRECISION NOT NULL,
        size BIGINT NOT NULL,
        chunks INTEGER NOT NULL DEFAULT 0,
        vectors_pending BOOLEAN NOT NULL DEFAULT false,
        indexed_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (index_id, path)
    );

    -- ``embedding`` is an untyped vector: the width is known only once the embedder
    -- answers, and a rebuild for another model fills the same table beside the live
    -- index. Each width gets its own partial HNSW index on ``embedding::vector(n)``.
    CREATE TABLE memory_chunks (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        index_id BIGINT NOT NULL REFERENCES memory_indexes ON DELETE CASCADE,
        path TEXT NOT NULL,
        source TEXT NOT NULL,
        scope TEXT NOT NULL,
        start_line INTEGER NOT NULL,
        end_line INTEGER NOT NULL,
        hash TEXT NOT NULL,
        text TEXT NOT NULL,
        ts TEXT,
        entry_ids TEXT NOT NULL DEFAULT '[]',
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        tsv TSVECTOR NOT NULL,
        doc_len INTEGER NOT NULL,
        cjk_tsv TSVECTOR,
        cjk_len INTEGER NOT NULL DEFAULT 0,
        embedding VECTOR,
        dims INTEGER
    );
    CREATE INDEX memory_chunks_path ON memory_chunks (index_id, path);
    CREATE INDEX memory_chunks_scope ON memory_chunks (index_id, scope) INCLUDE (doc_len);
    CREATE INDEX memory_chunks_fts ON memory_chunks USING gin (tsv);
    CREATE INDEX memory_chunks_cjk ON memory_chunks USING gin (cjk_tsv)
        WHERE cjk_tsv IS NOT NULL;

    CREATE TABLE memory_embedding_cache (
        index_id BIGINT NOT NULL REFERENCES memory_indexes ON DELETE CASCADE,
        provider TEXT NOT NULL,
        model TEXT NOT NULL,
        provider_key TEXT NOT NULL,
        hash TEXT NOT NULL,
        embedding BYTEA NOT NULL,
        dims INTEGER NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (index_id, provider, model, provider_key, hash)
    );
    CREATE INDEX memory_embedding_cache_age ON memory_embedding_cache (index_id, updated_at);
    """,
    # 4: several replicas. ``session_key`` lets the replica holding a session's lock
    # find every open message of that session, whoever received it; ``claimed_by`` is
    # the backend pid of the session-lock connection of the replica answerable for the
    # item: when that pid is gone from pg_stat_activity, the replica died and another
    # one claims the item. NULL (rows copied from SQLite) counts as unclaimed.
    """
    ALTER TABLE inbox ADD COLUMN session_key TEXT;
    ALTER TABLE inbox ADD COLUMN claimed_by INTEGER;
    CREATE INDEX inbox_open_by_session ON inbox (session_key, id)
        WHERE status IN ('received', 'replied');
    """,
    # 5: forgetting (issue 9). Tombstones of evicted memory chunks and the index's
    # small state (when it last forgot), keyed by the index *name*, not its row: a
    # rebuild's shadow sees the same tombstones, and a promotion keeps them.
    """
    CREATE TABLE memory_forgotten (
        name TEXT NOT NULL,
        path TEXT NOT NULL,
        hash TEXT NOT NULL,
        scope TEXT NOT NULL,
        source TEXT NOT NULL,
        start_line INTEGER NOT NULL,
        end_line INTEGER NOT NULL,
        reason TEXT NOT NULL,
        evicted_at DOUBLE PRECISION NOT NULL,
        preview TEXT NOT NULL,
        PRIMARY KEY (name, path, hash)
    );
    CREATE INDEX memory_forgotten_when ON memory_forgotten (name, evicted_at);
    CREATE TABLE memory_state (
        name TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        PRIMARY KEY (name, key)
    );
    """,
    # 6: knowing what went out (state.db's migration 3): each stored reply's send mark
    # and the items it answers; the platform ids of every message sent.
    """
    ALTER TABLE inbox ADD COLUMN send_mark TEXT;
    ALTER TABLE inbox ADD COLUMN reply_for TEXT;
    CREATE TABLE sent_messages (
        channel TEXT NOT NULL,
        account TEXT NOT NULL,
        platform_message_id TEXT NOT NULL,
        inbox_id BIGINT NOT NULL,
        PRIMARY KEY (channel, account, platform_message_id)
    );
    CREATE INDEX sent_messages_by_item ON sent_messages (inbox_id);
    """,
    # 7: the last retention run on this database, whichever replica (or `parley
    # maintenance`) ran it: one row. The daily run of every other replica reads it and
    # skips when a run since that day's hour is recorded (gateway/retention/).
    """
    CREATE TABLE retention_last_run (
        only_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
        finished_at TEXT NOT NULL,
        record TEXT NOT NULL
    );
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
