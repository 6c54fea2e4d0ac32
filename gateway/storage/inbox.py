"""The durable inbox: every inbound message is recorded before it is processed.

This module holds its records and its protocol (``Inbox``), which the SQLite
(``storage.sqlite.inbox``) and PostgreSQL (``storage.postgres.inbox``) stores both
satisfy; ``ReplicaInbox`` is what several replicas need on top (PostgreSQL only).

States: ``received`` (recorded, not yet answered) → ``replied`` (the reply text is
stored; delivery pending, or tried and to be tried again when ``error`` is set) →
``delivered``. ``failed`` (delivery refused for good, or not processed because the
disk refused a write: ``error`` then starts with ``storage:``) and ``rejected`` (busy)
are final. A platform delivering the same message twice
hits the unique (channel, account, platform message id) and is answered once.
Retention (``prune_finished``) removes only finished rows past the dedupe window
(``gateway.retention_config.INBOX_DEDUPE_DAYS``, longer than any platform redelivers)
and older than every open item, so neither dedupe nor send recovery loses a row it reads.
After a crash, ``open_items()`` gives back everything recorded but not finished,
in arrival order, so the gateway can answer it on restart.

Sending: a reply is stored (``mark_replied``) with the items it answers together
(``reply_for``, a folded turn) and the channel's *send mark* (where the chat's
message numbering stood before the send), and the platform ids of what went out
are recorded with the final status in ``sent_messages``. After a crash between a
send and its record, the mark and those ids let the gateway ask the platform
whether the reply is already there (``gateway.runtime.send_recovery``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from parley.channels.base import Attachment, EarlierMessage, InboundMessage, SeenMark
from parley.gateway.routing import normalise_channel, normalise_peer_id

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
class PruneResult:
    """Finished rows older than a cutoff: how many, and their stored bytes."""

    rows: int = 0
    bytes: int = 0


FINISHED_STATES = ("delivered", "failed", "rejected")


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
    for name in ("attachments", "reply_attachments"):
        files: tuple[Attachment, ...] = getattr(message, name)
        if any(_has_unstorable(a.name + a.ref + a.mime_type) for a in files):
            changes[name] = tuple(
                dataclasses.replace(
                    a, name=_scrub(a.name), ref=_scrub(a.ref), mime_type=_scrub(a.mime_type)
                )
                for a in files
            )
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
    # The rows of messages without files stay as they were.
    for name in ("attachments", "reply_attachments"):
        files: tuple[Attachment, ...] = data.pop(name)
        if files:
            data[name] = [a.to_dict() for a in files]
    # A line is [sender id, name, text, timestamp], and its files' dicts when it has any.
    data["group_context"] = [
        [*line[:4], [a.to_dict() for a in line.attachments]] if line.attachments else line[:4]
        for line in message.group_context
    ]
    return json.dumps(data, ensure_ascii=False)


def message_from_json(raw: str) -> InboundMessage:
    data = json.loads(raw)
    data["timestamp"] = datetime.fromisoformat(data["timestamp"])
    # Rows written before group context have none; JSON gives the lines back as lists.
    data["group_context"] = tuple(_earlier(line) for line in data.get("group_context", ()))
    for name in ("attachments", "reply_attachments"):
        data[name] = _files(data.get(name, ()))
    return InboundMessage(**data)


def _earlier(line: list[Any]) -> EarlierMessage:
    sender_id, sender_name, text, timestamp, *files = line
    attachments = _files(files[0]) if files else ()
    return EarlierMessage(sender_id, sender_name, text, timestamp, attachments)


def _files(raw: Sequence[dict[str, object]]) -> tuple[Attachment, ...]:
    return tuple(Attachment.from_dict(a) for a in raw)


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


class Inbox(Protocol):
    """The durable inbox (see the module doc). Status changes take every id of a
    folded turn at once."""

    async def record(
        self, message: InboundMessage, session_key: str | None = None
    ) -> RecordResult: ...

    async def get(self, item_id: int) -> InboxItem | None: ...

    async def mark_replied(
        self,
        item_ids: Sequence[int],
        session_id: str | None,
        reply: list[str],
        send_mark: str | None = None,
    ) -> None: ...

    async def mark_delivered(
        self, item_ids: Sequence[int], sent: SentMessages | None = None
    ) -> None: ...

    async def note_undelivered(self, item_ids: Sequence[int], error: str) -> None: ...

    async def mark_failed(
        self, item_ids: Sequence[int], error: str, sent: SentMessages | None = None
    ) -> None: ...

    async def mark_rejected(
        self, item_ids: Sequence[int], reason: str, sent: SentMessages | None = None
    ) -> None: ...

    async def is_recorded(self, channel: str, account: str, platform_message_id: str) -> bool: ...

    async def open_replies(self, channel: str, account: str) -> list[InboxItem]: ...

    async def forget_send_marks(self, item_ids: Sequence[int]) -> None: ...

    async def renew_send_mark(self, item_ids: Sequence[int], send_mark: str) -> None: ...

    async def note_preview(
        self, item_ids: Sequence[int], send_mark: str | None, sent: SentMessages | None = None
    ) -> None: ...

    async def previews(self, item_ids: Sequence[int]) -> list[str]: ...

    async def open_items(self, limit: int = 10_000) -> list[InboxItem]: ...

    async def newest_per_conversation(
        self, channel: str, since: datetime, limit: int = 1000
    ) -> list[SeenMark]: ...

    async def counts(self) -> dict[str, int]: ...

    async def items_from(self, channel: str | None, sender_id: str) -> list[int]: ...

    async def delete_items(self, item_ids: Sequence[int]) -> int: ...

    async def prune_finished(self, before: datetime, *, dry_run: bool = False) -> PruneResult:
        """Delete (``dry_run``: count) the finished items last changed before ``before``
        and older than every open item, with their sent-message records (retention)."""
        ...


class ReplicaInbox(Inbox, Protocol):
    """The inbox several replicas share: items carry their claimant (the backend pid of
    a replica's session-lock connection), and a dead replica's items are taken over."""

    @property
    def claimant(self) -> int | None: ...

    async def open_for_session(self, key: str, also: Sequence[int] = ()) -> list[InboxItem]: ...

    async def claim_orphans(
        self, *, channels: Sequence[str], limit: int = 1000
    ) -> list[InboxItem]: ...
