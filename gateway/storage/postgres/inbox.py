"""The durable inbox in the shared PostgreSQL: ``Inbox``'s API, states and dedupe.

Any replica may receive any platform delivery, so the unique (channel, account,
platform message id) is what answers a message once: the second replica's insert
waits for the first to commit, does nothing, and reads the first one's item.

Several replicas: each item carries its session key and ``claimed_by``, the backend
pid of the session-lock connection of the replica that recorded (or took over) it.
The replica holding a session's lock answers every open item of that session
(``open_for_session``), whoever received it; items whose claimant's connection is
gone (a dead replica) are taken over with ``claim_orphans``. PostgreSQL itself says
who is alive (``pg_stat_activity``): no heartbeat table of our own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from parley.channels.base import InboundMessage, SeenMark
from parley.gateway.storage.inbox import (
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
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.session_locks import SessionLocks

# Items deleted per transaction by retention.
PRUNE_BATCH = 500
# Rows fetched per round trip while scanning for the newest message per conversation.
NEWEST_BATCH = 500


class PgInbox:
    def __init__(self, db: PgDatabase) -> None:
        self._db = db
        # The replica's session locks: their connection's backend pid is the claimant.
        self.locks: SessionLocks | None = None

    @property
    def claimant(self) -> int | None:
        return self.locks.pid if self.locks is not None else None

    async def record(self, message: InboundMessage, session_key: str | None = None) -> RecordResult:
        return await self._db.run(_record, message, session_key, self.claimant)

    async def open_for_session(self, key: str, also: Sequence[int] = ()) -> list[InboxItem]:
        """The open items recorded under session ``key``, and those of ``also`` (ids)
        still open, in arrival order. Read under the session's lock, it is the truth
        about what is left to answer."""
        return await self._db.run(_open_for_session, key, list(also))

    async def claim_orphans(self, *, channels: Sequence[str], limit: int = 1000) -> list[InboxItem]:
        """Take over the open items of ``channels`` whose claimant is gone (or was
        never set), in arrival order; each is claimed by one replica only."""
        if self.claimant is None or not channels:
            return []
        return await self._db.run(_claim_orphans, self.claimant, list(channels), limit)

    async def get(self, item_id: int) -> InboxItem | None:
        return await self._db.run(_get, item_id)

    # Each status change takes every id of a folded turn at once: one statement.

    async def mark_replied(
        self,
        item_ids: Sequence[int],
        session_id: str | None,
        reply: list[str],
        send_mark: str | None = None,
    ) -> None:
        await self._db.run(
            functools.partial(
                _set,
                status="replied",
                session_id=session_id,
                reply=json.dumps(reply),
                send_mark=send_mark,
                reply_for=json.dumps(list(item_ids)),
            ),
            item_ids,
        )

    async def mark_delivered(
        self, item_ids: Sequence[int], sent: SentMessages | None = None
    ) -> None:
        await self._db.run(functools.partial(_set, status="delivered", sent=sent), item_ids)

    async def note_undelivered(self, item_ids: Sequence[int], error: str) -> None:
        """The reply could not be sent yet (the platform was unreachable): the item stays
        open as ``replied``, with the error, so the reply is sent again later."""
        await self._db.run(functools.partial(_set, status="replied", error=error), item_ids)

    async def mark_failed(
        self, item_ids: Sequence[int], error: str, sent: SentMessages | None = None
    ) -> None:
        await self._db.run(
            functools.partial(_set, status="failed", error=error, sent=sent), item_ids
        )

    async def mark_rejected(
        self, item_ids: Sequence[int], reason: str, sent: SentMessages | None = None
    ) -> None:
        await self._db.run(
            functools.partial(_set, status="rejected", error=reason, sent=sent), item_ids
        )

    async def is_recorded(self, channel: str, account: str, platform_message_id: str) -> bool:
        """Is this platform message recorded as (part of) the delivery of some reply?"""
        return await self._db.run(_is_recorded, channel, account, platform_message_id)

    async def open_replies(self, channel: str, account: str) -> list[InboxItem]:
        """The items of one channel account whose reply is stored and not recorded as
        sent, or shown while it is written (few: a reply is in that state only while
        it is being streamed or sent)."""
        return await self._db.run(_open_replies, channel, account)

    async def note_preview(
        self, item_ids: Sequence[int], send_mark: str | None, sent: SentMessages | None = None
    ) -> None:
        """A reply to ``item_ids`` is shown while it is written, in messages of its own:
        before the first, the chat's send mark (an earlier one is kept); after each,
        its platform id, recorded as this reply's (``is_recorded``)."""
        await self._db.run(_note_preview, list(item_ids), send_mark, sent)

    async def previews(self, item_ids: Sequence[int]) -> list[str]:
        """The platform ids recorded for these items' reply (its previews, its parts)."""
        return await self._db.run(_previews, list(item_ids))

    async def forget_send_marks(self, item_ids: Sequence[int]) -> None:
        """Set these replies' send mark to ``UNKNOWN_SEND_MARK`` for good."""
        await self._db.run(_forget_marks, list(item_ids))

    async def renew_send_mark(self, item_ids: Sequence[int], send_mark: str) -> None:
        """Replace these replies' send mark (not an unknown one): a look above the old
        mark found nothing, and the next send comes after this one."""
        await self._db.run(_renew_mark, list(item_ids), send_mark)

    async def open_items(self, limit: int = 10_000) -> list[InboxItem]:
        return await self._db.run(_open, limit)

    async def newest_per_conversation(
        self, channel: str, since: datetime, limit: int = 1000
    ) -> list[SeenMark]:
        """Per conversation (account, chat, thread) of ``channel`` with a message stored
        since ``since``: its newest message; the most recently active first, at most
        ``limit`` of them."""
        return await self._db.run(_newest, channel, since.isoformat(), limit)

    async def counts(self) -> dict[str, int]:
        return await self._db.run(_counts)

    async def items_from(self, channel: str | None, sender_id: str) -> list[int]:
        """The ids of every item ``sender_id`` sent on ``channel`` (None: any channel),
        whatever its state (``gateway.inbox.sender_matches``)."""
        return await self._db.run(_items_from, channel, sender_id)

    async def delete_items(self, item_ids: Sequence[int]) -> int:
        """Delete these items (``parley people erase``); how many there were."""
        return await self._db.run(_delete, list(item_ids))

    async def prune_finished(self, before: datetime, *, dry_run: bool = False) -> PruneResult:
        """Delete (``dry_run``: count) finished items last changed before ``before`` and
        older than every open item (any replica's), with their sent-message records."""
        found = await self._db.run(_prunable, before.isoformat())
        if dry_run or not found:
            return PruneResult(len(found), sum(size for _, size in found))
        ids = [item_id for item_id, _ in found]
        for start in range(0, len(ids), PRUNE_BATCH):
            await self._db.run(_delete, ids[start : start + PRUNE_BATCH])
        return PruneResult(len(found), sum(size for _, size in found))


