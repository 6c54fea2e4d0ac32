"""Task records: built from a turn's entries (tool turns only), classified, appended to
a per-scope log, searchable through MemoryIndex, forgettable, and counted."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.index import MemoryIndex
from parley.core.memory.memory_config import ForgettingSettings
from parley.core.memory.tasks import (
    TaskLog,
    TaskRecord,
    format_task_stats,
    normalise_error,
    scope_file_name,
    task_record_from_turn,
    task_stats,
)
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock
from parley.core.transcript import Entry
from tests.core.memory.helpers import make_layout, quiet_settings

START = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
END = START + timedelta(seconds=12.5)
_ids = count()


def entry(message: Message) -> Entry:
    n = next(_ids)
    return Entry(f"e{n}", None, START.isoformat(), "message", {"message": message.to_dict()})


def tool_call(*names: str) -> Entry:
    blocks = tuple(ToolUseBlock(f"t{next(_ids)}", name, {}) for name in names)
    return entry(Message("assistant", blocks))


def results(*outcomes: tuple[str, bool]) -> Entry:
    blocks = tuple(
        ToolResultBlock(f"t{i}", text, is_error=err) for i, (text, err) in enumerate(outcomes)
    )
    return entry(Message("user", blocks))


def reply(text: str) -> Entry:
    return entry(Message("assistant", (TextBlock(text),)))


def record(entries: list[Entry], **kw: Any) -> TaskRecord:
    made = task_record_from_turn("deploy the staging site", entries, START, END, **kw)
    assert made is not None
    return made


def test_no_tools_no_record() -> None:
    entries = [entry(Message.user("hello")), reply("Hi!")]
    assert task_record_from_turn("hello", entries, START, END) is None


def test_ok_counts_tools_in_order_of_first_use() -> None:
    made = record(
        [
            tool_call("shell", "read_file"),
            results(("built", False), ("contents", False)),
            tool_call("shell"),
            results(("deployed", False)),
            reply("Done."),
        ],
        scope="person:alice",
    )
    assert made.outcome == "ok" and made.errors == ()
    assert list(made.tools.items()) == [("shell", 2), ("read_file", 1)]
    assert (made.started_at, made.duration_seconds, made.scope) == (START, 12.5, "person:alice")
    assert made.request == "deploy the staging site"


def test_partial_when_a_failure_was_recovered_from() -> None:
    made = record(
        [
            tool_call("shell"),
            results(("error: permission denied on /srv/www", True)),
            tool_call("shell"),
            results(("deployed", False)),
            reply("Deployed after fixing permissions."),
        ]
    )
    assert made.outcome == "partial"
    assert made.errors == ("error: permission denied on /srv/www",)


def test_error_when_the_last_tool_result_failed() -> None:
    made = record(
        [tool_call("shell"), results(("ok", False), ("exit code 2: " + "x" * 1000, True))]
    )
    assert made.outcome == "error"
    assert len(made.errors) == 1 and made.errors[0].endswith("…") and len(made.errors[0]) <= 240


def test_error_when_the_turn_itself_failed() -> None:
    failed = Entry(
        "e-err", None, START.isoformat(), "custom",
        {"custom_type": "turn_error", "data": {"kind": "ServerError", "message": "upstream 500"}},
    )  # fmt: skip
    made = record([tool_call("web_fetch"), results(("page", False)), failed])
    assert made.outcome == "error" and made.errors == ("upstream 500",)


def test_record_round_trips_and_reads_as_a_chunk() -> None:
    made = record(
        [tool_call("shell"), results(("boom", True)), tool_call("shell"), results(("ok", False))]
    )
    assert TaskRecord.from_dict(json.loads(json.dumps(made.to_dict()))) == made
    assert made.as_text() == (
        "Task: deploy the staging site\n"
        "Tools: shell ×2\n"
        "Outcome: partial\n"
        "Errors: boom\n"
        "When: 2026-03-01 09:30 UTC (12.5 s)"
    )


def test_log_appends_per_scope_private_files(tmp_path: Path) -> None:
    log = TaskLog(tmp_path / "tasks")
    first = log.append(record([tool_call("shell"), results(("ok", False))], scope="person:alice"))
    log.append(record([tool_call("grep"), results(("ok", False))], scope="person:alice"))
    other = log.append(
        record([tool_call("shell"), results(("no", True))], scope="conversation:ops")
    )
    assert first != other and first.name == scope_file_name("person:alice")
    assert "alice" not in first.name  # scopes are data, never file names
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    with first.open("a", encoding="utf-8") as handle:
        handle.write('{"request": "torn')  # a crash mid-line
    assert [r.tools for r in log.records(["person:alice"])] == [{"shell": 1}, {"grep": 1}]
    assert len(log.records()) == 3
    assert log.records(["person:nobody"]) == []


def test_errors_are_normalised_for_counting() -> None:
    assert normalise_error("timeout after 30s fetching job 4f9c2a1b7e") == normalise_error(
        "timeout after 45s fetching job 0a1b2c3d4e5f"
    )
    assert normalise_error("no such file 'a.txt'") == normalise_error('no such file "b.md"')
    assert normalise_error("permission denied") != normalise_error("connection refused")


def test_stats_count_outcomes_and_rank_errors() -> None:
    def made(outcome_results: list[tuple[str, bool]]) -> TaskRecord:
        return record([tool_call("shell"), results(*outcome_results)])

    records = [
        made([("ok", False)]),
        made([("ok", False)]),
        made([("timeout after 30s on job 11", True), ("ok", False)]),
        made([("timeout after 31s on job 12", True)]),
        made([("timeout after 9s on job 13", True)]),
        made([("disk full", True)]),
    ]
    stats = task_stats(records)
    assert stats.total == 6
    assert stats.by_outcome == {"ok": 2, "partial": 1, "error": 3}
    assert stats.top_errors == [("timeout after <n>s on job <n>", 3), ("disk full", 1)]
    assert stats.tools == {"shell": 6}
    text = format_task_stats(stats)
    assert "Tasks: 6 (2 ok, 1 partial, 3 error)" in text
    assert "  3× timeout after <n>s on job <n>" in text
    assert format_task_stats(task_stats([])).startswith("No task records yet")


def test_top_errors_keep_five() -> None:
    records = [record([tool_call("t"), results((f"failure kind {c}", True))]) for c in "abcdefg"]
    assert len(task_stats(records).top_errors) == 5


@pytest.fixture
def layout(tmp_path: Path) -> Any:
    return make_layout(tmp_path)


async def test_records_are_searchable_in_their_scope_and_forgettable(layout: Any) -> None:
    clock = {"now": START + timedelta(hours=1)}
    index = MemoryIndex(
        quiet_settings(forgetting=ForgettingSettings(max_age_days=30, schedule_hours=0)),
        db_path=layout.db,
        workspace=layout.workspace,
        sessions_dir=layout.sessions,
        embedder=None,
        now=lambda: clock["now"],
    )
    await index.open()
    try:
        task = record(
            [tool_call("shell"), results(("nginx: permission denied", True))], scope="person:alice"
        )
        await index.record_task(task)
        await index.record_task(
            record([tool_call("grep"), results(("ok", False))], scope="person:bob")
        )
        await index.sync(reason="test")
        found = await index.search("staging nginx permission", scopes=["agent", "person:alice"])
        (hit,) = found.hits
        assert hit.path == f"tasks/{scope_file_name('person:alice')}" and hit.start_line == 1
        assert hit.source == "tasks" and hit.scope == "person:alice"
        assert "Outcome: error" in hit.snippet and "Tools: shell ×1" in hit.snippet
        assert [h.scope for h in (await index.search("staging", scopes=["person:bob"])).hits] == [
            "person:bob"
        ]
        stats = await index.task_stats(["person:alice"])
        assert stats.by_outcome == {"ok": 0, "partial": 0, "error": 1}
        # A new record marks the index dirty: the next search catches up first.
        later = task_record_from_turn(
            "rotate the zeppelin keys", [tool_call("vault"), results(("ok", False))], START, END,
            scope="person:alice",
        )  # fmt: skip
        assert later is not None
        await index.record_task(later)
        rotated = await index.search("zeppelin keys", scopes=["person:alice"])
        assert [h.start_line for h in rotated.hits] == [2]

        clock["now"] = START + timedelta(days=60)
        report = await index.forget()
        assert sorted(e.chunk.scope for e in report.evictions) == [
            "person:alice",
            "person:alice",
            "person:bob",
        ]
        assert (await index.search("staging nginx", scopes=["person:alice"])).hits == []
        # The log itself is kept (stats still count it); only the index forgot.
        assert (await index.task_stats()).total == 3
    finally:
        await index.close()
