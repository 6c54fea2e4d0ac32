"""The session registry in the shared PostgreSQL: ``SessionRegistry``'s API and rules.

A key still has at most one active session, now across every replica: the partial
unique index ``sessions_one_active_per_key`` decides a race between two replicas
creating it, and the loser reads the winner's row. Timestamps are ISO-8601 text, as in
state.db; comparisons and orderings on them use the "C" collation so they stay
bytewise (SQLite's) whatever the database's locale is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from parley.core.messages import Usage
from parley.gateway.errors import StateError
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.sessions import (
    SESSION_COLUMNS,
    SessionOrigin,
    SessionPage,
    SessionRecord,
    new_session_id,
    page_limit,
    session_page,
    split_cursor,
    utcnow,
)

# A winner may archive its new session before the loser reads it; then the loser tries
# again. More rounds than this means something keeps archiving: give up loudly.
CREATE_ATTEMPTS = 5


class PgSessionRegistry:
    """Session rows in PostgreSQL; every statement runs on a pool thread."""

    def __init__(self, db: PgDatabase) -> None:
        self._db = db

    async def get(self, session_id: str) -> SessionRecord | None:
        return await self._db.run(_get, session_id)

    async def get_active(self, key: str) -> SessionRecord | None:
        return await self._db.run(_get_active, key)

    async def find(self, key_or_id: str) -> SessionRecord | None:
        """The session with this id, else the active (or latest) session for this key."""
        return await self._db.run(_find, key_or_id)

    async def create(
        self,
        origin: SessionOrigin,
        *,
        settings: dict[str, Any] | None = None,
        model: str | None = None,
        now: datetime | None = None,
    ) -> SessionRecord:
        return await self._db.run(_create, origin, settings or {}, model, now or utcnow())

    async def archive(self, session_id: str, reason: str, now: datetime | None = None) -> None:
        await self._db.run(_archive, session_id, reason, now or utcnow())

    async def record_turn(
        self,
        session_id: str,
        *,
        usage: Usage,
        context_tokens: int,
        entry_count: int,
        last_entry_id: str | None,
        model: str | None,
        now: datetime | None = None,
        compactions: int = 0,
    ) -> None:
        await self._db.run(
            _record_turn,
            session_id,
            usage,
            compactions,
            context_tokens,
            entry_count,
            last_entry_id,
            model,
            now or utcnow(),
        )

    async def record_compaction(
        self,
        session_id: str,
        *,
        compactions: int,
        usage: Usage,
        context_tokens: int | None,
        entry_count: int,
        last_entry_id: str | None,
    ) -> None:
        """A compaction outside a turn (``/compact``): its count, cost and the new size."""
        await self._db.run(
            _record_compaction,
            session_id,
            compactions,
            usage,
            context_tokens,
            entry_count,
            last_entry_id,
        )

    async def record_entries(
        self, session_id: str, entry_count: int, last_entry_id: str | None
    ) -> None:
        await self._db.run(
            _execute,
            "UPDATE sessions SET entry_count = %s, last_entry_id = %s WHERE session_id = %s",
            (entry_count, last_entry_id, session_id),
        )

    async def record_delivery(
        self,
        session_id: str,
        route: dict[str, Any],
        error: str | None,
        *,
        entry_count: int,
        last_entry_id: str | None,
        message_ids: Sequence[str] = (),
    ) -> None:
        """The delivery result and the transcript's new tail, in one write."""
        await self._db.run(
            _execute,
            "UPDATE sessions SET last_route = %s, delivery_error = %s, entry_count = %s,"
            " last_entry_id = %s, last_message_ids = %s WHERE session_id = %s",
            (
                json.dumps(route),
                error,
                entry_count,
                last_entry_id,
                json.dumps(list(message_ids)),
                session_id,
            ),
        )

    async def update_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        await self._db.run(
            _execute,
            "UPDATE sessions SET settings = %s WHERE session_id = %s",
            (json.dumps(settings), session_id),
        )

    async def list(
        self,
        *,
        status: str | None = None,
        channel: str | None = None,
        agent_id: str | None = None,
        query: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        return await self._db.run(
            _list, status, channel, agent_id, query, page_limit(limit), cursor
        )

    async def delete(self, session_ids: Sequence[str]) -> int:
        """Delete these sessions' rows, active or archived (``parley people erase``,
        gateway stopped); how many there were."""
        return await self._db.run(_delete, list(session_ids))


# -- on a pool thread, inside the caller's transaction ------------------------------------


def _execute(conn: Connection, sql: str, params: Sequence[Any]) -> None:
    conn.execute(sql, params)


def _delete(conn: Connection, session_ids: list[str]) -> int:
    if not session_ids:
        return 0
    return conn.execute("DELETE FROM sessions WHERE session_id = ANY(%s)", (session_ids,)).rowcount


def _one(conn: Connection, sql: str, params: Sequence[Any]) -> SessionRecord | None:
    row = conn.execute(sql, params).fetchone()
    return SessionRecord.from_row(row) if row else None


def _get(conn: Connection, session_id: str) -> SessionRecord | None:
    return _one(
        conn, f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = %s", (session_id,)
    )


def _get_active(conn: Connection, key: str) -> SessionRecord | None:
    return _one(
        conn, f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = %s AND status = 'active'", (key,)
    )


def _find(conn: Connection, key_or_id: str) -> SessionRecord | None:
    found = _get(conn, key_or_id) or _get_active(conn, key_or_id)
    if found:
        return found
    return _one(
        conn,
        f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = %s"
        ' ORDER BY created_at COLLATE "C" DESC LIMIT 1',
        (key_or_id,),
    )


def _create(
    conn: Connection,
    origin: SessionOrigin,
    settings: dict[str, Any],
    model: str | None,
    now: datetime,
) -> SessionRecord:
    for _ in range(CREATE_ATTEMPTS):
        created = _insert_active(conn, origin, settings, model, now)
        if created is not None:
            return created
        # Another replica (or caller) holds the active session for this key: use theirs.
        # A new statement sees what they committed while the insert waited on them.
        existing = _get_active(conn, origin.key)
        if existing is not None:
            return existing
    raise StateError(f"could not create or find the active session for {origin.key!r}")


def _insert_active(
    conn: Connection,
    origin: SessionOrigin,
    settings: dict[str, Any],
    model: str | None,
    now: datetime,
) -> SessionRecord | None:
    """The new active session, or None when the key already has one. ON CONFLICT keeps
    the race from raising (and from aborting the transaction): a concurrent insert for
    the same key waits for the first to commit, then does nothing."""
    stamp = now.isoformat()
    return _one(
        conn,
        "INSERT INTO sessions (session_id, key, agent_id, channel, account, chat_type,"
        " peer, parent_key, display_name, created_at, updated_at, status, model, settings)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 'active', %s, %s)"
        " ON CONFLICT (key) WHERE status = 'active' DO NOTHING"
        f" RETURNING {SESSION_COLUMNS}",
        (
            new_session_id(),
            origin.key,
            origin.agent_id,
            origin.channel,
            origin.account,
            origin.chat_type,
            origin.peer,
            origin.parent_key,
            origin.display_name,
            stamp,
            stamp,
            model,
            json.dumps(settings),
        ),
    )


def _archive(conn: Connection, session_id: str, reason: str, now: datetime) -> None:
    conn.execute(
        "UPDATE sessions SET status = 'archived', archived_reason = %s, archived_at = %s"
        " WHERE session_id = %s AND status = 'active'",
        (reason, now.isoformat(), session_id),
    )


def _record_turn(
    conn: Connection,
    session_id: str,
    usage: Usage,
    compactions: int,
    context_tokens: int,
    entry_count: int,
    last_entry_id: str | None,
    model: str | None,
    now: datetime,
) -> None:
    # GREATEST under "C" is SQLite's MAX on text: updated_at never moves backwards.
    conn.execute(
        "UPDATE sessions SET input_tokens = input_tokens + %s,"
        " output_tokens = output_tokens + %s,"
        " cache_read_tokens = cache_read_tokens + %s,"
        " cache_write_tokens = cache_write_tokens + %s,"
        " compaction_count = compaction_count + %s,"
        " context_tokens = %s, turn_count = turn_count + 1, entry_count = %s,"
        " last_entry_id = %s, model = COALESCE(%s, model),"
        ' updated_at = GREATEST(updated_at COLLATE "C", %s)'
        " WHERE session_id = %s",
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            compactions,
            context_tokens,
            entry_count,
            last_entry_id,
            model,
            now.isoformat(),
            session_id,
        ),
    )


