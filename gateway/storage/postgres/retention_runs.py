"""Retention across replicas sharing one PostgreSQL: one run at a time, and when the
last one was (gateway/retention/ decides what a run removes; this is only the
database's part).

Every replica runs the daily retention at the same hour against the same rows. The run
lock is a session-level advisory lock taken with ``pg_try_advisory_lock`` on a
connection of its own and held for the whole run (``hold_run_lock``): a second run, a
replica's daily one or `parley maintenance` anywhere, finds it taken and stops
(``RetentionBusy``, ``shared``). Not the pool's connections: a pooled connection goes
back to the pool (and to other statements) while the run goes on, and a run would keep
one of them out of it for minutes. A replica that dies loses the connection and
PostgreSQL drops the lock with it; nothing else ever expires it. The connection can
still break during a run (a network cut, a server restart): another run may then start
beside this one, which only repeats work (every step of a run is idempotent); the
release notices and logs it.

``retention_last_run`` (schema version 7, one row) holds the record of the last run
that removed, whoever ran it: the other replicas' daily runs read it under the lock and
skip when it is from that day (``gateway.retention.run.run_daily``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from parley.gateway.errors import RetentionBusy, StateError
from parley.gateway.storage.postgres.database import Connection, PgDatabase
from parley.gateway.storage.postgres.session_locks import lock_connection

log = logging.getLogger("parley.gateway.retention")

# pg_try_advisory_lock(class, hashtext(current_schema())): the two-key form, which never
# meets the one-key session and migration locks; "retn" in ASCII, apart from pairing's
# class. Keyed by the schema because the rows a run works on are the schema's.
RUN_LOCK_CLASS = 0x7265746E
_KEY = "%s, hashtext(current_schema())"


@contextlib.asynccontextmanager
async def hold_run_lock(db: PgDatabase) -> AsyncIterator[int]:
    """Hold the database's retention lock for the block; yields the lock connection's
    backend pid. Raises RetentionBusy (``shared``) at once when another run holds it."""
    try:
        conn = await lock_connection(db.url)
    except psycopg.Error as exc:
        raise StateError(f"cannot open the retention lock connection to {db.where}: {exc}") from exc
    try:
        try:
            cursor = await conn.execute(
                f"SELECT pg_try_advisory_lock({_KEY}), pg_backend_pid()", (RUN_LOCK_CLASS,)
            )
            row = await cursor.fetchone()
        except psycopg.Error as exc:
            raise StateError(f"cannot take the retention lock at {db.where}: {exc}") from exc
        if not (row and row[0]):
            raise RetentionBusy(
                f"another retention run is under way on the shared database {db.where} "
                "(another replica's daily run or `parley maintenance`); try again when it "
                "is done",
                shared=True,
            )
        try:
            yield int(row[1])
        finally:
            await _release(conn)
    finally:
        await conn.close()  # drops the lock too, if the release could not


async def _release(conn: psycopg.AsyncConnection[Any]) -> None:
    """Unlock, and say so when the lock was no longer held: the connection broke during
    the run, so another run may have overlapped it (harmless, but worth a line)."""
    try:
        cursor = await conn.execute(f"SELECT pg_advisory_unlock({_KEY})", (RUN_LOCK_CLASS,))
        row = await cursor.fetchone()
        held = bool(row and row[0])
    except psycopg.Error:
        held = False
    if not held:
        log.warning(
            "retention: the database's run lock was lost during the run (its connection "
            "broke): another replica may have run beside it, repeating some of its work"
        )


def last_run(conn: Connection) -> dict[str, Any] | None:
    """The record of the last run on this database; None when there was none, or the
    schema is older than version 7 (`parley doctor` reads databases it does not migrate)."""
    found = conn.execute("SELECT to_regclass('retention_last_run') IS NOT NULL AS e").fetchone()
    if not (found and found["e"]):
        return None
    row = conn.execute("SELECT record FROM retention_last_run").fetchone()
    if row is None:
        return None
    try:
        data = json.loads(row["record"])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def record_run(conn: Connection, record: dict[str, Any]) -> None:
    """Replace the record of the last run (called under the run lock)."""
    conn.execute(
        "INSERT INTO retention_last_run (only_row, finished_at, record) VALUES (true, %s, %s)"
        " ON CONFLICT (only_row) DO UPDATE"
        " SET finished_at = excluded.finished_at, record = excluded.record",
        (str(record.get("finished_at", "")), json.dumps(record)),
    )
