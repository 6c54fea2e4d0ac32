"""The gateway's HTTP server (aiohttp): channel webhooks and a health check.

It starts before the channels (a webhook must be reachable once Telegram is told
about it) and stops after them. Bodies larger than ``max_body_bytes`` are refused by
aiohttp with 413 before any handler runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiohttp import web

from channels.base import WebhookRoute
from gateway.config import HttpConfig
from gateway.errors import ChannelFailure

log = logging.getLogger("parley.gateway.http")


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


class HttpServer:
    def __init__(self, config: HttpConfig, routes: Sequence[WebhookRoute]) -> None:
        self.config = config
        self.routes = list(routes)
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the HTTP server is not running")
        return self._port

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_get("/healthz", _health)
        for route in self.routes:
            app.router.add_route(route.method, route.path, route.handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ChannelFailure(
                f"cannot listen on {self.config.host}:{self.config.port}: {exc.strerror or exc}"
                " (set [http] port, or PARLEY_HTTP__PORT)"
            ) from exc
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or ()
        self._port = sockets[0].getsockname()[1] if sockets else self.config.port
        log.info(
            "HTTP server on %s:%s (%d route(s))", self.config.host, self._port, len(self.routes)
        )

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        self._port = None
        if runner is not None:
            await runner.cleanup()
