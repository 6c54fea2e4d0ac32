"""DM pairing in state.db: ``SqlitePairingStore``, the SQLite store behind the
``PairingStore`` protocol (how pairing works: ``gateway.storage.pairing``).
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable
from datetime import datetime

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
from parley.gateway.storage.sessions import utcnow
from parley.gateway.storage.sqlite.database import Database


class SqlitePairingStore:
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
