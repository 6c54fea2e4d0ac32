"""memory.db's layout: its tables, and the upgrades that bring an older file up to date.

``PRAGMA user_version`` holds the file's layout version (``STORE_VERSION``);
``create_tables`` makes a new file's tables and moves an older one forward by
``UPGRADES``. The layout version is not part of ``IndexMeta``: adding a table never
forces a rebuild of the rows.

Tables (one SQLite file per agent, WAL):

- ``meta(key, value)``: ``index`` holds the JSON ``IndexMeta`` the rows were built with
  (embedder, model, dimensions, chunking, tokenizer). A mismatch means a full reindex.
- ``files(path, source, scope, hash, mtime, size, chunks, vectors_pending, indexed_at)``.
- ``chunks(id, path, source, scope, start_line, end_line, hash, text, ts, entry_ids,
  created_at, updated_at)``.
- ``chunks_fts`` (FTS5, ``porter unicode61``) and ``chunks_cjk`` (FTS5 over CJK bigrams,
  which ``unicode61`` would otherwise keep as one token per run), rowid = chunk id.
- ``chunks_vec`` (sqlite-vec ``vec0``, cosine, ``scope`` partition key), rowid = chunk id;
  created once the embedder's width is known, absent in FTS-only mode.
- ``embedding_cache(provider, model, provider_key, hash, embedding, dims, updated_at)``,
  bounded at each write (``MemoryStore.cache_vectors``' ``max_entries``).
- ``forgotten(path, hash, scope, source, start_line, end_line, reason, evicted_at,
  preview)`` (file version 2): tombstones of evicted chunks, so a sync never indexes
  them again; a rebuild copies them into the new file.
"""

from __future__ import annotations

from typing import Any

# memory.db's table layout (PRAGMA user_version); 1 is the layout of issue 8.
STORE_VERSION = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY,
    source TEXT NOT NULL DEFAULT 'memory',
    scope TEXT NOT NULL,
    hash TEXT NOT NULL,
    mtime REAL NOT NULL,
    size INTEGER NOT NULL,
    chunks INTEGER NOT NULL DEFAULT 0,
    vectors_pending INTEGER NOT NULL DEFAULT 0,
    indexed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    source TEXT NOT NULL,
    scope TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    hash TEXT NOT NULL,
    text TEXT NOT NULL,
    ts TEXT,
    entry_ids TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_path ON chunks(path);
CREATE INDEX IF NOT EXISTS chunks_source ON chunks(source);
CREATE INDEX IF NOT EXISTS chunks_scope ON chunks(scope);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    text, tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_cjk USING fts5(text, tokenize = 'unicode61');
CREATE TABLE IF NOT EXISTS embedding_cache (
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    provider_key TEXT NOT NULL,
    hash TEXT NOT NULL,
    embedding BLOB NOT NULL,
    dims INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (provider, model, provider_key, hash)
);
CREATE INDEX IF NOT EXISTS embedding_cache_age ON embedding_cache(updated_at);
"""

# Version i + 1's statements, applied in order to files older than STORE_VERSION.
UPGRADES: dict[int, str] = {
    2: """
CREATE TABLE IF NOT EXISTS forgotten (
    path TEXT NOT NULL,
    hash TEXT NOT NULL,
    scope TEXT NOT NULL,
    source TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    reason TEXT NOT NULL,
    evicted_at REAL NOT NULL,
    preview TEXT NOT NULL,
    PRIMARY KEY (path, hash)
);
CREATE INDEX IF NOT EXISTS forgotten_when ON forgotten(evicted_at);
""",
    3: """
CREATE TABLE IF NOT EXISTS chunks_pending (id INTEGER PRIMARY KEY);
INSERT OR IGNORE INTO chunks_pending(id) SELECT c.id FROM chunks AS c
    JOIN files AS f ON f.path = c.path WHERE f.vectors_pending = 1;
CREATE INDEX IF NOT EXISTS chunks_path_line ON chunks(path, start_line);
""",
}


def create_tables(conn: Any) -> None:
    """Create what is missing of the layout on ``conn``, then upgrade it to
    ``STORE_VERSION`` (raises the driver's error when the file is unusable)."""
    conn.executescript(SCHEMA)
    _upgrade(conn)


def _upgrade(conn: Any) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == 0:
        version = 1  # created by SCHEMA just now, or by issue 8's parley: same layout
    for target in range(version + 1, STORE_VERSION + 1):
        # executescript commits first and runs each statement in autocommit: the
        # statements are IF NOT EXISTS, so a kill between them is repaired next open.
        conn.executescript(UPGRADES[target])
        conn.execute(f"PRAGMA user_version = {target}")
