"""``parley db migrate|status``: the state schema of the configured backend."""

from __future__ import annotations

import argparse

from parley.gateway.cli.common import EXIT_OK
from parley.gateway.config import LoadedConfig


def add_db_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    db = sub.add_parser("db", parents=[common], help="the state database's schema")
    actions = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    actions.add_parser(
        "migrate",
        parents=[common],
        help="apply pending schema migrations (idempotent; safe while replicas start)",
    )
    actions.add_parser("status", parents=[common], help="the backend and its schema version")


async def db_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    storage = loaded.config.storage
    if storage.backend == "postgres":
        assert storage.url is not None  # the config refuses postgres without one
        return await _postgres(storage.url.get_secret_value(), args.db_command)
    return await _sqlite(loaded, args.db_command)


async def _postgres(url: str, action: str) -> int:
    from parley.gateway.storage.postgres.database import PgDatabase
    from parley.gateway.storage.postgres.schema_migrations import (
        SCHEMA_VERSION,
        migrate,
        schema_version,
    )

    async with PgDatabase(url, pool_size=2, migrate_at_open=False) as db:
        if action == "migrate":
            applied = await db.run(migrate)
            done = ", ".join(map(str, applied)) if applied else "nothing to apply"
            print(f"postgres {db.where}: migrated ({done}); schema version {SCHEMA_VERSION}")
        else:
            version = await db.run(schema_version)
            behind = f" ({SCHEMA_VERSION - version} pending)" if version < SCHEMA_VERSION else ""
            print(f"postgres {db.where}: schema version {version} of {SCHEMA_VERSION}{behind}")
    return EXIT_OK


async def _sqlite(loaded: LoadedConfig, action: str) -> int:
    from parley.gateway.storage.sqlite.database import SCHEMA_VERSION, Database

    # Opening state.db migrates it: "migrate" and "status" differ only in the words.
    async with Database(loaded.state_db) as db:
        version = await db.run(lambda: db.conn.execute("PRAGMA user_version").fetchone()[0])
    verb = "migrated" if action == "migrate" else "schema version"
    print(f"sqlite {loaded.state_db}: {verb} {version} of {SCHEMA_VERSION}")
    return EXIT_OK
