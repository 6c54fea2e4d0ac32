"""How much memory this gateway may count on: the machine's, or its cgroup's limit
when that is lower (a container on a big host sees the host's memory in sysconf).

Read once at start-up, from sysconf and a few small files under /proc and /sys.
"""

from __future__ import annotations

import os
from pathlib import Path

# cgroup v1 writes "no limit" as a number near 2**63; anything past this is no limit.
NO_LIMIT_BYTES = 1 << 60


def usable_memory_bytes(root: Path = Path("/")) -> int | None:
    """The lower of the machine's memory and the process's cgroup memory limit; None
    when neither is known. ``root``: where /proc and /sys are (tests)."""
    known = [n for n in (physical_memory_bytes(), cgroup_limit_bytes(root)) if n is not None]
    return min(known) if known else None


def physical_memory_bytes() -> int | None:
    """The machine's memory, where the system tells (None elsewhere)."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # no sysconf, or no such name here
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


def cgroup_limit_bytes(root: Path = Path("/")) -> int | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), its own or its namespace root's; None without one."""
    limits: list[int] = []
    for path in _limit_files(root):
        try:
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and 0 < int(text) < NO_LIMIT_BYTES:
            limits.append(int(text))
    return min(limits) if limits else None


def _limit_files(root: Path) -> list[Path]:
    cgroups = root / "sys" / "fs" / "cgroup"
    files = [cgroups / "memory.max", cgroups / "memory" / "memory.limit_in_bytes"]
    try:
        memberships = (root / "proc" / "self" / "cgroup").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return files
    for line in memberships.splitlines():
        # "0::/path" (v2), "4:memory:/path" (v1); the path is under the mount.
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/") or parts[2] == "/":
            continue
        relative = parts[2].lstrip("/")
        if parts[0] == "0" and not parts[1]:
            files.append(cgroups / relative / "memory.max")
        elif "memory" in parts[1].split(","):
            files.append(cgroups / "memory" / relative / "memory.limit_in_bytes")
    return files
