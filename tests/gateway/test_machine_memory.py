"""The memory the gateway counts on: the machine's, or its cgroup's limit when lower."""

from __future__ import annotations

from pathlib import Path

import pytest

from parley.gateway import machine_memory
from parley.gateway.machine_memory import cgroup_limit_bytes, usable_memory_bytes

GIB = 1024**3


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="ascii")
    return root


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        # v2 in a container: the namespace root's file.
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": f"{GIB}\n"}, GIB),
        # v2 on a host: the process's own cgroup under the mount.
        (
            {
                "proc/self/cgroup": "0::/system.slice/parley.service\n",
                "sys/fs/cgroup/system.slice/parley.service/memory.max": f"{2 * GIB}\n",
            },
            2 * GIB,
        ),
        # v1, with the memory controller named among others.
        (
            {
                "proc/self/cgroup": "5:cpu,cpuacct:/\n4:memory:/docker/abc\n",
                "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": f"{3 * GIB}\n",
            },
            3 * GIB,
        ),
        # No limit: "max" (v2), a number near 2**63 (v1), or no files at all.
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, None),
        (
            {
                "proc/self/cgroup": "4:memory:/\n",
                "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
            },
            None,
        ),
        ({}, None),
    ],
    ids=["v2-root", "v2-own", "v1", "v2-max", "v1-unlimited", "none"],
)
def test_the_cgroup_limit_is_read_where_the_process_lives(
    tmp_path: Path, files: dict[str, str], limit: int | None
) -> None:
    assert cgroup_limit_bytes(tree(tmp_path, files)) == limit


def test_the_lower_of_the_machine_and_its_cgroup_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree(tmp_path, {"sys/fs/cgroup/memory.max": f"{GIB}\n"})
    monkeypatch.setattr(machine_memory, "physical_memory_bytes", lambda: 64 * GIB)
    assert usable_memory_bytes(root) == GIB
    monkeypatch.setattr(machine_memory, "physical_memory_bytes", lambda: GIB // 2)
    assert usable_memory_bytes(root) == GIB // 2
    monkeypatch.setattr(machine_memory, "physical_memory_bytes", lambda: None)
    assert usable_memory_bytes(tmp_path / "nothing") is None
