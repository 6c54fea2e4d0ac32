"""`parley doctor [--fix]`: run the checks (gateway/cli/doctor_checks.py) and print a line
for each; exit 1 when one fails."""

from __future__ import annotations

import argparse

from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.config import LoadedConfig


def add_doctor_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    doctor = sub.add_parser(
        "doctor", parents=[common], help="check config, state, transcripts, provider"
    )
    doctor.add_argument(
        "--fix",
        action="store_true",
        help="back up state written by an earlier parley and migrate it (gateway stopped)",
    )


async def doctor_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    # Imported here: the checks bring aiohttp and the admin server's setup.
    from parley.gateway.cli.doctor_checks import run_doctor

    findings = await run_doctor(loaded, fix=args.fix)
    marks = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}
    for f in findings:
        print(f"[{marks[f.severity]}] {f.check}: {f.detail}")
    failed = [f for f in findings if f.severity == "error"]
    print(f"\n{len(failed)} problem(s) found" if failed else "\nall checks passed")
    return EXIT_PROBLEM if failed else EXIT_OK
