"""Slash commands as typed: which command a message is, and its argument.

``/name@botname`` counts as ``/name`` (Telegram appends the bot's name in groups).
The reset triggers (``[session] reset_triggers``, ``/new`` and ``/reset`` by default)
are configurable words, matched case-insensitively, longest first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CONTEXT_MODES = ("list", "detail", "json")

# Telegram appends "@botname" to commands in groups; usernames are [A-Za-z0-9_].
_BOT_SUFFIX_RE = re.compile(r"@([A-Za-z0-9_]+)")
# Used only when the adapter left the leading mention in: "@bot", "<@123>", "<@!123>".
_LEADING_MENTION_RE = re.compile(r"\s*(?:<@!?\d+>|@[\w.]+)[:,]?\s+")


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


@dataclass(frozen=True, slots=True)
class ResetCommand:
    """A manual reset: the trigger as configured, and the text that follows it."""

    trigger: str
    remainder: str


def match_reset_trigger(
    text: str,
    triggers: list[str] | tuple[str, ...],
    *,
    bot_mention_stripped: bool = True,
    bot_username: str | None = None,
) -> ResetCommand | None:
    """A manual reset, if ``text`` is a trigger alone or a trigger, whitespace and more.

    Case-insensitive. ``/new@botname`` counts as ``/new``; with ``bot_username`` set, a
    suffix naming another bot does not. When ``bot_mention_stripped`` is false a leading
    mention (``@bot``, ``<@123>``) is skipped first. The longest matching trigger wins.
    """
    body = text.lstrip()
    if not bot_mention_stripped:
        mention = _LEADING_MENTION_RE.match(body)
        if mention is not None:
            body = body[mention.end() :]
    wanted_bot = bot_username.lstrip("@").lower() if bot_username else None
    for trigger in sorted(triggers, key=len, reverse=True):
        # Compare slices of the original so that indices stay aligned even where
        # lowercasing changes a string's length.
        if not trigger or body[: len(trigger)].lower() != trigger.lower():
            continue
        tail = body[len(trigger) :]
        suffix = _BOT_SUFFIX_RE.match(tail)
        if suffix is not None:
            if wanted_bot is not None and suffix.group(1).lower() != wanted_bot:
                continue
            tail = tail[suffix.end() :]
        if tail and not tail[0].isspace():
            continue
        return ResetCommand(trigger=trigger, remainder=tail.strip())
    return None