def _record_compaction(
    conn: Connection,
    session_id: str,
    compactions: int,
    usage: Usage,
    context_tokens: int | None,
    entry_count: int,
    last_entry_id: str | None,
) -> None:
    conn.execute(
        "UPDATE sessions SET compaction_count = compaction_count + %s,"
        " input_tokens = input_tokens + %s, output_tokens = output_tokens + %s,"
        " cache_read_tokens = cache_read_tokens + %s,"
        " cache_write_tokens = cache_write_tokens + %s,"
        " context_tokens = COALESCE(%s::bigint, context_tokens), entry_count = %s,"
        " last_entry_id = %s WHERE session_id = %s",
        (
            compactions,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            context_tokens,
            entry_count,
            last_entry_id,
            session_id,
        ),
    )


def _list(
    conn: Connection,
    status: str | None,
    channel: str | None,
    agent_id: str | None,
    query: str | None,
    limit: int,
    cursor: str | None,
) -> SessionPage:
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("status", status), ("channel", channel), ("agent_id", agent_id)):
        if value:
            where.append(f"{column} = %s")
            params.append(value)
    if query:
        # strpos, not LIKE: the query is matched as plain text, '%' and '_' included.
        where.append("(strpos(lower(key), %s) > 0 OR strpos(lower(display_name), %s) > 0)")
        params += [query.lower(), query.lower()]
    if cursor:
        updated, session_id = split_cursor(cursor)
        where.append(
            '(updated_at COLLATE "C" < %s'
            ' OR (updated_at COLLATE "C" = %s AND session_id COLLATE "C" < %s))'
        )
        params += [updated, updated, session_id]
    sql = f"SELECT {SESSION_COLUMNS} FROM sessions"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += ' ORDER BY updated_at COLLATE "C" DESC, session_id COLLATE "C" DESC LIMIT %s'
    rows = conn.execute(sql, (*params, limit + 1)).fetchall()
    return session_page([SessionRecord.from_row(r) for r in rows], limit)
