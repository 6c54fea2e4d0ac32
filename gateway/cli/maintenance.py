"""`parley maintenance [--dry-run]`: one retention run now (gateway/retention/), printing
per kind what it removed, or with ``--dry-run`` what it would remove: counts, bytes and
session ids, never a message's words.

It may run while a gateway runs on the same home: only archived data is touched, and
the home's retention lock keeps it from overlapping the gateway's daily run (it then
says so and exits 1). On PostgreSQL it also takes the shared database's run lock, so it
never overlaps a run of any replica either (the same: it says another run is under way
on the database, and exits 1). The memory index is opened so that a removed
transcript's chunks are kept (or dropped) as ``[retention] archived_memory`` says.
"""

from __future__ import annotations

import argparse
import sys

from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.config import LoadedConfig


def add_maintenance_commands(
    sub: argparse._SubParsersAction, common: argparse.ArgumentParser
) -> None:
    maintenance = sub.add_parser(
        "maintenance",
        parents=[common],
        help="remove archived data past [retention]'s windows and the disk cap",
    )
    maintenance.add_argument(
        "--dry-run", action="store_true", help="only say what would be removed"
    )


async def maintenance_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    # Imported here: the stores and the memory index are heavy to import.
    from parley.core.errors import CoreError
    from parley.gateway.agents import agent_specs, loaded_for
    from parley.gateway.memory import build_memory_index, memory_db_path
    from parley.gateway.retention.run import every_index, run_retention
    from parley.gateway.storage.sessions import utcnow
    from parley.gateway.storage.stores import StateStores

    postgres = loaded.config.storage.backend == "postgres"
    if not postgres and not loaded.state_db.exists():
        print("nothing to do: no state yet")
        return EXIT_OK
    async with StateStores(loaded) as state:
        # Every agent's index: each holds the rows of its own sessions' transcripts.
        indexes = []
        failed = False
        for spec in agent_specs(loaded.config):
            own = loaded_for(loaded, spec)
            if not own.config.memory.enabled:
                continue
            if not postgres and not memory_db_path(own).exists():
                continue
            index = build_memory_index(own, db=state.pg)
            try:
                await index.open()
            except (CoreError, OSError) as exc:
                print(f"parley: the memory index cannot be opened: {exc}", file=sys.stderr)
                await index.close()
                failed = True  # its chunks cannot be kept: retention holds back
                continue
            indexes.append(index)
        try:
            report = await run_retention(
                loaded,
                state,
                now=utcnow(),
                dry_run=args.dry_run,
                memory=None if failed else every_index(indexes),
            )
        finally:
            for index in indexes:
                await index.close()
    print("\n".join(report.lines()))
    return EXIT_PROBLEM if report.errors else EXIT_OK
