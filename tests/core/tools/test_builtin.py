"""The built-in tools, run through the registry the way the runner runs them."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from parley.core.messages import ToolResultBlock, ToolUseBlock
from parley.core.tools.builtin import DEFAULT_READ_MAX_LINES, default_registry
from parley.core.tools.tool_registry import ToolContext, ToolRegistry

NOW = datetime(2026, 3, 2, 5, 30, 15, tzinfo=UTC)  # a Monday


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret_dir = tmp_path / "outside"
    secret_dir.mkdir()
    (secret_dir / "secret.txt").write_text("TOP SECRET\n")
    return secret_dir


@pytest.fixture
def workspace(tmp_path: Path, outside: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "AGENTS.md").write_text("# Agents\nbe kind\n")
    (ws / "memory" / "2026-03-01.md").write_text("met Ana\n")
    (ws / "memory" / "notes.txt").write_text("x" * 1234)
    (ws / "lines.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (ws / "blob.bin").write_bytes(b"PNG\x00\x01\x02" * 10)
    (ws / "link_out.txt").symlink_to(outside / "secret.txt")
    (ws / "dir_out").symlink_to(outside, target_is_directory=True)
    (ws / "link_in.md").symlink_to(ws / "AGENTS.md")
    return ws


@pytest.fixture
def registry() -> ToolRegistry:
    return default_registry()


@pytest.fixture
def context(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, session_key="s", now=lambda: NOW)


async def call(registry: ToolRegistry, context: ToolContext, name: str, **args: Any) -> Any:
    return await registry.run(ToolUseBlock("id", name, args), context)


def test_default_registry_holds_the_three_tools() -> None:
    registry = default_registry(5000)

    assert registry.names == ("current_time", "list_files", "read_file")
    assert registry.max_result_chars == 5000


# -- current_time -------------------------------------------------------------------------


async def test_time_defaults_to_utc(registry: ToolRegistry, context: ToolContext) -> None:
    result = await call(registry, context, "current_time")

    assert result == ToolResultBlock("id", "2026-03-02T05:30:15+00:00 (Monday, UTC)")


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        ("Asia/Tokyo", "2026-03-02T14:30:15+09:00 (Monday, Asia/Tokyo)"),
        ("America/Los_Angeles", "2026-03-01T21:30:15-08:00 (Sunday, America/Los_Angeles)"),
    ],
)
async def test_time_in_a_zone_has_its_offset_and_weekday(
    registry: ToolRegistry, context: ToolContext, zone: str, expected: str
) -> None:
    result = await call(registry, context, "current_time", timezone=zone)

    assert not result.is_error
    assert result.content == expected


async def test_naive_clock_is_taken_as_utc(registry: ToolRegistry, workspace: Path) -> None:
    context = ToolContext(workspace, "s", now=lambda: datetime(2026, 3, 2, 5, 30, 15))

    result = await call(registry, context, "current_time", timezone="Europe/Paris")

    assert result.content == "2026-03-02T06:30:15+01:00 (Monday, Europe/Paris)"


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "/etc/localtime"])
async def test_unknown_zone_is_an_error(
    registry: ToolRegistry, context: ToolContext, zone: str
) -> None:
    result = await call(registry, context, "current_time", timezone=zone)

    assert result.is_error
    assert "unknown time zone" in result.content
    assert "Europe/Paris" in result.content


# -- read_file -----------------------------------------------------------------------------


async def test_reads_a_workspace_file(registry: ToolRegistry, context: ToolContext) -> None:
    result = await call(registry, context, "read_file", path="AGENTS.md")

    assert result == ToolResultBlock("id", "# Agents\nbe kind\n")


async def test_offset_and_limit_select_lines(registry: ToolRegistry, context: ToolContext) -> None:
    result = await call(registry, context, "read_file", path="lines.txt", offset=3, limit=2)

    assert not result.is_error
    assert result.content.startswith("line 3\nline 4\n")
    assert "line 5" not in result.content.replace("offset=5", "")
    assert "read on with offset=5" in result.content


async def test_reading_to_the_end_adds_no_note(
    registry: ToolRegistry, context: ToolContext
) -> None:
    result = await call(registry, context, "read_file", path="lines.txt", offset=9)

    assert result.content == "line 9\nline 10\n"


async def test_empty_file_says_so(
    registry: ToolRegistry, context: ToolContext, workspace: Path
) -> None:
    (workspace / "empty.md").write_text("")

    result = await call(registry, context, "read_file", path="empty.md")

    assert result == ToolResultBlock("id", "[empty file]")


async def test_offset_past_the_end_is_an_error(
    registry: ToolRegistry, context: ToolContext
) -> None:
    result = await call(registry, context, "read_file", path="lines.txt", offset=50)

    assert result.is_error
    assert "fewer than 50 lines" in result.content


async def test_byte_budget_bounds_a_read(workspace: Path, context: ToolContext) -> None:
    registry = default_registry(read_max_bytes=21)  # "line N\n" is 7 bytes

    result = await call(registry, context, "read_file", path="lines.txt")

    assert result.content.startswith("line 1\nline 2\nline 3\n")
    assert "line 4\n" not in result.content
    assert "offset=4" in result.content


async def test_a_single_giant_line_is_read_in_bounded_pieces(
    workspace: Path, context: ToolContext
) -> None:
    (workspace / "minified.js").write_text("a" * 100_000)
    registry = default_registry(read_max_bytes=1000)

    result = await call(registry, context, "read_file", path="minified.js")

    assert not result.is_error
    assert result.content.startswith("a" * 1000)
    assert "a" * 1001 not in result.content


@pytest.mark.parametrize(
    "path",
    ["../outside/secret.txt", "memory/../../outside/secret.txt", "..", "link_out.txt"],
)
async def test_paths_leading_out_are_refused(
    registry: ToolRegistry, context: ToolContext, path: str
) -> None:
    result = await call(registry, context, "read_file", path=path)

    assert result.is_error
    assert "outside the workspace" in result.content
    assert "SECRET" not in result.content


async def test_files_under_a_symlinked_dir_that_leads_out_are_refused(
    registry: ToolRegistry, context: ToolContext
) -> None:
    result = await call(registry, context, "read_file", path="dir_out/secret.txt")

    assert result.is_error
    assert "outside the workspace" in result.content


async def test_absolute_paths_are_refused(
    registry: ToolRegistry, context: ToolContext, outside: Path
) -> None:
    result = await call(registry, context, "read_file", path=str(outside / "secret.txt"))

    assert result.is_error
    assert "absolute paths are not allowed" in result.content


async def test_links_and_dots_that_stay_inside_are_fine(
    registry: ToolRegistry, context: ToolContext
) -> None:
    via_link = await call(registry, context, "read_file", path="link_in.md")
    via_dots = await call(registry, context, "read_file", path="memory/../AGENTS.md")

    assert via_link.content == via_dots.content == "# Agents\nbe kind\n"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("blob.bin", "binary file"),
        ("memory", "is not a file"),
        ("missing.md", "does not exist"),
        ("bad\x00name", "NUL"),
    ],
)
async def test_what_cannot_be_read_says_why(
    registry: ToolRegistry, context: ToolContext, path: str, expected: str
) -> None:
    result = await call(registry, context, "read_file", path=path)

    assert result.is_error
    assert expected in result.content


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
async def test_unreadable_file_reports_without_absolute_path(
    registry: ToolRegistry, context: ToolContext, workspace: Path
) -> None:
    locked = workspace / "locked.txt"
    locked.write_text("x")
    locked.chmod(0)

    result = await call(registry, context, "read_file", path="locked.txt")

    assert result.is_error
    assert str(workspace) not in result.content


async def test_symlink_loop_is_refused_without_absolute_path(
    registry: ToolRegistry, context: ToolContext, workspace: Path
) -> None:
    (workspace / "loop").symlink_to(workspace / "loop")

    read = await call(registry, context, "read_file", path="loop/x")
    listing = await call(registry, context, "list_files")

    assert read.is_error
    assert "symlink loop" in read.content
    assert str(workspace) not in read.content
    assert not listing.is_error
    assert "loop" not in listing.content


async def test_missing_workspace_is_an_error(registry: ToolRegistry, tmp_path: Path) -> None:
    context = ToolContext(tmp_path / "nowhere", "s")

    result = await call(registry, context, "read_file", path="AGENTS.md")

    assert result.is_error
    assert "workspace directory does not exist" in result.content


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "'path' is required"),
        ({"path": "AGENTS.md", "offset": 0}, "'offset' must be at least 1"),
        ({"path": "AGENTS.md", "limit": DEFAULT_READ_MAX_LINES + 1}, "'limit' must be at most"),
        ({"path": "AGENTS.md", "encoding": "latin-1"}, "unknown argument 'encoding'"),
    ],
)
async def test_read_file_arguments_are_checked(
    registry: ToolRegistry, context: ToolContext, arguments: dict[str, Any], expected: str
) -> None:
    result = await registry.run(ToolUseBlock("id", "read_file", arguments), context)

    assert result.is_error
    assert expected in result.content


async def test_registry_cap_applies_to_file_reads(workspace: Path, context: ToolContext) -> None:
    (workspace / "big.txt").write_text("".join(f"row {i}\n" for i in range(1000)))
    registry = default_registry(1000)

    result = await call(registry, context, "read_file", path="big.txt")

    assert len(result.content) <= 1000
    assert result.content.endswith("lines) omitted ...]")


# -- list_files ----------------------------------------------------------------------------


def _names(listing: str) -> list[str]:
    return [line.split()[-1] for line in listing.splitlines() if not line.startswith("[")]


async def test_lists_the_root_with_types_and_sizes(
    registry: ToolRegistry, context: ToolContext
) -> None:
    result = await call(registry, context, "list_files")

    assert not result.is_error
    names = _names(result.content)
    assert names == sorted(names)
    assert set(names) == {"AGENTS.md", "blob.bin", "lines.txt", "link_in.md", "memory/"}
    lines = result.content.splitlines()
    assert any(line.split() == ["dir", "-", "memory/"] for line in lines)
    assert any(line.split() == ["file", "17", "AGENTS.md"] for line in lines)


async def test_symlinks_leading_out_are_left_out_of_listings(
    registry: ToolRegistry, context: ToolContext
) -> None:
    flat = await call(registry, context, "list_files")
    deep = await call(registry, context, "list_files", pattern="**/*")

    for result in (flat, deep):
        assert "link_out" not in result.content
        assert "dir_out" not in result.content
        assert "secret" not in result.content


async def test_lists_a_subdirectory_with_workspace_relative_names(
    registry: ToolRegistry, context: ToolContext
) -> None:
    result = await call(registry, context, "list_files", path="memory")

    assert result.content.splitlines() == [
        f"file  {8:>10}  memory/2026-03-01.md",
        f"file  {1234:>10}  memory/notes.txt",
    ]


async def test_pattern_filters_and_descends(registry: ToolRegistry, context: ToolContext) -> None:
    flat = await call(registry, context, "list_files", pattern="*.md")
    deep = await call(registry, context, "list_files", pattern="**/*.md")

    assert _names(flat.content) == ["AGENTS.md", "link_in.md"]
    assert _names(deep.content) == ["AGENTS.md", "link_in.md", "memory/2026-03-01.md"]


async def test_patterns_cannot_climb_out(registry: ToolRegistry, context: ToolContext) -> None:
    result = await call(registry, context, "list_files", path="memory", pattern="../../*/*")

    assert "secret" not in result.content
    assert "outside" not in result.content


async def test_absolute_pattern_is_refused(registry: ToolRegistry, context: ToolContext) -> None:
    result = await call(registry, context, "list_files", pattern="/etc/*")

    assert result.is_error
    assert "pattern must be relative" in result.content


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("..", "outside the workspace"),
        ("dir_out", "outside the workspace"),
        ("/etc", "absolute paths are not allowed"),
        ("AGENTS.md", "is not a directory"),
    ],
)
async def test_directories_that_cannot_be_listed_say_why(
    registry: ToolRegistry, context: ToolContext, path: str, expected: str
) -> None:
    result = await call(registry, context, "list_files", path=path)

    assert result.is_error
    assert expected in result.content


async def test_no_match_says_so(registry: ToolRegistry, context: ToolContext) -> None:
    result = await call(registry, context, "list_files", pattern="*.pdf")

    assert not result.is_error
    assert result.content == "no entries in . match *.pdf"


async def test_listing_is_bounded(workspace: Path, context: ToolContext) -> None:
    many = workspace / "many"
    many.mkdir()
    for i in range(30):
        (many / f"f{i:02d}.txt").write_text("")
    registry = default_registry(list_max_entries=10)

    result = await call(registry, context, "list_files", path="many")

    lines = result.content.splitlines()
    assert len(lines) == 11
    assert _names("\n".join(lines[:10])) == [f"many/f{i:02d}.txt" for i in range(10)]
    assert lines[-1] == "[... 20 more entries not shown]"
