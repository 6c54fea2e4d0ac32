"""`parley sessions export|show` run in-process through ``gateway.cli.main``, once per
state backend: sessions registered in the backend's registry, their transcripts written
through its transcript store with fixed entry ids and times, so that the same appends
into a plain ``FileTranscriptStore`` give the bytes the export must reproduce."""

from __future__ import annotations

import asyncio
import itertools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from parley.core.messages import Message, TextBlock, ToolUseBlock, Usage
from parley.core.transcript import base as transcript_module
from parley.core.transcript_store import FileTranscriptStore, SessionTranscript, TranscriptStore
from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.cli.main import main
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.storage.sessions import SessionOrigin
from parley.gateway.storage.stores import StateStores
from tests.gateway.memory_helpers import restored_logging

ALICE_KEY = "agent:main:test:direct:alice"
BOB_KEY = "agent:main:test:direct:bob"
# Two ids sharing their first 12 characters (what `sessions list` shows), and one more.
ALICE_ID = "abcdef012345" + "0" * 20
BOB_ID = "abcdef012345" + "1" * 20
CAROL_ID = "0123456789abcdef" * 2


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    with restored_logging():
        yield


@pytest.fixture(params=["sqlite", "postgres"])
def loaded(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> LoadedConfig:
    """The environment ``main`` reads (PARLEY_HOME and the storage backend)."""
    for name in list(os.environ):
        if name.startswith("PARLEY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PARLEY_MEMORY__ENABLED", "false")
    if request.param == "postgres":
        monkeypatch.setenv("PARLEY_STORAGE__BACKEND", "postgres")
        monkeypatch.setenv("PARLEY_STORAGE__URL", request.getfixturevalue("pg_url"))
    return load_config()


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Deterministic entry ids and times; call it to start the ids over."""

    def restart() -> None:
        counter = itertools.count()
        monkeypatch.setattr(transcript_module, "new_entry_id", lambda: f"{next(counter):016x}")

    restart()
    monkeypatch.setattr(transcript_module, "_now_iso", lambda: "2026-01-02T03:04:05.678Z")
    return restart


def fill(store: TranscriptStore, session_id: str, key: str) -> None:
    with store.create(session_id, key, {"agent": "main", "memory_scope": "person:x"}) as t:
        _appends(t)


def _appends(t: SessionTranscript) -> None:
    first = t.append_message(Message.user("héllo ✓ what is in the shed?"))
    t.append_message(
        Message("assistant", (TextBlock("looking"), ToolUseBlock("t1", "search", {"q": "x"}))),
        usage=Usage(10, 5, 3, 2),
    )
    t.append_custom("delivery", {"ok": True})
    t.append_compaction(
        "summary", first_kept_entry_id=first.id, tokens_before=90, tokens_after=30, trigger="t"
    )
    t.append_message(Message.assistant("A ladder — and ünïcode \ud800."))


def seed(
    loaded: LoadedConfig, monkeypatch: pytest.MonkeyPatch, restart: Callable[[], None]
) -> dict[str, bytes]:
    """Alice, Bob and Carol in the backend; each one's expected export by session id."""
    ids = iter([ALICE_ID, BOB_ID, CAROL_ID])
    monkeypatch.setattr(
        "parley.gateway.storage.sqlite.session_registry.new_session_id", lambda: next(ids)
    )
    monkeypatch.setattr(
        "parley.gateway.storage.postgres.session_registry.new_session_id",
        lambda: next(ids),
        raising=False,
    )
    people = [("alice", ALICE_KEY), ("bob", BOB_KEY), ("carol", "agent:main:test:direct:carol")]

    loaded.sessions_dir.mkdir(parents=True)  # the gateway's start makes it

    async def register() -> list[str]:
        async with StateStores(loaded) as state:
            made = []
            for peer, key in people:
                origin = SessionOrigin(key, "main", "test", "default", "direct", peer)
                record = await state.registry.create(origin)
                restart()
                await asyncio.to_thread(fill, state.transcripts, record.session_id, key)
                made.append(record.session_id)
            return made

    made = asyncio.run(register())
    assert made == [ALICE_ID, BOB_ID, CAROL_ID]
    reference = FileTranscriptStore(loaded.home / "reference")
    reference.sessions_dir.mkdir()
    expected = {}
    for session_id, (_, key) in zip(made, people, strict=True):
        restart()
        fill(reference, session_id, key)
        expected[session_id] = reference.path(session_id).read_bytes()
    return expected


def test_export_to_a_file_writes_the_file_backends_bytes(
    loaded: LoadedConfig,
    fixed_ids: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = seed(loaded, monkeypatch, fixed_ids)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "carol.jsonl"
    target.write_text("an older export, replaced whole\n" * 100)

    assert main(["sessions", "export", CAROL_ID[:6], "-o", str(target)]) == EXIT_OK

    assert target.read_bytes() == expected[CAROL_ID]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in out_dir.iterdir()] == ["carol.jsonl"]  # no temp file left
    err = capsys.readouterr().err
    assert CAROL_ID in err and f"{len(expected[CAROL_ID]):,} bytes" in err
    if loaded.config.storage.backend == "sqlite":
        # The file backend's export is its file, byte for byte.
        assert target.read_bytes() == (loaded.sessions_dir / f"{CAROL_ID}.jsonl").read_bytes()


def test_export_to_stdout_by_id_or_key(
    loaded: LoadedConfig,
    fixed_ids: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    expected = seed(loaded, monkeypatch, fixed_ids)

    assert main(["sessions", "export", BOB_ID]) == EXIT_OK
    assert capsysbinary.readouterr().out == expected[BOB_ID]
    assert main(["sessions", "export", ALICE_KEY]) == EXIT_OK
    assert capsysbinary.readouterr().out == expected[ALICE_ID]
    # Upper case, as someone may paste it.
    assert main(["sessions", "export", ALICE_ID[:14].upper()]) == EXIT_OK
    assert capsysbinary.readouterr().out == expected[ALICE_ID]


def test_unknown_and_ambiguous_ids_are_refused_clearly(
    loaded: LoadedConfig,
    fixed_ids: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed(loaded, monkeypatch, fixed_ids)
    target = tmp_path / "nothing.jsonl"

    assert main(["sessions", "export", ALICE_ID[:12], "-o", str(target)]) == EXIT_PROBLEM
    err = capsys.readouterr().err
    assert "ambiguous: 2 sessions start with it" in err
    assert ALICE_ID in err and BOB_ID in err
    for unknown in ("fedcba", "not-an-id", "%", "agent:main:test:direct:nobody"):
        assert main(["sessions", "export", unknown, "-o", str(target)]) == EXIT_PROBLEM
        assert f"no session matches {unknown!r}" in capsys.readouterr().err
    assert not target.exists()


def test_show_accepts_a_prefix_and_names_the_stores_location(
    loaded: LoadedConfig,
    fixed_ids: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed(loaded, monkeypatch, fixed_ids)

    assert main(["sessions", "show", CAROL_ID[:8], "--entries", "2"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"id:           {CAROL_ID}" in out
    if loaded.config.storage.backend == "sqlite":
        assert f"transcript:   {loaded.sessions_dir / f'{CAROL_ID}.jsonl'}" in out
    else:
        assert f"#transcripts/{CAROL_ID}" in out
    assert "last 2 of 5 entries:" in out
    assert "A ladder" in out


def test_export_before_any_session_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith("PARLEY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path / "home"))
    assert main(["sessions", "export", "abc"]) == EXIT_PROBLEM
    assert "no session matches 'abc' (no sessions yet)" in capsys.readouterr().err
