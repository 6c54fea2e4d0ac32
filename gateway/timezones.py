"""The time zone that daily resets and turn timestamps use."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

log = logging.getLogger("parley.gateway.timezones")

LOCALTIME = Path("/etc/localtime")


def resolve_zone(name: str | None, *, localtime: Path = LOCALTIME) -> ZoneInfo:
    """The configured IANA zone, else the host's (``TZ``, then /etc/localtime), else UTC."""
    if name:
        return ZoneInfo(name)
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    try:
        target = str(localtime.resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    for candidate in candidates:
        if not candidate:
            continue
        try:
            return ZoneInfo(candidate)
        except (ZoneInfoNotFoundError, ValueError):
            continue
    try:
        with localtime.open("rb") as handle:
            return ZoneInfo.from_file(handle, key="localtime")
    except (OSError, ValueError):
        log.info("host time zone unknown; using UTC")
        return ZoneInfo("UTC")
