"""DM pairing: a stranger gets a code, an operator approves it.

Under ``dm_policy = "pairing"`` a direct message from someone who is neither in
``allow_from`` nor approved is not answered by the agent. The sender gets a short
code instead (once, and again at most every ``RENOTIFY_AFTER`` while it is valid);
``parley pairing approve CODE`` lets them in for good, ``deny`` silences them.

Approval is per channel and person (any bot account of that channel). Codes use an
alphabet without look-alikes (no 0/O, 1/I), expire after an hour, and at most
``MAX_PENDING_PER_CHANNEL`` are open at once, so a flood of strangers cannot fill the
table or the operator's screen.
"""

from __future__ import annotations

import builtins
import secrets
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from gateway.db import Database
from gateway.errors import PairingError
from gateway.registry import utcnow

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL = timedelta(hours=1)
RENOTIFY_AFTER = timedelta(minutes=10)
MAX_PENDING_PER_CHANNEL = 3

PairingStatus = Literal["pending", "approved", "denied"]


@dataclass(frozen=True, slots=True)
class PairingRequest:
    channel: str
    sender_id: str
    account: str
    sender_name: str | None
    code: str
    status: PairingStatus
    created_at: datetime
    expires_at: datetime
    notified_at: datetime | None
    decided_at: datetime | None

    @property
    def display_code(self) -> str:
        return format_code(self.code)

    def expired(self, now: datetime) -> bool:
        return self.status == "pending" and now >= self.expires_at


@dataclass(frozen=True, slots=True)
class PairingCheck:
    """The answer for one direct message: let it through, or (maybe) send the code."""

    allowed: bool
    request: PairingRequest | None = None
    notify: bool = False  # send the code to the sender now
    reason: str = ""


def format_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


def normalise_code(text: str) -> str:
    return "".join(c for c in text.upper() if c.isalnum())


