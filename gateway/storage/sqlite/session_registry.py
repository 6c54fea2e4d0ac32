"""The session registry in state.db: ``SqliteSessionRegistry``, the SQLite store behind
the ``SessionRegistry`` protocol (its rules: ``gateway.storage.sessions``).
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from parley.core.messages import Usage
from parley.gateway.storage.sessions import (
    MAX_PAGE_SIZE,
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
from parley.gateway.storage.sqlite.database import Database, delete_rows_in


class SqliteSessionRegistry:
    """Session rows in state.db; every method runs on the database thread."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, session_id: str) -> SessionRecord | None:
        return await self._db.run(self._get_sync, session_id)

    async def get_active(self, key: str) -> SessionRecord | None:
        return await self._db.run(self._get_active_sync, key)

    async def find(self, key_or_id: str) -> SessionRecord | None:
        """The session with this id, else the active (or latest) session for this key."""
        return await self._db.run(self._find_sync, key_or_id)

    async def create(
        self,
        origin: SessionOrigin,
        *,
        settings: dict[str, Any] | None = None,
        model: str | None = None,
        now: datetime | None = None,
    ) -> SessionRecord:
        return await self._db.run(self._create_sync, origin, settings or {}, model, now or utcnow())

    async def archive(self, session_id: str, reason: str, now: datetime | None = None) -> None:
        await self._db.run(self._archive_sync, session_id, reason, now or utcnow())

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
            self._record_turn_sync,
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
            self._record_compaction_sync,
            session_id,
            compactions,
            usage,
            context_tokens,
            entry_count,
            last_entry_id,
        )

    def _record_compaction_sync(
        self,
        session_id: str,
        compactions: int,
        usage: Usage,
        context_tokens: int | None,
        entry_count: int,
        last_entry_id: str | None,
    ) -> None:
        self._db.conn.execute(
            "UPDATE sessions SET compaction_count = compaction_count + ?,"
            " input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
            " cache_read_tokens = cache_read_tokens + ?,"
            " cache_write_tokens = cache_write_tokens + ?,"
            " context_tokens = COALESCE(?, context_tokens), entry_count = ?, last_entry_id = ?"
            " WHERE session_id = ?",
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

    async def record_entries(
        self, session_id: str, entry_count: int, last_entry_id: str | None
    ) -> None:
        await self._db.run(self._record_entries_sync, session_id, entry_count, last_entry_id)

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
            self._record_delivery_sync,
            session_id,
            json.dumps(route),
            error,
            entry_count,
            last_entry_id,
            json.dumps(list(message_ids)),
        )

    async def update_settings(self, session_id: str, settings: dict[str, Any]) -> None:
        await self._db.run(self._update_settings_sync, session_id, json.dumps(settings))

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
            self._list_sync, status, channel, agent_id, query, page_limit(limit), cursor
        )

    async def delete(self, session_ids: Sequence[str]) -> int:
        """Delete these sessions' rows, active or archived (``parley people erase``,
        gateway stopped); how many there were."""
        return await self._db.run(self._delete_sync, list(session_ids))

    # -- on the database thread -------------------------------------------------------

    # ``builtins.list``: the ``list`` method above shadows the builtin in the class body.
    def _delete_sync(self, session_ids: builtins.list[str]) -> int:
        return delete_rows_in(self._db.conn, "sessions", "session_id", session_ids, MAX_PAGE_SIZE)

    def _get_sync(self, session_id: str) -> SessionRecord | None:
        row = self._db.conn.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return SessionRecord.from_row(row) if row else None

    def _get_active_sync(self, key: str) -> SessionRecord | None:
        row = self._db.conn.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = ? AND status = 'active'", (key,)
        ).fetchone()
        return SessionRecord.from_row(row) if row else None

    def _find_sync(self, key_or_id: str) -> SessionRecord | None:
        found = self._get_sync(key_or_id) or self._get_active_sync(key_or_id)
        if found:
            return found
        row = self._db.conn.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = ?"
            " ORDER BY created_at DESC LIMIT 1",
            (key_or_id,),
        ).fetchone()
        return SessionRecord.from_row(row) if row else None

    def _create_sync(
        self, origin: SessionOrigin, settings: dict[str, Any], model: str | None, now: datetime
    ) -> SessionRecord:
        session_id = new_session_id()
        stamp = now.isoformat()
        try:
            self._db.conn.execute(
                "INSERT INTO sessions (session_id, key, agent_id, channel, account, chat_type,"
                " peer, parent_key, display_name, created_at, updated_at, status, model, settings)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?, ?)",
                (
                    session_id,
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
        except sqlite3.IntegrityError:
            # Someone created the active session for this key first: use theirs.
            existing = self._get_active_sync(origin.key)
            if existing is None:
                raise
            return existing
        record = self._get_sync(session_id)
        assert record is not None
        return record

    def _archive_sync(self, session_id: str, reason: str, now: datetime) -> None:
        self._db.conn.execute(
            "UPDATE sessions SET status = 'archived', archived_reason = ?, archived_at = ?"
            " WHERE session_id = ? AND status = 'active'",
            (reason, now.isoformat(), session_id),
        )

    def _record_turn_sync(
        self,
        session_id: str,
        usage: Usage,
        compactions: int,
        context_tokens: int,
        entry_count: int,
        last_entry_id: str | None,
        model: str | None,
        now: datetime,
    ) -> None:
        self._db.conn.execute(
            "UPDATE sessions SET input_tokens = input_tokens + ?,"
            " output_tokens = output_tokens + ?,"
            " cache_read_tokens = cache_read_tokens + ?,"
            " cache_write_tokens = cache_write_tokens + ?, compaction_count = compaction_count + ?,"
            " context_tokens = ?, turn_count = turn_count + 1, entry_count = ?,"
            " last_entry_id = ?, model = COALESCE(?, model), updated_at = MAX(updated_at, ?)"
            " WHERE session_id = ?",
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

    def _record_entries_sync(
        self, session_id: str, entry_count: int, last_entry_id: str | None
    ) -> None:
        self._db.conn.execute(
            "UPDATE sessions SET entry_count = ?, last_entry_id = ? WHERE session_id = ?",
            (entry_count, last_entry_id, session_id),
        )

    def _record_delivery_sync(
        self,
        session_id: str,
        route: str,
        error: str | None,
        entry_count: int,
        last_entry_id: str | None,
        message_ids: str,
    ) -> None:
        self._db.conn.execute(
            "UPDATE sessions SET last_route = ?, delivery_error = ?, entry_count = ?,"
            " last_entry_id = ?, last_message_ids = ? WHERE session_id = ?",
            (route, error, entry_count, last_entry_id, message_ids, session_id),
        )

    def _update_settings_sync(self, session_id: str, settings: str) -> None:
        self._db.conn.execute(
            "UPDATE sessions SET settings = ? WHERE session_id = ?", (settings, session_id)
        )

    def _list_sync(
        self,
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
                where.append(f"{column} = ?")
                params.append(value)
        if query:
            where.append("(instr(lower(key), ?) > 0 OR instr(lower(display_name), ?) > 0)")
            params += [query.lower(), query.lower()]
        if cursor:
            updated, sid = split_cursor(cursor)
            where.append("(updated_at < ? OR (updated_at = ? AND session_id < ?))")
            params += [updated, updated, sid]
        sql = f"SELECT {SESSION_COLUMNS} FROM sessions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY updated_at DESC, session_id DESC LIMIT ?"
        rows = self._db.conn.execute(sql, (*params, limit + 1)).fetchall()
        return session_page([SessionRecord.from_row(r) for r in rows], limit)
