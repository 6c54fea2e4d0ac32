"""The ``[retention]`` section: how long archived data is kept, and the disk cap.

Days count from when the data was finished with: a transcript from its session's
archiving, an inbox row from its last change (its delivery), a media file from its
mtime. ``0`` keeps that kind forever. The cap (``disk_cap``) is a size string such as
``"20GiB"`` or ``"500MB"``, or ``"off"``; past ``high_water_percent`` of it a run
removes the oldest archived data until the home is under ``low_water_percent``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Platforms redeliver an update within a day (Telegram keeps one for 24 hours) and the
# catch-up after a restart reads conversations active in the last 7 days
# (gateway/app.py CATCH_UP_ACTIVE_DAYS): a finished inbox row younger than this is
# what answers a redelivery once, so no setting may remove it sooner.
INBOX_DEDUPE_DAYS = 7
MAX_DAYS = 36_500

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "20GiB", "500 MB", "1.5G"; ValueError
    otherwise (decimal units are powers of 1000, binary ones of 1024)."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative: {value}")
        return value
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if match is not None and match.group(2).lower() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    raise ValueError(f'not a size: {value!r} (e.g. "20GiB", "500MB", or a number of bytes)')


def format_bytes(count: int) -> str:
    """``1.5 GiB``, ``320 KiB``, ``12 B``: for reports."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError(count)  # pragma: no cover


class RetentionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        True,
        description="run retention once a day inside the gateway (`parley maintenance` "
        "runs it by hand either way)",
    )
    archived_transcripts_days: int = Field(
        90,
        ge=0,
        le=MAX_DAYS,
        description="remove an archived session's transcript and its compaction checkpoints "
        "this many days after it was archived; 0 keeps them forever",
    )
    archived_memory: Literal["keep", "drop"] = Field(
        "keep",
        description="the memory chunks of a removed transcript: 'keep' (still searchable) "
        "or 'drop' (removed from the memory index with it)",
    )
    inbox_days: int = Field(
        30,
        ge=0,
        le=MAX_DAYS,
        description=f"remove a delivered (or failed, or refused) inbox row this many days "
        f"after it was finished; 0 keeps them forever; at least {INBOX_DEDUPE_DAYS} "
        "(the dedupe window)",
    )
    media_days: int = Field(
        90,
        ge=0,
        le=MAX_DAYS,
        description="remove a file under $PARLEY_HOME/media this many days after its mtime; "
        "0 keeps media forever",
    )
    disk_cap: int | Literal["off"] = Field(
        "off",
        description='"off", or the most the home may hold (e.g. "20GiB"); past the high-'
        "water mark the oldest archived data goes first",
    )
    high_water_percent: int = Field(
        100, ge=1, le=100, description="of disk_cap: a run starts removing above this"
    )
    low_water_percent: int = Field(
        90, ge=1, le=100, description="of disk_cap: and removes down to this"
    )
    run_hour_utc: int = Field(
        3, ge=0, le=23, description="the daily run's hour (UTC); a failed run is tried the next day"
    )

    @field_validator("disk_cap", mode="before")
    @classmethod
    def _cap(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("off", "none", "0", ""):
            return "off"
        if value == 0:
            return "off"
        size = parse_size(value)
        if size < 1024**2:
            raise ValueError(f"a disk cap under 1 MiB is no cap: {value!r}")
        return size

    @field_validator("inbox_days")
    @classmethod
    def _inbox_window(cls, value: int) -> int:
        if 0 < value < INBOX_DEDUPE_DAYS:
            raise ValueError(
                f"must be 0 (keep forever) or at least {INBOX_DEDUPE_DAYS} (the dedupe "
                "window): a finished row is what answers a redelivered message once"
            )
        return value

    @model_validator(mode="after")
    def _water_marks(self) -> RetentionConfig:
        if self.low_water_percent > self.high_water_percent:
            raise ValueError(
                f"low_water_percent ({self.low_water_percent}) must not be above "
                f"high_water_percent ({self.high_water_percent})"
            )
        return self

    @property
    def cap_bytes(self) -> int | None:
        return None if self.disk_cap == "off" else self.disk_cap

    def describe(self) -> str:
        """One line of the settings, for the doctor and the CLI."""

        def days(n: int) -> str:
            return "forever" if n == 0 else f"{n} d"

        cap = self.cap_bytes
        cap_text = (
            "off"
            if cap is None
            else f"{format_bytes(cap)} (from {self.high_water_percent}% down to "
            f"{self.low_water_percent}%)"
        )
        return (
            f"archived transcripts {days(self.archived_transcripts_days)} (memory "
            f"{self.archived_memory}), inbox {days(self.inbox_days)}, media "
            f"{days(self.media_days)}, disk cap {cap_text}, daily run "
        ) + (f"at {self.run_hour_utc:02d}:00 UTC" if self.enabled else "off")
