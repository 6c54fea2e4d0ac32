"""Tools the model can call: their definitions, a registry, and one safe way to run them.

``ToolRegistry.run`` never raises for anything a tool or the model did wrong: an
unknown tool, arguments that do not fit the schema, a handler that raises or hangs
all come back as an error ``ToolResultBlock`` with a short message the model can act
on (never a traceback; that goes to the log). Only cancellation of the turn itself
propagates. Every result is capped at ingest (``max_result_chars``, or a per-call
``max_chars``) by ``core.tools.truncation.truncate_tool_result``, which keeps the head
and, when it looks like the outcome, the tail; so one huge tool output cannot flood the
window.

Handlers report a refusal they mean the model to read by raising
``core.errors.ToolError``; its message is passed on as is.

Arguments are checked against the subset of JSON Schema that tool schemas here use
(``type`` object/array/string/integer/number/boolean/null, ``properties``,
``required``, ``additionalProperties: false``, ``enum``, ``minLength``/``maxLength``,
``minimum``/``maximum``, ``items``, ``minItems``/``maxItems``); other keywords are
ignored. Written here rather than pulled in as a dependency: it is small, and its
messages are worded for a model to fix its call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from parley.core.agent_config import DEFAULT_TOOL_RESULT_MAX_CHARS
from parley.core.errors import ToolError
from parley.core.messages import ToolResultBlock, ToolSpec, ToolUseBlock
from parley.core.tools.truncation import truncate_tool_result

log = logging.getLogger("parley.core.tools")

DEFAULT_TOOL_TIMEOUT_SECONDS = 30.0
# Long enough to say what went wrong, short enough to keep exception dumps out.
DEFAULT_ERROR_MESSAGE_MAX_CHARS = 500
TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Providers keep tool input that was not a JSON object under this single key.
_RAW_INPUT_KEY = "_raw"


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler may know about the call beyond its arguments."""

    workspace: Path
    session_key: str
    now: Callable[[], datetime] = _utc_now
    # Room for later needs (memory store, channel facts) without changing the signature.
    extra: Mapping[str, Any] = field(default_factory=dict)


ToolHandler = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: ToolHandler
    timeout_seconds: float | None = None  # None: the registry's default

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.input_schema)


# The name the registry's tests and callers have used; the policy lives in core.tools.truncation.
truncate_result = truncate_tool_result


# -- argument validation ---------------------------------------------------------------

_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _json_type(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "array", "object", "null"):
        if _TYPE_CHECKS[name](value):
            return name
    return type(value).__name__


