"""Slash commands: parsing and the texts they answer with.

``/new`` and ``/reset`` (the configured reset triggers) start a new session; the text
after the trigger becomes its first message. ``/status`` and ``/help`` answer at once,
without touching the model. Any other ``/word`` is ordinary text for the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gateway.registry import SessionRecord

HELP_TEXT = """Commands:
/new [text]   start a new session (the old one is archived, not deleted);
              the text becomes its first message
/reset        same as /new
/status       this session: key and id, model, tokens used / window, compactions, last update
/help         this list"""


@dataclass(frozen=True, slots=True)
class InfoCommand:
    name: str  # "status" | "help"


def parse_info_command(text: str) -> InfoCommand | None:
    """``/status`` or ``/help`` (also ``/status@botname``), case-insensitive, nothing after."""
    word = text.strip().split(maxsplit=1)
    if len(word) != 1 or not word[0].startswith("/"):
        return None
    name = word[0][1:].split("@", 1)[0].lower()
    return InfoCommand(name) if name in ("status", "help") else None


def format_status(
    record: SessionRecord | None, *, key: str, model: str, window: int, now: datetime
) -> str:
    if record is None:
        return (
            f"Session: {key}\nNo conversation yet: the next message starts one.\n"
            f"Model: {model} · window {window:,} tokens"
        )
    used = record.context_tokens
    share = f" ({used / window:.0%})" if window else ""
    usage = record.usage
    lines = [
        f"Session: {record.key}",
        f"Id: {record.session_id} (started {_ago(record.created_at, now)})",
        f"Model: {record.model or model}",
        f"Context: {used:,} / {window:,} tokens{share} · compactions: {record.compaction_count}",
        f"Usage so far: {usage.input_tokens:,} in, {usage.output_tokens:,} out, "
        f"{usage.cache_read_tokens:,} cache read, {usage.cache_write_tokens:,} cache write "
        f"over {record.turn_count} turn(s)",
        f"Last update: {_ago(record.updated_at, now)}",
    ]
    if record.delivery_error:
        lines.append(f"Last delivery error: {record.delivery_error}")
    return "\n".join(lines)


def _ago(then: datetime, now: datetime) -> str:
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m ago"
    return f"{seconds // 86400}d ago ({then:%Y-%m-%d %H:%M} UTC)"
