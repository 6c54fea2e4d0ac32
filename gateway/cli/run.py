"""`parley run` and `parley chat`: the gateway with every configured channel, or with the
terminal chat alone."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

from parley.gateway.cli.common import EXIT_OK
from parley.gateway.config import LoadedConfig


def add_run_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    sub.add_parser(
        "run",
        parents=[common],
        help="run every configured channel (the terminal chat when none is)",
    )
    sub.add_parser("chat", parents=[common], help="chat in this terminal")


async def serve(loaded: LoadedConfig, *, terminal_only: bool) -> int:
    """The gateway with its channels until SIGINT or SIGTERM, or (the terminal chat) until
    input ends and what is queued is answered."""
    from parley.gateway.app import Gateway
    from parley.gateway.channel_factory import build_channels
    from parley.gateway.people.inventory import terminal_history
    from parley.gateway.process_gc import tune_collector
    from parley.gateway.providers import build_provider

    config = loaded.config
    stop = asyncio.Event()
    eof = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    provider, banner = build_provider(config.providers)
    channels = build_channels(
        config.channels,
        terminal_only=terminal_only,
        banner=banner,
        on_terminal_close=eof.set,
        terminal_history=terminal_history(loaded),
        upload_dir=loaded.media_dir / "uploads",
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
        tune_collector()
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