def pairing_text(request: PairingRequest, now: datetime) -> str:
    minutes = max(1, int((request.expires_at - now).total_seconds() // 60))
    return (
        "Hi! I don't know you yet, so I can't chat until the person who runs me lets you in.\n"
        f"Your pairing code is {request.display_code}. Ask them to run:\n"
        f"  parley pairing approve {request.display_code}\n"
        f"The code is valid for {minutes} more minute(s)."
    )


def check_existing(current: PairingRequest | None, now: datetime) -> PairingCheck | None:
    """The answer the sender's current request gives, or None when a new code is due
    (no request yet, or an expired one)."""
    if current is not None and current.status == "approved":
        return PairingCheck(allowed=True, request=current)
    if current is not None and current.status == "denied":
        return PairingCheck(allowed=False, request=current, reason="denied")
    if current is not None and not current.expired(now):
        due = current.notified_at is None or now - current.notified_at >= RENOTIFY_AFTER
        return PairingCheck(allowed=False, request=current, notify=due, reason="pending")
    return None


def cannot_decide(request: PairingRequest, now: datetime) -> str | None:
    """Why ``request`` can no longer be approved or denied; None when it can."""
    if request.status != "pending":
        return (
            f"{request.display_code} was already {request.status}"
            f" ({request.channel} user {request.sender_id})"
        )
    if request.expired(now):
        return (
            f"{request.display_code} expired at {request.expires_at:%Y-%m-%d %H:%M} UTC;"
            " the person gets a new code when they write again"
        )
    return None


def draw_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


class PairingStore:
    def __init__(self, db: Database, *, now: Callable[[], datetime] = utcnow) -> None:
        self._db = db
        self._now = now

    def now(self) -> datetime:
        return self._now()

    async def check(
        self, channel: str, account: str, sender_id: str, sender_name: str | None
    ) -> PairingCheck:
        return await self._db.run(
            self._check_sync, channel, account, sender_id.lower(), sender_name, self._now()
        )

    async def mark_notified(self, channel: str, sender_id: str) -> None:
        await self._db.run(self._notified_sync, channel, sender_id.lower(), self._now())

    async def list(self, status: PairingStatus | None = None) -> list[PairingRequest]:
        return await self._db.run(self._list_sync, status)

    async def approve(self, code: str) -> PairingRequest:
        return await self._db.run(self._decide_sync, normalise_code(code), "approved", self._now())

    async def deny(self, code: str) -> PairingRequest:
        return await self._db.run(self._decide_sync, normalise_code(code), "denied", self._now())

    async def revoke(self, channel: str, sender_id: str) -> bool:
        return await self._db.run(self._revoke_sync, channel, sender_id.lower())

    # -- on the database thread -------------------------------------------------------

    def _get_sync(self, channel: str, sender_id: str) -> PairingRequest | None:
        row = self._db.conn.execute(
            "SELECT * FROM pairing WHERE channel = ? AND sender_id = ?", (channel, sender_id)
        ).fetchone()
        return request_from_row(row) if row else None

    def _check_sync(
        self,
        channel: str,
        account: str,
        sender_id: str,
        sender_name: str | None,
        now: datetime,
    ) -> PairingCheck:
        decided = check_existing(self._get_sync(channel, sender_id), now)
        if decided is not None:
            return decided
        conn = self._db.conn
        pending = conn.execute(
            "SELECT count(*) FROM pairing WHERE channel = ? AND status = 'pending'"
            " AND expires_at > ? AND sender_id != ?",
            (channel, now.isoformat(), sender_id),
        ).fetchone()[0]
        if pending >= MAX_PENDING_PER_CHANNEL:
            return PairingCheck(allowed=False, request=None, reason="too many pending codes")
        for _ in range(8):  # a clash in a 32^8 space is rare; retry rather than fail
            code = draw_code()
            try:
                conn.execute(
                    "INSERT INTO pairing (channel, sender_id, account, sender_name, code, status,"
                    " created_at, expires_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)"
                    " ON CONFLICT (channel, sender_id) DO UPDATE SET account = excluded.account,"
                    " sender_name = excluded.sender_name, code = excluded.code,"
                    " status = 'pending', created_at = excluded.created_at,"
                    " expires_at = excluded.expires_at, notified_at = NULL, decided_at = NULL",
                    (
                        channel,
                        sender_id,
                        account,
                        sender_name,
                        code,
                        now.isoformat(),
                        (now + CODE_TTL).isoformat(),
                    ),
                )
            except sqlite3.IntegrityError:
                continue
            created = self._get_sync(channel, sender_id)
            return PairingCheck(allowed=False, request=created, notify=True, reason="new code")
        raise PairingError("could not draw a unique pairing code")

    def _notified_sync(self, channel: str, sender_id: str, now: datetime) -> None:
        self._db.conn.execute(
            "UPDATE pairing SET notified_at = ? WHERE channel = ? AND sender_id = ?",
            (now.isoformat(), channel, sender_id),
        )

    # ``builtins.list``: the ``list`` method above shadows the builtin in the class body.
    def _list_sync(self, status: PairingStatus | None) -> builtins.list[PairingRequest]:
        if status is None:
            rows = self._db.conn.execute("SELECT * FROM pairing ORDER BY created_at").fetchall()
        else:
            rows = self._db.conn.execute(
                "SELECT * FROM pairing WHERE status = ? ORDER BY created_at", (status,)
            ).fetchall()
        return [request_from_row(r) for r in rows]

    def _decide_sync(self, code: str, status: PairingStatus, now: datetime) -> PairingRequest:
        row = self._db.conn.execute("SELECT * FROM pairing WHERE code = ?", (code,)).fetchone()
        if row is None:
            raise PairingError(f"no pairing request has the code {format_code(code)!s}")
        request = request_from_row(row)
        problem = cannot_decide(request, now)
        if problem is not None:
            raise PairingError(problem)
        self._db.conn.execute(
            "UPDATE pairing SET status = ?, decided_at = ? WHERE code = ?",
            (status, now.isoformat(), code),
        )
        decided = self._get_sync(request.channel, request.sender_id)
        assert decided is not None
        return decided

    def _revoke_sync(self, channel: str, sender_id: str) -> bool:
        cursor = self._db.conn.execute(
            "DELETE FROM pairing WHERE channel = ? AND sender_id = ?", (channel, sender_id)
        )
        return cursor.rowcount > 0


def _when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def request_from_row(row: Mapping[str, Any]) -> PairingRequest:
    """From a pairing row of either backend (sqlite3.Row or a psycopg dict row)."""
    return PairingRequest(
        channel=row["channel"],
        sender_id=row["sender_id"],
        account=row["account"],
        sender_name=row["sender_name"],
        code=row["code"],
        status=row["status"],
        created_at=datetime.fromisoformat(row["created_at"]),
        expires_at=datetime.fromisoformat(row["expires_at"]),
        notified_at=_when(row["notified_at"]),
        decided_at=_when(row["decided_at"]),
    )
