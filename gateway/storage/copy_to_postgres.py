"""Copy a gateway's SQLite state into PostgreSQL: the engine of ``parley migrate --from
sqlite --to postgres`` (the command: gateway/cli/migrate.py).

What is copied, from $PARLEY_HOME into the database at ``--url`` (else ``[storage] url``
/ ``PARLEY_DATABASE_URL``): state.db's sessions (active and archived), pairing and
inbox rows, column for column and with the inbox's ids; every JSONL transcript line for
line through ``insert_line``, so line numbers and ``kept_seq`` are what the PostgreSQL
transcript store would have written and an export gives the file's bytes back; and
memory.db (files, chunks with their vectors, the embedding cache), nothing re-embedded.

Re-running is safe and is how an interrupted copy is finished: rows already there are
skipped (``ON CONFLICT DO NOTHING``), a transcript resumes after its last stored line
(each batch of lines is one transaction, and ``insert_line`` refuses a gap or a
duplicate), and a memory file is rewritten, in one transaction, only when the target
does not hold it exactly. The source is only read. Afterwards every count is compared,
source against target (``Report``); the command exits 1 on any difference.

All the work runs on one worker thread (SQLite connections belong to their thread); the
event loop only opens and closes the pool.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from parley.core.errors import CoreError
from parley.core.transcript import ENTRY_COMPACTION, TranscriptHeader, parse_entry_or_none
from parley.core.transcript_store import FileTranscriptStore, TranscriptInfo
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import StateError
from parley.gateway.storage.sqlite.database import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION

if TYPE_CHECKING:
    from parley.core.memory.rows import CacheEntry, FileRow, StoredChunk
    from parley.core.memory.store import MemoryStore
    from parley.gateway.storage.postgres.database import Connection, PgDatabase
    from parley.gateway.storage.postgres.memory.store import PgMemoryStore
    from parley.gateway.storage.postgres.memory.vectors import VectorIndex

# Rows (or transcript lines) per target transaction: few round trips of commits, and
# a kill loses at most one batch, which the next run writes again.
BATCH = 500

# state.db's tables: the key that says "this row is there" and its PostgreSQL types.
TABLES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("sessions", ("session_id",), ("text",)),
    ("pairing", ("channel", "sender_id"), ("text", "text")),
    ("inbox", ("id",), ("bigint",)),
    ("sent_messages", ("channel", "account", "platform_message_id"), ("text", "text", "text")),
)


@dataclass(slots=True)
class Count:
    what: str
    source: int
    target: int
    copied: int = 0

    @property
    def ok(self) -> bool:
        return self.source == self.target


@dataclass(slots=True)
class Report:
    counts: list[Count] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(c.ok for c in self.counts)


class Migration:
    """One run: copy (unless ``dry_run``), then count. Synchronous: a worker thread.

    ``memory_db`` is memory.db's path (``gateway.memory.memory_db_path``), given by the
    caller: storage sits below the memory wiring and does not import it."""

    def __init__(
        self,
        loaded: LoadedConfig,
        pg: PgDatabase,
        *,
        memory_db: Path,
        other_memory: Sequence[tuple[str, Path]] = (),
        dry_run: bool = False,
        vector_index: VectorIndex = "hnsw",
        out: TextIO = sys.stdout,
    ) -> None:
        """``other_memory``: each other agent's id and memory.db (``[[agents]]``); each
        is copied to that agent's index."""
        self.loaded = loaded
        self.pg = pg
        self.memory_db = memory_db
        self.other_memory = tuple(other_memory)
        self.dry_run = dry_run
        self.vector_index: VectorIndex = vector_index
        self.out = out
        self.report = Report()

    def run(self) -> Report:
        conn = _open_state(self.loaded.state_db)
        try:
            self._refuse_foreign_state(conn)
            for table, keys, types in TABLES:
                self._section(table, self._table, conn, table, keys, types)
        finally:
            conn.close()
        self._section("transcripts", self._transcripts)
        self._section("memory", self._memory)
        return self.report

    def _refuse_foreign_state(self, conn: sqlite3.Connection) -> None:
        """A target holding sessions this state does not have belongs to another bot
        (or holds newer work): copying into it would mix two bots, and its counts could
        never match. Refused before anything is written; a re-run after a partial copy
        finds only sessions of its own and goes on."""
        ours = {row[0] for row in conn.execute("SELECT session_id FROM sessions")}

        def target_ids(pg_conn: Connection) -> set[str]:
            found = pg_conn.execute("SELECT to_regclass('sessions') AS t").fetchone()
            if found is None or found["t"] is None:
                return set()  # a dry run on a database without the schema yet
            rows = pg_conn.execute("SELECT session_id FROM sessions").fetchall()
            return {row["session_id"] for row in rows}

        foreign = sorted(self.pg.call(target_ids) - ours)
        if foreign:
            raise StateError(
                f"the target database already holds {len(foreign)} session(s) that are "
                f"not in {self.loaded.state_db} (e.g. {foreign[0][:12]}): it is another "
                "bot's, or used after an earlier copy. Migrate into an empty database."
            )

    def _section(self, name: str, fn: Callable[..., None], *args: Any) -> None:
        """Run one part; a failure is reported and the other parts still run (a re-run
        finishes what this one could not)."""
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            fn(*args)
        except (psycopg.Error, PoolTimeout, sqlite3.Error, CoreError, StateError) as exc:
            self.report.problems.append(f"{name}: {exc}")

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # -- state.db tables -----------------------------------------------------------------

    def _table(
        self, conn: sqlite3.Connection, table: str, keys: Sequence[str], types: Sequence[str]
    ) -> None:
        order = ", ".join(keys)
        cursor = conn.execute(f"SELECT * FROM {table} ORDER BY {order}")
        columns = [d[0] for d in cursor.description]
        present = self.pg.call(_columns, table)
        if present and (missing := [c for c in columns if c not in present]):
            self.report.problems.append(f"{table}: the target lacks column(s) {missing}")
            return
        key_at = [columns.index(k) for k in keys]
        source = target = copied = 0
        while rows := cursor.fetchmany(BATCH):
            source += len(rows)
            if not self.dry_run:
                copied += self._insert(table, columns, [tuple(r) for r in rows], key_at)
            if present or not self.dry_run:
                key_rows = [tuple(r[i] for i in key_at) for r in rows]
                target += self.pg.call(_count_present, table, keys, types, key_rows)
        if table == "inbox" and not self.dry_run:
            # Copied ids were given explicitly: move the identity past them, or the next
            # message recorded in PostgreSQL would collide with a migrated one.
            self.pg.call(_advance_inbox_identity)
        self.report.counts.append(Count(table, source, target, copied))
        if not self.dry_run:
            self._say(f"{table}: {copied} copied, {source - copied} already there")

    def _insert(
        self, table: str, columns: list[str], rows: list[tuple[Any, ...]], key_at: list[int]
    ) -> int:
        """Rows inserted; a batch the target refuses is retried row by row, so one bad
        row (a NUL, say, which PostgreSQL text cannot hold) costs only itself."""
        import psycopg

        try:
            return self.pg.call(_insert_rows, table, columns, rows)
        except psycopg.DataError:
            pass
        inserted = 0
        for row in rows:
            try:
                inserted += self.pg.call(_insert_rows, table, columns, [row])
            except psycopg.DataError as exc:
                key = ", ".join(str(row[i]) for i in key_at)
                self.report.problems.append(f"{table}: row ({key}) not copied: {exc}")
        return inserted

    # -- transcripts ---------------------------------------------------------------------

    def _transcripts(self) -> None:
        import psycopg
        from psycopg_pool import PoolTimeout

        store = FileTranscriptStore(self.loaded.sessions_dir)
        infos = store.list_transcripts()
        have_table = self.pg.call(_columns, "transcript_lines") != []
        sessions = Count("transcripts", len(infos), 0)
        lines = Count("transcript lines", 0, 0)
        for info in infos:
            try:
                done = self._transcript(store, info, have_table)
            except (CoreError, StateError, ValueError, psycopg.Error, PoolTimeout) as exc:
                self.report.problems.append(f"transcript {info.session_id}: {exc}")
                continue
            source_lines, target_lines, copied = done
            lines.source += source_lines
            lines.target += target_lines
            lines.copied += copied
            if copied:
                sessions.copied += 1
            if target_lines == source_lines:
                sessions.target += 1
            elif not self.dry_run:
                self.report.problems.append(
                    f"transcript {info.session_id}: {source_lines} line(s) in the file, "
                    f"{target_lines} in the target"
                )
        self.report.counts += [sessions, lines]
        if not self.dry_run:
            self._say(
                f"transcripts: {lines.copied} line(s) copied into {sessions.copied} transcript(s)"
            )

    def _transcript(
        self, store: FileTranscriptStore, info: TranscriptInfo, have_table: bool
    ) -> tuple[int, int, int]:
        """(lines in the file, lines in the target, lines copied now), header included."""
        sid = info.session_id
        state = self.pg.call(_transcript_state, sid) if have_table else None
        stored = 0 if state is None else state.line_count
        # Read-only: a torn last line is left alone and not copied, as an export would.
        with store.open(sid, read_only=True) as transcript:
            raw = transcript.raw_lines()
            header_line = _text(next(raw), 1)
            if state is not None and state.header != header_line:
                raise StateError("the target holds another transcript under this id")
            if state is None and not self.dry_run:
                created = TranscriptHeader.from_json(header_line.encode("utf-8")).created
                self.pg.call(_insert_header, sid, header_line, created)
                stored = 1
            ids: dict[str, int] = {}  # entry id -> seq, for each compaction's kept_seq
            pending: list[tuple[int, str, str, int | None]] = []
            total, copied = 1, 0
            for seq, raw_line in enumerate(raw, start=2):
                total = seq
                line = _text(raw_line, seq)
                entry = parse_entry_or_none(line)
                kind, kept = "corrupt", None  # a corrupt line keeps its slot, as in files
                if entry is not None:
                    kind = entry.type
                    first = entry.payload.get("first_kept_entry_id")
                    if kind == ENTRY_COMPACTION and first is not None:
                        kept = ids.get(first)  # the latest line with that id, as files find
                    ids[entry.id] = seq
                if seq < stored:
                    continue
                if seq == stored:  # the last line already there must be this one
                    if state is not None and state.last_line != line:
                        raise StateError(f"line {seq} differs in the target; not resuming")
                    continue
                if self.dry_run:
                    copied += 1
                    continue
                pending.append((seq, kind, line, kept))
                if len(pending) >= BATCH:
                    copied += self._flush_lines(sid, pending)
            if pending:
                copied += self._flush_lines(sid, pending)
        if self.dry_run:
            return total, stored, copied
        return total, self.pg.call(_stored_lines, sid), copied

    def _flush_lines(self, sid: str, pending: list[tuple[int, str, str, int | None]]) -> int:
        from parley.gateway.storage.postgres.transcripts import insert_line

        def write(conn: Connection) -> None:
            for seq, kind, line, kept in pending:
                insert_line(conn, sid, seq, kind, line, kept)

        self.pg.call(write)
        count = len(pending)
        pending.clear()
        return count

    # -- memory --------------------------------------------------------------------------

    def _memory(self) -> None:
        self._agent_memory(self.loaded.config.agent.id, self.memory_db, "memory")
        for agent, path in self.other_memory:
            self._agent_memory(agent, path, f"memory ({agent})")

    def _agent_memory(self, agent: str, path: Path, label: str) -> None:
        from parley.core.memory.store import MemoryStore

        if not path.is_file():
            self._say(f"{label}: {path} does not exist; nothing to copy")
            return
        source = MemoryStore.open(path, driver=self.loaded.config.memory.driver, vector=True)
        try:
            target = self._memory_target(agent)
            if target is not None and not self.dry_run:
                self._copy_memory(source, target)
            # A dry run against a database without the index counts zeros there.
            self._memory_counts(source, target, label)
        finally:
            source.close()

    def _memory_target(self, name: str) -> PgMemoryStore | None:
        from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
        from parley.gateway.storage.postgres.memory.base import LIVE

        if self.dry_run:
            exists = self.pg.call(_live_index_exists, name, LIVE)
            if not exists:
                return None
        backend = PgMemoryBackend(self.pg, name, vector_index=self.vector_index)
        return backend.open_live(vector=True)

    def _copy_memory(self, source: MemoryStore, target: PgMemoryStore) -> None:
        from parley.core.errors import MemoryIndexError

        meta, current = source.meta(), target.meta()
        if current is not None and meta is not None and current != meta and target.files():
            raise MemoryIndexError(
                "the target's memory index was built with other settings "
                f"({current.embedder}/{current.model}); drop it or reindex the source first"
            )
        if meta is not None and current != meta:
            target.set_meta(meta)
        dims = source.vector_dims
        if dims is not None and not target.info.vector_available:
            raise MemoryIndexError(f"the target cannot hold vectors: {target.info.vector_error}")
        held = self.pg.call(_memory_files_held, target)
        copied = 0
        for file in source.files().values():
            chunks = source.stored_chunks(file.path)
            vectors = sum(c.vector is not None for c in chunks)
            if held.get(file.path) == _file_signature(file, len(chunks), vectors):
                continue
            self.pg.call(_write_memory_file, target, file, chunks)
            copied += 1
        if dims is not None:
            # After the rows: an HNSW index is built once over them, not grown per row.
            target.ensure_vectors(dims)
        cached = 0
        for batch in source.cache_entries():
            cached += self.pg.call(_insert_cache, target, batch)
        # What forgetting evicted stays forgotten: without its tombstones the target's
        # next sync would index those transcript chunks again.
        tombstones = source.tombstones()
        target.add_tombstones(tombstones)
        self._say(
            f"memory: {copied} file(s) copied, {cached} cache entr(ies) added, "
            f"{len(tombstones)} eviction(s) carried over"
        )

    def _memory_counts(
        self, source: MemoryStore, target: PgMemoryStore | None, label: str = "memory"
    ) -> None:
        src = source.counts()
        tgt = target.counts() if target is not None else None
        for what, attr in (
            (f"{label} files", "files"),
            (f"{label} chunks", "chunks"),
            (f"{label} vectors", "vectors"),
            (f"{label} cache", "cache_entries"),
        ):
            self.report.counts.append(
                Count(what, getattr(src, attr), getattr(tgt, attr) if tgt else 0)
            )


