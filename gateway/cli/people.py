"""`parley people list|erase`: what the home keeps about each person (gateway/people/)."""

from __future__ import annotations

import argparse
import json
import sys

from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.config import LoadedConfig
from parley.gateway.people import PersonError, erase_person, format_people, list_people


def add_people_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    people = sub.add_parser(
        "people", parents=[common], help="list the people parley keeps something of, or erase one"
    )
    actions = people.add_subparsers(dest="people_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", parents=[common], help="each person: their ids, sessions, notes, task logs"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON array")
    erase = actions.add_parser(
        "erase",
        parents=[common],
        help="remove everything of one person (gateway stopped); group history stays",
    )
    erase.add_argument(
        "person", help="a linked name (every linked id), or <channel>:<id> (that id only)"
    )
    erase.add_argument("--dry-run", action="store_true", help="only list what would go")
    erase.add_argument("--json", action="store_true", help="print one JSON object")


async def people_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    try:
        if args.people_command == "list":
            people = await list_people(loaded)
            if args.json:
                print(json.dumps([p.to_dict() for p in people], ensure_ascii=False, indent=1))
            else:
                print(format_people(people))
            return EXIT_OK
        report = await erase_person(loaded, args.person, dry_run=args.dry_run)
    except PersonError as exc:
        print(f"parley people {args.people_command}: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False, indent=1))
    else:
        print("\n".join(report.lines()))
    return EXIT_PROBLEM if report.errors else EXIT_OK
