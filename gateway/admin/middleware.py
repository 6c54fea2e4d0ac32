"""Two middlewares, outermost first: every failure becomes a JSON error body (no
stack trace ever leaves the process), then the bearer token is checked."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from parley.gateway.admin.auth import presented_token
from parley.gateway.admin.keys import MAX_BODY, METRICS, PUBLIC_RESOURCES, TOKEN
from parley.gateway.errors import ApiError

log = logging.getLogger("parley.gateway.admin")

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    503: "unavailable",
}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": code, "message": message}, status=status, headers=headers or None
    )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, exc.code, exc.message, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        keep = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        message = exc.text if exc.text and not exc.text.startswith("<") else exc.reason
        if exc.status == 413:
            message = f"request body too large (limit {request.app[MAX_BODY]:,} bytes)"
        return error_response(exc.status, _CODES.get(exc.status, "error"), message, keep)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        request.app[METRICS].error("admin_internal")
        return error_response(500, "internal", "internal error; the gateway log has the details")


@web.middleware
async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    resource = request.match_info.route.resource
    if resource is not None and resource.canonical in request.app[PUBLIC_RESOURCES]:
        return await handler(request)
    if not request.app[TOKEN].matches(presented_token(request)):
        raise ApiError(401, "unauthorized", "a valid admin token is required (Bearer)")
    return await handler(request)
