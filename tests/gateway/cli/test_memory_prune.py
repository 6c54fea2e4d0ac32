"""``parley memory prune [--dry-run]``, ``parley memory pruned`` and ``parley memory
stats``, run in-process through ``gateway.cli.main`` against a PARLEY_HOME in
tmp_path (keyword-only memory.db, forgetting by age)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from parley.core.memory.tasks import TaskLog, TaskRecord
from parley.core.messages import Message
from parley.core.transcript import Transcript
from parley.gateway.cli.main import main
from tests.gateway.memory_helpers import restored_logging

OLD = datetime.now(UTC) - timedelta(days=100)
RECENT = datetime.now(UTC) - timedelta(days=1)


@pytest.fixture(autouse=True)
def keep_logging() -> Iterator[None]:
    with restored_logging():
        yield


def write_transcript(home: Path, session_id: str, text: str, when: datetime) -> None:
    sessions = home / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    meta = {"agent": "main", "memory_scope": "person:test:alice"}
    key = "agent:main:test:direct:alice"
    with Transcript.create(sessions / f"{session_id}.jsonl", session_id, key, meta) as t:
        t.append_message(Message.user(text), ts=when)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / "workspace").mkdir(parents=True)
    memory_md = home / "workspace" / "MEMORY.md"
    memory_md.write_text("# Memory\n\nThe walrus lives in the blue shed.\n", encoding="utf-8")
    os.utime(memory_md, (OLD.timestamp(), OLD.timestamp()))  # old, and still the user's
    write_transcript(home, "s-old", "The walrus escaped through the garden gate", OLD)
    write_transcript(home, "s-new", "The walrus sings at the new zoo", RECENT)
    monkeypatch.setenv("PARLEY_HOME", str(home))
    monkeypatch.setenv("PARLEY_MEMORY__EMBEDDER__PROVIDER", "none")
    monkeypatch.setenv("PARLEY_MEMORY__FORGETTING__MAX_AGE_DAYS", "30")
    return home


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def indexed_chunks(capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    code, out, err = run(capsys, "memory", "status", "--json")
    assert code == 0, err
    return {s["source"]: s["chunks"] for s in json.loads(out)["by_source"]}


def test_dry_run_then_prune_then_pruned(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "memory", "prune", "--dry-run")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "would evict 1 chunk(s):"
    assert "  age        person:test:alice: 1" in lines
    assert any(
        line.startswith("  - [age] person:test:alice sessions/s-old.jsonl#L2") for line in lines
    )
    assert indexed_chunks(capsys) == {"memory": 1, "sessions": 2}  # nothing changed
    code, out, _ = run(capsys, "memory", "pruned")
    assert code == 0 and out.strip() == "Nothing has been forgotten."

    code, out, err = run(capsys, "memory", "prune")
    assert code == 0, err
    assert out.splitlines()[0] == "evicted 1 chunk(s):"
    assert indexed_chunks(capsys) == {"memory": 1, "sessions": 1}
    code, out, _ = run(capsys, "memory", "status")
    assert any(line.startswith("Forgotten: 1 chunks (last run: 20") for line in out.splitlines())
    # Pruning again finds nothing: the chunk did not come back with the sync before it.
    code, out, _ = run(capsys, "memory", "prune")
    assert code == 0 and out.strip() == "Nothing to forget."

    code, out, _ = run(capsys, "memory", "pruned", "--limit", "5")
    assert code == 0
    head, preview = out.splitlines()
    assert "  person:test:alice  sessions/s-old.jsonl#L2  age: 100 days old > 30" in head
    assert "walrus escaped through the garden gate" in preview
    code, out, _ = run(capsys, "memory", "pruned", "--json")
    (row,) = json.loads(out)
    assert (row["scope"], row["path"], row["lines"]) == (
        "person:test:alice",
        "sessions/s-old.jsonl",
        [2, 2],
    )


def test_prune_json_and_forgetting_turned_off(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run(capsys, "memory", "prune", "--dry-run", "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["dry_run"] is True and payload["evicted"] == 0
    assert payload["by_policy"] == [{"policy": "age", "scope": "person:test:alice", "chunks": 1}]
    monkeypatch.setenv("PARLEY_MEMORY__FORGETTING__ENABLED", "false")
    code, out, err = run(capsys, "memory", "prune")
    assert code == 1 and out == "" and "forgetting is turned off" in err


def test_stats(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "memory", "stats")
    assert code == 0 and out.startswith("No task records yet")
    log = TaskLog(home / "memory" / "main" / "tasks")
    for outcome, errors in (("ok", ()), ("error", ("exit code 2",)), ("error", ("exit code 1",))):
        log.append(
            TaskRecord("build it", {"shell": 1}, outcome, errors, RECENT, 1.0, "person:test:alice")
        )
    code, out, _ = run(capsys, "memory", "stats", "--json")
    assert code == 0
    stats = json.loads(out)
    assert stats["total"] == 3
    assert stats["by_outcome"] == {"ok": 1, "partial": 0, "error": 2}
    assert stats["top_errors"] == [{"error": "exit code <n>", "count": 2}]
