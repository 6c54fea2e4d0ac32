"""The built-in tools: ``current_time``, ``read_file`` and ``list_files``.

The file tools see only the agent's workspace, minus its *private roots*: where the
gateway keeps transcripts, notes, task records and state. They never live in the
default workspace, but an operator may point the workspace at the home itself; a
private root is then neither readable nor listed, whatever the path. A path is taken
relative to the workspace and resolved (symlinks followed, ``..`` collapsed) before
use; anything that lands outside, or any absolute path, is refused with a message
that says so. All file-system work runs in a worker thread. Their output is bounded
here (lines, bytes, entries) and capped again by the registry.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterable, Sequence
from datetime import UTC
from itertools import islice
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from parley.core.agent_config import DEFAULT_TOOL_RESULT_MAX_CHARS
from parley.core.errors import ToolError
from parley.core.tools.tool_registry import Tool, ToolContext, ToolRegistry

DEFAULT_READ_MAX_LINES = 2000
DEFAULT_READ_MAX_BYTES = 256 * 1024
DEFAULT_LIST_MAX_ENTRIES = 200
# A glob over a huge tree stops counting here; the listing says the count is a floor.
DEFAULT_LIST_SCAN_LIMIT = 5000
# A NUL byte in the first block is how git and grep tell binary files too.
BINARY_SNIFF_BYTES = 8192
MAX_PATH_CHARS = 1024
MAX_PATTERN_CHARS = 256


def resolve_in_workspace(workspace: Path, relative: str) -> Path:
    """``relative`` resolved inside ``workspace``; ``ToolError`` if it would leave it.

    Blocking (it touches the file system): call it from a worker thread.
    """
    if "\x00" in relative:
        raise ToolError("the path contains a NUL character")
    candidate = Path(relative)
    if candidate.is_absolute():
        raise ToolError(
            f"absolute paths are not allowed ({relative}); give a path relative to the workspace"
        )
    root = workspace.resolve()
    if not root.is_dir():
        raise ToolError("the workspace directory does not exist")
    try:
        target = (root / candidate).resolve()
    except RuntimeError as exc:  # Python 3.11 reports a symlink loop this way
        raise ToolError(f"{relative} is a symlink loop") from exc
    if not target.is_relative_to(root):
        raise ToolError(f"{relative} is outside the workspace; only the workspace is accessible")
    return target


def _refuse_private(target: Path, private: Sequence[Path], relative: str) -> None:
    if _is_private(target, private):
        raise ToolError(f"{relative} is private to the gateway; it cannot be read or listed")


def _is_private(target: Path, private: Sequence[Path]) -> bool:
    return any(target == root or target.is_relative_to(root) for root in private)


def _display(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


# -- current_time ------------------------------------------------------------------------


async def current_time(arguments: dict[str, Any], context: ToolContext) -> str:
    now = context.now()
    if now.tzinfo is None:  # a naive clock is taken to be UTC
        now = now.replace(tzinfo=UTC)
    name = arguments.get("timezone")
    if name:
        try:
            # Loading a zone reads tzdata files: off the loop.
            zone = await asyncio.to_thread(ZoneInfo, name)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ToolError(
                f"unknown time zone '{name}'; use an IANA name such as Europe/Paris"
            ) from exc
        now = now.astimezone(zone)
        label = name
    else:
        label = now.tzname() or "UTC"
    return f"{now.isoformat(timespec='seconds')} ({now.strftime('%A')}, {label})"


CURRENT_TIME = Tool(
    name="current_time",
    description=(
        "The current date and time, with the weekday. Give an IANA time zone "
        "(e.g. Europe/Paris) to get the local time there; the default is UTC."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "timezone": {
                "type": "string",
                "maxLength": 64,
                "description": "IANA time zone name, e.g. America/New_York",
            }
        },
        "additionalProperties": False,
    },
    handler=current_time,
)


# -- read_file ---------------------------------------------------------------------------


def _read_lines(
    workspace: Path,
    relative: str,
    offset: int,
    limit: int,
    max_bytes: int,
    private: Sequence[Path] = (),
) -> str:
    try:
        return _read_lines_unguarded(workspace, relative, offset, limit, max_bytes, private)
    except OSError as exc:  # the reason, without the absolute path the OS puts in
        raise ToolError(f"cannot read {relative}: {exc.strerror or type(exc).__name__}") from exc


def _read_lines_unguarded(
    workspace: Path, relative: str, offset: int, limit: int, max_bytes: int, private: Sequence[Path]
) -> str:
    target = resolve_in_workspace(workspace, relative)
    _refuse_private(target, private, relative)
    if not target.exists():
        raise ToolError(f"{relative} does not exist")
    if not target.is_file():
        raise ToolError(f"{relative} is not a file (use list_files for directories)")
    with target.open("rb") as raw:
        if b"\x00" in raw.read(BINARY_SNIFF_BYTES):
            raise ToolError(f"{relative} is a binary file; only text files can be read")
        raw.seek(0)
        lines: list[str] = []
        used = number = 0
        more = False
        # readline is bounded so that one giant line cannot fill memory; such a line is
        # counted in pieces, which only shifts line numbers in files no one reads by line.
        while line := raw.readline(max_bytes):
            number += 1
            if number < offset:
                continue
            if len(lines) >= limit or used + len(line) > max_bytes:
                more = True
                break
            lines.append(line.decode("utf-8", errors="replace"))
            used += len(line)
    if not lines:
        if offset > 1:
            raise ToolError(f"{relative} has fewer than {offset} lines")
        return "[empty file]"
    text = "".join(lines)
    if more:
        last = offset + len(lines) - 1
        separator = "" if text.endswith("\n") else "\n"
        text += (
            f"{separator}[lines {offset}-{last} shown; more follow: read on with offset={last + 1}]"
        )
    return text


def _read_file_tool(max_bytes: int, private: Sequence[Path]) -> Tool:
    async def read_file(arguments: dict[str, Any], context: ToolContext) -> str:
        return await asyncio.to_thread(
            _read_lines,
            context.workspace,
            arguments["path"],
            arguments.get("offset", 1),
            arguments.get("limit", DEFAULT_READ_MAX_LINES),
            max_bytes,
            private,
        )

    return Tool(
        name="read_file",
        description=(
            "Read a text file from the workspace. `path` is relative to the workspace; "
            "`offset` (1-based line number) and `limit` (line count) read part of a long file."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS},
                "offset": {"type": "integer", "minimum": 1},
                "limit": {"type": "integer", "minimum": 1, "maximum": DEFAULT_READ_MAX_LINES},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        handler=read_file,
    )


# -- list_files --------------------------------------------------------------------------


def _entry(root: Path, path: Path, private: Sequence[Path] = ()) -> tuple[str, str] | None:
    """(name, listing line), or None for an entry that is gone, leads out of the
    workspace or is private."""
    try:
        resolved = path.resolve()
        if not resolved.is_relative_to(root) or _is_private(resolved, private):
            return None
        info = resolved.stat()
    except (OSError, RuntimeError):  # gone, unreadable, or a symlink loop
        return None
    # Named as reached (a link keeps its own name), with any `..` collapsed.
    tidy = Path(os.path.normpath(path))
    name = _display(root, tidy if tidy.is_relative_to(root) else resolved)
    if stat.S_ISDIR(info.st_mode):
        return name, f"dir   {'-':>10}  {name}/"
    if stat.S_ISREG(info.st_mode):
        return name, f"file  {info.st_size:>10}  {name}"
    return name, f"other {'-':>10}  {name}"


def _list(
    workspace: Path,
    directory: str,
    pattern: str | None,
    max_entries: int,
    private: Sequence[Path] = (),
) -> str:
    try:
        return _list_unguarded(workspace, directory, pattern, max_entries, private)
    except OSError as exc:
        raise ToolError(f"cannot list {directory}: {exc.strerror or type(exc).__name__}") from exc


def _list_unguarded(
    workspace: Path,
    directory: str,
    pattern: str | None,
    max_entries: int,
    private: Sequence[Path],
) -> str:
    base = resolve_in_workspace(workspace, directory)
    _refuse_private(base, private, directory)
    root = workspace.resolve()
    if not base.is_dir():
        raise ToolError(f"{directory} is not a directory")
    candidates: Iterable[Path]
    if pattern:
        if Path(pattern).is_absolute():
            raise ToolError("the pattern must be relative, like *.md or notes/**/*.txt")
        candidates = base.glob(pattern)
    else:
        candidates = base.iterdir()
    try:
        scanned = list(islice(candidates, DEFAULT_LIST_SCAN_LIMIT + 1))
    except (ValueError, NotImplementedError) as exc:  # pathlib's verdict on a bad pattern
        raise ToolError(f"invalid pattern {pattern!r}: {exc}") from exc
    capped = len(scanned) > DEFAULT_LIST_SCAN_LIMIT
    entries = (_entry(root, p, private) for p in scanned[:DEFAULT_LIST_SCAN_LIMIT])
    # By name, so a directory and its files sit together.
    lines = [line for _, line in sorted(e for e in entries if e is not None)]
    where = _display(root, base)
    if not lines:
        return f"no entries in {where}" + (f" match {pattern}" if pattern else "")
    shown = lines[:max_entries]
    rest = len(lines) - len(shown)
    if rest or capped:
        shown.append(f"[... {rest}{'+' if capped else ''} more entries not shown]")
    return "\n".join(shown)


def _list_files_tool(max_entries: int, private: Sequence[Path]) -> Tool:
    async def list_files(arguments: dict[str, Any], context: ToolContext) -> str:
        return await asyncio.to_thread(
            _list,
            context.workspace,
            arguments.get("path", "."),
            arguments.get("pattern"),
            max_entries,
            private,
        )

    return Tool(
        name="list_files",
        description=(
            "List files and directories in the workspace with their type and size. "
            "`path` is a directory relative to the workspace (default: its root); "
            "`pattern` is a glob such as *.md or **/*.txt (** descends into subdirectories)."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS},
                "pattern": {"type": "string", "minLength": 1, "maxLength": MAX_PATTERN_CHARS},
            },
            "additionalProperties": False,
        },
        handler=list_files,
    )


def default_registry(
    max_result_chars: int = DEFAULT_TOOL_RESULT_MAX_CHARS,
    *,
    read_max_bytes: int = DEFAULT_READ_MAX_BYTES,
    list_max_entries: int = DEFAULT_LIST_MAX_ENTRIES,
    private_roots: Sequence[Path] = (),
) -> ToolRegistry:
    """A registry holding the three built-in tools. ``private_roots``: paths the file
    tools refuse and never list (resolved here, once)."""
    private = tuple(Path(os.path.realpath(p)) for p in private_roots)
    registry = ToolRegistry(max_result_chars=max_result_chars)
    registry.register(CURRENT_TIME)
    registry.register(_read_file_tool(read_max_bytes, private))
    registry.register(_list_files_tool(list_max_entries, private))
    return registry
