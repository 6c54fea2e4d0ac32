"""Every exception the gateway raises.

GatewayError
├── ConfigFileError      the config file or an override is invalid (exit code 2)
├── StateError           state.db cannot be opened, migrated or written
│   └── SchemaTooNewError   state.db was written by a newer parley
├── SessionNotFound      no session matches the id or key given
├── PairingError         a pairing code is unknown, expired or already decided
└── ChannelFailure       a channel adapter could not start (bad token, unreachable API)
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error raised by ``gateway``."""


class ConfigFileError(GatewayError):
    """``problems`` lists (dotted path, reason) pairs, one per bad field."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{source}: invalid configuration"]
        lines += [f"  {path}: {reason}" for path, reason in problems]
        super().__init__("\n".join(lines))


class StateError(GatewayError):
    pass


class SchemaTooNewError(StateError):
    pass


class SessionNotFound(GatewayError):
    pass


class PairingError(GatewayError):
    pass


class ChannelFailure(GatewayError):
    pass
