from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from core.messages import ToolSpec
from core.prompt import PROJECT_FILES, SystemPromptBuilder, render_turn_context, truncate_head_tail


def workspace(tmp_path: Path) -> Path:
    for name in PROJECT_FILES:
        (tmp_path / name).write_text(f"# {name}\ncontent of {name}\n", encoding="utf-8")
    return tmp_path


def test_sections_in_order_and_files_included(tmp_path: Path) -> None:
    builder = SystemPromptBuilder(
        workspace(tmp_path), agent_name="Ada", tools=[ToolSpec("current_time", "the time")]
    )
    text = builder.build().text
    order = [
        "You are Ada",
        "## Tooling",
        "## Safety",
        "## Workspace",
        "# Project Context",
        "## Silent replies",
    ]
    positions = [text.index(marker) for marker in order]
    assert positions == sorted(positions)
    for name in PROJECT_FILES:
        assert f"content of {name}" in text


def test_missing_file_gets_a_marker(tmp_path: Path) -> None:
    workspace(tmp_path)
    (tmp_path / "USER.md").unlink()
    prompt = SystemPromptBuilder(tmp_path, agent_name="A").build()
    assert "[USER.md is missing]" in prompt.text
    assert [f.name for f in prompt.files if f.missing] == ["USER.md"]


def test_truncation_keeps_head_and_tail() -> None:
    text = "H" * 800 + "M" * 800 + "T" * 400
    cut = truncate_head_tail(text, 1000, "X.md")
    assert cut.startswith("H" * 700) and cut.endswith("T" * 200)
    assert "X.md truncated" in cut
    assert truncate_head_tail("short", 1000, "X.md") == "short"


def test_per_file_and_total_caps(tmp_path: Path) -> None:
    workspace(tmp_path)
    (tmp_path / "MEMORY.md").write_text("m" * 50_000, encoding="utf-8")
    prompt = SystemPromptBuilder(
        tmp_path, agent_name="A", file_max_chars=1000, total_max_chars=3000
    ).build()
    memory = next(f for f in prompt.files if f.name == "MEMORY.md")
    assert memory.truncated and memory.injected_chars <= 1100
    assert sum(f.injected_chars for f in prompt.files) <= 3000 + 200


def test_stable_until_a_file_changes(tmp_path: Path) -> None:
    builder = SystemPromptBuilder(workspace(tmp_path), agent_name="A")
    first = builder.build()
    assert builder.build() is first  # cached: no re-read, byte-identical
    path = tmp_path / "SOUL.md"
    path.write_text("# SOUL.md\nnew personality\n", encoding="utf-8")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    second = builder.build()
    assert "new personality" in second.text and second.text != first.text


def test_turn_context_carries_the_volatile_facts() -> None:
    text = render_turn_context(
        now=datetime(2026, 11, 22, 9, 30, tzinfo=UTC),
        channel="telegram",
        chat_type="group",
        sender_name="Bob",
        sender_id="42",
    )
    assert "2026-11-22 09:30" in text and "Sunday" in text
    assert "telegram (group)" in text and "Bob [42]" in text