# -- the source ------------------------------------------------------------------------------


def _open_state(path: Path) -> sqlite3.Connection:
    """state.db for reading only. Not ``mode=ro``: a read-only connection to a WAL
    database leaves its -wal and -shm files behind, where the last ordinary connection
    removes them on close; ``query_only`` refuses any write instead."""
    try:
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA query_only = ON")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.Error as exc:
        raise StateError(f"cannot read {path}: {exc}") from exc
    if version != SQLITE_SCHEMA_VERSION:
        conn.close()
        fix = (
            "run `parley db migrate` with the SQLite backend first"
            if version < SQLITE_SCHEMA_VERSION
            else "upgrade parley first"
        )
        raise StateError(
            f"{path} has schema version {version}, this parley expects "
            f"{SQLITE_SCHEMA_VERSION}: {fix}"
        )
    return conn


def _text(raw: bytes, seq: int) -> str:
    """A transcript line as PostgreSQL text, or ValueError: the copy must be exact."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"line {seq} is not UTF-8; PostgreSQL cannot store it as is") from None
    if "\x00" in line:
        raise ValueError(f"line {seq} holds a NUL character; PostgreSQL text cannot")
    return line


def _file_signature(file: FileRow, chunks: int, vectors: int) -> tuple[Any, ...]:
    """What says a memory file is in the target exactly as in the source."""
    return (file.hash, file.indexed_at, file.vectors_pending, file.chunks, chunks, vectors)


# -- statements (each ``fn(conn, ...)`` runs in one PgDatabase.call transaction) -----------


def _columns(conn: Connection, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    ).fetchall()
    return [r["column_name"] for r in rows]


def _insert_rows(
    conn: Connection, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
) -> int:
    names = ", ".join(columns)
    marks = ", ".join(["%s"] * len(columns))
    # The inbox's id is an identity column: keep the source's ids (replies refer to them).
    override = " OVERRIDING SYSTEM VALUE" if "id" in columns else ""
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} ({names}){override} VALUES ({marks}) ON CONFLICT DO NOTHING",
            rows,
        )
        return max(cur.rowcount, 0)  # summed over the rows: those really inserted


def _count_present(
    conn: Connection,
    table: str,
    keys: Sequence[str],
    types: Sequence[str],
    key_rows: list[tuple[Any, ...]],
) -> int:
    arrays = [list(column) for column in zip(*key_rows, strict=True)] if key_rows else []
    if not arrays:
        return 0
    unnest = ", ".join(f"%s::{t}[]" for t in types)
    names = ", ".join(f"k{i}" for i in range(len(keys)))
    join = " AND ".join(f"t.{k} = u.k{i}" for i, k in enumerate(keys))
    row = conn.execute(
        f"SELECT count(*) AS n FROM {table} t JOIN unnest({unnest}) AS u({names}) ON {join}",
        arrays,
    ).fetchone()
    return int(row["n"]) if row else 0


def _advance_inbox_identity(conn: Connection) -> None:
    conn.execute(
        "SELECT setval(pg_get_serial_sequence('inbox', 'id'),"
        " coalesce((SELECT max(id) FROM inbox), 1), (SELECT count(*) > 0 FROM inbox))"
    )


@dataclass(frozen=True, slots=True)
class _TranscriptState:
    header: str
    line_count: int
    last_line: str | None


def _transcript_state(conn: Connection, session_id: str) -> _TranscriptState | None:
    head = conn.execute(
        "SELECT header, line_count FROM transcripts WHERE session_id = %s", (session_id,)
    ).fetchone()
    if head is None:
        return None
    last = conn.execute(
        "SELECT line FROM transcript_lines WHERE session_id = %s AND seq = %s",
        (session_id, head["line_count"]),
    ).fetchone()
    last_line = last["line"] if last is not None else None
    return _TranscriptState(head["header"], int(head["line_count"]), last_line)


def _insert_header(conn: Connection, session_id: str, header: str, created: str) -> None:
    # line_count starts at 1 (the header); insert_line advances it with each line.
    conn.execute(
        "INSERT INTO transcripts (session_id, header, created_at) VALUES (%s, %s, %s)"
        " ON CONFLICT (session_id) DO NOTHING",
        (session_id, header, created),
    )


def _stored_lines(conn: Connection, session_id: str) -> int:
    """Lines really stored (header included): rows, not the counter, so a hole shows."""
    row = conn.execute(
        "SELECT 1 + count(*) AS n FROM transcript_lines WHERE session_id = %s", (session_id,)
    ).fetchone()
    return int(row["n"]) if row else 0


def _live_index_exists(conn: Connection, name: str, role: str) -> bool:
    if not _columns(conn, "memory_indexes"):
        return False
    row = conn.execute(
        "SELECT 1 AS x FROM memory_indexes WHERE name = %s AND role = %s", (name, role)
    ).fetchone()
    return row is not None


def _index_id(conn: Connection, target: PgMemoryStore) -> int:
    row = conn.execute(
        "SELECT id FROM memory_indexes WHERE name = %s AND role = %s FOR SHARE",
        (target.name, target.role),
    ).fetchone()
    if row is None:
        raise StateError(f"memory index {target.name!r} vanished during the migration")
    return int(row["id"])


def _memory_files_held(conn: Connection, target: PgMemoryStore) -> dict[str, tuple[Any, ...]]:
    ix = _index_id(conn, target)
    rows = conn.execute(
        "SELECT f.path, f.hash, f.indexed_at, f.vectors_pending, f.chunks,"
        " count(c.id) AS found, count(c.embedding) AS vectors FROM memory_files f"
        " LEFT JOIN memory_chunks c ON c.index_id = f.index_id AND c.path = f.path"
        " WHERE f.index_id = %s"
        " GROUP BY f.path, f.hash, f.indexed_at, f.vectors_pending, f.chunks",
        (ix,),
    ).fetchall()
    return {
        r["path"]: (
            r["hash"],
            float(r["indexed_at"]),
            bool(r["vectors_pending"]),
            int(r["chunks"]),
            int(r["found"]),
            int(r["vectors"]),
        )
        for r in rows
    }


def _write_memory_file(
    conn: Connection, target: PgMemoryStore, file: FileRow, chunks: list[StoredChunk]
) -> None:
    """A file and its chunks as they are in the source (times and all), in one
    transaction: a kill leaves the file either absent, as it was, or complete."""
    from parley.gateway.storage.postgres.memory.chunks import write_stored_file

    write_stored_file(conn, _index_id(conn, target), file, chunks)


def _insert_cache(conn: Connection, target: PgMemoryStore, batch: Sequence[CacheEntry]) -> int:
    ix = _index_id(conn, target)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO memory_embedding_cache (index_id, provider, model, provider_key,"
            " hash, embedding, dims, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            [
                (ix, e.provider, e.model, e.provider_key, e.hash, e.embedding, e.dims, e.updated_at)
                for e in batch
            ],
        )
        return max(cur.rowcount, 0)
