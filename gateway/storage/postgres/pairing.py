"""DM pairing in the shared PostgreSQL: ``PairingStore``'s API and rules.

Several replicas may see the same stranger (or a flood of them) at once. Drawing a code
is a read-modify-write over the channel (this sender's row, and the count of open codes
against ``MAX_PENDING_PER_CHANNEL``), so it runs under a transaction-level advisory
lock per channel: one replica draws, the next finds the code already there. Deciding a
code locks its row, so two operators approving at once get one approval and one
"already approved".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import psycopg

from parley.gateway.errors import PairingError
from parley.gateway.storage.pairing import (
    CODE_TTL,
    MAX_PENDING_PER_CHANNEL,
    PairingCheck,
    PairingRequest,
    PairingStatus,
    cannot_decide,
    check_existing,
    draw_code,
    format_code,
    normalise_code,
    request_from_row,
)
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.sessions import utcnow

# pg_advisory_xact_lock(class, hashtext(channel)): the two-key form, so it can never
# meet the one-key migration lock. "pair" in ASCII; any constant will do.
PAIRING_LOCK_CLASS = 0x70616972
# A clash in a 32^8 space is rare; retry rather than fail (as the SQLite store does).
CODE_ATTEMPTS = 8


class PgPairingStore:
    def __init__(self, db: PgDatabase, *, now: Callable[[], datetime] = utcnow) -> None:
        self._db = db
        self._now = now

    def now(self) -> datetime:
        return self._now()

    async def check(
        self, channel: str, account: str, sender_id: str, sender_name: str | None
    ) -> PairingCheck:
        return await self._db.run(
            _check, channel, account, sender_id.lower(), sender_name, self._now()
        )

    async def mark_notified(self, channel: str, sender_id: str) -> None:
        await self._db.run(_notified, channel, sender_id.lower(), self._now())

    async def list(self, status: PairingStatus | None = None) -> list[PairingRequest]:
        return await self._db.run(_list, status)

    async def approve(self, code: str) -> PairingRequest:
        return await self._db.run(_decide, normalise_code(code), "approved", self._now())

    async def deny(self, code: str) -> PairingRequest:
        return await self._db.run(_decide, normalise_code(code), "denied", self._now())

    async def revoke(self, channel: str, sender_id: str) -> bool:
        return await self._db.run(_revoke, channel, sender_id.lower())


# -- on a pool thread, inside the caller's transaction ------------------------------------


def _get(conn: Connection, channel: str, sender_id: str) -> PairingRequest | None:
    row = conn.execute(
        "SELECT * FROM pairing WHERE channel = %s AND sender_id = %s", (channel, sender_id)
    ).fetchone()
    return request_from_row(row) if row else None


def _check(
    conn: Connection,
    channel: str,
    account: str,
    sender_id: str,
    sender_name: str | None,
    now: datetime,
) -> PairingCheck:
    # Known senders (the usual case) are answered without taking the lock.
    decided = check_existing(_get(conn, channel, sender_id), now)
    if decided is not None:
        return decided
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (PAIRING_LOCK_CLASS, channel))
    # Another replica may have drawn this sender's code while we waited for the lock.
    decided = check_existing(_get(conn, channel, sender_id), now)
    if decided is not None:
        return decided
    if _open_codes(conn, channel, sender_id, now) >= MAX_PENDING_PER_CHANNEL:
        return PairingCheck(allowed=False, request=None, reason="too many pending codes")
    created = _draw(conn, channel, account, sender_id, sender_name, now)
    return PairingCheck(allowed=False, request=created, notify=True, reason="new code")


def _open_codes(conn: Connection, channel: str, sender_id: str, now: datetime) -> int:
    """Valid pending codes of ``channel``'s other senders."""
    row = conn.execute(
        "SELECT count(*) AS n FROM pairing WHERE channel = %s AND status = 'pending'"
        ' AND expires_at COLLATE "C" > %s AND sender_id != %s',
        (channel, now.isoformat(), sender_id),
    ).fetchone()
    return int(row["n"]) if row else 0


def _draw(
    conn: Connection,
    channel: str,
    account: str,
    sender_id: str,
    sender_name: str | None,
    now: datetime,
) -> PairingRequest:
    """A new pending code for the sender, replacing an expired one."""
    for _ in range(CODE_ATTEMPTS):
        try:
            # A savepoint: a clashing code must not abort the whole transaction.
            with conn.transaction():
                row = conn.execute(
                    "INSERT INTO pairing (channel, sender_id, account, sender_name, code,"
                    " status, created_at, expires_at)"
                    " VALUES (%s, %s, %s, %s, %s, 'pending', %s, %s)"
                    " ON CONFLICT (channel, sender_id) DO UPDATE SET account = excluded.account,"
                    " sender_name = excluded.sender_name, code = excluded.code,"
                    " status = 'pending', created_at = excluded.created_at,"
                    " expires_at = excluded.expires_at, notified_at = NULL, decided_at = NULL"
                    " RETURNING *",
                    (
                        channel,
                        sender_id,
                        account,
                        sender_name,
                        draw_code(),
                        now.isoformat(),
                        (now + CODE_TTL).isoformat(),
                    ),
                ).fetchone()
        except psycopg.errors.UniqueViolation:
            continue
        assert row is not None  # an upsert always returns its row
        return request_from_row(row)
    raise PairingError("could not draw a unique pairing code")


def _notified(conn: Connection, channel: str, sender_id: str, now: datetime) -> None:
    conn.execute(
        "UPDATE pairing SET notified_at = %s WHERE channel = %s AND sender_id = %s",
        (now.isoformat(), channel, sender_id),
    )


def _list(conn: Connection, status: PairingStatus | None) -> list[PairingRequest]:
    order = ' ORDER BY created_at COLLATE "C"'
    if status is None:
        rows = conn.execute("SELECT * FROM pairing" + order).fetchall()
    else:
        rows = conn.execute("SELECT * FROM pairing WHERE status = %s" + order, (status,)).fetchall()
    return [request_from_row(r) for r in rows]


def _decide(conn: Connection, code: str, status: PairingStatus, now: datetime) -> PairingRequest:
    # FOR UPDATE: a concurrent decision on the same code waits, then sees this one's.
    row = conn.execute("SELECT * FROM pairing WHERE code = %s FOR UPDATE", (code,)).fetchone()
    if row is None:
        raise PairingError(f"no pairing request has the code {format_code(code)!s}")
    request = request_from_row(row)
    problem = cannot_decide(request, now)
    if problem is not None:
        raise PairingError(problem)
    decided = conn.execute(
        "UPDATE pairing SET status = %s, decided_at = %s WHERE code = %s RETURNING *",
        (status, now.isoformat(), code),
    ).fetchone()
    assert decided is not None  # the row is locked: it is still there
    return request_from_row(decided)


def _revoke(conn: Connection, channel: str, sender_id: str) -> bool:
    cursor = conn.execute(
        "DELETE FROM pairing WHERE channel = %s AND sender_id = %s", (channel, sender_id)
    )
    return cursor.rowcount > 0
