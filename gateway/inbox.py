"""The durable inbox: every inbound message is recorded before it is processed.

States: ``received`` (recorded, not yet answered) → ``replied`` (the reply text is
stored; delivery pending, or tried and to be tried again when ``error`` is set) →
``delivered``. ``failed`` (delivery refused for good, or not processed because the
disk refused a write: ``error`` then starts with ``storage:``) and ``rejected`` (busy)
are final. A platform delivering the same message twice
hits the unique (channel, account, platform message id) and is answered once.
After a crash, ``open_items()`` gives back everything recorded but not finished,
in arrival order, so the gateway can answer it on restart.

Sending: a reply is stored (``mark_replied``) with the items it answers together
(``reply_for``, a folded turn) and the channel's *send mark* (where the chat's
message numbering stood before the send), and the platform ids of what went out
are recorded with the final status in ``sent_messages``. After a crash between a
send and its record, the mark and those ids let the gateway ask the platform
whether the reply is already there (``gateway.send_recovery``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from channels.base import InboundMessage, SeenMark
from gateway.db import Database, delete_rows_in
from gateway.routing import normalise_channel, normalise_peer_id

OPEN_STATES = ("received", "replied")
# The send mark of a reply whose chat had several replies in doubt at once: a message
# found there could be any one's, so this reply is never looked for, only resent.
UNKNOWN_SEND_MARK = "unknown"


@dataclass(frozen=True, slots=True)
class InboxItem:
    id: int
    message: InboundMessage
    status: str
    session_id: str | None
    reply: list[str] | None
    error: str | None
    received_at: datetime | None = None
    # PostgreSQL only (several replicas): the route key it was recorded under, and the
    # backend pid of the replica answerable for it (None: unclaimed).
    session_key: str | None = None
    claimed_by: int | None = None
    # Stored with the reply: the channel's send mark, and every item the reply answers.
    send_mark: str | None = None
    reply_for: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SentMessages:
    """What went out for a reply: recorded with its final status, in one transaction."""

    channel: str
    account: str
    message_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecordResult:
    item: InboxItem
    is_new: bool


# json.loads joins a valid surrogate pair into one code point: any left is alone.
# NUL: PostgreSQL text (and its JSON types) cannot hold it at all.
_UNSTORABLE = re.compile("[\ud800-\udfff\x00]")


def well_formed(message: InboundMessage) -> InboundMessage:
    """``message`` with lone UTF-16 surrogates and NUL characters replaced by U+FFFD in
    every text field.

    JSON allows ``"\\ud800"`` and ``"\\u0000"`` and Python decodes them into a str
    that UTF-8 cannot encode (a surrogate) or that PostgreSQL refuses (NUL): the
    stores, the transcript and the platforms would refuse it later. A platform (or a
    browser) can send one; it must cost a character, never the message.
    """
    # Any: each value replaces a field that held a str, which mypy cannot tie to its name.
    changes: dict[str, Any] = {
        name: _scrub(value)
        for name in InboundMessage.__dataclass_fields__
        if isinstance(value := getattr(message, name), str) and _has_unstorable(value)
    }
    return dataclasses.replace(message, **changes) if changes else message


def _has_unstorable(text: str) -> bool:
    return _UNSTORABLE.search(text) is not None


def _scrub(text: str) -> str:
    return _UNSTORABLE.sub("\ufffd", text)


def message_to_json(message: InboundMessage) -> str:
    data: dict[str, Any] = {
        name: getattr(message, name) for name in InboundMessage.__dataclass_fields__
    }
    data["timestamp"] = message.timestamp.isoformat()
    return json.dumps(data, ensure_ascii=False)


def message_from_json(raw: str) -> InboundMessage:
    data = json.loads(raw)
    data["timestamp"] = datetime.fromisoformat(data["timestamp"])
    return InboundMessage(**data)


class Inbox:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(self, message: InboundMessage, session_key: str | None = None) -> RecordResult:
        # One process answers everything here: the session key is only needed where
        # several replicas share the inbox (PgInbox), so it is not stored.
        return await self._db.run(self._record_sync, message)

    async def get(self, item_id: int) -> InboxItem | None:
        return await self._db.run(self._get_sync, item_id)

    # Each status change takes every id of a folded turn at once: one round trip.

    async def mark_replied(
        self,
        item_ids: Sequence[int],
        session_id: str | None,
        reply: list[str],
        send_mark: str | None = None,
    ) -> None:
        """Store the reply for ``item_ids`` before it is sent. A send mark already
        stored is kept: an earlier send of this reply was made after it."""
        await self._db.run(
            functools.partial(
                self._set_sync,
                item_ids,
                "replied",
                session_id=session_id,
                reply=json.dumps(reply),
                send_mark=send_mark,
                reply_for=json.dumps(list(item_ids)),
            )
        )

    async def mark_delivered(
        self, item_ids: Sequence[int], sent: SentMessages | None = None
    ) -> None:
        await self._db.run(functools.partial(self._set_sync, item_ids, "delivered", sent=sent))

    async def note_undelivered(self, item_ids: Sequence[int], error: str) -> None:
        """The reply could not be sent yet (the platform was unreachable): the item stays
        open as ``replied``, with the error, so the reply is sent again later."""
        await self._db.run(functools.partial(self._set_sync, item_ids, "replied", error=error))

    async def mark_failed(
        self, item_ids: Sequence[int], error: str, sent: SentMessages | None = None
    ) -> None:
        await self._db.run(
            functools.partial(self._set_sync, item_ids, "failed", error=error, sent=sent)
        )

    async def mark_rejected(
        self, item_ids: Sequence[int], reason: str, sent: SentMessages | None = None
    ) -> None:
        await self._db.run(
            functools.partial(self._set_sync, item_ids, "rejected", error=reason, sent=sent)
        )

    async def is_recorded(self, channel: str, account: str, platform_message_id: str) -> bool:
        """Is this platform message recorded as (part of) the delivery of some reply?"""
        return await self._db.run(self._is_recorded_sync, channel, account, platform_message_id)

    async def open_replies(self, channel: str, account: str) -> list[InboxItem]:
        """The items of one channel account whose reply is stored and not recorded as
        sent (few: a reply is in that state only while it is being sent)."""
        return await self._db.run(self._open_replies_sync, channel, account)

    async def forget_send_marks(self, item_ids: Sequence[int]) -> None:
        """Set these replies' send mark to ``UNKNOWN_SEND_MARK`` for good."""
        await self._db.run(self._forget_marks_sync, list(item_ids))

    async def renew_send_mark(self, item_ids: Sequence[int], send_mark: str) -> None:
        """Replace these replies' send mark (not an unknown one): a look above the old
        mark found nothing, and the next send comes after this one."""
        await self._db.run(self._renew_mark_sync, list(item_ids), send_mark)

    async def open_items(self, limit: int = 10_000) -> list[InboxItem]:
        return await self._db.run(self._open_sync, limit)

    async def newest_per_conversation(
        self, channel: str, since: datetime, limit: int = 1000
    ) -> list[SeenMark]:
        """Per conversation (account, chat, thread) of ``channel`` with a message stored
        since ``since``: its newest message; the most recently active first, at most
        ``limit`` of them."""
        return await self._db.run(self._newest_sync, channel, since.isoformat(), limit)

    async def counts(self) -> dict[str, int]:
        return await self._db.run(self._counts_sync)

    async def items_from(self, channel: str | None, sender_id: str) -> list[int]:
        """The ids of every item ``sender_id`` sent on ``channel`` (None: any channel),
        whatever its state: ids compared as session keys do (``sender_matches``)."""
        return await self._db.run(self._items_from_sync, channel, sender_id)

    async def delete_items(self, item_ids: Sequence[int]) -> int:
        """Delete these items (``parley people erase``); how many there were."""
        return await self._db.run(self._delete_sync, list(item_ids))

    # -- on the database thread -------------------------------------------------------

    def _items_from_sync(self, channel: str | None, sender_id: str) -> list[int]:
        if channel is None:
            rows = self._db.conn.execute("SELECT id, channel, payload FROM inbox ORDER BY id")
        else:
            rows = self._db.conn.execute(
                "SELECT id, channel, payload FROM inbox WHERE channel = ? ORDER BY id", (channel,)
            )
        return [
            int(item_id)
            for item_id, row_channel, payload in rows
            if sender_matches(row_channel, payload, channel, sender_id)
        ]

    def _delete_sync(self, item_ids: list[int]) -> int:
        delete_rows_in(self._db.conn, "sent_messages", "inbox_id", item_ids, DELETE_BATCH)
        return delete_rows_in(self._db.conn, "inbox", "id", item_ids, DELETE_BATCH)

    def _record_sync(self, message: InboundMessage) -> RecordResult:
        now = datetime.now(UTC).isoformat()
        try:
            cursor = self._db.conn.execute(
                "INSERT INTO inbox (channel, account, platform_message_id, received_at,"
                " updated_at, payload, status) VALUES (?, ?, ?, ?, ?, ?, 'received')",
                (
                    message.channel,
                    message.account,
                    message.message_id,
                    now,
                    now,
                    message_to_json(message),
                ),
            )
        except sqlite3.IntegrityError:
            row = self._db.conn.execute(
                "SELECT * FROM inbox WHERE channel = ? AND account = ? AND platform_message_id = ?",
                (message.channel, message.account, message.message_id),
            ).fetchone()
            return RecordResult(item_from_row(row), is_new=False)
        item = self._get_sync(int(cursor.lastrowid or 0))
        assert item is not None
        return RecordResult(item, is_new=True)

    def _get_sync(self, item_id: int) -> InboxItem | None:
        row = self._db.conn.execute("SELECT * FROM inbox WHERE id = ?", (item_id,)).fetchone()
        return item_from_row(row) if row else None

    def _set_sync(
        self,
        item_ids: Sequence[int],
        status: str,
        *,
        session_id: str | None = None,
        reply: str | None = None,
        error: str | None = None,
        send_mark: str | None = None,
        reply_for: str | None = None,
        sent: SentMessages | None = None,
    ) -> None:
        now = datetime.now(UTC).isoformat()
        conn = self._db.conn
        conn.execute("BEGIN")  # the connection autocommits: make the batch one transaction
        try:
            conn.executemany(
                "UPDATE inbox SET status = ?, session_id = COALESCE(?, session_id),"
                " reply = COALESCE(?, reply), error = COALESCE(?, error), updated_at = ?,"
                " send_mark = COALESCE(send_mark, ?), reply_for = COALESCE(?, reply_for)"
                " WHERE id = ?",
                [
                    (status, session_id, reply, error, now, send_mark, reply_for, item_id)
                    for item_id in item_ids
                ],
            )
            if sent is not None and item_ids:
                conn.executemany(
                    "INSERT OR IGNORE INTO sent_messages"
                    " (channel, account, platform_message_id, inbox_id) VALUES (?, ?, ?, ?)",
                    [(sent.channel, sent.account, m, item_ids[0]) for m in sent.message_ids],
                )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _open_replies_sync(self, channel: str, account: str) -> list[InboxItem]:
        rows = self._db.conn.execute(
            "SELECT * FROM inbox WHERE status = 'replied' AND channel = ? AND account = ?"
            " ORDER BY id",
            (channel, account),
        ).fetchall()
        return [item_from_row(r) for r in rows]

    def _forget_marks_sync(self, item_ids: list[int]) -> None:
        self._db.conn.executemany(
            "UPDATE inbox SET send_mark = ? WHERE id = ?",
            [(UNKNOWN_SEND_MARK, item_id) for item_id in item_ids],
        )

    def _renew_mark_sync(self, item_ids: list[int], send_mark: str) -> None:
        self._db.conn.executemany(
            "UPDATE inbox SET send_mark = ? WHERE id = ? AND send_mark IS NOT ?",
            [(send_mark, item_id, UNKNOWN_SEND_MARK) for item_id in item_ids],
        )

    def _is_recorded_sync(self, channel: str, account: str, platform_message_id: str) -> bool:
        row = self._db.conn.execute(
            "SELECT 1 FROM sent_messages WHERE channel = ? AND account = ?"
            " AND platform_message_id = ?",
            (channel, account, platform_message_id),
        ).fetchone()
        return row is not None

    def _open_sync(self, limit: int) -> list[InboxItem]:
        rows = self._db.conn.execute(
            "SELECT * FROM inbox WHERE status IN ('received', 'replied') ORDER BY id LIMIT ?",
            (limit,),
        ).fetchall()
        return [item_from_row(r) for r in rows]

    def _newest_sync(self, channel: str, since: str, limit: int) -> list[SeenMark]:
        # Newest first along the primary key (arrival order), so the scan stops at the
        # first row older than ``since`` instead of reading the whole inbox.
        rows = self._db.conn.execute(
            "SELECT account, json_extract(payload, '$.chat_id'),"
            " json_extract(payload, '$.thread_id'), platform_message_id, received_at"
            " FROM inbox WHERE channel = ? ORDER BY id DESC",
            (channel,),
        )
        return newest_marks(rows, since, limit)

    def _counts_sync(self) -> dict[str, int]:
        rows = self._db.conn.execute("SELECT status, count(*) FROM inbox GROUP BY status")
        return {status: n for status, n in rows}