# -- on a pool thread, inside the caller's transaction ------------------------------------


def _record(
    conn: Connection, message: InboundMessage, session_key: str | None, claimant: int | None
) -> RecordResult:
    now = datetime.now(UTC).isoformat()
    row = conn.execute(
        "INSERT INTO inbox (channel, account, platform_message_id, received_at,"
        " updated_at, payload, status, session_key, claimed_by)"
        " VALUES (%s, %s, %s, %s, %s, %s, 'received', %s, %s)"
        " ON CONFLICT (channel, account, platform_message_id) DO NOTHING RETURNING *",
        (
            message.channel,
            message.account,
            message.message_id,
            now,
            now,
            message_to_json(message),
            session_key,
            claimant,
        ),
    ).fetchone()
    if row is not None:
        return RecordResult(item_from_row(row), is_new=True)
    # A duplicate: a new statement sees the first copy, even one committed by another
    # replica while this insert waited on it.
    existing = conn.execute(
        "SELECT * FROM inbox WHERE channel = %s AND account = %s AND platform_message_id = %s",
        (message.channel, message.account, message.message_id),
    ).fetchone()
    if existing is None:
        # Retention removed it between the insert and this read: it is past the dedupe
        # window, so it is new to us (the caller's transaction inserts it now).
        return _record(conn, message, session_key, claimant)
    return RecordResult(item_from_row(existing), is_new=False)


