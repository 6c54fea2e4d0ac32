"""`parley config check|show`: the configuration as loaded (an invalid one never gets here:
``main`` exits 2 with the dotted path of each bad field)."""

from __future__ import annotations

import argparse

from parley.gateway.cli.common import EXIT_OK
from parley.gateway.config import LoadedConfig, effective_config_toml


def add_config_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    config = sub.add_parser("config", parents=[common], help="check or show the configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    config_sub.add_parser("check", parents=[common], help="validate and exit (2 when invalid)")
    config_sub.add_parser(
        "show", parents=[common], help="print the effective config, secrets masked"
    )


def config_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    if args.config_command == "check":
        print(f"config ok: {loaded.source}")
    else:
        print(f"# effective configuration (from {loaded.source}; PARLEY_HOME={loaded.home})")
        print(effective_config_toml(loaded.config), end="")
    return EXIT_OK