# Ids per DELETE statement (SQLite's default limit on parameters is far above it).
DELETE_BATCH = 500


def sender_matches(row_channel: str, payload: str, channel: str | None, sender_id: str) -> bool:
    """Is a stored message (its channel and JSON payload) from ``sender_id`` of
    ``channel`` (None: any)? Ids compare as session keys do (``normalise_peer_id``):
    case-insensitive, and an id a key had to escape matches its escaped form."""
    if channel is not None and normalise_channel(row_channel) != normalise_channel(channel):
        return False
    try:
        sender = json.loads(payload).get("sender_id")
    except (ValueError, AttributeError):
        return False
    if not isinstance(sender, str) or not sender:
        return False
    found = normalise_peer_id(sender)
    return found in (sender_id.lower(), normalise_peer_id(sender_id))


def newest_marks(rows: Iterable[Sequence[Any]], since: str, limit: int) -> list[SeenMark]:
    """The first (newest) message per conversation from ``rows`` of (account, chat_id,
    thread_id, platform message id, received_at), newest first; stops at the first row
    received before ``since`` or once ``limit`` conversations are found."""
    marks: dict[tuple[str, str, str | None], SeenMark] = {}
    for account, chat_id, thread_id, message_id, received_at in rows:
        if received_at < since or len(marks) >= limit:
            break
        key = (account, str(chat_id), None if thread_id is None else str(thread_id))
        if key not in marks:
            marks[key] = SeenMark(account, key[1], key[2], message_id)
    return list(marks.values())


def item_from_row(row: Mapping[str, Any]) -> InboxItem:
    """From an inbox row of either backend (sqlite3.Row or a psycopg dict row)."""
    return InboxItem(
        id=row["id"],
        message=message_from_json(row["payload"]),
        status=row["status"],
        session_id=row["session_id"],
        reply=json.loads(row["reply"]) if row["reply"] else None,
        error=row["error"],
        received_at=datetime.fromisoformat(row["received_at"]),
        session_key=_column(row, "session_key"),
        claimed_by=_column(row, "claimed_by"),
        send_mark=_column(row, "send_mark"),
        reply_for=tuple(json.loads(row["reply_for"])) if _column(row, "reply_for") else (),
    )


def _column(row: Mapping[str, Any], name: str) -> Any:
    """A column only one backend's table has (sqlite3.Row has no ``get``)."""
    return row[name] if name in row.keys() else None  # noqa: SIM118 (Row: `in` reads values)
