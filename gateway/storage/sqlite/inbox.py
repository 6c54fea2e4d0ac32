"""The durable inbox in state.db: ``SqliteInbox``, the SQLite store behind the ``Inbox``
protocol. Its states, dedupe and send records are described in ``gateway.storage.inbox``.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

from parley.channels.base import InboundMessage, SeenMark
from parley.gateway.storage.inbox import (
    DELETE_BATCH,
    FINISHED_STATES,
    UNKNOWN_SEND_MARK,
    InboxItem,
    PruneResult,
    RecordResult,
    SentMessages,
    item_from_row,
    message_to_json,
    newest_marks,
    sender_matches,
)
from parley.gateway.storage.sqlite.database import Database, delete_rows_in


class SqliteInbox:
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
        sent, or shown while it is written (few: a reply is in that state only while
        it is being streamed or sent)."""
        return await self._db.run(self._open_replies_sync, channel, account)

    async def note_preview(
        self, item_ids: Sequence[int], send_mark: str | None, sent: SentMessages | None = None
    ) -> None:
        """A reply to ``item_ids`` is shown while it is written, in messages of its own:
        before the first, the chat's send mark (an earlier one is kept); after each,
        its platform id, recorded as this reply's (``is_recorded``)."""
        await self._db.run(self._preview_sync, list(item_ids), send_mark, sent)

    async def previews(self, item_ids: Sequence[int]) -> list[str]:
        """The platform ids recorded for these items' reply (its previews, its parts)."""
        return await self._db.run(self._previews_sync, list(item_ids))

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

    async def prune_finished(self, before: datetime, *, dry_run: bool = False) -> PruneResult:
        """Delete (``dry_run``: count) finished items last changed before ``before`` and
        older than every open item, with their sent-message records. A batch at a time:
        the gateway's writes wait at most one batch."""
        return await self._db.run(self._prune_sync, before.isoformat(), dry_run)

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

    def _prune_sync(self, before: str, dry_run: bool) -> PruneResult:
        states = ", ".join(f"'{s}'" for s in FINISHED_STATES)
        rows = self._db.conn.execute(
            "SELECT id, length(CAST(payload AS BLOB)) + COALESCE(length(CAST(reply AS BLOB)), 0)"
            f" FROM inbox WHERE status IN ({states}) AND updated_at < ? AND id < COALESCE("
            "(SELECT min(id) FROM inbox WHERE status IN ('received', 'replied')), 1 << 62)"
            " ORDER BY id",
            (before,),
        ).fetchall()
        found = PruneResult(len(rows), sum(int(size) for _, size in rows))
        if dry_run or not rows:
            return found
        ids = [int(item_id) for item_id, _ in rows]
        for start in range(0, len(ids), DELETE_BATCH):
            batch = ids[start : start + DELETE_BATCH]
            conn = self._db.conn
            conn.execute("BEGIN IMMEDIATE")
            marks = ", ".join("?" * len(batch))
            try:
                conn.execute(f"DELETE FROM sent_messages WHERE inbox_id IN ({marks})", batch)
                conn.execute(f"DELETE FROM inbox WHERE id IN ({marks})", batch)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return found

    def _record_sync(self, message: InboundMessage) -> RecordResult:
        # Twice at most: a duplicate whose row retention removed between the insert and
        # the read is inserted again (it is past the dedupe window: new to us).
        for _ in range(2):
            result = self._try_record(message)
            if result is not None:
                return result
        raise AssertionError("inbox row vanished twice")  # pragma: no cover

    def _try_record(self, message: InboundMessage) -> RecordResult | None:
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
            return None if row is None else RecordResult(item_from_row(row), is_new=False)
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
                _record_sent(conn, item_ids, sent)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _open_replies_sync(self, channel: str, account: str) -> list[InboxItem]:
        rows = self._db.conn.execute(
            "SELECT * FROM inbox WHERE (status = 'replied'"
            " OR (status = 'received' AND send_mark IS NOT NULL))"
            " AND channel = ? AND account = ? ORDER BY id",
            (channel, account),
        ).fetchall()
        return [item_from_row(r) for r in rows]

    def _preview_sync(
        self, item_ids: list[int], send_mark: str | None, sent: SentMessages | None
    ) -> None:
        if not item_ids:
            return
        conn = self._db.conn
        conn.execute("BEGIN")
        try:
            if send_mark is not None:
                conn.executemany(
                    "UPDATE inbox SET send_mark = COALESCE(send_mark, ?),"
                    " reply_for = COALESCE(reply_for, ?) WHERE id = ?",
                    [(send_mark, json.dumps(item_ids), item_id) for item_id in item_ids],
                )
            if sent is not None:
                _record_sent(conn, item_ids, sent)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _previews_sync(self, item_ids: list[int]) -> list[str]:
        marks = ",".join("?" * len(item_ids))
        rows = self._db.conn.execute(
            f"SELECT platform_message_id FROM sent_messages WHERE inbox_id IN ({marks})",
            item_ids,
        ).fetchall()
        return [str(r[0]) for r in rows]

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


def _record_sent(conn: sqlite3.Connection, item_ids: Sequence[int], sent: SentMessages) -> None:
    """The platform ids of what went out for a reply, under its first item."""
    conn.executemany(
        "INSERT OR IGNORE INTO sent_messages"
        " (channel, account, platform_message_id, inbox_id) VALUES (?, ?, ?, ?)",
        [(sent.channel, sent.account, m, item_ids[0]) for m in sent.message_ids],
    )
