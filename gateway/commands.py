"""Slash commands: parsing and the texts they answer with.

``/new`` and ``/reset`` (the configured reset triggers) start a new session; the text
after the trigger becomes its first message. ``/compact [focus]`` runs in the session's
lane like a turn (it writes the transcript). ``/status``, ``/context [list|detail|json]``,
``/memory status|search <q>|stats`` and ``/help`` answer at once, without touching the model.
Any other ``/word`` is ordinary text for the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from core.compaction_stats import CompactionStats
from gateway.registry import SessionRecord

HELP_TEXT = """Commands:
/new [text]   start a new session (the old one is archived, not deleted);
              the text becomes its first message
/reset        same as /new
/compact [focus]
              summarise the older part of this session now (the summary keeps
              decisions, open asks and exact identifiers); focus: what to keep above all
/context [list|detail|json]
              what the model is sent, part by part, in characters and tokens
/status       this session: key and id, model, context used / window, compactions,
              cache-read share, last update
/memory status
              the long-term memory index: embedder, files and chunks, dirty files
/memory search <query>
              what memory_search finds for this conversation
/memory stats
              this conversation's task records: outcomes, most frequent errors
/remember <text>
              keep a note in your own memory (in a group: the group's memory)
/forget <text or citation>
              remove your notes that contain the text (or the cited lines)
/help         this list"""

CONTEXT_MODES = ("list", "detail", "json")
MEMORY_USAGE = "Usage: /memory status | /memory search <query> | /memory stats"
REMEMBER_USAGE = "Usage: /remember <text to keep>"
FORGET_USAGE = "Usage: /forget <text the note contains, or its citation notes/…#Lx>"


@dataclass(frozen=True, slots=True)
class InfoCommand:
    name: str  # "status" | "help" | "context" | "memory" | "remember" | "forget"
    argument: str = ""  # /context's mode, /memory's action and query, a note's text


def _command_word(text: str) -> tuple[str, str] | None:
    """(name, rest) of a ``/name[@bot] rest`` message, name lowercased; None otherwise."""
    parts = text.strip().split(maxsplit=1)
    if not parts or not parts[0].startswith("/"):
        return None
    name = parts[0][1:].split("@", 1)[0].lower()
    return name, parts[1].strip() if len(parts) > 1 else ""


def parse_info_command(text: str) -> InfoCommand | None:
    """``/status``, ``/help`` (nothing after) or ``/context [mode]``, also ``/cmd@botname``."""
    parsed = _command_word(text)
    if parsed is None:
        return None
    name, rest = parsed
    if name in ("status", "help") and not rest:
        return InfoCommand(name)
    if name == "context" and (not rest or rest.lower() in CONTEXT_MODES or " " not in rest):
        return InfoCommand(name, rest.lower())
    if name == "memory":
        action, _, query = rest.partition(" ")
        return InfoCommand(name, f"{action.lower()} {query.strip()}".strip())
    if name in ("remember", "forget"):
        return InfoCommand(name, rest.strip())  # the note's own words, case kept
    return None


def parse_compact_command(text: str) -> str | None:
    """The focus text of ``/compact [focus]`` ("" for none); None for any other message."""
    parsed = _command_word(text)
    if parsed is None or parsed[0] != "compact":
        return None
    return parsed[1]


def format_status(
    record: SessionRecord | None,
    *,
    key: str,
    model: str,
    window: int,
    now: datetime,
    compactions: CompactionStats | None = None,
) -> str:
    if record is None:
        return (
            f"Session: {key}\nNo conversation yet: the next message starts one.\n"
            f"Model: {model} · window {window:,} tokens"
        )
    used = record.context_tokens
    share = f" ({used / window:.0%})" if window else ""
    usage = record.usage
    prompt_tokens = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    cache_share = (
        f"{usage.cache_read_tokens / prompt_tokens:.0%} of prompt tokens read from cache"
        if prompt_tokens
        else "no prompt tokens yet"
    )
    lines = [
        f"Session: {record.key}",
        f"Id: {record.session_id} (started {_ago(record.created_at, now)})",
        f"Model: {record.model or model}",
        f"Context: {used:,} / {window:,} tokens{share} · compactions: {record.compaction_count}",
        f"Cache: {cache_share}",
        f"Usage so far: {usage.input_tokens:,} in, {usage.output_tokens:,} out, "
        f"{usage.cache_read_tokens:,} cache read, {usage.cache_write_tokens:,} cache write "
        f"over {record.turn_count} turn(s)",
        f"Last update: {_ago(record.updated_at, now)}",
    ]
    if compactions is not None and compactions.count:
        lines.insert(4, _compaction_line(compactions))
    if record.delivery_error:
        lines.append(f"Last delivery error: {record.delivery_error}")
    return "\n".join(lines)


def _compaction_line(stats: CompactionStats) -> str:
    """ "Compactions: 3 (summary 2, sliding-window 1; threshold 2, messages 1), last
    52,100 → 9,800 tokens"."""
    strategies = ", ".join(f"{k} {v}" for k, v in sorted(stats.by_strategy.items()))
    triggers = ", ".join(f"{k} {v}" for k, v in sorted(stats.by_trigger.items()))
    line = f"Compactions: {stats.count} ({strategies}; {triggers})"
    if stats.last_tokens_before is not None and stats.last_tokens_after is not None:
        line += f", last {stats.last_tokens_before:,} → {stats.last_tokens_after:,} tokens"
    return line


def _ago(then: datetime, now: datetime) -> str:
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m ago"
    return f"{seconds // 86400}d ago ({then:%Y-%m-%d %H:%M} UTC)"
