"""The OpenAPI 3.1 document, generated from the routes the server really mounts:
the ``Operation`` rows (API, health, metrics, pages) and the channels' routes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from parley.channels.base import WebhookRoute
from parley.gateway.admin.api import Operation
from parley.gateway.admin.schemas import SESSION_ID_PATTERN, ErrorBody

_REF = "#/components/schemas/{model}"
_REASONS = {
    400: "bad input (the message says which)",
    401: "no token, or a wrong one",
    404: "no such session or file",
    413: "the body is larger than the server accepts",
    415: "the body is not JSON",
}
_PATH_PARAMS = {
    "id": {"type": "string", "pattern": SESSION_ID_PATTERN, "description": "a session id"},
    "name": {"type": "string", "description": "a file name"},
    "account": {"type": "string", "description": "a bot account name"},
}


def build_openapi(
    operations: Sequence[Operation], channel_routes: Sequence[WebhookRoute], version: str
) -> dict[str, Any]:
    models = _models(operations)
    _, top = models_json_schema(
        [(m, "serialization" if m not in _inputs(operations) else "validation") for m in models],
        ref_template=_REF,
    )
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    for route in channel_routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _channel_operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "parley admin API",
            "version": version,
            "description": "Sessions, transcripts, context, compactions and memory of one "
            "parley gateway. Every route but /health and the pages needs "
            "`Authorization: Bearer <token>`.",
        },
        "paths": paths,
        "components": {
            "schemas": top.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _operation(op: Operation) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "summary": op.summary,
        "tags": [op.tag],
        "operationId": _operation_id(op.method, op.path),
    }
    if op.public:
        doc["security"] = []
    parameters = _path_parameters(op.path)
    if op.query is not None:
        parameters += _query_parameters(op.query)
    if parameters:
        doc["parameters"] = parameters
    if op.body is not None:
        doc["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": _ref(op.body)}},
        }
    ok: dict[str, Any] = {"description": "OK"}
    if op.response is not None:
        ok["content"] = {op.media_type: {"schema": _ref(op.response)}}
    else:
        plain = {"type": "object"} if op.media_type == "application/json" else {"type": "string"}
        ok["content"] = {media: {"schema": plain} for media in op.media_type.split(",")}
    responses: dict[str, Any] = {"200": ok}
    for status in op.errors:
        responses[str(status)] = _error(_REASONS[status])
    for status, reason, model in op.extra_responses:
        body = model or ErrorBody
        responses[str(status)] = {
            "description": reason,
            "content": {"application/json": {"schema": _ref(body)}},
        }
    doc["responses"] = responses
    return doc


def _channel_operation(route: WebhookRoute) -> dict[str, Any]:
    """A channel's endpoint: documented so the document lists every route; its
    protocol belongs to the platform (Telegram's webhook, the web chat socket)."""
    websocket = route.method == "GET"
    responses: dict[str, Any] = {
        "400": {"description": "not a request this endpoint accepts"},
        "401": _error(_REASONS[401]) if not route.public else {"description": "bad secret"},
    }
    if websocket:
        responses["101"] = {"description": "switched to the websocket protocol"}
    else:
        responses["200"] = {"description": "accepted and stored"}
        responses["413"] = {"description": "update too large"}
        responses["500"] = {"description": "not stored; the platform redelivers"}
        responses["503"] = {"description": "not started yet; the platform redelivers"}
    doc: dict[str, Any] = {
        "summary": "web chat websocket" if websocket else "channel webhook",
        "tags": ["channels"],
        "operationId": _operation_id(route.method, route.path),
        "responses": responses,
    }
    if route.public:
        doc["security"] = []
    return doc


def _operation_id(method: str, path: str) -> str:
    words = [part.strip("{}") for part in path.strip("/").split("/")]
    return "_".join([method.lower(), *(w.replace(".", "_") for w in words if w)]) or method


def _path_parameters(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [
        {"name": n, "in": "path", "required": True, "schema": dict(_PATH_PARAMS[n])} for n in names
    ]


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=_REF)
    required = set(schema.get("required", ()))
    params = []
    for name, prop in schema.get("properties", {}).items():
        prop = dict(prop)
        description = prop.pop("description", None)
        prop.pop("title", None)
        param: dict[str, Any] = {
            "name": name,
            "in": "query",
            "required": name in required,
            "schema": prop,
        }
        if description:
            param["description"] = description
        params.append(param)
    return params


def _error(reason: str) -> dict[str, Any]:
    return {"description": reason, "content": {"application/json": {"schema": _ref(ErrorBody)}}}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _inputs(operations: Sequence[Operation]) -> set[type[BaseModel]]:
    return {op.body for op in operations if op.body is not None}


def _models(operations: Sequence[Operation]) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = [ErrorBody]
    for op in operations:
        for model in (op.response, op.body, *(m for _, _, m in op.extra_responses)):
            if model is not None and model not in found:
                found.append(model)
    return found
