"""The gateway's HTTP server (aiohttp): the admin API and pages, metrics, and the
channels' endpoints (Telegram webhooks, the web chat's websocket).

It starts before the channels (a webhook must be reachable once Telegram is told
about it) and stops after them. Bodies larger than ``max_body_bytes`` are refused
with 413 before any handler reads them. Connections are bounded in time and number
(``gateway.http_limits``): a request's headers, its body and an idle keep-alive each
have a deadline, and past ``max_connections`` the oldest idle or unfinished connection
is closed to let a new one in, so silent sockets cannot keep ``/health`` out. The admin
token is resolved at start (see ``gateway.admin.auth``): a server on a non-loopback
address without one refuses to start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from parley.channels.base import WebhookRoute
from parley.gateway.admin.auth import AdminToken, resolve_token
from parley.gateway.admin.metrics import GatewayMetrics
from parley.gateway.admin.web_app import build_app
from parley.gateway.config import HttpConfig
from parley.gateway.errors import AdminServerError
from parley.gateway.http_limits import (
    GuardedAppRunner,
    HttpLimits,
    connection_budget,
    nofile_soft_limit,
    reserved_descriptors,
)

if TYPE_CHECKING:
    from parley.gateway.admin.gateway_view import AdminGateway

log = logging.getLogger("parley.gateway.http")

MAX_REQUEST_LINE = 32_768


class HttpServer:
    def __init__(
        self,
        config: HttpConfig,
        routes: Sequence[WebhookRoute],
        *,
        token_file: Path,
        gateway: AdminGateway,
        metrics: GatewayMetrics,
    ) -> None:
        self.config = config
        self.routes = list(routes)
        self.token_file = token_file
        self._gateway = gateway
        self._metrics = metrics
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._token: AdminToken | None = None
        self._limits: HttpLimits | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the HTTP server is not running")
        return self._port

    @property
    def token(self) -> AdminToken:
        if self._token is None:
            raise RuntimeError("the HTTP server is not running")
        return self._token

    @property
    def limits(self) -> HttpLimits:
        """The limits in force (``max_connections`` fitted to the descriptor limit)."""
        if self._limits is None:
            raise RuntimeError("the HTTP server is not running")
        return self._limits

    @property
    def connection_stats(self) -> dict[str, int]:
        """Connections open now, and those closed by a deadline or at the cap."""
        runner = self._runner
        if not isinstance(runner, GuardedAppRunner):
            raise RuntimeError("the HTTP server is not running")
        return {"open": runner.guard.open_connections, **runner.guard.stats}

    def url(self, path: str = "/") -> str:
        host = self.config.host
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        return f"http://{host}:{self.port}{path}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        secret = self.config.token.get_secret_value() if self.config.token else None
        token = await asyncio.to_thread(resolve_token, secret, self.config.host, self.token_file)
        app = build_app(
            self._gateway,
            token=token,
            metrics=self._metrics,
            channel_routes=self.routes,
            max_body_bytes=self.config.max_body_bytes,
        )
        # A request line may carry a 1,000-character query of 4-byte characters,
        # percent-encoded: 12 bytes each, past aiohttp's default 8,190.
        limits = self._fit_limits()
        runner = GuardedAppRunner(
            app, limits, access_log=None, handle_signals=False, max_line_size=MAX_REQUEST_LINE
        )
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port, backlog=limits.backlog)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise AdminServerError(
                f"cannot listen on {self.config.host}:{self.config.port}: {exc.strerror or exc}"
                " (set [http] port, or PARLEY_ADMIN_PORT)"
            ) from exc
        self._runner = runner
        self._token = token
        self._limits = limits
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or ()
        self._port = sockets[0].getsockname()[1] if sockets else self.config.port
        log.info("HTTP server on %s (token from %s)", self.url(), token.source)

    def _fit_limits(self) -> HttpLimits:
        config = self.config
        storage = self._gateway.config.storage
        reserved = reserved_descriptors(
            storage.backend, storage.max_open_transcripts, storage.pool_size
        )
        soft = nofile_soft_limit()
        cap, backlog = connection_budget(config.max_connections, reserved, soft)
        if cap < config.max_connections:
            log.warning(
                "[http] max_connections %d lowered to %d: the descriptor limit (ulimit -n) "
                "is %d, and %d of it is kept for the rest of the gateway and the accept "
                "backlog; raise the limit (LimitNOFILE= in systemd) for more",
                config.max_connections,
                cap,
                soft,
                reserved + backlog,
            )
        return HttpLimits(
            header_timeout=config.header_timeout_seconds,
            body_timeout=config.body_timeout_seconds,
            keepalive_timeout=config.keepalive_timeout_seconds,
            max_connections=cap,
            backlog=backlog,
        )

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        self._port = None
        self._limits = None
        if runner is not None:
            await runner.cleanup()
