"""`parley`: the global options, the command groups (one module each in this package) and
``main``, the console script (``python -m gateway.cli.main`` runs it too)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from parley.core.errors import CoreError
from parley.gateway.cli.bench import add_bench_commands, bench_command
from parley.gateway.cli.common import EXIT_CONFIG, EXIT_PROBLEM
from parley.gateway.cli.config import add_config_commands, config_command
from parley.gateway.cli.db import add_db_commands, db_command
from parley.gateway.cli.doctor import add_doctor_commands, doctor_command
from parley.gateway.cli.maintenance import add_maintenance_commands, maintenance_command
from parley.gateway.cli.memory import add_memory_commands, memory_command
from parley.gateway.cli.migrate import add_migrate_commands, migrate_command
from parley.gateway.cli.pairing import add_pairing_commands, pairing_command
from parley.gateway.cli.people import add_people_commands, people_command
from parley.gateway.cli.run import add_run_commands, serve
from parley.gateway.cli.sessions import add_sessions_commands, sessions_command
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.errors import ConfigFileError, GatewayError
from parley.gateway.file_modes import owner_only_umask, secure_home
from parley.gateway.memory import memory_db_path


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        type=Path,
        default=argparse.SUPPRESS,
        help="config file (default: $PARLEY_HOME/parley.toml, else built-ins)",
    )
    common.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
    )
    common.add_argument(
        "--log-json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log one JSON object per line",
    )
    parser = argparse.ArgumentParser(
        prog="parley",
        parents=[common],
        description="A chat gateway bot that remembers. State lives in $PARLEY_HOME "
        "(default ~/.parley).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # In the order `parley --help` lists them.
    add_run_commands(sub, common)
    add_config_commands(sub, common)
    add_sessions_commands(sub, common)
    add_doctor_commands(sub, common)
    add_maintenance_commands(sub, common)
    add_pairing_commands(sub, common)
    add_memory_commands(sub, common)
    add_bench_commands(sub, common)
    add_db_commands(sub, common)
    add_migrate_commands(sub, common)
    add_people_commands(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # python-telegram-bot 22 warns on every flood-control error unless its timedelta
    # periods are opted into; the Telegram adapter reads both forms.
    os.environ.setdefault("PTB_TIMEDELTA", "1")
    args = build_parser().parse_args(argv)
    try:
        loaded = load_config(getattr(args, "config", None))
    except ConfigFileError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    command = args.command
    umask: int | None = None
    try:
        if command == "config":
            return config_command(loaded, args)
        # Every other command touches the home: owner-only from here on, the files that
        # libraries create included (gateway/file_modes.py). The doctor only reports
        # modes (its --fix narrows them), so it leaves the home as it finds it.
        if command == "doctor":
            umask = owner_only_umask()
        else:
            umask = secure_home(loaded.home, (loaded.state_db, memory_db_path(loaded)))
        _logging(loaded, args, chat=command in ("run", "chat"))
        if command in ("run", "chat"):
            return asyncio.run(serve(loaded, terminal_only=command == "chat"))
        if command == "sessions":
            return asyncio.run(sessions_command(loaded, args))
        if command == "doctor":
            return asyncio.run(doctor_command(loaded, args))
        if command == "maintenance":
            return asyncio.run(maintenance_command(loaded, args))
        if command == "pairing":
            return asyncio.run(pairing_command(loaded, args))
        if command == "memory":
            return asyncio.run(memory_command(loaded, args))
        if command == "bench":
            return asyncio.run(bench_command(loaded, args))
        if command == "db":
            return asyncio.run(db_command(loaded, args))
        if command == "migrate":
            return asyncio.run(migrate_command(loaded, args))
        if command == "people":
            return asyncio.run(people_command(loaded, args))
    except (GatewayError, CoreError) as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    except KeyboardInterrupt:
        return 130
    finally:
        if umask is not None:
            os.umask(umask)  # process-wide: tests run main() in their own process
    raise AssertionError(command)


def _logging(loaded: LoadedConfig, args: argparse.Namespace, *, chat: bool) -> None:
    from parley.gateway.logs import setup_logging

    level = getattr(args, "log_level", None) or loaded.config.logging.level
    json_lines = getattr(args, "log_json", False) or loaded.config.logging.json_lines
    if chat:
        # Keep the conversation readable: full logs to a file, only warnings on screen.
        explicit = getattr(args, "log_level", None)
        setup_logging(
            level,
            json_lines=json_lines,
            file=loaded.home / "logs" / "parley.log",
            stderr_level=explicit or "WARNING",
        )
    else:
        setup_logging(level, json_lines=json_lines, stderr_level="WARNING")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
