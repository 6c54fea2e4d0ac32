"""Typed application keys: what the admin app's handlers and middlewares share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from parley.gateway.admin.auth import AdminToken

if TYPE_CHECKING:
    from parley.gateway.admin.metrics import GatewayMetrics
    from parley.gateway.admin.service import AdminService

TOKEN = web.AppKey("parley.token", AdminToken)
# Canonical paths of the routes that need no token (health, pages, own-credential routes).
PUBLIC_RESOURCES = web.AppKey("parley.public", frozenset)
MAX_BODY = web.AppKey("parley.max_body", int)
OPENAPI = web.AppKey("parley.openapi", dict)
METRICS: web.AppKey[GatewayMetrics] = web.AppKey("parley.metrics")
SERVICE: web.AppKey[AdminService] = web.AppKey("parley.service")
