"""The admin API's routes, declared once as ``Operation`` rows: the web app mounts
them and the OpenAPI document is generated from the same rows."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from parley.gateway.admin import schemas as s
from parley.gateway.admin.keys import METRICS, SERVICE
from parley.gateway.errors import ApiError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)

# Statuses every authenticated JSON route can answer besides its own.
AUTH_ERRORS = (401,)
SESSION_ERRORS = (400, 401, 404)


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    response: type[BaseModel] | None = None  # the 200 body; None: not JSON
    media_type: str = "application/json"  # several: comma-separated
    errors: tuple[int, ...] = AUTH_ERRORS
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    public: bool = False  # no token needed
    extra_responses: tuple[tuple[int, str, type[BaseModel] | None], ...] = ()


def json_body(model: BaseModel, status: int = 200) -> web.Response:
    return web.json_response(model.model_dump(mode="json"), status=status)


def parse_query(request: web.Request, model: type[M]) -> M:
    try:
        return model.model_validate(dict(request.query))
    except ValidationError as exc:
        raise ApiError(400, "bad_request", _describe(exc)) from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    """An optional JSON body; an empty one means the defaults."""
    raw = await request.read()  # aiohttp refuses one over the size limit with 413
    if not raw.strip():
        return model()
    if request.content_type not in ("application/json", "application/octet-stream"):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "bad_request", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "bad_request", "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError(400, "bad_request", _describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "(body)"
        problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)


# -- handlers ------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    report = await request.app[SERVICE].health()
    return json_body(report, 200 if report.ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def list_sessions(request: web.Request) -> web.Response:
    query = parse_query(request, s.SessionListQuery)
    return json_body(await request.app[SERVICE].sessions(query))


async def get_session(request: web.Request) -> web.Response:
    return json_body(await request.app[SERVICE].session(request.match_info["id"]))


async def get_transcript(request: web.Request) -> web.Response:
    query = parse_query(request, s.TranscriptQuery)
    return json_body(await request.app[SERVICE].transcript(request.match_info["id"], query))


async def get_context(request: web.Request) -> web.Response:
    return json_body(await request.app[SERVICE].context(request.match_info["id"]))


async def get_compactions(request: web.Request) -> web.Response:
    return json_body(await request.app[SERVICE].compactions(request.match_info["id"]))


async def compact(request: web.Request) -> web.Response:
    body = await parse_body(request, s.CompactRequest)
    return json_body(await request.app[SERVICE].compact(request.match_info["id"], body.focus))


async def reset(request: web.Request) -> web.Response:
    await parse_body(request, s.EmptyRequest)
    return json_body(await request.app[SERVICE].reset(request.match_info["id"]))


async def memory_status(request: web.Request) -> web.Response:
    query = parse_query(request, s.MemoryStatusQuery)
    return json_body(await request.app[SERVICE].memory_status(query))


async def memory_stats(request: web.Request) -> web.Response:
    query = parse_query(request, s.MemoryStatsQuery)
    return json_body(await request.app[SERVICE].memory_stats(query))


async def memory_search(request: web.Request) -> web.Response:
    query = parse_query(request, s.MemorySearchQuery)
    return json_body(await request.app[SERVICE].memory_search(query))


_RESET_WHILE_READING = ((409, "the session was reset while it was read; retry", s.ErrorBody),)
_CHANGES = (
    (409, "the session is archived", s.ErrorBody),
    (503, "the session's queue is full or the gateway is stopping", s.ErrorBody),
)

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "GET",
        "/health",
        health,
        "Liveness and readiness: state.db, channels, provider",
        "status",
        s.Health,
        errors=(),
        public=True,
        extra_responses=((503, "not ready (the body says why)", s.Health),),
    ),
    Operation(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics of this gateway process",
        "status",
        None,
        media_type="text/plain",
    ),
    Operation(
        "GET",
        "/api/sessions",
        list_sessions,
        "Sessions, most recently updated first",
        "sessions",
        s.SessionPage,
        errors=(400, 401),
        query=s.SessionListQuery,
    ),
    Operation(
        "GET",
        "/api/sessions/{id}",
        get_session,
        "One session: registry entry, token counters, cache-read share",
        "sessions",
        s.SessionDetail,
        errors=SESSION_ERRORS,
    ),
    Operation(
        "GET",
        "/api/sessions/{id}/transcript",
        get_transcript,
        "Transcript entries in file order",
        "sessions",
        s.TranscriptPage,
        errors=SESSION_ERRORS,
        query=s.TranscriptQuery,
        extra_responses=_RESET_WHILE_READING,
    ),
    Operation(
        "GET",
        "/api/sessions/{id}/context",
        get_context,
        "What the model would see on the next turn, by part, against the window",
        "sessions",
        s.ContextBreakdown,
        errors=SESSION_ERRORS,
    ),
    Operation(
        "GET",
        "/api/sessions/{id}/compactions",
        get_compactions,
        "Every compaction: trigger, tokens before and after, summary, ledger",
        "sessions",
        s.CompactionList,
        errors=SESSION_ERRORS,
        extra_responses=_RESET_WHILE_READING,
    ),
    Operation(
        "POST",
        "/api/sessions/{id}/compact",
        compact,
        "Compact the session now (after anything queued in it)",
        "sessions",
        s.CompactResult,
        errors=(*SESSION_ERRORS, 413, 415),
        body=s.CompactRequest,
        extra_responses=_CHANGES,
    ),
    Operation(
        "POST",
        "/api/sessions/{id}/reset",
        reset,
        "Archive the session; the next message starts a new one",
        "sessions",
        s.ResetResult,
        errors=(*SESSION_ERRORS, 413, 415),
        body=s.EmptyRequest,
        extra_responses=_CHANGES,
    ),
    Operation(
        "GET",
        "/api/memory/status",
        memory_status,
        "The memory index: counts, embedder, fallbacks",
        "memory",
        s.MemoryStatusBody,
        errors=(400, 401, 404),
        query=s.MemoryStatusQuery,
        extra_responses=((503, "the memory index is unavailable", s.ErrorBody),),
    ),
    Operation(
        "GET",
        "/api/memory/stats",
        memory_stats,
        "Task records: counts by outcome, most frequent errors, tool use",
        "memory",
        s.MemoryStatsBody,
        errors=(400, 401, 404),
        query=s.MemoryStatsQuery,
        extra_responses=((503, "the memory index is unavailable", s.ErrorBody),),
    ),
    Operation(
        "GET",
        "/api/memory/search",
        memory_search,
        "Hybrid search over long-term memory (one scope, or all)",
        "memory",
        s.MemorySearchBody,
        errors=(400, 401, 404),
        query=s.MemorySearchQuery,
        extra_responses=(
            (409, "memory is turned off", s.ErrorBody),
            (503, "the memory index is unavailable", s.ErrorBody),
        ),
    ),
)
