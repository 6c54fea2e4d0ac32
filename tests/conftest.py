"""Suite-wide hygiene: no proxies (the httpx stacks would route loopback through them),
no real credentials or parley settings from the developer's shell, no hub downloads."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.pg_server import PgServer, fresh_database

_CLEARED_PREFIXES = ("ANTHROPIC_", "OPENAI_", "PARLEY_", "TELEGRAM_", "DISCORD_")
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower() in _PROXY_VARS or name.startswith(_CLEARED_PREFIXES):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # python-telegram-bot 22 warns on every RetryAfter unless timedelta periods are on
    # (the adapter reads both forms); `parley` sets the same.
    monkeypatch.setenv("PTB_TIMEDELTA", "1")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The session's PostgreSQL (started on first use only)."""
    server = PgServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A libpq URL to an empty database of this test's own."""
    yield from fresh_database(pg_server)
