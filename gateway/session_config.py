"""The ``[session]`` config section: how conversations map to sessions and when they reset.

The gateway's root config composes ``SessionConfig``; ``gateway.routing`` and
``gateway.runtime.resets`` read it. Everything here is validated once at load time so the
per-message code never meets a malformed value.
"""

from __future__ import annotations

import re
from typing import Literal, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DmScope = Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]
ResetMode = Literal["daily", "idle", "both", "off"]
ResetType = Literal["direct", "group", "thread"]

DEFAULT_DM_SCOPE: DmScope = "per-channel-peer"
DEFAULT_MAIN_KEY = "main"
DEFAULT_RESET_MODE: ResetMode = "daily"
DEFAULT_RESET_AT_HOUR = 4
DEFAULT_IDLE_MINUTES = 0
DEFAULT_RESET_TRIGGERS: tuple[str, ...] = ("/new", "/reset")
# Ten years: far beyond any sensible idle window, and small enough that
# ``updated_at + timedelta(minutes=...)`` can never overflow ``datetime``.
MAX_IDLE_MINUTES = 10 * 366 * 24 * 60

# The shapes routing accepts verbatim; see gateway.routing for the full rules.
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_CANONICAL_RE = re.compile(r"^[a-z0-9][a-z0-9_.@+-]{0,63}$")
# A main key equal to a structural word would make keys read ambiguously.
_RESERVED_MAIN_KEYS = frozenset({"agent", "direct", "group", "thread"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResetConfig(_Strict):
    """When a session stops being continued and a fresh one starts."""

    mode: ResetMode = Field(
        DEFAULT_RESET_MODE,
        description=(
            '"daily": a new session after the daily reset hour; "idle": after idle_minutes '
            'without activity; "both": whichever comes first; "off": never reset automatically'
        ),
    )
    at_hour: int = Field(
        DEFAULT_RESET_AT_HOUR,
        ge=0,
        le=23,
        description="local hour (0-23, in session.timezone) at which daily resets happen",
    )
    idle_minutes: int = Field(
        DEFAULT_IDLE_MINUTES,
        ge=0,
        le=MAX_IDLE_MINUTES,
        description='minutes without activity before a reset; required (> 0) for "idle" and "both"',
    )

    @model_validator(mode="after")
    def _idle_needs_minutes(self) -> Self:
        # Upstream silently never expires an idle policy with 0 minutes; say so instead.
        if self.mode in ("idle", "both") and self.idle_minutes <= 0:
            raise ValueError(f'reset mode "{self.mode}" needs idle_minutes > 0')
        return self


class SessionConfig(_Strict):
    """The ``[session]`` section."""

    dm_scope: DmScope = Field(
        DEFAULT_DM_SCOPE,
        description=(
            'how direct messages share sessions: "main" (every DM in one session), "per-peer" '
            '(one per person across channels), "per-channel-peer" (one per person per channel), '
            '"per-account-channel-peer" (also per bot account)'
        ),
    )
    main_key: str = Field(
        DEFAULT_MAIN_KEY,
        pattern=_ID_RE.pattern,
        description='name of the shared DM session used when dm_scope is "main"',
    )
    identity_links: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            'one person known on several channels: canonical name -> ids ("telegram:123" or '
            '"123"); linked ids share a DM session (ignored when dm_scope is "main")'
        ),
    )
    reset: ResetConfig = Field(default_factory=ResetConfig, description="the default reset policy")
    reset_by_type: dict[ResetType, ResetConfig] = Field(
        default_factory=dict,
        description='reset policy per chat type ("direct", "group", "thread"); replaces reset',
    )
    reset_by_channel: dict[str, ResetConfig] = Field(
        default_factory=dict,
        description="reset policy per channel name; replaces reset_by_type and reset",
    )
    reset_triggers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_RESET_TRIGGERS),
        description="messages that start a new session (case-insensitive; text after one "
        "becomes the first message)",
    )
    timezone: str | None = Field(
        None,
        description="IANA time zone for daily resets, e.g. Europe/Berlin; unset: the host's zone",
    )

    @field_validator("main_key")
    @classmethod
    def _main_key_not_reserved(cls, value: str) -> str:
        if value in _RESERVED_MAIN_KEYS:
            raise ValueError(f"main_key may not be one of {sorted(_RESERVED_MAIN_KEYS)}")
        return value

    @field_validator("identity_links")
    @classmethod
    def _normalise_links(cls, links: dict[str, list[str]]) -> dict[str, list[str]]:
        normalised: dict[str, list[str]] = {}
        owner: dict[str, str] = {}
        for canonical, ids in links.items():
            name = canonical.strip().lower()
            if not _CANONICAL_RE.fullmatch(name):
                raise ValueError(
                    f"identity_links name {canonical!r} must match {_CANONICAL_RE.pattern}"
                )
            if name in normalised:
                raise ValueError(f"identity_links name {canonical!r} appears twice")
            cleaned: list[str] = []
            for raw in ids:
                link = raw.strip().lower()
                if not link:
                    raise ValueError(f"identity_links.{canonical} holds an empty id")
                # One id under two names would make the link depend on table order.
                if owner.setdefault(link, name) != name:
                    raise ValueError(f"id {raw!r} is linked to both {owner[link]!r} and {name!r}")
                cleaned.append(link)
            normalised[name] = cleaned
        return normalised

    @field_validator("reset_by_channel")
    @classmethod
    def _lowercase_channels(cls, by_channel: dict[str, ResetConfig]) -> dict[str, ResetConfig]:
        lowered: dict[str, ResetConfig] = {}
        for channel, policy in by_channel.items():
            name = channel.strip().lower()
            if not _ID_RE.fullmatch(name):
                raise ValueError(f"reset_by_channel name {channel!r} is not a channel name")
            if name in lowered:
                raise ValueError(f"reset_by_channel names {channel!r} twice")
            lowered[name] = policy
        return lowered

    @field_validator("reset_triggers")
    @classmethod
    def _clean_triggers(cls, triggers: list[str]) -> list[str]:
        cleaned = [trigger.strip() for trigger in triggers]
        if any(not trigger for trigger in cleaned):
            raise ValueError("reset_triggers may not hold an empty trigger")
        return cleaned

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
            raise ValueError(f"unknown time zone {value!r} (expected an IANA name)") from exc
        return value
