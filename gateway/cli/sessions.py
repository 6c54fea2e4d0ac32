"""`parley sessions list|show|export`: the session registry and transcripts, read only."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from parley.core.errors import TranscriptError
from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM, table
from parley.gateway.config import LoadedConfig
from parley.gateway.storage.sessions import removed_at

if TYPE_CHECKING:  # imported lazily: startup stays fast
    from parley.core.transcript import Entry
    from parley.core.transcript_store import TranscriptStore
    from parley.gateway.storage.sessions import SessionRecord
    from parley.gateway.storage.stores import StateStores


def add_sessions_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    sessions = sub.add_parser("sessions", parents=[common], help="list, show or export sessions")
    sessions_sub = sessions.add_subparsers(dest="sessions_command", required=True, metavar="ACTION")
    listing = sessions_sub.add_parser("list", parents=[common], help="a table of sessions")
    listing.add_argument("--status", choices=["active", "archived"])
    listing.add_argument("--channel")
    listing.add_argument("--agent", help="only this agent's sessions (its id)")
    listing.add_argument("--query", help="text in the key or display name")
    listing.add_argument("--limit", type=int, default=50)
    show = sessions_sub.add_parser(
        "show", parents=[common], help="one session and its latest entries"
    )
    show.add_argument("key", help="a session key, session id or unique prefix of one")
    show.add_argument("--entries", type=int, default=20, help="how many recent entries to print")
    export = sessions_sub.add_parser(
        "export", parents=[common], help="write a session's transcript as JSONL"
    )
    export.add_argument("key", help="a session id, unique prefix of one, or session key")
    export.add_argument(
        "-o",
        "--output",
        type=Path,
        help="write to this file (mode 0600, replaced atomically); default: stdout",
    )


async def sessions_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    from parley.gateway.storage.stores import StateStores

    action = args.sessions_command
    if loaded.config.storage.backend == "sqlite" and not loaded.state_db.exists():
        if action == "list":
            print("no sessions yet")
            return EXIT_OK
        print(f"no session matches {args.key!r} (no sessions yet)", file=sys.stderr)
        return EXIT_PROBLEM
    async with StateStores(loaded) as state:
        registry = state.registry
        if action == "list":
            page = await registry.list(
                status=args.status,
                channel=args.channel,
                agent_id=args.agent,
                query=args.query,
                limit=args.limit,
            )
            print(_sessions_table(page.sessions))
            return EXIT_OK
        try:
            record = await _resolve_session(state, args.key)
        except LookupError as exc:
            print(f"parley: {exc.args[0]}", file=sys.stderr)
            return EXIT_PROBLEM
        if action == "export":
            removed = removed_at(record)
            if removed is not None:
                print(
                    f"parley: the transcript of {record.session_id} was removed by retention "
                    f"on {removed[:10]}",
                    file=sys.stderr,
                )
                return EXIT_PROBLEM
            return await _export(state.transcripts, record.session_id, args.output)
        print(await asyncio.to_thread(_describe_session, state.transcripts, record, args.entries))
        return EXIT_OK


# Ids listed when a prefix is ambiguous.
AMBIGUOUS_SHOWN = 5


async def _resolve_session(state: StateStores, key: str) -> SessionRecord:
    """The session ``key`` names: its id or key (as the registry finds them), else the
    one session whose id starts with it (the list shows 12 characters).
    LookupError with the message for a person when none or several match."""
    record = await state.registry.find(key)
    if record is not None:
        return record
    # Ids are lowercase hex: anything else is no prefix of one (nor a wildcard).
    prefix = key.lower()
    if not prefix or any(c not in "0123456789abcdef" for c in prefix):
        raise LookupError(f"no session matches {key!r}")
    # Every session has a transcript, archived ones too: the store lists their ids.
    infos = await asyncio.to_thread(state.transcripts.list_transcripts)
    ids = [i.session_id for i in infos if i.session_id.startswith(prefix)]
    if len(ids) > 1:
        shown = ", ".join(ids[:AMBIGUOUS_SHOWN])
        more = f" and {len(ids) - AMBIGUOUS_SHOWN} more" if len(ids) > AMBIGUOUS_SHOWN else ""
        raise LookupError(
            f"{key!r} is ambiguous: {len(ids)} sessions start with it ({shown}{more}); "
            "give more of the id"
        )
    found = await state.registry.get(ids[0]) if ids else None
    if found is None:
        raise LookupError(f"no session matches {key!r}")
    return found


async def _export(store: TranscriptStore, session_id: str, output: Path | None) -> int:
    from parley.core.transcript_store import export_transcript, write_jsonl

    try:
        if output is None:
            # stdout as bytes: the export is the file's bytes, whatever the locale.
            def to_stdout() -> int:
                with store.open(session_id, read_only=True) as transcript:
                    written = write_jsonl(transcript, sys.stdout.buffer)
                sys.stdout.buffer.flush()
                return written

            await asyncio.to_thread(to_stdout)
            return EXIT_OK
        written = await asyncio.to_thread(export_transcript, store, session_id, output)
    except OSError as exc:
        print(f"parley: cannot write {output or 'stdout'}: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    print(f"exported {session_id}: {written:,} bytes to {output}", file=sys.stderr)
    return EXIT_OK


def _sessions_table(records: Sequence[SessionRecord]) -> str:
    rows = [("KEY", "AGENT", "CHANNEL", "UPDATED", "TOKENS", "STATUS", "ID")]
    for r in records:
        status = r.status if r.status == "active" else f"archived ({r.archived_reason})"
        if removed_at(r) is not None:
            status += ", removed by retention"
        rows.append(
            (
                r.key,
                r.agent_id,
                r.channel,
                r.updated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
                f"{r.context_tokens:,}",
                status,
                r.session_id[:12],
            )
        )
    return table(rows) if len(rows) > 1 else "no sessions"


def _describe_session(store: TranscriptStore, record: SessionRecord, entries: int) -> str:
    u = record.usage
    lines = [
        f"key:          {record.key}",
        f"id:           {record.session_id}",
        f"status:       {record.status}"
        + (
            f" ({record.archived_reason}, {record.archived_at:%Y-%m-%d %H:%M})"
            if record.archived_at
            else ""
        ),
        f"agent:        {record.agent_id}",
        f"channel:      {record.channel} / {record.account} / {record.chat_type} / {record.peer}",
        f"display name: {record.display_name or '-'}",
        f"created:      {record.created_at:%Y-%m-%d %H:%M:%S} UTC",
        f"updated:      {record.updated_at:%Y-%m-%d %H:%M:%S} UTC",
        f"model:        {record.model or '-'}",
        f"tokens:       context {record.context_tokens:,}; in {u.input_tokens:,}, "
        f"out {u.output_tokens:,}, cache read {u.cache_read_tokens:,}, "
        f"cache write {u.cache_write_tokens:,}; {record.turn_count} turns",
        f"compactions:  {record.compaction_count}",
        f"entries:      {record.entry_count}",
        "last reply:   "
        + (", ".join(record.last_message_ids) or "-")
        + (f" (failed: {record.delivery_error})" if record.delivery_error else ""),
    ]
    removed = removed_at(record)
    if removed is not None:
        lines.append(f"transcript:   removed by retention on {removed[:10]}")
        return "\n".join(lines)
    try:
        transcript = store.open(record.session_id, read_only=True)
    except TranscriptError as exc:
        lines.append(f"transcript:   cannot load: {exc}")
        return "\n".join(lines)
    with transcript:
        lines.append(f"transcript:   {transcript.location}")
        total = transcript.entry_count
        recent = list(transcript.entries(offset=max(0, total - entries)))
    lines.append(f"\nlast {len(recent)} of {total} entries:")
    for entry in recent:
        lines.append(f"  {entry.ts}  {_entry_line(entry)}")
    return "\n".join(lines)


def _entry_line(entry: Entry) -> str:
    if entry.type == "message":
        message = entry.message
        text = message.text.replace("\n", " ")
        if message.tool_uses:
            text += " " + " ".join(f"[tool {u.name}]" for u in message.tool_uses)
        if message.role == "tool_result":
            text = f"[{len(message.content)} tool result(s)]"
        # A lone surrogate (the transcript keeps it, JSON-escaped) cannot be printed.
        text = text[:160].encode("utf-8", "replace").decode("utf-8")
        return f"{message.role:<11} {text}"
    if entry.type == "custom":
        return f"{'custom':<11} {entry.custom_type}"
    return f"{entry.type:<11}"
