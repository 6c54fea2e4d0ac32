"""Which files the memory index reads: a real workspace on disk, symlinks included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.core.memory.sources import (
    AGENT_SCOPE,
    MEMORY_SOURCE,
    SESSIONS_SOURCE,
    memory_files,
    memory_path,
    read_header,
    transcript_files,
)


def write(path: Path, text: str = "note\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    return root


def paths(workspace: Path, extra: tuple[Path, ...] = ()) -> list[str]:
    return [f.path for f in memory_files(workspace, extra)]


def test_memory_md_and_memory_dir_recursively(workspace: Path) -> None:
    write(workspace / "MEMORY.md")
    write(workspace / "memory" / "2026-01-02.md")
    write(workspace / "memory" / "projects" / "parley.md")
    write(workspace / "memory" / "projects" / "deep" / "deeper" / "x.MD")
    write(workspace / "memory" / "notes.txt")  # not Markdown
    write(workspace / "AGENTS.md")  # a workspace file, not memory
    write(workspace / "other" / "y.md")  # outside memory/

    found = memory_files(workspace)

    assert [f.path for f in found] == [
        "MEMORY.md",
        "memory/2026-01-02.md",
        "memory/projects/parley.md",  # a directory's files before its subdirectories'
        "memory/projects/deep/deeper/x.MD",
    ]
    assert {(f.source, f.scope) for f in found} == {(MEMORY_SOURCE, AGENT_SCOPE)}
    assert found[0].abs_path == workspace / "MEMORY.md"


def test_lowercase_memory_md(workspace: Path) -> None:
    write(workspace / "memory.md")
    assert paths(workspace) == ["memory.md"]


def test_empty_or_missing_workspace(tmp_path: Path) -> None:
    assert memory_files(tmp_path / "nowhere") == []
    assert memory_files(tmp_path) == []


def test_symlinks_are_skipped(workspace: Path, tmp_path: Path) -> None:
    secret = write(tmp_path / "outside" / "secret.md", "do not index\n")
    write(workspace / "memory" / "real.md")
    (workspace / "memory" / "link.md").symlink_to(secret)
    (workspace / "memory" / "linked-dir").symlink_to(secret.parent, target_is_directory=True)
    (workspace / "MEMORY.md").symlink_to(secret)

    assert paths(workspace) == ["memory/real.md"]


def test_a_symlinked_memory_dir_is_skipped(workspace: Path, tmp_path: Path) -> None:
    write(tmp_path / "elsewhere" / "a.md")
    (workspace / "memory").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert paths(workspace) == []


def test_hidden_and_tool_dirs_are_skipped(workspace: Path) -> None:
    write(workspace / "memory" / "kept.md")
    for skipped in (".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".hidden"):
        write(workspace / "memory" / skipped / "x.md")
        write(workspace / "memory" / "sub" / skipped / "y.md")
    notes = workspace / "notes"
    write(notes / "n.md")
    write(notes / ".obsidian" / "z.md")
    write(notes / "venv" / "z.md")

    assert paths(workspace, (notes,)) == ["memory/kept.md", "notes/n.md"]


def test_extra_paths_files_and_dirs_inside_and_outside(workspace: Path, tmp_path: Path) -> None:
    write(workspace / "docs" / "inside.md")
    write(workspace / "docs" / "deep" / "inside2.md")
    write(workspace / "single.md")
    outside = tmp_path / "shared-notes"
    write(outside / "team.md")
    write(outside / "sub" / "more.md")
    outside_file = write(tmp_path / "loose.md")
    write(tmp_path / "readme.txt")

    found = memory_files(
        workspace,
        (
            Path("docs"),  # relative: to the workspace
            workspace / "single.md",  # absolute, inside: stored relative
            outside,  # a directory outside: stored absolute
            outside_file,
            tmp_path / "readme.txt",  # not Markdown
            tmp_path / "missing.md",  # not there
            Path("missing-dir"),
        ),
    )

    assert [f.path for f in found] == [
        "docs/inside.md",
        "docs/deep/inside2.md",
        "single.md",
        (outside / "team.md").as_posix(),
        (outside / "sub" / "more.md").as_posix(),
        outside_file.as_posix(),
    ]
    assert all(f.abs_path.is_file() for f in found)
    assert {f.scope for f in found} == {AGENT_SCOPE}


def test_an_extra_path_that_leaves_the_workspace_is_stored_absolute(
    workspace: Path, tmp_path: Path
) -> None:
    """Regression: "../notes.md" was stored as the path "../notes.md" (a lexical
    relative_to), not as the absolute path of a file outside the workspace."""
    outside = write(tmp_path / "notes.md")

    found = memory_files(workspace, (Path("../notes.md"),))

    assert [f.path for f in found] == [outside.as_posix()]


def test_an_extra_symlink_is_skipped(workspace: Path, tmp_path: Path) -> None:
    target = write(tmp_path / "target" / "t.md")
    (workspace / "link.md").symlink_to(target)
    (workspace / "linkdir").symlink_to(target.parent, target_is_directory=True)
    assert paths(workspace, (Path("link.md"), Path("linkdir"))) == []


def test_duplicates_are_dropped_by_real_path(workspace: Path) -> None:
    write(workspace / "MEMORY.md")
    write(workspace / "memory" / "a.md")

    found = paths(
        workspace,
        (
            Path("memory"),
            Path("memory/a.md"),
            workspace / "memory" / ".." / "memory" / "a.md",
            Path("MEMORY.md"),
        ),
    )

    assert found == ["MEMORY.md", "memory/a.md"]


def test_transcripts_are_listed(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    write(sessions / "b-session.jsonl", "{}\n")
    write(sessions / "a-session.jsonl", "{}\n")  # archived ones live here too
    write(sessions / "notes.txt")
    write(sessions / "sub" / "c.jsonl", "{}\n")  # not a transcript of ours
    (sessions / "link.jsonl").symlink_to(sessions / "a-session.jsonl")

    found = transcript_files(sessions)

    assert [f.path for f in found] == ["sessions/a-session.jsonl", "sessions/b-session.jsonl"]
    assert {(f.source, f.scope) for f in found} == {(SESSIONS_SOURCE, None)}
    assert found[0].abs_path == sessions / "a-session.jsonl"
    assert transcript_files(tmp_path / "no-sessions") == []


def test_read_header() -> None:
    header = {"type": "session", "version": 1, "id": "s", "meta": {"memory_scope": "person:a"}}
    assert read_header(json.dumps(header).encode()) == header
    assert read_header(b'{"type": "message"}') is None
    assert read_header(b"[1, 2]") is None
    assert read_header(b"not json") is None
    assert read_header(b"") is None
    huge = json.dumps({"type": "session", "pad": "x" * 70_000}).encode()
    assert read_header(huge) is None


def test_memory_path_allows_memory_files_only(workspace: Path, tmp_path: Path) -> None:
    write(workspace / "MEMORY.md")
    write(workspace / "AGENTS.md")
    write(workspace / "memory" / "a.md")
    extra = write(tmp_path / "extra.md")
    root = workspace.resolve()

    assert memory_path("MEMORY.md", workspace) == root / "MEMORY.md"
    assert memory_path("memory/a.md", workspace) == root / "memory" / "a.md"
    # Missing but allowed: memory_get answers "" for it rather than refusing.
    assert memory_path("memory/2099-01-01.md", workspace) == root / "memory" / "2099-01-01.md"
    assert memory_path(extra.as_posix(), workspace, (extra,)) == extra
    assert memory_path(extra.as_posix(), workspace) is None
    for refused in (
        "AGENTS.md",
        "memory/../AGENTS.md",
        "../extra.md",
        "memory/x.txt",
        "sessions/abc.jsonl",
        "/etc/passwd",
        "",
        "memory/a\x00.md",
    ):
        assert memory_path(refused, workspace) is None, refused


def test_memory_path_refuses_a_symlink_out_of_memory(workspace: Path, tmp_path: Path) -> None:
    secret = write(tmp_path / "secret.md")
    (workspace / "memory").mkdir(parents=True, exist_ok=True)
    (workspace / "memory" / "link.md").symlink_to(secret)
    assert memory_path("memory/link.md", workspace) is None
