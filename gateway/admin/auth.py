"""The admin token: where it comes from, and how a request presents it.

Every route but ``/health``, the static pages and routes that check a credential of
their own needs ``Authorization: Bearer <token>``. A browser cannot set that header
on a websocket, so the web chat sends the token as a subprotocol ``bearer.<token>``
instead (never in the URL, which ends up in histories and logs).

With no token configured, a loopback server generates one and keeps it in
``$PARLEY_HOME/admin.token`` (mode 0600), so bookmarks and scripts survive a restart;
a server on any other address refuses to start without one.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from aiohttp import hdrs, web

from parley.core.files import write_atomically
from parley.gateway.errors import AdminServerError

SUBPROTOCOL_PREFIX = "bearer."
MIN_TOKEN_CHARS = 16
# Characters a token may hold: they must survive an HTTP header and a websocket
# subprotocol name (RFC 7230 token characters, minus the ones that confuse shells).
_TOKEN_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/=")

TokenSource = Literal["config", "file", "generated"]


@dataclass(frozen=True, slots=True)
class AdminToken:
    value: str
    source: TokenSource

    def matches(self, presented: str | None) -> bool:
        """Constant-time comparison: the time taken says nothing about the token.

        A header with bytes that are not UTF-8 reaches us as surrogate escapes, which
        plain UTF-8 cannot encode: ``surrogatepass`` makes such a token merely wrong."""
        if presented is None:
            return False
        given = presented.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(given, self.value.encode("utf-8"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def resolve_token(configured: str | None, host: str, token_file: Path) -> AdminToken:
    """The token to require (blocking: reads and may write ``token_file``)."""
    if configured is not None:
        _check(configured, "the configured admin token ([http] token, PARLEY_ADMIN_TOKEN)")
        return AdminToken(configured, "config")
    if not is_loopback(host):
        raise AdminServerError(
            f"refusing to serve the admin API on {host} without a token: set [http] token "
            "or PARLEY_ADMIN_TOKEN (anyone who can reach the address could read every chat)"
        )
    try:
        stored = token_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        stored = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise AdminServerError(f"cannot read {token_file}: {exc}") from exc
    if stored:
        _check(stored, str(token_file))
        return AdminToken(stored, "file")
    value = secrets.token_urlsafe(32)
    _write_private(token_file, value + "\n")
    return AdminToken(value, "generated")


def check_setup(configured: str | None, host: str, token_file: Path) -> str:
    """What ``resolve_token`` would do, without writing anything (for ``parley doctor``);
    raises ``AdminServerError`` where it would refuse."""
    if configured is not None:
        _check(configured, "the configured admin token ([http] token, PARLEY_ADMIN_TOKEN)")
        return "token from the configuration"
    if not is_loopback(host):
        resolve_token(None, host, token_file)  # raises: a public address needs a token
    if token_file.is_file():
        return f"token in {token_file}"
    return f"a token will be generated into {token_file} at start"


def presented_token(request: web.Request) -> str | None:
    """The bearer token of a request, from its header or its websocket subprotocols."""
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if request.headers.get(hdrs.UPGRADE, "").lower() == "websocket":
        offered = request.headers.get(hdrs.SEC_WEBSOCKET_PROTOCOL, "")
        for item in offered.split(","):
            item = item.strip()
            if item.startswith(SUBPROTOCOL_PREFIX):
                return item[len(SUBPROTOCOL_PREFIX) :]
    return None


def _check(token: str, where: str) -> None:
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminServerError(f"{where} is too short: use at least {MIN_TOKEN_CHARS} characters")
    if not set(token) <= _TOKEN_ALPHABET:
        raise AdminServerError(
            f"{where} has characters a header or websocket cannot carry: use letters, digits "
            "and -._~+/="
        )


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only, atomically (no window at 0644)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text.encode("utf-8"))
