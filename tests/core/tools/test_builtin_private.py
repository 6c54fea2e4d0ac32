"""The file tools never reach the gateway's private roots, even when an operator points
the workspace at the home that holds them (transcripts, notes, state)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.core.messages import ToolResultBlock, ToolUseBlock
from parley.core.tools.builtin import default_registry
from parley.core.tools.tool_registry import ToolContext, ToolRegistry

CANARY = "CANARY-alice-locker-7491"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "s-alice.jsonl").write_text(CANARY + "\n", encoding="utf-8")
    notes = tmp_path / "memory" / "main" / "notes" / "person" / "telegram%3A1"
    notes.mkdir(parents=True)
    (notes / "remembered.md").write_text(f"- {CANARY}\n", encoding="utf-8")
    (tmp_path / "AGENTS.md").write_text("# Agents\n", encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path / "sessions")
    return tmp_path


def registry_for(home: Path) -> ToolRegistry:
    return default_registry(private_roots=(home / "sessions", home / "memory"))


async def run(registry: ToolRegistry, home: Path, name: str, **args: str) -> ToolResultBlock:
    return await registry.run(ToolUseBlock("id", name, args), ToolContext(home, "s"))


@pytest.mark.parametrize(
    "path",
    [
        "sessions/s-alice.jsonl",
        "./sessions/../sessions/s-alice.jsonl",
        "link/s-alice.jsonl",
        "memory/main/notes/person/telegram%3A1/remembered.md",
    ],
)
async def test_read_file_refuses_a_private_root(home: Path, path: str) -> None:
    result = await run(registry_for(home), home, "read_file", path=path)
    assert result.is_error and CANARY not in result.content
    assert "private" in result.content


async def test_list_files_neither_lists_nor_enters_a_private_root(home: Path) -> None:
    registry = registry_for(home)
    top = await run(registry, home, "list_files")
    assert "AGENTS.md" in top.content
    assert "sessions" not in top.content and "memory" not in top.content
    deep = await run(registry, home, "list_files", pattern="**/*")
    assert "s-alice" not in deep.content and "telegram" not in deep.content
    inside = await run(registry, home, "list_files", path="memory/main")
    assert inside.is_error and "telegram" not in inside.content


async def test_without_private_roots_the_same_paths_are_readable(home: Path) -> None:
    # What the guard is for: the same call without it reads the canary.
    result = await run(default_registry(), home, "read_file", path="sessions/s-alice.jsonl")
    assert CANARY in result.content
