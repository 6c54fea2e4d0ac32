"""Every exception the gateway raises.

GatewayError
├── ConfigFileError      the config file or an override is invalid (exit code 2)
├── StateError           state.db cannot be opened, migrated or written
│   └── SchemaTooNewError   state.db was written by a newer parley
├── SessionNotFound      no session matches the id or key given
├── PairingError         a pairing code is unknown, expired or already decided
├── ChannelFailure       a channel adapter could not start (bad token, unreachable API)
├── LaneBusy             a session's lane cannot take more work now
├── RetentionBusy        another retention run holds the home's or the shared database's lock
├── NotStarted           a part built at start was asked for before the gateway started
├── AdminServerError     the HTTP server cannot start (no token on a public address, port taken)
├── ApiError             an admin API request cannot be served; carries the HTTP status
└── MediaRejected        a picture, document or voice note cannot be used (too big, of
                         an unsupported type, unreadable); says why in words a person reads
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


class LaneBusy(GatewayError):
    pass


class RetentionBusy(GatewayError):
    """Another retention run holds the home's retention lock, or (``shared``) the shared
    PostgreSQL database's: there, another replica's daily run, which is no failure."""

    def __init__(self, message: str, *, shared: bool = False) -> None:
        super().__init__(message)
        self.shared = shared


class NotStarted(GatewayError, RuntimeError):
    """Also a RuntimeError: asking a stopped gateway for its provider is a caller's
    mistake, as it was before this class existed."""


class AdminServerError(GatewayError):
    pass


class ApiError(GatewayError):
    """Answered as ``{"error": code, "message": message}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class MediaRejected(GatewayError):
    """An attachment the gateway cannot use. ``str(exc)`` is the reason, written for the
    person who sent it ("it is 31 MB; the limit is 20 MB")."""
