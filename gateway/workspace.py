"""The agent's workspace: created from the templates on first run, never overwritten."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("parley.gateway.workspace")

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "config" / "workspace"
WORKSPACE_FILES = ("AGENTS.md", "SOUL.md", "IDENTITY.md", "USER.md", "TOOLS.md", "MEMORY.md")


@dataclass(frozen=True, slots=True)
class BootstrapReport:
    created: tuple[str, ...]
    kept: tuple[str, ...]


def ensure_workspace(workspace: Path, templates: Path = TEMPLATE_DIR) -> BootstrapReport:
    """Create missing workspace files from ``templates``; an existing file is never touched.

    Blocking: call it from a thread (or before the event loop starts).
    """
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "memory").mkdir(exist_ok=True)
    created: list[str] = []
    kept: list[str] = []
    for name in WORKSPACE_FILES:
        target = workspace / name
        source = templates / name
        text = source.read_text(encoding="utf-8") if source.is_file() else f"# {name}\n"
        try:
            # O_EXCL makes "never overwrite" hold even against a concurrent start.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            kept.append(name)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        created.append(name)
    if created:
        log.info("workspace %s: created %s", workspace, ", ".join(created))
    return BootstrapReport(tuple(created), tuple(kept))
