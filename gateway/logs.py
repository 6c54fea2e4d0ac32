"""Logging setup: stdlib logging, plain or one JSON object per line."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT_LOGGER = "parley"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


def setup_logging(
    level: str,
    *,
    json_lines: bool = False,
    file: Path | None = None,
    stderr_level: str | None = None,
) -> None:
    """Configure the ``parley`` logger tree; ``file`` receives ``level``, stderr ``stderr_level``.

    With a terminal chat on screen, logs go to ``file`` and only warnings reach stderr,
    so the conversation stays readable.
    """
    formatter: logging.Formatter = (
        JsonFormatter()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger(ROOT_LOGGER)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    root.propagate = False
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(formatter)
    stream.setLevel(stderr_level or level)
    root.addHandler(stream)
    if file is not None:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handler = logging.FileHandler(file, encoding="utf-8")
        os.chmod(file, 0o600)  # every message passes through it: owner-only, whatever the umask
        handler.setFormatter(formatter)
        handler.setLevel(level)
        root.addHandler(handler)
