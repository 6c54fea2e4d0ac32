"""``parley memory status|index|search|prune|pruned|stats``: the long-term memory index."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from parley.core.memory.audience import AGENT, Audience, AudienceError, Viewer, parse_scope
from parley.core.memory.forgetting import format_forgetting_report, format_tombstones
from parley.core.memory.index import MemoryIndex
from parley.core.memory.tasks import format_task_stats
from parley.gateway.agents import agent_specs, loaded_for
from parley.gateway.audiences import PersonLinks, scope_for_key, viewer_for
from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.config import LoadedConfig
from parley.gateway.memory import build_memory_index
from parley.gateway.runtime.commands.texts import format_memory_status, format_search

BAR_WIDTH = 30


def add_memory_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    memory = sub.add_parser("memory", parents=[common], help="the long-term memory index")
    actions = memory.add_subparsers(dest="memory_command", required=True, metavar="ACTION")
    # Each agent's memory is its own: which one (default: the default agent's).
    agent = argparse.ArgumentParser(add_help=False)
    agent.add_argument("--agent", help="this agent's memory (its id; default: the default agent)")
    status = actions.add_parser(
        "status", parents=[common, agent], help="provider, counts, dirty files"
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    index = actions.add_parser("index", parents=[common, agent], help="bring the index up to date")
    index.add_argument("--force", action="store_true", help="rebuild everything from scratch")
    search = actions.add_parser(
        "search", parents=[common, agent], help="search as memory_search does"
    )
    search.add_argument("query")
    search.add_argument("--json", action="store_true", help="print one JSON object")
    search.add_argument("--max-results", type=int, default=None)
    search.add_argument("--min-score", type=float, default=None)
    who = search.add_mutually_exclusive_group()
    who.add_argument(
        "--person", help="as this person's direct chats would (a linked name or channel:id)"
    )
    who.add_argument("--conversation", help="as this group would (channel:chat id)")
    who.add_argument("--session", help="as this session key's conversation would")
    who.add_argument(
        "--all", "--all-scopes", dest="all_scopes", action="store_true",
        help="every audience (the operator's view)",
    )  # fmt: skip
    prune = actions.add_parser(
        "prune", parents=[common, agent], help="apply the forgetting policies now"
    )
    prune.add_argument("--dry-run", action="store_true", help="only say what would be evicted")
    prune.add_argument("--json", action="store_true", help="print one JSON object")
    pruned = actions.add_parser(
        "pruned", parents=[common, agent], help="list evictions, newest first"
    )
    pruned.add_argument("--limit", type=int, default=20, help="at most N (default 20)")
    pruned.add_argument("--json", action="store_true", help="print one JSON array")
    stats = actions.add_parser(
        "stats", parents=[common, agent], help="task records: outcomes, errors"
    )
    stats.add_argument("--json", action="store_true", help="print one JSON object")


class ProgressBar:
    """A one-line progress bar on a terminal; a line per 10% elsewhere (logs, CI)."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream = stream
        self.label = label
        self.tty = stream.isatty()
        self._last_decile = -1
        self._started = time.monotonic()

    def __call__(self, done: int, total: int, path: str) -> None:
        if total <= 0:
            return
        share = done / total
        if self.tty:
            filled = int(BAR_WIDTH * share)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            name = path if len(path) <= 40 else "…" + path[-39:]
            self.stream.write(f"\r{self.label} [{bar}] {done}/{total} {name:<40}")
            if done == total:
                self.stream.write("\n")
        else:
            decile = int(share * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                elapsed = time.monotonic() - self._started
                self.stream.write(f"{self.label}: {done}/{total} files ({elapsed:.1f} s)\n")
        self.stream.flush()


async def memory_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    if getattr(args, "agent", None):
        specs = {spec.id: spec for spec in agent_specs(loaded.config)}
        if args.agent not in specs:
            print(
                f"parley: no agent {args.agent!r} (there are {', '.join(specs)})", file=sys.stderr
            )
            return EXIT_PROBLEM
        loaded = loaded_for(loaded, specs[args.agent])
    if not loaded.config.memory.enabled:
        print("long-term memory is turned off ([memory] enabled = false)", file=sys.stderr)
        return EXIT_PROBLEM
    index = build_memory_index(loaded)
    try:
        # Inside the try: a failed open still releases what it opened (a pool).
        await index.open()
        action = args.memory_command
        if action == "status":
            status = await index.status()
            if args.json:
                print(json.dumps(status.to_dict(), indent=1, default=str))
            else:
                print(format_memory_status(status))
            return EXIT_OK
        if action == "index":
            report = await index.sync(
                reason="cli", force=args.force, progress=ProgressBar(sys.stderr, "indexing")
            )
            # Sources retention removed but kept: carried over from the old index.
            kept = f", {report.files_kept} kept" if report.files_kept else ""
            print(
                f"{'rebuilt' if report.reindexed else 'synced'}: {report.files_seen} files seen, "
                f"{report.files_indexed} indexed, {report.files_unchanged} unchanged, "
                f"{report.files_deleted} removed{kept}; {report.chunks_written} chunks written, "
                f"{report.embedded} embedded, {report.cache_hits} from cache "
                f"({report.seconds:.1f} s)"
            )
            for error in report.errors:
                print(f"  problem: {error}", file=sys.stderr)
            return EXIT_PROBLEM if report.errors else EXIT_OK
        if action in ("prune", "pruned", "stats"):
            return await _lifecycle_command(index, args)
        try:
            viewer = search_viewer(args, loaded)
        except AudienceError as exc:
            print(f"parley memory search: {exc}", file=sys.stderr)
            return EXIT_PROBLEM
        scopes = await index.visible_scopes(viewer)
        result = await index.search(
            args.query,
            scopes=scopes,
            max_results=args.max_results,
            min_score=args.min_score,
        )
        searched = describe_viewer(viewer, scopes)
        if args.json:
            payload = result.to_dict()
            payload["searched"] = {"as": searched, "scopes": list(scopes)}
            print(json.dumps(payload, ensure_ascii=False, indent=1))
        else:
            print(f"Searched {searched}")
            print(format_search(args.query, result, audiences=viewer.operator))
        return EXIT_OK
    finally:
        await index.close()


def search_viewer(args: argparse.Namespace, loaded: LoadedConfig) -> Viewer:
    """Whose eyes ``parley memory search`` looks through (the agent's alone by default)."""
    session = loaded.config.session
    if args.all_scopes:
        return Viewer.for_operator()
    if args.person:
        audience = Audience.person(args.person.strip().lower())
    elif args.conversation:
        audience = Audience.conversation(args.conversation.strip().lower())
    elif args.session:
        found = parse_scope(scope_for_key(args.session))
        if found is None:
            raise AudienceError(f"not a session key: {args.session[:80]!r}")
        audience = found
    else:
        return Viewer(AGENT)
    return viewer_for(audience, session, PersonLinks(session))


def describe_viewer(viewer: Viewer, scopes: tuple[str, ...]) -> str:
    if viewer.operator:
        return f"every audience ({len(scopes)} scopes)"
    if viewer.audience.kind == "agent":
        return "the agent-wide memory only (see --person, --conversation, --all)"
    return f"as {viewer.audience.label} would: " + ", ".join(scopes)


async def _lifecycle_command(index: MemoryIndex, args: argparse.Namespace) -> int:
    """``prune``, ``pruned`` and ``stats``: forgetting and task records."""
    action = args.memory_command
    if action == "prune":
        if not index.settings.forgetting.enabled:
            print("forgetting is turned off ([memory.forgetting] enabled = false)", file=sys.stderr)
            return EXIT_PROBLEM
        # Bring the index up to date first: a prune judges what is indexed now.
        await index.sync(reason="prune", scheduled_forgetting=False)
        report = await index.forget(dry_run=args.dry_run)
        if args.json:
            print(json.dumps(report.to_dict(), ensure_ascii=False, indent=1))
        else:
            print(format_forgetting_report(report))
        return EXIT_OK
    if action == "pruned":
        tombstones = await index.forgotten(limit=max(1, args.limit))
        if args.json:
            rows = [
                {
                    "evicted_at": t.evicted_at,
                    "scope": t.scope,
                    "path": t.path,
                    "lines": [t.start_line, t.end_line],
                    "reason": t.reason,
                    "preview": t.preview,
                }
                for t in tombstones
            ]
            print(json.dumps(rows, ensure_ascii=False, indent=1))
        else:
            print(format_tombstones(tombstones))
        return EXIT_OK
    stats = await index.task_stats()
    if args.json:
        print(json.dumps(stats.to_dict(), ensure_ascii=False, indent=1))
    else:
        print(format_task_stats(stats))
    return EXIT_OK
