"""/context: the breakdown of what fills the window, as text and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from parley.core.context.history import summary_message
from parley.core.context.report import (
    REPORT_TITLE,
    USAGE,
    ContextReport,
    build_context_report,
    render_context,
)
from parley.core.messages import Message, ToolResultBlock, ToolSpec, ToolUseBlock
from parley.core.prompt import PROJECT_FILES, SystemPromptBuilder


class FakeCounter:
    """Deterministic: one token per 4 characters, rounded up; a message adds 4."""

    def text(self, s: str) -> int:
        return -(-len(s) // 4)

    def message(self, m: Message) -> int:
        return 4 + sum(self.text(json.dumps(b.to_dict())) for b in m.content)

    def tools(self, specs: Sequence[ToolSpec]) -> int:
        return sum(self.text(s.schema_json()) for s in specs)


SMALL = ToolSpec("tiny", "t")
BIG = ToolSpec(
    "search_everything",
    "a long description " * 10,
    {"type": "object", "properties": {"q": {"type": "string"}}},
)


def make_report(
    tmp_path: Path,
    *,
    history: Sequence[Message] = (),
    window: int = 10_000,
    session_tokens: int | None = None,
) -> ContextReport:
    for name in PROJECT_FILES:
        (tmp_path / name).write_text(f"{name} " * 20, encoding="utf-8")
    (tmp_path / "MEMORY.md").write_text("m" * 5_000, encoding="utf-8")
    (tmp_path / "USER.md").unlink()
    tools = [SMALL, BIG]
    prompt = SystemPromptBuilder(
        tmp_path, agent_name="A", tools=tools, file_max_chars=1_000, total_max_chars=10_000
    ).build()
    return build_context_report(
        prompt=prompt,
        tools=tools,
        history=history,
        counter=FakeCounter(),
        window=window,
        workspace=tmp_path,
        file_max_chars=1_000,
        total_max_chars=10_000,
        session_tokens=session_tokens,
    )


HISTORY = [
    summary_message("earlier we decided X"),
    Message("assistant", (ToolUseBlock("a", "tiny", {"q": 1}),)),
    Message("tool_result", (ToolResultBlock("a", "r" * 400),)),
    Message.assistant("done"),
    Message.user("thanks"),
]


def test_numbers_add_up(tmp_path: Path) -> None:
    counter = FakeCounter()
    report = make_report(tmp_path, history=HISTORY, window=10_000, session_tokens=1234)
    assert report.system_chars == sum(s.chars for s in report.sections) + 2 * (
        len(report.sections) - 1
    )
    assert [s.tokens for s in report.sections] == [
        counter.text("x" * s.chars) for s in report.sections
    ]
    assert report.tool_count == 2
    assert report.tool_tokens == counter.tools([SMALL, BIG])
    assert report.tool_chars == len(SMALL.schema_json()) + len(BIG.schema_json())
    assert [t.name for t in report.tools] == ["search_everything", "tiny"]  # largest first
    assert report.history_messages == 5
    assert report.history_tokens == sum(counter.message(m) for m in HISTORY)
    assert report.total_tokens == report.system_tokens + report.tool_tokens + report.history_tokens
    assert report.share == pytest.approx(report.total_tokens / 10_000)
    roles = {r.role: (r.messages, r.tokens) for r in report.history_roles}
    assert roles["user"][0] == 2 and roles["assistant"][0] == 2 and roles["tool_result"][0] == 1
    assert sum(t for _, t in roles.values()) == report.history_tokens
    assert report.summary_tokens == counter.text(HISTORY[0].text)
    assert report.session_tokens == 1234


def test_file_statuses(tmp_path: Path) -> None:
    report = make_report(tmp_path)
    status = {f.name: f.status for f in report.files}
    assert status["MEMORY.md"] == "TRUNCATED"
    assert status["USER.md"] == "MISSING"
    assert status["AGENTS.md"] == "OK"
    memory = next(f for f in report.files if f.name == "MEMORY.md")
    assert memory.raw_chars == 5_000 and memory.injected_chars <= 1_000
    user = next(f for f in report.files if f.name == "USER.md")
    assert user.path == str(tmp_path / "USER.md")


def test_list_mode(tmp_path: Path) -> None:
    report = make_report(tmp_path, history=HISTORY, session_tokens=777)
    text = render_context(report, "list")
    assert text == render_context(report)  # list is the default
    assert text == render_context(report, "  LIST ")
    lines = text.splitlines()
    assert lines[0] == REPORT_TITLE
    assert f"Workspace: {tmp_path}" in text
    assert "1,000 chars per file" in text and "10,000 in total" in text
    assert f"System prompt: {report.system_chars:,} chars (~{report.system_tokens:,} tok)" in text
    assert any(line.strip().startswith("project_context:") for line in lines)
    assert any(
        "TRUNCATED" in line and "MEMORY.md" in line and "raw 5,000" in line for line in lines
    )
    assert any("MISSING" in line and "USER.md" in line for line in lines)
    assert any(line.strip().startswith("OK") and "AGENTS.md" in line for line in lines)
    assert "Tool schemas (JSON): 2 tools" in text
    assert "History: 5 messages" in text
    assert f"~{report.total_tokens:,} tok of a 10,000 token window" in text
    assert "Session tokens (last reported): 777" in text
    assert "compaction summary" not in text  # detail only


def test_detail_mode_adds_tools_roles_and_summary(tmp_path: Path) -> None:
    report = make_report(tmp_path, history=HISTORY)
    text = render_context(report, "detail")
    lines = text.splitlines()
    big = next(i for i, line in enumerate(lines) if line.strip().startswith("search_everything:"))
    small = next(i for i, line in enumerate(lines) if line.strip().startswith("tiny:"))
    assert big < small
    assert any(line.strip().startswith("tool_result: 1 messages") for line in lines)
    assert f"compaction summary: ~{report.summary_tokens:,} tok" in text
    assert "Session tokens" not in text  # not given


def test_no_summary_tokens_without_a_summary(tmp_path: Path) -> None:
    report = make_report(tmp_path, history=HISTORY[3:])
    assert report.summary_tokens is None
    assert "compaction summary" not in render_context(report, "detail")


def test_json_mode_is_one_stable_object(tmp_path: Path) -> None:
    report = make_report(tmp_path, history=HISTORY, session_tokens=99)
    data = json.loads(render_context(report, "json"))
    assert set(data) == {
        "workspace",
        "caps",
        "system_prompt",
        "files",
        "tools",
        "history",
        "total_tokens",
        "window",
        "share",
        "session_tokens",
        "recall",
    }
    assert data["caps"] == {"file_max_chars": 1_000, "total_max_chars": 10_000}
    assert data["system_prompt"]["tokens"] == report.system_tokens
    assert [s["name"] for s in data["system_prompt"]["sections"]] == [
        s.name for s in report.sections
    ]
    assert {f["name"]: f["status"] for f in data["files"]}["USER.md"] == "MISSING"
    assert data["tools"]["count"] == 2 and data["tools"]["items"][0]["name"] == "search_everything"
    assert data["history"]["messages"] == 5
    assert data["history"]["summary_tokens"] == report.summary_tokens
    assert data["total_tokens"] == report.total_tokens and data["window"] == 10_000
    assert data["session_tokens"] == 99
    assert render_context(report, "json") == render_context(report, "json")


@pytest.mark.parametrize("mode", ["bogus", "help", "lists"])
def test_unknown_mode_gets_the_usage_line(tmp_path: Path, mode: str) -> None:
    assert render_context(make_report(tmp_path), mode) == USAGE


def test_empty_everything_and_a_zero_window(tmp_path: Path) -> None:
    prompt = SystemPromptBuilder(tmp_path, agent_name="A").build()
    report = build_context_report(
        prompt=prompt,
        tools=[],
        history=[],
        counter=FakeCounter(),
        window=0,
        workspace=tmp_path,
        file_max_chars=20_000,
        total_max_chars=150_000,
    )
    assert report.tool_tokens == 0 and report.history_tokens == 0 and report.share == 0.0
    assert all(f.status == "MISSING" for f in report.files)
    assert "Tool schemas (JSON): 0 tools" in render_context(report)
    assert json.loads(render_context(report, "json"))["session_tokens"] is None
