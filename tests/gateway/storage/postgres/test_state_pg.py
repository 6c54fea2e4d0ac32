"""What only the shared PostgreSQL has to get right: several replicas (each its own
connection pool) racing on the same session key, platform message and pairing code,
and PostgreSQL failures told as storage failures. The backend-neutral behaviour is in
tests/gateway/test_state.py, which runs against both backends."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from parley.channels.base import InboundMessage
from parley.gateway.errors import PairingError, StateError
from parley.gateway.storage.errors import storage_failure
from parley.gateway.storage.pairing import MAX_PENDING_PER_CHANNEL
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.inbox import PgInbox
from parley.gateway.storage.postgres.pairing import PgPairingStore
from parley.gateway.storage.postgres.session_registry import PgSessionRegistry
from parley.gateway.storage.sessions import SessionOrigin
from parley.gateway.storage.sqlite.inbox import SqliteInbox
from parley.gateway.storage.sqlite.pairing import SqlitePairingStore
from parley.gateway.storage.sqlite.session_registry import SqliteSessionRegistry

ORIGIN = SessionOrigin("agent:main:test:direct:alice", "main", "test", "default", "direct", "alice")
RACERS = 24  # concurrent callers, split over the two replicas


@pytest.fixture
async def replicas(pg_url: str) -> AsyncIterator[tuple[PgDatabase, PgDatabase]]:
    """Two replicas' pools on one database, each big enough to run every racer at once."""
    async with (
        PgDatabase(pg_url, pool_size=RACERS) as one,
        PgDatabase(pg_url, pool_size=RACERS) as two,
    ):
        yield one, two


def message(mid: str) -> InboundMessage:
    return InboundMessage(
        "telegram", "default", "direct", "1", "1", "A", "hi", mid, datetime(2026, 1, 1, tzinfo=UTC)
    )


async def count(db: PgDatabase, sql: str) -> int:
    row = await db.run(lambda conn: conn.execute(sql).fetchone())
    return int(row["n"])


async def admin(url: str, sql: str, *params: Any) -> None:
    """One statement on a connection of its own, outside any pool (off the loop)."""

    def run() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql, params)

    await asyncio.to_thread(run)


def public_api(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") or name == "__init__"
    }


REPLICAS_ONLY = {PgInbox: {"open_for_session", "claim_orphans"}}


@pytest.mark.parametrize(
    ("sqlite_cls", "pg_cls"),
    [
        (SqliteSessionRegistry, PgSessionRegistry),
        (SqliteInbox, PgInbox),
        (SqlitePairingStore, PgPairingStore),
    ],
)
def test_the_postgres_classes_have_the_sqlite_api(sqlite_cls: type, pg_cls: type) -> None:
    sqlite_api, pg_api = public_api(sqlite_cls), public_api(pg_cls)
    # What only several replicas need (gateway/replicas.py) is PostgreSQL's alone.
    replicas_only = REPLICAS_ONLY.get(pg_cls, set())
    assert replicas_only <= set(pg_api)
    assert sorted(set(pg_api) - replicas_only) == sorted(sqlite_api)
    for name, signature in sqlite_api.items():
        params = list(signature.parameters.values())[1:]  # past self; db's type differs
        pg_params = list(pg_api[name].parameters.values())[1:]
        if name == "__init__":
            params, pg_params = params[1:], pg_params[1:]
        assert [(p.name, p.kind, p.default) for p in pg_params] == [
            (p.name, p.kind, p.default) for p in params
        ], name
        assert pg_api[name].return_annotation == signature.return_annotation, name


async def test_replicas_racing_to_create_a_session_get_one(
    replicas: tuple[PgDatabase, PgDatabase],
) -> None:
    registries = [PgSessionRegistry(db) for db in replicas]
    created = await asyncio.gather(
        *(registries[n % 2].create(ORIGIN, model=f"m{n}") for n in range(RACERS))
    )
    # The partial unique index picked one winner; every other caller read its row.
    assert len({r.session_id for r in created}) == 1
    winner = created[0]
    assert all(r == winner for r in created)
    assert await registries[1].get_active(ORIGIN.key) == winner
    assert await count(replicas[0], "SELECT count(*) AS n FROM sessions") == 1


async def test_a_reset_racing_new_sessions_leaves_one_active(
    replicas: tuple[PgDatabase, PgDatabase],
) -> None:
    registries = [PgSessionRegistry(db) for db in replicas]
    first = await registries[0].create(ORIGIN)

    async def reset() -> None:
        await registries[0].archive(first.session_id, "reset")

    created = await asyncio.gather(
        reset(), *(registries[n % 2].create(ORIGIN) for n in range(RACERS))
    )
    # Creates before the archive get the first session; those after, one new session.
    new_ids = {r.session_id for r in created[1:]} - {first.session_id}
    assert len(new_ids) <= 1
    assert await count(replicas[1], "SELECT count(*) AS n FROM sessions") == 1 + len(new_ids)
    active = "SELECT count(*) AS n FROM sessions WHERE status = 'active'"
    assert await count(replicas[1], active) == len(new_ids)


