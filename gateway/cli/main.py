"""The `parley` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import CoreError, TranscriptError
from gateway.cli.db import add_db_commands, db_command
from gateway.cli.memory import add_memory_commands, bench_command, memory_command
from gateway.cli.migrate import add_migrate_commands, migrate_command
from gateway.cli.people import add_people_commands, people_command
from gateway.config import LoadedConfig, effective_config_toml, load_config
from gateway.errors import ConfigFileError, GatewayError
from gateway.file_modes import owner_only_umask, secure_home
from gateway.memory import memory_db_path

if TYPE_CHECKING:  # the commands import these lazily: startup stays fast
    from datetime import datetime

    from core.transcript import Entry
    from core.transcript_store import TranscriptStore
    from gateway.storage.pairing import PairingRequest
    from gateway.storage.sessions import SessionRecord
    from gateway.storage.stores import StateStores

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_CONFIG = 2


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
    sub.add_parser(
        "run",
        parents=[common],
        help="run every configured channel (the terminal chat when none is)",
    )
    sub.add_parser("chat", parents=[common], help="chat in this terminal")
    config = sub.add_parser("config", parents=[common], help="check or show the configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    config_sub.add_parser("check", parents=[common], help="validate and exit (2 when invalid)")
    config_sub.add_parser(
        "show", parents=[common], help="print the effective config, secrets masked"
    )
    sessions = sub.add_parser("sessions", parents=[common], help="list, show or export sessions")
    sessions_sub = sessions.add_subparsers(dest="sessions_command", required=True, metavar="ACTION")
    listing = sessions_sub.add_parser("list", parents=[common], help="a table of sessions")
    listing.add_argument("--status", choices=["active", "archived"])
    listing.add_argument("--channel")
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
    doctor = sub.add_parser(
        "doctor", parents=[common], help="check config, state, transcripts, provider"
    )
    doctor.add_argument(
        "--fix",
        action="store_true",
        help="back up state written by an earlier parley and migrate it (gateway stopped)",
    )
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
    add_memory_commands(sub, common)
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
            return _config(loaded, args.config_command)
        # Every other command touches the home: owner-only from here on, the files that
        # libraries create included (gateway/file_modes.py). The doctor only reports
        # modes (its --fix narrows them), so it leaves the home as it finds it.
        if command == "doctor":
            umask = owner_only_umask()
        else:
            umask = secure_home(loaded.home, (loaded.state_db, memory_db_path(loaded)))
        _logging(loaded, args, chat=command in ("run", "chat"))
        if command in ("run", "chat"):
            return asyncio.run(_serve(loaded, terminal_only=command == "chat"))
        if command == "sessions":
            return asyncio.run(_sessions(loaded, args))
        if command == "doctor":
            return asyncio.run(_doctor(loaded, fix=args.fix))
        if command == "pairing":
            return asyncio.run(_pairing(loaded, args))
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


def _config(loaded: LoadedConfig, action: str) -> int:
    if action == "check":
        print(f"config ok: {loaded.source}")
    else:
        print(f"# effective configuration (from {loaded.source}; PARLEY_HOME={loaded.home})")
        print(effective_config_toml(loaded.config), end="")
    return EXIT_OK


def _logging(loaded: LoadedConfig, args: argparse.Namespace, *, chat: bool) -> None:
    from gateway.logs import setup_logging

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


async def _serve(loaded: LoadedConfig, *, terminal_only: bool) -> int:
    from gateway.app import Gateway
    from gateway.channel_factory import build_channels
    from gateway.providers import build_provider

    config = loaded.config
    stop = asyncio.Event()
    eof = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    provider, banner = build_provider(config.providers)
    channels = build_channels(
        config.channels, terminal_only=terminal_only, banner=banner, on_terminal_close=eof.set
    )
    gateway = Gateway(
        loaded,
        channels=channels,
        provider=provider,
        banner=banner,
        serve_http=False if terminal_only else None,
        announce=lambda links: print(links, flush=True),
    )
    try:
        await gateway.start()
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(eof.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        if eof.is_set() and not stop.is_set():
            # Input ended: answer what is queued, then leave.
            idle = asyncio.create_task(gateway.wait_idle())
            interrupted = asyncio.create_task(stop.wait())
            await asyncio.wait([idle, interrupted], return_when=asyncio.FIRST_COMPLETED)
            idle.cancel()
            interrupted.cancel()
    finally:
        await gateway.stop()
        await provider.aclose()
    return EXIT_OK


async def _sessions(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    from gateway.storage.stores import StateStores

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
                status=args.status, channel=args.channel, query=args.query, limit=args.limit
            )
            print(_sessions_table(page.sessions))
            return EXIT_OK
        try:
            record = await _resolve_session(state, args.key)
        except LookupError as exc:
            print(f"parley: {exc.args[0]}", file=sys.stderr)
            return EXIT_PROBLEM
        if action == "export":
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
    from core.transcript_store import export_transcript, write_jsonl

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
    rows = [("KEY", "CHANNEL", "UPDATED", "TOKENS", "STATUS", "ID")]
    for r in records:
        status = r.status if r.status == "active" else f"archived ({r.archived_reason})"
        rows.append(
            (
                r.key,
                r.channel,
                r.updated_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
                f"{r.context_tokens:,}",
                status,
                r.session_id[:12],
            )
        )
    return _table(rows) if len(rows) > 1 else "no sessions"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


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
        return f"{'custom':<11} {entry.payload.get('custom_type')}"
    return f"{entry.type:<11}"


async def _pairing(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    from gateway.storage.stores import StateStores

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
    return _table(rows) if len(rows) > 1 else "no pairing requests"


async def _doctor(loaded: LoadedConfig, *, fix: bool = False) -> int:
    from gateway.cli.doctor_checks import run_doctor

    findings = await run_doctor(loaded, fix=fix)
    marks = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}
    for f in findings:
        print(f"[{marks[f.severity]}] {f.check}: {f.detail}")
    failed = [f for f in findings if f.severity == "error"]
    print(f"\n{len(failed)} problem(s) found" if failed else "\nall checks passed")
    return EXIT_PROBLEM if failed else EXIT_OK


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
