"""The one aiohttp application: admin API, pages, metrics, channel endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from importlib import metadata
from typing import TYPE_CHECKING

from aiohttp import web

from parley.channels.base import WebhookRoute
from parley.gateway.admin import api, pages
from parley.gateway.admin.auth import AdminToken
from parley.gateway.admin.keys import MAX_BODY, METRICS, OPENAPI, PUBLIC_RESOURCES, SERVICE, TOKEN
from parley.gateway.admin.metrics import GatewayMetrics
from parley.gateway.admin.middleware import json_errors, require_token
from parley.gateway.admin.openapi import build_openapi
from parley.gateway.admin.service import AdminService

if TYPE_CHECKING:
    from parley.gateway.admin.gateway_view import AdminGateway


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


PAGE_OPERATIONS: tuple[api.Operation, ...] = (
    api.Operation(
        "GET",
        "/api/openapi.json",
        openapi,
        "This document",
        "status",
        None,
        media_type="application/json",
    ),
    api.Operation(
        "GET", "/", pages.inspector, "The session inspector page", "pages", None,
        media_type="text/html", errors=(), public=True,
    ),
    api.Operation(
        "GET", "/chat", pages.chat, "The web chat page", "pages", None,
        media_type="text/html", errors=(), public=True,
    ),
    api.Operation(
        "GET", "/static/{name}", pages.asset, "A file the pages load", "pages", None,
        media_type=",".join(pages.ASSET_TYPES), errors=(404,), public=True,
    ),
)  # fmt: skip


def build_app(
    gateway: AdminGateway,
    *,
    token: AdminToken,
    metrics: GatewayMetrics,
    channel_routes: Sequence[WebhookRoute],
    max_body_bytes: int,
) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes, middlewares=[json_errors, require_token])
    app[TOKEN] = token
    app[METRICS] = metrics
    app[MAX_BODY] = max_body_bytes
    operations = (*api.OPERATIONS, *PAGE_OPERATIONS)
    public: set[str] = set()
    for op in operations:
        app.router.add_route(op.method, op.path, op.handler)
        if op.public:
            public.add(op.path)
    for route in channel_routes:
        app.router.add_route(route.method, route.path, route.handler)
        if route.public:
            public.add(route.path)
    app[PUBLIC_RESOURCES] = frozenset(public)
    app[OPENAPI] = build_openapi(operations, channel_routes, _version())

    async def service(app: web.Application) -> AsyncIterator[None]:
        app[SERVICE] = AdminService(gateway)
        yield
        await app[SERVICE].close()

    app.cleanup_ctx.append(service)
    return app


def _version() -> str:
    try:
        return metadata.version("parley")
    except metadata.PackageNotFoundError:
        return "0.0.0"
