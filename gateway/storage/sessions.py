"""The session registry's records and its protocol (``SessionRegistry``), which the
SQLite (``storage.sqlite.session_registry``) and PostgreSQL
(``storage.postgres.session_registry``) stores both satisfy.

A session key (who/where) has at most one *active* session at a time; a reset
archives it (the row and its transcript stay, listable and readable) and starts a
new session id. Rows are deleted only by ``parley people erase`` (``delete``);
retention removes an old archived session's transcript and notes it in the row's
settings (``REMOVED_SETTING``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from parley.core.messages import Usage

SESSION_COLUMNS = (
    "session_id, key, agent_id, channel, account, chat_type, peer, parent_key, display_name,"
    " created_at, updated_at, status, archived_reason, archived_at, model, settings, last_route,"
    " input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, context_tokens,"
    " compaction_count, turn_count, entry_count, last_entry_id, delivery_error,"
    " last_message_ids"
)


# The settings key of an archived session whose transcript retention removed (the row
# stays, so listings and the inspector can say so): when, in ISO form.
REMOVED_SETTING = "retention_removed_at"


def removed_at(record: SessionRecord) -> str | None:
    """When retention removed the session's transcript (ISO), else None."""
    value = record.settings.get(REMOVED_SETTING)
    return value if isinstance(value, str) else None


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_session_id() -> str:
    """Random, path-safe, sortable-enough ids; keys never become file names."""
    return secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class SessionOrigin:
    """Where a session lives: what the routing step resolved."""

    key: str
    agent_id: str
    channel: str
    account: str
    chat_type: str
    peer: str
    parent_key: str | None = None
    display_name: str | None = None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    key: str
    agent_id: str
    channel: str
    account: str
    chat_type: str
    peer: str
    parent_key: str | None
    display_name: str | None
    created_at: datetime
    updated_at: datetime
    status: str
    archived_reason: str | None
    archived_at: datetime | None
    model: str | None
    settings: dict[str, Any] = field(default_factory=dict)
    last_route: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    context_tokens: int = 0
    compaction_count: int = 0
    turn_count: int = 0
    entry_count: int = 0
    last_entry_id: str | None = None
    delivery_error: str | None = None
    last_message_ids: list[str] = field(default_factory=list)  # of the last reply delivered

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> SessionRecord:
        """From a sessions row of either backend (sqlite3.Row or a psycopg dict row)."""
        return cls(
            session_id=row["session_id"],
            key=row["key"],
            agent_id=row["agent_id"],
            channel=row["channel"],
            account=row["account"],
            chat_type=row["chat_type"],
            peer=row["peer"],
            parent_key=row["parent_key"],
            display_name=row["display_name"],
            created_at=datetime.fromisoformat(row["created_at"]),
            updated_at=datetime.fromisoformat(row["updated_at"]),
            status=row["status"],
            archived_reason=row["archived_reason"],
            archived_at=datetime.fromisoformat(row["archived_at"]) if row["archived_at"] else None,
            model=row["model"],
            settings=json.loads(row["settings"] or "{}"),
            last_route=json.loads(row["last_route"]) if row["last_route"] else None,
            usage=Usage(
                row["input_tokens"],
                row["output_tokens"],
                row["cache_read_tokens"],
                row["cache_write_tokens"],
            ),
            context_tokens=row["context_tokens"],
            compaction_count=row["compaction_count"],
            turn_count=row["turn_count"],
            entry_count=row["entry_count"],
            last_entry_id=row["last_entry_id"],
            delivery_error=row["delivery_error"],
            last_message_ids=json.loads(row["last_message_ids"] or "[]"),
        )


@dataclass(frozen=True, slots=True)
class SessionPage:
    sessions: list[SessionRecord]
    next_cursor: str | None


MAX_PAGE_SIZE = 500


def page_limit(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE_SIZE))


def split_cursor(cursor: str) -> tuple[str, str]:
    """The cursor is "<updated_at>|<session_id>" of the last row of the previous page."""
    updated, _, session_id = cursor.partition("|")
    return updated, session_id


def session_page(records: Sequence[SessionRecord], limit: int) -> SessionPage:
    """A page from up to ``limit + 1`` records: the extra one only says there is more."""
    page = list(records[:limit])
    next_cursor = None
    if len(records) > limit:
        last = page[-1]
        next_cursor = f"{last.updated_at.isoformat()}|{last.session_id}"
    return SessionPage(page, next_cursor)


class SessionRegistry(Protocol):
    """One row per session: its key, origin, settings, counters and last delivery."""

    async def get(self, session_id: str) -> SessionRecord | None: ...

    async def get_active(self, key: str) -> SessionRecord | None: ...

    async def find(self, key_or_id: str) -> SessionRecord | None:
        """The session with this id, else the active (or latest) session for this key."""
        ...

    async def create(
        self,
        origin: SessionOrigin,
        *,
        settings: dict[str, Any] | None = None,
        model: str | None = None,
        now: datetime | None = None,
    ) -> SessionRecord: ...

    async def archive(self, session_id: str, reason: str, now: datetime | None = None) -> None: ...

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
    ) -> None: ...

    async def record_compaction(
        self,
        session_id: str,
        *,
        compactions: int,
        usage: Usage,
        context_tokens: int | None,
        entry_count: int,
        last_entry_id: str | None,
    ) -> None: ...

    async def record_entries(
        self, session_id: str, entry_count: int, last_entry_id: str | None
    ) -> None: ...

    async def record_delivery(
        self,
        session_id: str,
        route: dict[str, Any],
        error: str | None,
        *,
        entry_count: int,
        last_entry_id: str | None,
        message_ids: Sequence[str] = (),
    ) -> None: ...

    async def update_settings(self, session_id: str, settings: dict[str, Any]) -> None: ...

    async def list(
        self,
        *,
        status: str | None = None,
        channel: str | None = None,
        agent_id: str | None = None,
        query: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage: ...

    async def delete(self, session_ids: Sequence[str]) -> int:
        """Delete these rows (``parley people erase``); returns how many went."""
        ...