def _get(conn: Connection, item_id: int) -> InboxItem | None:
    row = conn.execute("SELECT * FROM inbox WHERE id = %s", (item_id,)).fetchone()
    return item_from_row(row) if row else None


def _set(
    conn: Connection,
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
    conn.execute(
        "UPDATE inbox SET status = %s, session_id = COALESCE(%s, session_id),"
        " reply = COALESCE(%s, reply), error = COALESCE(%s, error), updated_at = %s,"
        " send_mark = COALESCE(send_mark, %s), reply_for = COALESCE(%s, reply_for)"
        " WHERE id = ANY(%s)",
        (status, session_id, reply, error, now, send_mark, reply_for, list(item_ids)),
    )
    if sent is not None and item_ids and sent.message_ids:
        conn.execute(
            "INSERT INTO sent_messages (channel, account, platform_message_id, inbox_id)"
            " SELECT %s, %s, unnest(%s::text[]), %s ON CONFLICT DO NOTHING",
            (sent.channel, sent.account, list(sent.message_ids), item_ids[0]),
        )


def _open_replies(conn: Connection, channel: str, account: str) -> list[InboxItem]:
    rows = conn.execute(
        "SELECT * FROM inbox WHERE (status = 'replied'"
        " OR (status = 'received' AND send_mark IS NOT NULL))"
        " AND channel = %s AND account = %s ORDER BY id",
        (channel, account),
    ).fetchall()
    return [item_from_row(r) for r in rows]


def _note_preview(
    conn: Connection, item_ids: list[int], send_mark: str | None, sent: SentMessages | None
) -> None:
    if not item_ids:
        return
    if send_mark is not None:
        conn.execute(
            "UPDATE inbox SET send_mark = COALESCE(send_mark, %s),"
            " reply_for = COALESCE(reply_for, %s) WHERE id = ANY(%s)",
            (send_mark, json.dumps(item_ids), item_ids),
        )
    if sent is not None and sent.message_ids:
        conn.execute(
            "INSERT INTO sent_messages (channel, account, platform_message_id, inbox_id)"
            " SELECT %s, %s, unnest(%s::text[]), %s ON CONFLICT DO NOTHING",
            (sent.channel, sent.account, list(sent.message_ids), item_ids[0]),
        )


def _previews(conn: Connection, item_ids: list[int]) -> list[str]:
    rows = conn.execute(
        "SELECT platform_message_id FROM sent_messages WHERE inbox_id = ANY(%s)", (item_ids,)
    ).fetchall()
    return [str(r["platform_message_id"]) for r in rows]


def _forget_marks(conn: Connection, item_ids: list[int]) -> None:
    conn.execute(
        "UPDATE inbox SET send_mark = %s WHERE id = ANY(%s)", (UNKNOWN_SEND_MARK, item_ids)
    )


def _renew_mark(conn: Connection, item_ids: list[int], send_mark: str) -> None:
    conn.execute(
        "UPDATE inbox SET send_mark = %s WHERE id = ANY(%s) AND send_mark IS DISTINCT FROM %s",
        (send_mark, item_ids, UNKNOWN_SEND_MARK),
    )


def _is_recorded(conn: Connection, channel: str, account: str, platform_message_id: str) -> bool:
    row = conn.execute(
        "SELECT 1 AS found FROM sent_messages WHERE channel = %s AND account = %s"
        " AND platform_message_id = %s",
        (channel, account, platform_message_id),
    ).fetchone()
    return row is not None


def _open(conn: Connection, limit: int) -> list[InboxItem]:
    rows = conn.execute(
        "SELECT * FROM inbox WHERE status IN ('received', 'replied') ORDER BY id LIMIT %s",
        (limit,),
    ).fetchall()
    return [item_from_row(r) for r in rows]


def _open_for_session(conn: Connection, key: str, also: list[int]) -> list[InboxItem]:
    rows = conn.execute(
        "SELECT * FROM inbox WHERE status IN ('received', 'replied')"
        " AND (session_key = %s OR id = ANY(%s)) ORDER BY id",
        (key, also),
    ).fetchall()
    return [item_from_row(r) for r in rows]


def _claim_orphans(
    conn: Connection, claimant: int, channels: list[str], limit: int
) -> list[InboxItem]:
    # SKIP LOCKED: two replicas scanning at once split the orphans instead of waiting
    # on each other's rows; the claim commits with this transaction.
    rows = conn.execute(
        "UPDATE inbox SET claimed_by = %(me)s WHERE id IN ("
        " SELECT id FROM inbox WHERE status IN ('received', 'replied')"
        " AND channel = ANY(%(channels)s)"
        " AND (claimed_by IS NULL OR (claimed_by <> %(me)s AND NOT EXISTS ("
        "  SELECT 1 FROM pg_stat_activity a WHERE a.pid = inbox.claimed_by)))"
        " ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) RETURNING *",
        {"me": claimant, "channels": channels, "limit": limit},
    ).fetchall()
    return sorted((item_from_row(r) for r in rows), key=lambda item: item.id)


def _newest(conn: Connection, channel: str, since: str, limit: int) -> list[SeenMark]:
    # Newest first along the primary key (arrival order), through a server-side cursor
    # so the scan stops once ``limit`` conversations are found. The chat and thread are
    # read from the payload here, not with ->> in SQL: PostgreSQL's JSON types refuse
    # a "\u0000" anywhere in the document, which a message's text may carry.
    with conn.cursor(name="parley_inbox_newest") as cursor:
        cursor.itersize = NEWEST_BATCH
        cursor.execute(
            "SELECT account, payload, platform_message_id, received_at FROM inbox"
            ' WHERE channel = %s AND received_at COLLATE "C" >= %s ORDER BY id DESC',
            (channel, since),
        )
        return newest_marks(_conversation_rows(cursor), since, limit)


def _conversation_rows(rows: Iterable[Mapping[str, Any]]) -> Iterator[tuple[Any, ...]]:
    for row in rows:
        payload = json.loads(row["payload"])
        yield (
            row["account"],
            payload.get("chat_id"),
            payload.get("thread_id"),
            row["platform_message_id"],
            row["received_at"],
        )


def _counts(conn: Connection) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) AS n FROM inbox GROUP BY status").fetchall()
    return {row["status"]: int(row["n"]) for row in rows}


