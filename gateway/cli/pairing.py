"""`parley pairing list|approve|deny|revoke`: who may write under ``dm_policy = "pairing"``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC
from typing import TYPE_CHECKING

from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM, table
from parley.gateway.config import LoadedConfig

if TYPE_CHECKING:  # imported lazily: startup stays fast
    from datetime import datetime

    from parley.gateway.storage.pairing import PairingRequest


def add_pairing_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    pairing = sub.add_parser(
        "pairing", parents=[common], help="let people in who wrote under dm_policy = pairing"
    )
    pairing_sub = pairing.add_subparsers(dest="pairing_command", required=True, metavar="ACTION")
    pairing_list = pairing_sub.add_parser("list", parents=[common], help="requests and approvals")
    pairing_list.add_argument("--status", choices=["pending", "approved", "denied"])
    for action, text in (("approve", "let this person in"), ("deny", "ignore this person")):
        decide = pairing_sub.add_parser(action, parents=[common], help=text)
        decide.add_argument("code", help="the code the person was given, e.g. ABCD-EFGH")
    revoke = pairing_sub.add_parser("revoke", parents=[common], help="forget an approval or denial")
    revoke.add_argument("channel", help="telegram, discord, ...")
    revoke.add_argument("sender_id", help="the person's user id on that channel")


async def pairing_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    from parley.gateway.storage.stores import StateStores

    async with StateStores(loaded) as state:
        store = state.pairing
        action = args.pairing_command
        if action == "list":
            requests = await store.list(args.status)
            print(_pairing_table(requests, store.now()))
            return EXIT_OK
        if action == "revoke":
            found = await store.revoke(args.channel, args.sender_id)
            print("revoked" if found else f"nothing to revoke for {args.channel} {args.sender_id}")
            return EXIT_OK if found else EXIT_PROBLEM
        decide = store.approve if action == "approve" else store.deny
        request = await decide(args.code)
        who = request.sender_name or request.sender_id
        print(f"{request.status}: {who} ({request.channel} user {request.sender_id})")
        return EXIT_OK


def _pairing_table(requests: Sequence[PairingRequest], now: datetime) -> str:
    rows = [("CODE", "STATUS", "CHANNEL", "USER", "NAME", "SINCE")]
    for r in requests:
        status = "expired" if r.expired(now) else r.status
        since = (r.decided_at or r.created_at).astimezone(UTC).strftime("%Y-%m-%d %H:%M")
        rows.append((r.display_code, status, r.channel, r.sender_id, r.sender_name or "-", since))
    return table(rows) if len(rows) > 1 else "no pairing requests"
