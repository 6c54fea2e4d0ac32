"""A gateway serving HTTP under a lowered descriptor limit, for test_http_limits.

    python -m tests.gateway.http_limits_child HOME SOFT_LIMIT

Prints one JSON line (port, max_connections in force, descriptor limit) once serving;
on any line from stdin prints the server's connection counts, the number of failed
accepts asyncio logged, and exits. The header and keep-alive deadlines are two minutes,
so only the connection cap can let a request past a flood of silent sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
from pathlib import Path


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


async def _serve(home: Path) -> None:
    import parley.gateway.memory
    from parley.gateway.app import Gateway
    from tests.fakes.embedder import HashingEmbedder, resilient
    from tests.fakes.recording_channel import RecordingChannel
    from tests.fakes.scripted_provider import ScriptedProvider
    from tests.gateway.memory_helpers import memory_config

    parley.gateway.memory.build_embedder = lambda settings: resilient(HashingEmbedder())  # type: ignore[assignment]
    accept_errors = _Count()
    logging.getLogger("asyncio").addHandler(accept_errors)  # "accept() out of system resource"
    loaded = memory_config(
        home,
        PARLEY_HTTP__HEADER_TIMEOUT_SECONDS="120",
        PARLEY_HTTP__KEEPALIVE_TIMEOUT_SECONDS="120",
        PARLEY_STORAGE__MAX_OPEN_TRANSCRIPTS="8",
    )
    async with Gateway(
        loaded, channels=[RecordingChannel()], provider=ScriptedProvider(), announce=lambda _: None
    ) as gw:
        assert gw.http is not None
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        ready = {"port": gw.http.port, "max_connections": gw.http.limits.max_connections}
        print(json.dumps({**ready, "nofile": soft}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        stats = {**gw.http.connection_stats, "accept_errors": accept_errors.count}
        print(json.dumps(stats), flush=True)


def main() -> None:
    home, soft = Path(sys.argv[1]), int(sys.argv[2])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    asyncio.run(_serve(home))


if __name__ == "__main__":
    main()
