"""The memory.db driver: a SQLite that loads sqlite-vec when one can, FTS-only and saying why
when none can. Real files, the real stdlib sqlite3, pysqlite3 and sqlite-vec."""

from __future__ import annotations

import importlib
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.driver import DriverInfo, open_connection


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def opened() -> Iterator[list[Any]]:
    """Connections a test opened; closed after it."""
    conns: list[Any] = []
    yield conns
    for conn in conns:
        conn.close()


def _open(conns: list[Any], path: Path, **kwargs: Any) -> tuple[Any, DriverInfo]:
    conn, info = open_connection(path, **kwargs)
    conns.append(conn)
    return conn, info


def _stdlib_loads_extensions() -> bool:
    conn = sqlite3.connect(":memory:")
    try:
        return hasattr(conn, "enable_load_extension")
    finally:
        conn.close()


def test_this_python_cannot_load_extensions_with_the_stdlib() -> None:
    # The premise of the driver choice below; if it changes, "auto" may pick sqlite3.
    assert not _stdlib_loads_extensions()


def test_auto_picks_pysqlite3_with_vectors_on(db: Path, opened: list[Any]) -> None:
    conn, info = _open(opened, db)

    assert info.name == "pysqlite3"
    assert info.vector_available
    assert info.vector_error is None
    assert info.vector_version == conn.execute("SELECT vec_version()").fetchone()[0]
    assert info.module.__name__ == "pysqlite3.dbapi2"
    conn.execute("CREATE VIRTUAL TABLE v USING vec0(embedding float[2] distance_metric=cosine)")
    conn.execute("INSERT INTO v(rowid, embedding) VALUES (1, '[1, 0]')")
    assert conn.execute("SELECT COUNT(*) FROM v").fetchone()[0] == 1


def test_connection_is_wal_autocommit_with_a_busy_timeout(db: Path, opened: list[Any]) -> None:
    conn, _ = _open(opened, db)

    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    assert conn.isolation_level is None


def test_sqlite3_choice_is_fts_only_and_says_why(db: Path, opened: list[Any]) -> None:
    conn, info = _open(opened, db, choice="sqlite3")

    assert info.name == "sqlite3"
    assert info.module is sqlite3
    assert not info.vector_available
    assert info.vector_version is None
    assert info.vector_error is not None
    assert "sqlite3" in info.vector_error
    assert "cannot load extensions" in info.vector_error
    # FTS5 still works: that is what the index falls back to.
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(text)")
    conn.execute("INSERT INTO f(text) VALUES ('hello world')")
    assert conn.execute("SELECT COUNT(*) FROM f WHERE f MATCH 'hello'").fetchone()[0] == 1
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("SELECT vec_version()")


def test_vector_false_skips_sqlite_vec_on_purpose(db: Path, opened: list[Any]) -> None:
    conn, info = _open(opened, db, vector=False)

    assert not info.vector_available
    assert info.vector_error == "vector search is turned off (keyword-only)"
    with pytest.raises(info.module.OperationalError):
        conn.execute("SELECT vec_version()")


def test_pysqlite3_choice(db: Path, opened: list[Any]) -> None:
    _, info = _open(opened, db, choice="pysqlite3")

    assert info.name == "pysqlite3"
    assert info.vector_available
    assert info.sqlite_version.startswith("3.")


def test_without_sqlite_vec_every_driver_says_why(
    db: Path, opened: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sqlite_vec", None)  # "import sqlite_vec" fails

    _, info = _open(opened, db)

    assert not info.vector_available
    assert info.name == "sqlite3"  # the first candidate, when none can load vectors
    assert info.vector_error is not None
    assert "sqlite3: this SQLite driver cannot load extensions" in info.vector_error
    assert "pysqlite3.dbapi2: the sqlite-vec package is not installed" in info.vector_error


def test_a_missing_driver_is_an_import_error(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def no_pysqlite3(name: str, package: str | None = None) -> Any:
        if name.startswith("pysqlite3"):
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_pysqlite3)

    with pytest.raises(ImportError, match="pysqlite3"):
        open_connection(db, choice="pysqlite3")


def test_describe_is_what_status_shows(db: Path, opened: list[Any]) -> None:
    _, info = _open(opened, db, choice="sqlite3")

    described = info.describe()

    assert described == {
        "driver": "sqlite3",
        "sqlite": info.sqlite_version,
        "vector": False,
        "vector_version": None,
        "vector_error": info.vector_error,
    }


def test_only_one_sqlite_library_touches_the_file(db: Path, opened: list[Any]) -> None:
    """Regression: "auto" used to open the file with the stdlib sqlite3 too, just to find
    that it cannot load extensions. Closing that connection made the stdlib's SQLite think
    it was the last one (POSIX locks are per process), so it unlinked the -wal and -shm
    files under pysqlite3's live connections, and the next open failed with "disk I/O
    error"."""
    first, _ = _open(opened, db)
    first.execute("CREATE TABLE t(x)")
    first.execute("INSERT INTO t VALUES (1)")
    second, _ = _open(opened, db)

    assert (db.parent / "memory.db-wal").exists()
    assert (db.parent / "memory.db-shm").exists()
    first.execute("CREATE VIRTUAL TABLE v USING vec0(embedding float[2])")
    assert second.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1
    third, _ = _open(opened, db)
    first.execute("INSERT INTO t VALUES (2)")
    assert third.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 2
    assert third.execute("SELECT COUNT(*) FROM v").fetchone()[0] == 0
