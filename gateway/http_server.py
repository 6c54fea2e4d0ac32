"""The gateway's HTTP server (aiohttp): the admin API and pages, metrics, and the
channels' endpoints (Telegram webhooks, the web chat's websocket).

It starts before the channels (a webhook must be reachable once Telegram is told
about it) and stops after them. Bodies larger than ``max_body_bytes`` are refused
with 413 before any handler reads them. The admin token is resolved at start (see
``gateway.admin.auth``): a server on a non-loopback address without one refuses to
start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from channels.base import WebhookRoute
from gateway.admin.auth import AdminToken, resolve_token
from gateway.admin.metrics import GatewayMetrics
from gateway.admin.web_app import build_app
from gateway.config import HttpConfig
from gateway.errors import AdminServerError

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger("parley.gateway.http")

MAX_REQUEST_LINE = 32_768


class HttpServer:
    def __init__(
        self,
        config: HttpConfig,
        routes: Sequence[WebhookRoute],
        *,
        token_file: Path,
        gateway: Gateway,
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
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, max_line_size=MAX_REQUEST_LINE
        )
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
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
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or ()
        self._port = sockets[0].getsockname()[1] if sockets else self.config.port
        log.info("HTTP server on %s (token from %s)", self.url(), token.source)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        self._port = None
        if runner is not None:
            await runner.cleanup()