def schema_problem(value: Any, schema: Mapping[str, Any], where: str = "arguments") -> str | None:
    """The first way ``value`` breaks ``schema``, worded for the model; None if it fits."""
    expected = schema.get("type")
    if expected is not None:
        types = [expected] if isinstance(expected, str) else list(expected)
        if not any(_TYPE_CHECKS.get(t, lambda _: True)(value) for t in types):
            return f"{where} must be of type {' or '.join(types)}, not {_json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        options = ", ".join(json.dumps(o) for o in schema["enum"])
        return f"{where} must be one of {options}"
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where} must be at most {schema['maxLength']} characters long"
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{where} must be at least {schema['minLength']} characters long"
    if _TYPE_CHECKS["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be at least {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be at most {schema['maximum']}"
    if isinstance(value, list):
        return _array_problem(value, schema, where)
    if isinstance(value, dict):
        return _object_problem(value, schema, where)
    return None


def _array_problem(value: list[Any], schema: Mapping[str, Any], where: str) -> str | None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return f"{where} must have at most {schema['maxItems']} items"
    if "minItems" in schema and len(value) < schema["minItems"]:
        return f"{where} must have at least {schema['minItems']} items"
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            if problem := schema_problem(item, items, f"{where}[{i}]"):
                return problem
    return None


def _object_problem(value: dict[str, Any], schema: Mapping[str, Any], where: str) -> str | None:
    prefix = "" if where == "arguments" else f"{where}."
    for key in schema.get("required", ()):
        if key not in value:
            return f"'{prefix}{key}' is required"
    properties: Mapping[str, Any] = schema.get("properties") or {}
    if schema.get("additionalProperties") is False:
        unknown = sorted(k for k in value if k not in properties)
        if unknown:
            allowed = ", ".join(properties) or "none"
            return f"unknown argument '{prefix}{unknown[0]}' (allowed: {allowed})"
    for key, sub in properties.items():
        if key in value and (problem := schema_problem(value[key], sub, f"'{prefix}{key}'")):
            return problem
    return None


# -- the registry -----------------------------------------------------------------------


class ToolRegistry:
    """The tools on offer, in a stable order, and the one way to run them."""

    def __init__(
        self,
        *,
        max_result_chars: int = DEFAULT_TOOL_RESULT_MAX_CHARS,
        timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
    ) -> None:
        if max_result_chars < 1:
            raise ValueError("max_result_chars must be positive")
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.max_result_chars = max_result_chars
        self.timeout_seconds = timeout_seconds
        self._tools: dict[str, Tool] = {}
        self._specs: tuple[ToolSpec, ...] | None = None

    def register(self, tool: Tool) -> Tool:
        if not TOOL_NAME_PATTERN.fullmatch(tool.name):
            raise ValueError(f"invalid tool name {tool.name!r}: use 1-64 of [a-zA-Z0-9_-]")
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        if tool.input_schema.get("type") != "object":
            raise ValueError(f"the input schema of {tool.name!r} must be of type object")
        self._tools[tool.name] = tool
        self._specs = None
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._tools))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> tuple[ToolSpec, ...]:
        """Every tool's spec, sorted by name whatever the registration order.

        The tool list opens the prompt, so the same set must give the same bytes.
        """
        if self._specs is None:
            self._specs = tuple(self._tools[name].spec for name in self.names)
        return self._specs

    async def run(
        self, tool_use: ToolUseBlock, context: ToolContext, *, max_chars: int | None = None
    ) -> ToolResultBlock:
        """Run one call; the result is capped at ``max_chars`` (None: ``max_result_chars``).

        The per-call cap lets the caller size results to the session's model window
        (``core.tools.truncation.tool_result_cap``) while the registry itself stays shared.
        """
        cap = self.max_result_chars if max_chars is None else max_chars
        if cap < 1:
            raise ValueError("max_chars must be positive")
        text, is_error = await self._run(tool_use, context)
        return ToolResultBlock(tool_use.id, truncate_tool_result(text, cap), is_error=is_error)

    async def _run(self, tool_use: ToolUseBlock, context: ToolContext) -> tuple[str, bool]:
        name = tool_use.name
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self.names) or "none"
            return f"unknown tool '{name}' (available: {available})", True
        arguments = tool_use.input
        if set(arguments) == {_RAW_INPUT_KEY}:
            return f"the arguments for {name} were not a JSON object; call it again", True
        if problem := schema_problem(arguments, tool.input_schema):
            return f"invalid arguments for {name}: {problem}", True
        seconds = tool.timeout_seconds or self.timeout_seconds
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                result = await tool.handler(dict(arguments), context)
        except ToolError as exc:
            return str(exc) or f"{name} failed", True
        except TimeoutError:
            if deadline.expired():
                log.warning("tool %s timed out after %.3g s", name, seconds)
                return f"{name} timed out after {seconds:g} s", True
            log.warning("tool %s raised a timeout", name, exc_info=True)
            return f"{name} failed: it timed out", True
        except Exception as exc:
            # The traceback is for operators; the model gets one line.
            log.warning("tool %s failed", name, exc_info=True)
            return _short(f"{name} failed: {type(exc).__name__}: {exc}"), True
        if not isinstance(result, str):
            log.warning("tool %s returned %s, not text", name, type(result).__name__)
            return f"{name} failed: it returned no text", True
        return result, False


def _short(message: str) -> str:
    message = " ".join(message.split())  # one line: exception texts may span many
    if len(message) <= DEFAULT_ERROR_MESSAGE_MAX_CHARS:
        return message
    return message[: DEFAULT_ERROR_MESSAGE_MAX_CHARS - 3] + "..."
