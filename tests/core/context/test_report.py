"""/context: the breakdown of what fills the window, as text and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from parley.core.context.history import summary_message
from parley.core.context.report import (
    LAST_CALL_LABEL,
    NEXT_REQUEST_LABEL,
    REPORT_TITLE,
    USAGE,
    WINDOW_LABEL,
    ContextReport,
    LastCall,
    build_context_report,
    describe_profile,
    describe_tools,
    describe_window,
    figure_lines,
    last_call,
    render_context,
)
from parley.core.context.window import WindowInfo
from parley.core.messages import Message, ToolResultBlock, ToolSpec, ToolUseBlock, Usage
from parley.core.prompt import PROJECT_FILES, SystemPromptBuilder
from parley.core.providers.base import ModelFacts
from parley.core.transcript.file import Transcript


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
    last_call: LastCall | None = None,
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
        last_call=last_call,
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
    report = make_report(tmp_path, history=HISTORY, window=10_000, last_call=LastCall(1200, 34))
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
    assert report.last_call is not None
    assert report.session_tokens == report.last_call.tokens == 1234


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
    report = make_report(tmp_path, history=HISTORY, last_call=LastCall(700, 77))
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
    # The figures close the report, in the words /status and the inspector use too.
    assert (
        lines[-3:]
        == figure_lines(report)
        == [
            f"{WINDOW_LABEL}: 10,000 tokens",
            f"{NEXT_REQUEST_LABEL}: ~{report.total_tokens:,} / 10,000 tokens ({report.share:.1%})",
            f"{LAST_CALL_LABEL}: 777 tokens (700 read + 77 written)",
        ]
    )
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
    # No call reported since the compaction the summary stands for.
    assert f"{LAST_CALL_LABEL}: none since the latest compaction" in text


def test_no_summary_tokens_without_a_summary(tmp_path: Path) -> None:
    report = make_report(tmp_path, history=HISTORY[3:])
    assert report.summary_tokens is None
    assert "compaction summary" not in render_context(report, "detail")


def test_json_mode_is_one_stable_object(tmp_path: Path) -> None:
    report = make_report(tmp_path, history=HISTORY, last_call=LastCall(90, 9))
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
        "figures",
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
    assert data["figures"] == {
        "window_tokens": 10_000,
        "window_source": "",
        "next_request_tokens": report.total_tokens,
        "share": round(report.share, 4),
        "last_call": {"prompt_tokens": 90, "output_tokens": 9, "tokens": 99},
        "lines": figure_lines(report),
    }
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
    assert f"{LAST_CALL_LABEL}: none yet" in render_context(report)


# -- the last call, from the live window ---------------------------------------------------


def test_last_call_is_the_newest_reported_call_of_the_live_window(tmp_path: Path) -> None:
    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        assert last_call(transcript.live_entries()) is None  # no call yet
        first = transcript.append_message(Message.user("hi"))
        transcript.append_message(Message.assistant("one"), usage=Usage(100, 10, 50))
        transcript.append_message(Message.user("again"))
        transcript.append_message(Message.assistant("two"), usage=Usage(200, 20, 0, 5))
        # An assistant message no call wrote (an import: no usage) is passed over.
        transcript.append_message(Message.assistant("imported"))
        # Read, cache read and cache write: everything the model read, plus its output.
        assert last_call(transcript.live_entries()) == LastCall(205, 20)
        transcript.append_compaction(
            "summary",
            first_kept_entry_id=first.id,
            tokens_before=500,
            tokens_after=100,
            trigger="manual",
        )
        # The report described a view the compaction replaced: no figure until a call.
        assert last_call(transcript.live_entries()) is None
        transcript.append_message(Message.user("after"))
        transcript.append_message(Message.assistant("three"), usage=Usage(0, 3))
        # A server that reported nothing: unknown, not an older call's figure.
        assert last_call(transcript.live_entries()) is None


# -- where the window came from, tools, profile --------------------------------------------


def _with_detail(info: WindowInfo, detail: str) -> Any:
    """``info`` with the engine's ``detail``, duck-typed: read with getattr, as
    ``describe_window`` does, so the test holds with or without the field."""
    return SimpleNamespace(
        tokens=info.tokens, source=info.source, capped=info.capped, detail=detail
    )


LLAMA = ModelFacts(8192, "llama.cpp /props", supports_tools=False, server="llama.cpp")


@pytest.mark.parametrize(
    ("info", "facts", "expected"),
    [
        (
            WindowInfo(8192, "provider", False),
            LLAMA,
            "8,192 tokens, from the llama.cpp server (/props)",
        ),
        (
            WindowInfo(4096, "provider", False),
            ModelFacts(4096, "gguf metadata", server="embedded"),
            "4,096 tokens, from the model file (gguf metadata)",
        ),
        (
            WindowInfo(32768, "provider", False),
            ModelFacts(32768, "/v1/models max_model_len"),
            "32,768 tokens, from the model server (/v1/models max_model_len)",
        ),
        (WindowInfo(8192, "provider", False), None, "8,192 tokens, from the model's provider"),
        # The engine's detail names the source when the provider's facts do not.
        (
            _with_detail(WindowInfo(16_384, "provider", False), "ollama /api/show"),
            None,
            "16,384 tokens, from the ollama server (/api/show)",
        ),
        (WindowInfo(200_000, "table", False), None, "200,000 tokens, from parley's built-in table"),
        (
            WindowInfo(20_000, "config", False),
            None,
            '20,000 tokens, from your config (context.models."m")',
        ),
        (
            WindowInfo(32_000, "default", False),
            None,
            '32,000 tokens, assumed default: set context.models."m".context_tokens '
            "to the model's real window",
        ),
        (
            WindowInfo(50_000, "table", True),
            None,
            "50,000 tokens, from parley's built-in table, capped by context.agent_max_tokens",
        ),
    ],
)
def test_the_window_says_where_it_came_from(
    info: WindowInfo, facts: ModelFacts | None, expected: str
) -> None:
    assert describe_window(info, model="m", facts=facts) == expected


class _Provider:
    def __init__(self, name: str = "openai", facts: ModelFacts | None = None) -> None:
        self.name = name
        self.facts = facts


def test_tools_say_who_withheld_them() -> None:
    def tools(offered: bool, configured: bool | None, provider: object) -> str:
        return describe_tools(offered, count=7, model="m", configured=configured, provider=provider)

    assert tools(True, None, _Provider()) == "offered (7)"
    assert tools(True, True, _Provider(facts=LLAMA)) == (
        'offered (7, as context.models."m".tools = true says)'
    )
    assert tools(False, False, _Provider()) == 'withheld: context.models."m".tools = false'
    assert tools(False, None, _Provider(facts=LLAMA)) == (
        "withheld: the llama.cpp server says the model cannot use them"
    )
    assert tools(False, None, _Provider("local")) == "withheld: the embedded model cannot use them"
    assert tools(False, None, _Provider()) == (
        "withheld: the model's provider says it cannot use them"
    )


def test_the_profile_is_shown_only_when_there_is_one() -> None:
    class Profile:
        name = "small"
        reason = "a window below 16k tokens"

    assert describe_profile(None) is None
    assert describe_profile("standard") == "standard"
    assert describe_profile(Profile()) == "small (a window below 16k tokens)"
    assert describe_profile(object()) is None
