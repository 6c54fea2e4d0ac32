"""DM pairing: a stranger gets a code, an operator approves it.

This module holds the records and the store's protocol (``PairingStore``), which the
SQLite (``storage.sqlite.pairing``) and PostgreSQL (``storage.postgres.pairing``)
stores both satisfy.

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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

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


class PairingStore(Protocol):
    def now(self) -> datetime: ...

    async def check(
        self, channel: str, account: str, sender_id: str, sender_name: str | None
    ) -> PairingCheck: ...

    async def mark_notified(self, channel: str, sender_id: str) -> None: ...

    async def list(self, status: PairingStatus | None = None) -> builtins.list[PairingRequest]: ...

    async def approve(self, code: str) -> PairingRequest: ...

    async def deny(self, code: str) -> PairingRequest: ...

    async def revoke(self, channel: str, sender_id: str) -> bool: ...
