"""Build the configured channel adapters (imported lazily: each library costs 0.1-0.2 s)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from parley.channels.base import Channel
from parley.channels.config import ChannelsConfig


def build_channels(
    config: ChannelsConfig,
    *,
    terminal_only: bool = False,
    banner: str | None = None,
    on_terminal_close: Callable[[], None] | None = None,
    terminal_history: Path | None = None,
    upload_dir: Path | None = None,
) -> list[Channel]:
    """The terminal chat when asked for, or when nothing else is configured; the web chat
    when ``config.web_enabled()`` (never with ``terminal_only``). ``terminal_history``:
    the file where lines typed at a real terminal are kept across runs (owner-only);
    ``upload_dir``: where the web chat keeps files sent with messages (None: none taken)."""
    configured = [] if terminal_only else config.configured()
    channels: list[Channel] = []
    if terminal_only or not configured or "terminal" in configured:
        from parley.channels.terminal import TerminalChannel

        channels.append(
            TerminalChannel(
                config.terminal,
                banner=banner,
                on_close=on_terminal_close,
                history_path=terminal_history,
            )
        )
    if "telegram" in configured:
        from parley.channels.telegram import TelegramChannel

        channels.append(TelegramChannel(config.telegram))
    if "discord" in configured:
        from parley.channels.discord_adapter import DiscordChannel

        channels.append(DiscordChannel(config.discord))
    if not terminal_only and config.web_enabled():
        from parley.channels.web import WebChannel

        channels.append(WebChannel(config.web, upload_dir=upload_dir))
    return channels
