"""``parley migrate --from sqlite --to postgres``: move a gateway's state to PostgreSQL.

The command around the copy (gateway/storage/copy_to_postgres.py, which says what is
copied and how a re-run finishes an interrupted one): it picks the target (``--url``,
else ``[storage] url`` / ``PARLEY_DATABASE_URL``), brings the target's schema up to date
(unless ``--dry-run``), runs the copy on a worker thread and prints the counts, source
against target; any difference exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TextIO

from parley.core.errors import CoreError
from parley.gateway.agents import agent_specs, loaded_for
from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import StateError
from parley.gateway.memory import memory_db_path
from parley.gateway.storage.copy_to_postgres import Migration, Report

BACKENDS = ("sqlite", "postgres")


def add_migrate_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    migrate = sub.add_parser(
        "migrate",
        parents=[common],
        help="copy sessions, transcripts, inbox, pairing and memory to PostgreSQL",
        description="Copy this gateway's SQLite state ($PARLEY_HOME: state.db, sessions/, "
        "memory.db) into PostgreSQL, then compare counts. Safe to re-run: what is "
        "already there is skipped, an interrupted copy is completed.",
    )
    migrate.add_argument("--from", dest="source", required=True, choices=BACKENDS)
    migrate.add_argument("--to", dest="target", required=True, choices=BACKENDS)
    migrate.add_argument(
        "--url", help="target database URL (default: [storage] url / PARLEY_DATABASE_URL)"
    )
    migrate.add_argument(
        "--dry-run", action="store_true", help="print what would be copied; change nothing"
    )
    migrate.add_argument(
        "--vector-index",
        choices=("hnsw", "exact"),
        default=None,
        help="the memory index's vector search in PostgreSQL (exact: no HNSW index); "
        "default: [storage] vector_index",
    )


async def migrate_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    out = sys.stdout
    if (args.source, args.target) != ("sqlite", "postgres"):
        print(
            f"parley migrate: cannot migrate from {args.source} to {args.target}; "
            "only --from sqlite --to postgres is supported",
            file=sys.stderr,
        )
        return EXIT_USAGE
    url = args.url
    if url is None and loaded.config.storage.url is not None:
        url = loaded.config.storage.url.get_secret_value()
    if not url:
        print(
            "parley migrate: no target database: pass --url, or set [storage] url "
            "(or PARLEY_DATABASE_URL)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not loaded.state_db.is_file():
        raise StateError(f"nothing to migrate: {loaded.state_db} does not exist")

    import psycopg

    from parley.gateway.storage.postgres.database import PgDatabase, redact_url
    from parley.gateway.storage.postgres.schema_migrations import (
        SCHEMA_VERSION,
        migrate,
        schema_version,
    )

    dry_run = bool(args.dry_run)
    try:
        async with PgDatabase(url, pool_size=2, migrate_at_open=False) as pg:
            verb = "would copy" if dry_run else "copying"
            print(f"{verb} {loaded.home} (sqlite) -> {pg.where} (postgres)", file=out)
            if dry_run:
                version = await pg.run(schema_version)
                if version < SCHEMA_VERSION:
                    print(f"schema: would migrate v{version} -> v{SCHEMA_VERSION}", file=out)
            else:
                applied = await pg.run(migrate)
                if applied:
                    print(f"schema: migrated to v{SCHEMA_VERSION}", file=out)
            migration = Migration(
                loaded,
                pg,
                memory_db=memory_db_path(loaded),
                other_memory=[
                    (spec.id, memory_db_path(loaded_for(loaded, spec)))
                    for spec in agent_specs(loaded.config)[1:]
                ],
                dry_run=dry_run,
                vector_index=args.vector_index or loaded.config.storage.vector_index,
                out=out,
            )
            report = await asyncio.to_thread(migration.run)
    except (StateError, CoreError, psycopg.Error) as exc:
        # psycopg's messages carry no password, but a URL echoed back might: scrub it.
        raise StateError(_scrub(str(exc), url)) from None
    print_report(report, dry_run=dry_run, out=out)
    if dry_run:
        return EXIT_PROBLEM if report.problems else EXIT_OK
    if not report.ok:
        print(
            f"migration incomplete: see above; re-run to finish ({redact_url(url)})",
            file=sys.stderr,
        )
        return EXIT_PROBLEM
    return EXIT_OK


def _scrub(text: str, url: str) -> str:
    import psycopg

    try:
        password = psycopg.conninfo.conninfo_to_dict(url).get("password")
    except psycopg.ProgrammingError:
        password = None
    if password:
        text = text.replace(str(password), "***")
    return text.replace(url, "<database URL>")


def print_report(report: Report, *, dry_run: bool, out: TextIO) -> None:
    third = "to copy" if dry_run else "status"
    width = max(len(c.what) for c in report.counts) if report.counts else 10
    print(f"\n{'':{width}}  {'source':>10}  {'target':>10}  {third}", file=out)
    for c in report.counts:
        status = "ok" if c.ok else "MISMATCH"
        tail = str(max(c.source - c.target, 0)) if dry_run else status
        print(f"{c.what:{width}}  {c.source:>10}  {c.target:>10}  {tail}", file=out)
    for problem in report.problems:
        print(f"problem: {problem}", file=out)
