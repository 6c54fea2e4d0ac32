"""$PARLEY_HOME is owner-only (issue 19): whatever the umask parley starts under, every
directory under the home is 0700 and every file 0600, SQLite's -wal and -shm included;
`parley doctor` reports wider modes and `parley doctor --fix` narrows them.

Modes are read with ``lstat``, which means the same as root (the sandbox runs the suite
as root, and root reads any file whatever its mode, but its modes are still its modes).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.core.memory.store import MemoryStore
from parley.gateway.cli.doctor_checks import _check_file_modes
from parley.gateway.file_modes import find_wide_modes, narrow_modes, secure_home
from parley.gateway.logs import setup_logging
from parley.gateway.storage.sqlite.database import Database
from tests.fakes.anthropic_api import FakeAnthropic
from tests.gateway.cli.test_main import anthropic_env, parley


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    """The usual login umask, in this process and the `parley` processes it starts;
    the umask is process-wide, so the previous one comes back for the other tests."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes(home: Path) -> dict[str, int]:
    """Every entry under ``home`` (``home`` itself as ".") and its permission bits."""
    found = {".": mode(home)}
    for path in home.rglob("*"):
        found[str(path.relative_to(home))] = mode(path)
    return found


def wider_than_owner_only(home: Path) -> dict[str, str]:
    """Directories not 0700 and files not 0600, with their modes."""
    wrong: dict[str, str] = {}
    for name, bits in modes(home).items():
        expected = 0o700 if (home / name).is_dir() else 0o600
        if bits != expected:
            wrong[name] = f"{bits:04o}"
    return wrong


async def test_parley_chat_under_umask_022_leaves_only_owner_only_files(tmp_path: Path) -> None:
    home = tmp_path / "home"  # parley creates it
    async with FakeAnthropic() as fake:
        code, _, err = await parley("chat", home=home, stdin="hello\n", env=anthropic_env(fake))
        assert code == 0, err
        code, out, err = await parley("sessions", "list", home=home)
        assert code == 0 and "agent:main:terminal" in out, err
    created = modes(home)
    # What holds the conversation is there: the state, the index, the log, a transcript.
    for name in ("state.db", "memory/main/memory.db", "logs/parley.log", "workspace/AGENTS.md"):
        assert name in created
    assert any(name.startswith("sessions/") and name.endswith(".jsonl") for name in created)
    assert wider_than_owner_only(home) == {}


async def test_sqlite_wal_and_shm_and_the_log_are_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # state.db and the log narrow themselves, whatever the umask (022 here).
    db = Database(home / "state.db")
    await db.open()
    try:
        for suffix in ("", "-wal", "-shm"):
            assert mode(home / f"state.db{suffix}") == 0o600, suffix
    finally:
        await db.close()
    try:
        setup_logging("INFO", file=home / "logs" / "parley.log")
        logging.getLogger("parley.test").info("a line with a message in it")
    finally:
        setup_logging("WARNING")  # closes the file
    assert "a line with a message" in (home / "logs" / "parley.log").read_text()
    # memory.db is owner-only through the umask the CLI sets at start.
    previous = secure_home(home)
    try:
        store = MemoryStore.open(home / "memory" / "main" / "memory.db")
        try:
            for suffix in ("", "-wal", "-shm"):
                assert mode(home / "memory" / "main" / f"memory.db{suffix}") == 0o600, suffix
        finally:
            store.close()
    finally:
        os.umask(previous)
    assert previous == 0o022
    assert wider_than_owner_only(home) == {}


def test_secure_home_narrows_what_an_earlier_parley_left(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "memory" / "main").mkdir(parents=True)
    home.chmod(0o755)
    planted = [home / n for n in ("state.db", "state.db-wal", "state.db-shm")]
    planted.append(home / "memory" / "main" / "memory.db")
    for path in planted:
        path.write_bytes(b"")
        path.chmod(0o644)

    previous = secure_home(home, (home / "state.db", home / "memory" / "main" / "memory.db"))
    try:
        assert os.umask(0o077) == 0o077  # set for whatever the command creates next
    finally:
        os.umask(previous)

    assert mode(home) == 0o700
    assert {path.name: mode(path) for path in planted} == {path.name: 0o600 for path in planted}


def test_find_wide_modes_lists_group_or_other_bits_and_skips_symlinks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "open").mkdir(parents=True, mode=0o755)
    (home / "open" / "note.md").write_text("x")  # 0644 under umask 022
    (home / "private.md").write_text("x")
    (home / "private.md").chmod(0o600)
    (home / "script.sh").write_text("x")
    (home / "script.sh").chmod(0o750)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    (outside / "big.bin").write_text("x")
    (home / "link").symlink_to(outside)
    home.chmod(0o700)

    wide = {str(path.relative_to(home)): bits for path, bits in find_wide_modes(home)}

    assert wide == {"open": 0o755, "open/note.md": 0o644, "script.sh": 0o750}
    narrowed, failures = narrow_modes(find_wide_modes(home))
    assert (narrowed, failures) == (3, [])
    # Only group and other bits go: the owner keeps execute on what had it.
    assert (mode(home / "open"), mode(home / "open" / "note.md")) == (0o700, 0o600)
    assert mode(home / "script.sh") == 0o700
    assert mode(outside) == 0o755 and mode(outside / "big.bin") == 0o644  # not followed


async def test_doctor_reports_wide_modes_and_fix_narrows_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with FakeAnthropic() as fake:
        env = anthropic_env(fake)
        code, _, err = await parley("chat", home=home, stdin="hi\n", env=env)
        assert code == 0, err
        code, out, _ = await parley("doctor", home=home, env=env)
        assert code == 0 and f"[ok  ] file modes: owner-only ({home})" in out, out

        (home / "exports").mkdir(mode=0o755)
        (home / "exports" / "chat.jsonl").write_text("{}\n")  # 0644 under umask 022
        before = modes(home)
        assert before["exports"] == 0o755 and before["exports/chat.jsonl"] == 0o644

        code, out, _ = await parley("doctor", home=home, env=env)
        assert code == 0, out  # a warning: the home itself is 0700, no one gets in
        assert (
            f"[warn] file modes: 2 open to group or others under {home}: "
            "exports (0755); exports/chat.jsonl (0644); `parley doctor --fix` narrows them"
        ) in out
        assert modes(home) == before  # the doctor without --fix changes nothing

        code, out, _ = await parley("doctor", "--fix", home=home, env=env)
        assert code == 0, out
        assert f"[ok  ] file modes: narrowed 2 to owner-only ({home})" in out
        assert wider_than_owner_only(home) == {}

        code, out, _ = await parley("doctor", home=home, env=env)
        assert code == 0 and f"[ok  ] file modes: owner-only ({home})" in out, out


def test_doctor_fails_when_the_home_itself_lets_others_in(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    (home / "state.db").write_bytes(b"")
    before = modes(home)

    finding = _check_file_modes(home, False)

    assert finding.severity == "error"
    assert finding.detail.startswith(f"2 open to group or others under {home}: . (0755)")
    assert modes(home) == before
    fixed = _check_file_modes(home, True)
    assert (fixed.severity, fixed.detail) == ("ok", f"narrowed 2 to owner-only ({home})")
    assert modes(home) == {".": 0o700, "state.db": 0o600}
    missing = _check_file_modes(tmp_path / "nowhere", False)
    assert missing.severity == "ok" and not (tmp_path / "nowhere").exists()
