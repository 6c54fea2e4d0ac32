"""``parley db migrate|status`` on both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.gateway.cli.main import main
from parley.gateway.storage.postgres.schema_migrations import SCHEMA_VERSION


def test_postgres_migrate_is_idempotent_and_status_tells_the_version(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path))
    monkeypatch.setenv("PARLEY_STORAGE__BACKEND", "postgres")
    monkeypatch.setenv("PARLEY_DATABASE_URL", pg_url)
    assert main(["db", "status"]) == 0
    assert (
        f"schema version 0 of {SCHEMA_VERSION} ({SCHEMA_VERSION} pending)"
        in capsys.readouterr().out
    )
    assert main(["db", "migrate"]) == 0
    applied = ", ".join(str(v) for v in range(1, SCHEMA_VERSION + 1))
    assert f"migrated ({applied})" in capsys.readouterr().out
    assert main(["db", "migrate"]) == 0
    assert "migrated (nothing to apply)" in capsys.readouterr().out
    assert main(["db", "status"]) == 0
    out = capsys.readouterr().out
    assert f"schema version {SCHEMA_VERSION} of {SCHEMA_VERSION}\n" in out
    assert "postgresql://postgres@" in out and "pending" not in out


def test_postgres_unreachable_is_a_clear_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path))
    monkeypatch.setenv("PARLEY_STORAGE__BACKEND", "postgres")
    url = f"postgresql://parley:hunter2@/parley?host={tmp_path}&connect_timeout=1"
    monkeypatch.setenv("PARLEY_DATABASE_URL", url)
    assert main(["db", "migrate"]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to PostgreSQL at postgresql://parley@" in err
    assert "hunter2" not in err


def test_sqlite_migrate_creates_state_db(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from parley.gateway.storage.sqlite.database import SCHEMA_VERSION as SQLITE_VERSION

    monkeypatch.setenv("PARLEY_HOME", str(tmp_path))
    assert main(["db", "migrate"]) == 0
    assert (tmp_path / "state.db").is_file()
    assert f"migrated {SQLITE_VERSION} of {SQLITE_VERSION}" in capsys.readouterr().out
