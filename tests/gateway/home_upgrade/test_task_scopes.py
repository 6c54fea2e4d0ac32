"""Task records filed before audiences (scopes ``dm:…``/``group:…``) are filed again
under the person or group their session key names, once, and nothing else moves."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from parley.core.memory.tasks import TaskLog, TaskRecord, scope_file_name
from parley.gateway.home_upgrade.task_scopes import legacy_task_logs, new_scope, rescope_task_logs

WHEN = datetime(2026, 3, 1, tzinfo=UTC)


def record(request: str, scope: str) -> TaskRecord:
    return TaskRecord(request, {"shell": 1}, "ok", (), WHEN, 1.0, scope=scope)


def write(path: Path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_new_scope_reads_the_key_a_legacy_scope_holds() -> None:
    names = frozenset({"alice"})
    assert new_scope("dm:test:direct:bob", "main", names) == "person:test:bob"
    assert new_scope("dm:test:acct:direct:bob", "main", names) == "person:test:bob"
    assert new_scope("dm:telegram:direct:alice", "main", names) == "person:alice"
    assert new_scope("group:test:group:g1", "main", names) == "conversation:test:g1"
    assert new_scope("dm:main", "main", names) == "person:~main"
    for untouched in ("agent", "person:test:bob", "dm:", "dm:not a key", "other:x"):
        assert new_scope(untouched, "main", names) is None


def test_legacy_records_move_to_their_audience_once(tmp_path: Path) -> None:
    names: frozenset[str] = frozenset()
    alice_old = record("rotate keys", "dm:test:direct:alice")
    group_old = record("plan picnic", "group:test:group:g1")
    shared = record("agent-wide, from transcript_scope agent", "agent")
    mixed = tmp_path / "host-1" / scope_file_name("dm:test:direct:alice")
    write(
        mixed,
        json.dumps(alice_old.to_dict()),
        json.dumps(group_old.to_dict()),
        json.dumps(shared.to_dict()),
        '{"torn',
    )
    current = tmp_path / scope_file_name("person:test:bob")
    write(current, json.dumps(record("already current", "person:test:bob").to_dict()))
    assert legacy_task_logs(tmp_path, "main", names) == [mixed]

    assert rescope_task_logs(tmp_path, "main", names) == 2
    log = TaskLog(tmp_path)
    [alice] = log.records(["person:test:alice"])
    assert (alice.request, alice.scope) == ("rotate keys", "person:test:alice")
    [group] = log.records(["conversation:test:g1"])
    assert group.request == "plan picnic"
    # What names no audience, and what is not a record, stay in the old log.
    assert mixed.read_text(encoding="utf-8").splitlines()[1] == '{"torn'
    assert [r.scope for r in log.records(["dm:test:direct:alice"])] == ["agent"]
    assert len(log.records(["person:test:bob"])) == 1
    # Done: a second run finds nothing and copies nothing.
    assert legacy_task_logs(tmp_path, "main", names) == []
    assert rescope_task_logs(tmp_path, "main", names) == 0
    assert len(log.records(["person:test:alice"])) == 1


def test_a_rerun_after_a_kill_does_not_copy_twice(tmp_path: Path) -> None:
    old = record("rotate keys", "dm:test:direct:alice")
    legacy = tmp_path / scope_file_name(old.scope)
    write(legacy, json.dumps(old.to_dict()))
    rescope_task_logs(tmp_path, "main", frozenset())
    # As if killed after the copy, before the old log went: it is back.
    write(legacy, json.dumps(old.to_dict()))
    rescope_task_logs(tmp_path, "main", frozenset())
    assert len(TaskLog(tmp_path).records(["person:test:alice"])) == 1
    assert not legacy.exists()
