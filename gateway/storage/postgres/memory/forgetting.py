"""``PgMemoryStore``'s forgetting: index state, evicting chunks, and the tombstones
that keep an evicted chunk from coming back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parley.core.memory.rows import ForgettableChunk, Tombstone
from parley.gateway.storage.postgres.database import Connection
from parley.gateway.storage.postgres.memory.base import StoreBase


class ForgettingMethods(StoreBase):
    """Tombstones and state belong to the index name (migration 5): live and shadow
    share them, so a rebuild never brings an evicted chunk back."""

    def state(self, key: str) -> str | None:
        row = self._call(
            lambda conn: conn.execute(
                "SELECT value FROM memory_state WHERE name = %s AND key = %s", (self.name, key)
            ).fetchone()
        )
        return None if row is None else str(row["value"])

    def states(self, prefix: str) -> dict[str, str]:
        """Every state value whose key starts with ``prefix`` (e.g. the kept sources)."""
        rows = self._call(
            lambda conn: conn.execute(
                "SELECT key, value FROM memory_state WHERE name = %s AND left(key, %s) = %s",
                (self.name, len(prefix), prefix),
            ).fetchall()
        )
        return {str(r["key"]): str(r["value"]) for r in rows}

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