async def test_replicas_recording_the_same_delivery_record_it_once(
    replicas: tuple[PgDatabase, PgDatabase],
) -> None:
    inboxes = [PgInbox(db) for db in replicas]
    results = await asyncio.gather(*(inboxes[n % 2].record(message("777")) for n in range(RACERS)))
    assert sum(r.is_new for r in results) == 1
    assert len({r.item.id for r in results}) == 1
    assert all(r.item.message == message("777") for r in results)
    assert await inboxes[1].counts() == {"received": 1}


async def test_replicas_seeing_a_stranger_at_once_draw_one_code(
    replicas: tuple[PgDatabase, PgDatabase],
) -> None:
    stores = [PgPairingStore(db) for db in replicas]
    checks = await asyncio.gather(
        *(stores[n % 2].check("telegram", "default", "mallory", None) for n in range(RACERS))
    )
    assert [c.reason for c in checks].count("new code") == 1
    assert len({c.request.code for c in checks if c.request}) == 1
    assert await count(replicas[0], "SELECT count(*) AS n FROM pairing") == 1


async def test_a_flood_of_strangers_on_replicas_respects_the_cap(
    replicas: tuple[PgDatabase, PgDatabase],
) -> None:
    stores = [PgPairingStore(db) for db in replicas]
    checks = await asyncio.gather(
        *(stores[n % 2].check("telegram", "default", f"s{n}", None) for n in range(RACERS))
    )
    assert [c.reason for c in checks].count("new code") == MAX_PENDING_PER_CHANNEL
    assert len(await stores[1].list("pending")) == MAX_PENDING_PER_CHANNEL


async def test_two_operators_approving_at_once_approve_once(
    replicas: tuple[PgDatabase, PgDatabase],
) -> None:
    stores = [PgPairingStore(db) for db in replicas]
    request = (await stores[0].check("telegram", "default", "bob", None)).request
    assert request is not None
    outcomes = await asyncio.gather(
        *(stores[n % 2].approve(request.code) for n in range(RACERS)), return_exceptions=True
    )
    approved = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(approved) == 1 and approved[0].status == "approved"
    assert all(isinstance(o, PairingError) and "already approved" in str(o) for o in refused)


# -- failures --------------------------------------------------------------------------


async def test_a_read_only_database_is_a_storage_failure(pg_url: str) -> None:
    async with PgDatabase(pg_url) as db:
        dbname = await db.run(lambda c: c.execute("SELECT current_database() AS d").fetchone())
    await admin(pg_url, f'ALTER DATABASE "{dbname["d"]}" SET default_transaction_read_only = on')
    # New connections start read-only: what a standby, or a server an operator fenced
    # off, looks like to a replica. (Migrating would be a write: the schema is there.)
    async with PgDatabase(pg_url, migrate_at_open=False) as db:
        with pytest.raises(psycopg.Error) as raised:
            await PgInbox(db).record(message("1"))
        assert storage_failure(raised.value) == (
            "PostgreSQL: cannot execute INSERT in a read-only transaction"
        )
        with pytest.raises(psycopg.Error) as raised:
            await PgSessionRegistry(db).create(ORIGIN)
        assert (storage_failure(raised.value) or "").startswith("PostgreSQL: cannot execute")
        # Reads still work: the gateway can tell what it has, it just cannot add to it.
        assert await PgInbox(db).open_items() == []


async def test_a_connection_the_server_killed_is_a_storage_failure(pg_url: str) -> None:
    async with PgDatabase(pg_url, pool_size=1) as db:
        pid = await db.run(lambda c: c.execute("SELECT pg_backend_pid() AS p").fetchone())
        # Waits until the backend is gone, so the next statement surely meets it.
        await admin(pg_url, "SELECT pg_terminate_backend(%s, 10000)", pid["p"])
        with pytest.raises(psycopg.OperationalError) as raised:
            await PgSessionRegistry(db).get("any")
        detail = storage_failure(raised.value)
        assert detail is not None and detail.startswith("PostgreSQL: ")
        assert "\n" not in detail
        # The pool dropped the dead connection: the next call gets a fresh one.
        assert await PgSessionRegistry(db).get("any") is None


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.errors.DiskFull("could not extend file: No space left on device"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.OperationalError("connection failed:\n  server closed the connection"),
    ],
    ids=["disk-full", "read-only", "admin-shutdown", "connection-lost"],
)
def test_postgres_storage_errors_are_recognised(exc: psycopg.Error) -> None:
    detail = storage_failure(exc)
    assert detail == "PostgreSQL: " + " ".join(str(exc).split())
    # Wrapped by a layer above, the outer message is kept (it says where).
    try:
        raise StateError("PostgreSQL at postgresql://p@h/d: write refused") from exc
    except StateError as wrapped:
        assert storage_failure(wrapped) == "PostgreSQL at postgresql://p@h/d: write refused"
    try:
        raise RuntimeError("turn failed") from exc
    except RuntimeError as wrapped:
        assert storage_failure(wrapped) == "turn failed"


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.errors.UniqueViolation("duplicate key value"),
        psycopg.errors.DivisionByZero("division by zero"),
        psycopg.errors.UndefinedTable('relation "inbox" does not exist'),
    ],
)
def test_postgres_errors_in_a_statement_are_not_storage_failures(exc: Any) -> None:
    assert storage_failure(exc) is None
