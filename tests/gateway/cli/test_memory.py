"""`parley memory status|index|search` run in-process through ``gateway.cli.main`` against
a PARLEY_HOME in tmp_path: a workspace with MEMORY.md and two people's direct-chat
transcripts written as the gateway writes them (one of them from before memory existed,
without a recorded scope). The real default embedder (e5) and memory.db."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from parley.core.messages import Message, TextBlock
from parley.core.prompt import render_turn_context
from parley.core.transcript import Transcript
from parley.gateway.audiences import scope_for_key
from parley.gateway.cli.main import main
from tests.gateway.memory_helpers import restored_logging

ALICE_KEY = "agent:main:test:direct:alice"
BOB_KEY = "agent:main:test:direct:bob"
MEMORY_MD = "# Memory\n\n- The spare house key hangs inside the blue watering can.\n"
ALICE_WORDS = "My ferret Pumpernickel sleeps in the laundry basket every afternoon."
BOB_WORDS = "I tune my bassoon reed with a tiny file before every concert."
STATUS_FIELDS = {
    "provider", "model", "dimensions", "files", "chunks", "by_source", "dirty",
    "vector", "fts", "cache", "fallback",
}  # fmt: skip


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    with restored_logging():
        yield


def write_dm(
    home: Path, session_id: str, key: str, sender: str, text: str, *, legacy: bool
) -> None:
    sessions = home / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"agent": "main", "agent_name": "Parley"}
    if not legacy:
        meta["memory_scope"] = scope_for_key(key)
    context = render_turn_context(
        now=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        channel="test",
        chat_type="direct",
        sender_name=sender.title(),
        sender_id=sender,
    )
    with Transcript.create(sessions / f"{session_id}.jsonl", session_id, key, meta) as t:
        t.append_message(Message("user", (TextBlock(text), TextBlock(context))))
        t.append_message(Message.assistant("Noted."))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / "workspace").mkdir(parents=True)
    (home / "workspace" / "MEMORY.md").write_text(MEMORY_MD, encoding="utf-8")
    write_dm(home, "s-alice", ALICE_KEY, "alice", ALICE_WORDS, legacy=False)
    write_dm(home, "s-bob", BOB_KEY, "bob", BOB_WORDS, legacy=True)
    monkeypatch.setenv("PARLEY_HOME", str(home))
    return home


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    payload = json.loads(out)  # one JSON object, nothing else on stdout
    assert isinstance(payload, dict)
    return payload


def snippets(payload: dict[str, Any]) -> str:
    return "\n".join(r["snippet"] for r in payload["results"])


def test_index_then_index_again(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "memory", "index")
    assert code == 0, err
    assert out.startswith("synced: 3 files seen, 3 indexed, 0 unchanged, 0 removed; "), out
    assert "problem" not in err and "indexing: 3/3 files" in err
    assert (home / "memory" / "main" / "memory.db").is_file()
    code, out, _ = run(capsys, "memory", "index")
    assert code == 0
    assert out.startswith("synced: 3 files seen, 0 indexed, 3 unchanged, 0 removed; 0 chunks")
    code, out, _ = run(capsys, "memory", "index", "--force")
    assert code == 0 and out.startswith("rebuilt: 3 files seen, 3 indexed")


def test_status_text_and_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = run_json(capsys, "memory", "status", "--json")
    assert before["files"] == 0 and before["dirty"] is True
    assert len(before["dirty_files"]) == 3
    assert run(capsys, "memory", "index")[0] == 0
    status = run_json(capsys, "memory", "status", "--json")
    assert set(status) >= STATUS_FIELDS
    assert (status["provider"], status["model"], status["dimensions"]) == (
        "e5", "multilingual-e5-small-q4", 384,
    )  # fmt: skip
    assert status["requested_provider"] == "auto"
    assert status["files"] == 3 and status["chunks"] == 3 and status["vectors"] == 3
    by_source = {s["source"]: (s["files"], s["chunks"]) for s in status["by_source"]}
    assert by_source == {"memory": (1, 1), "sessions": (2, 2)}
    assert status["dirty"] is False and status["dirty_files"] == []
    assert status["vector"] == {"available": True, "error": None}
    assert status["fts"] == {"available": True}
    assert status["cache"]["entries"] == 3 and status["cache"]["max_entries"] == 100_000
    assert status["fallback"] is None
    assert status["db_path"] == str(home / "memory" / "main" / "memory.db")

    code, text, _ = run(capsys, "memory", "status")
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == "Provider: e5 (requested: auto)"
    assert lines[1] == "Model: multilingual-e5-small-q4 · 384 dims"
    assert lines[2] == "Indexed: 3 files · 3 chunks · 3 vectors"
    assert "  memory: 1 files · 1 chunks" in lines and "  sessions: 2 files · 2 chunks" in lines
    assert "Dirty: no" in lines and "Vector: ready" in lines and "FTS: ready" in lines
    assert f"Workspace: {home / 'workspace'}" in lines


def test_search_text_and_json(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No index run first: the search syncs the empty index before it answers.
    code, text, err = run(capsys, "memory", "search", "where is the spare house key")
    assert code == 0, err
    searched, head, first, snippet, *_ = text.splitlines()
    assert searched.startswith("Searched the agent-wide memory only")  # the default
    assert head.startswith('1 result(s) for "where is the spare house key" (hybrid, ')
    assert first.startswith("1. MEMORY.md#L1-L3 · ") and first.endswith(" · memory")
    assert "blue watering can" in snippet
    payload = run_json(capsys, "memory", "search", "spare house key", "--json")
    assert set(payload) == {
        "results", "mode", "provider", "model", "fallback", "search_ms", "searched",
    }  # fmt: skip
    assert payload["searched"]["scopes"] == ["agent"]
    assert payload["mode"] == "hybrid" and payload["provider"] == "e5"
    [hit] = payload["results"]
    assert hit["citation"] == "MEMORY.md#L1-L3" and hit["source"] == "memory"
    loose = ["memory", "search", "spare key ferret bassoon", "--all-scopes", "--json"]
    assert len(run_json(capsys, *loose, "--min-score", "0")["results"]) == 3
    assert len(run_json(capsys, *loose, "--min-score", "0", "--max-results", "2")["results"]) == 2
    # Nothing matches by keyword, so min_score alone decides: nothing reaches 1.
    unrelated = ["memory", "search", "qwxv zzyzx", "--all-scopes", "--json"]
    assert run_json(capsys, *unrelated, "--min-score", "0")["results"]
    assert run_json(capsys, *unrelated, "--min-score", "1")["results"] == []


def test_session_scopes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "memory", "index")[0] == 0
    query = ["memory", "search", "ferret Pumpernickel laundry basket", "--json"]
    default = run_json(capsys, *query)
    assert "Pumpernickel" not in snippets(default)  # the agent scope alone
    own = run_json(capsys, *query, "--session", ALICE_KEY)
    assert "Pumpernickel sleeps in the laundry basket" in snippets(own)
    assert {r["path"] for r in own["results"]} >= {"sessions/s-alice.jsonl"}
    other = run_json(capsys, *query, "--session", BOB_KEY)
    assert "Pumpernickel" not in snippets(other)
    # A thread in Alice's DM shares her scope.
    thread = run_json(capsys, *query, "--session", f"{ALICE_KEY}:thread:t1")
    assert "Pumpernickel" in snippets(thread)
    # Bob's transcript has no recorded scope: it is scoped by its key all the same.
    bassoon = ["memory", "search", "bassoon reed", "--json"]
    assert "bassoon" in snippets(run_json(capsys, *bassoon, "--session", BOB_KEY))
    assert "bassoon" not in snippets(run_json(capsys, *bassoon, "--session", ALICE_KEY))
    explicit = run_json(capsys, *bassoon, "--person", "test:bob")
    assert "bassoon" in snippets(explicit)
    assert explicit["searched"]["scopes"] == ["agent", "person:test:bob"]
    assert "bassoon" not in snippets(run_json(capsys, *bassoon, "--person", "test:alice"))
    group = run_json(capsys, *bassoon, "--conversation", "test:g1")
    assert "bassoon" not in snippets(group)  # a group never sees a person's memory
    assert group["searched"]["scopes"] == ["agent", "conversation:test:g1"]


def test_all_scopes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "memory", "index")[0] == 0
    code, text, _ = run(capsys, "memory", "search", "Pumpernickel laundry basket", "--all")
    assert code == 0 and text.startswith("Searched every audience")
    # The operator's view labels each hit with whose it is.
    assert " · sessions · person test:alice\n" in text
    every = run_json(
        capsys, "memory", "search", "Pumpernickel bassoon", "--all-scopes", "--json",
        "--min-score", "0",
    )  # fmt: skip
    text = snippets(every)
    assert "Pumpernickel" in text and "bassoon" in text


def test_session_and_all_scopes_exclude_each_other(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["memory", "search", "x", "--all-scopes", "--session", ALICE_KEY])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.skipif(
    hasattr(sqlite3.connect(":memory:"), "enable_load_extension"),
    reason="this Python's sqlite3 can load sqlite-vec: no FTS-only driver to test",
)
def test_sqlite3_driver_is_keyword_only_and_says_why(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLEY_MEMORY__DRIVER", "sqlite3")
    assert run(capsys, "memory", "index")[0] == 0
    status = run_json(capsys, "memory", "status", "--json")
    assert status["driver"]["driver"] == "sqlite3"
    assert status["vector"]["available"] is False
    reason = status["vector"]["error"]
    assert reason == "sqlite3: this SQLite driver cannot load extensions"
    assert status["fts"] == {"available": True}
    assert status["provider"] == "none" and status["vectors"] == 0
    assert status["files"] == 3 and status["fallback"] == f"vector search unavailable: {reason}"
    code, text, _ = run(capsys, "memory", "status")
    assert code == 0
    assert f"Vector: off — {reason}" in text.splitlines()
    assert "Provider: none (keyword-only) (requested: auto)" in text.splitlines()
    payload = run_json(
        capsys, "memory", "search", "ferret Pumpernickel", "--session", ALICE_KEY, "--json"
    )
    assert payload["mode"] == "keyword"
    assert payload["fallback"] == f"vector search unavailable: {reason}"
    assert "Pumpernickel" in snippets(payload)
    code, text, _ = run(capsys, "memory", "search", "blue watering can")
    assert code == 0 and "MEMORY.md#L1-L3" in text
    assert text.splitlines()[-1] == f"(keyword-only: vector search unavailable: {reason})"


def test_memory_turned_off(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARLEY_MEMORY__ENABLED", "false")
    code, out, err = run(capsys, "memory", "status")
    assert code == 1 and out == ""
    assert "long-term memory is turned off" in err
    assert not (home / "memory").exists()
