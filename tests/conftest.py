"""Suite-wide hygiene: no proxies (the httpx stacks would route loopback through them),
no real credentials or parley settings from the developer's shell, no hub downloads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg_server import PG16_TREE, PgServer, PgTreeServer, fresh_database

_CLEARED_PREFIXES = ("ANTHROPIC_", "OPENAI_", "PARLEY_", "TELEGRAM_", "DISCORD_")
_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower() in _PROXY_VARS or name.startswith(_CLEARED_PREFIXES):
            monkeypatch.delenv(name, raising=False)
    # Both spellings: urllib (the Telegram transport) prefers a lowercase one.
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # python-telegram-bot 22 warns on every RetryAfter unless timedelta periods are on
    # (the adapter reads both forms); `parley` sets the same.
    monkeypatch.setenv("PTB_TIMEDELTA", "1")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer | PgTreeServer]:
    """The session's PostgreSQL (started on first use only).

    ``PG_TEST_TREE=<dir>`` runs every PostgreSQL test on a server unpacked there
    instead (e.g. ``.venv/pg16``), to check parley on an older server and pgvector.
    """
    tree = os.environ.get("PG_TEST_TREE")
    server = PgTreeServer(Path(tree)) if tree else PgServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg16_server() -> Iterator[PgTreeServer]:
    """PostgreSQL 16 with a portable pgvector 0.6, whose HNSW runs on any CPU."""
    if not (PG16_TREE / "bin" / "postgres").exists():
        pytest.skip(f"{PG16_TREE} missing: `make test` unpacks it (tests/fetch_pg16.py)")
    server = PgTreeServer(PG16_TREE)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg16_url(pg16_server: PgTreeServer) -> Iterator[str]:
    yield from fresh_database(pg16_server)


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A libpq URL to an empty database of this test's own."""
    yield from fresh_database(pg_server)