def _items_from(conn: Connection, channel: str | None, sender_id: str) -> list[int]:
    # The sender is read from the payload in Python (see _newest), batch by batch.
    with conn.cursor(name="parley_inbox_sender") as cursor:
        cursor.itersize = NEWEST_BATCH
        if channel is None:
            cursor.execute("SELECT id, channel, payload FROM inbox ORDER BY id")
        else:
            cursor.execute(
                "SELECT id, channel, payload FROM inbox WHERE channel = %s ORDER BY id", (channel,)
            )
        return [
            int(row["id"])
            for row in cursor
            if sender_matches(row["channel"], row["payload"], channel, sender_id)
        ]


def _prunable(conn: Connection, before: str) -> list[tuple[int, int]]:
    rows = conn.execute(
        "SELECT id, octet_length(payload) + COALESCE(octet_length(reply), 0) AS size"
        " FROM inbox WHERE status = ANY(%s) AND updated_at < %s AND id < COALESCE("
        "(SELECT min(id) FROM inbox WHERE status IN ('received', 'replied')), 9223372036854775807)"
        " ORDER BY id",
        (list(FINISHED_STATES), before),
    ).fetchall()
    return [(int(r["id"]), int(r["size"])) for r in rows]


def _delete(conn: Connection, item_ids: list[int]) -> int:
    if not item_ids:
        return 0
    conn.execute("DELETE FROM sent_messages WHERE inbox_id = ANY(%s)", (item_ids,))
    cursor = conn.execute("DELETE FROM inbox WHERE id = ANY(%s)", (item_ids,))
    return cursor.rowcount
