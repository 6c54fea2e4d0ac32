"""ToolRegistry: registration, stable specs, validation, failures, timeouts, the cap."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.core.agent_config import DEFAULT_TOOL_RESULT_MAX_CHARS
from parley.core.errors import ToolError
from parley.core.messages import ToolResultBlock, ToolUseBlock
from parley.core.tools.tool_registry import (
    DEFAULT_ERROR_MESSAGE_MAX_CHARS,
    DEFAULT_TOOL_TIMEOUT_SECONDS,
    Tool,
    ToolContext,
    ToolRegistry,
    schema_problem,
    truncate_result,
)
from parley.core.tools.truncation import truncate_tool_result

SHORT_TIMEOUT = 0.05
NOTICE = re.compile(r"\[\.\.\. ([\d,]+) characters? \([\d,]+ lines?\) omitted \.\.\.\]$")


async def _echo(arguments: dict[str, Any], context: ToolContext) -> str:
    return f"{context.session_key}:{sorted(arguments.items())}"


def _tool(name: str = "echo", handler: Any = _echo, **schema: Any) -> Tool:
    return Tool(name, f"the {name} tool", {"type": "object", **schema}, handler)


@pytest.fixture
def context(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path, session_key="s1")


async def _run(registry: ToolRegistry, context: ToolContext, name: str, **args: Any) -> Any:
    return await registry.run(ToolUseBlock("call-1", name, args), context)


# -- registration and specs ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "naïve", "dot.ted", "slash/y"])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        ToolRegistry().register(_tool(name))


@pytest.mark.parametrize("name", ["a", "read_file", "Web-Search_2", "x" * 64])
def test_valid_names_are_accepted(name: str) -> None:
    registry = ToolRegistry()
    registry.register(_tool(name))

    assert name in registry
    assert registry.get(name) is not None


def test_duplicate_names_are_refused() -> None:
    registry = ToolRegistry()
    registry.register(_tool("echo"))

    with pytest.raises(ValueError, match="already registered"):
        registry.register(_tool("echo"))
    assert len(registry) == 1


def test_schema_must_describe_an_object() -> None:
    with pytest.raises(ValueError, match="type object"):
        ToolRegistry().register(Tool("t", "d", {"type": "string"}, _echo))


def test_specs_are_sorted_whatever_the_registration_order() -> None:
    forward, backward = ToolRegistry(), ToolRegistry()
    names = ["zeta", "alpha", "mid"]
    for name in names:
        forward.register(_tool(name))
    for name in reversed(names):
        backward.register(_tool(name))

    assert [s.name for s in forward.specs()] == ["alpha", "mid", "zeta"]
    assert forward.specs() == backward.specs()
    assert forward.specs() == forward.specs()


def test_specs_follow_a_later_registration() -> None:
    registry = ToolRegistry()
    registry.register(_tool("b"))
    before = registry.specs()
    registry.register(_tool("a"))

    assert [s.name for s in before] == ["b"]
    assert [s.name for s in registry.specs()] == ["a", "b"]
    spec = registry.specs()[0]
    assert (spec.description, spec.input_schema) == ("the a tool", {"type": "object"})


def test_registry_defaults() -> None:
    registry = ToolRegistry()

    assert registry.max_result_chars == DEFAULT_TOOL_RESULT_MAX_CHARS
    assert registry.timeout_seconds == DEFAULT_TOOL_TIMEOUT_SECONDS


def test_context_clock_defaults_to_aware_utc(tmp_path: Path) -> None:
    now = ToolContext(workspace=tmp_path, session_key="s").now()

    assert now.tzinfo is not None
    assert now.utcoffset() == UTC.utcoffset(now)


# -- running -------------------------------------------------------------------------------


async def test_a_valid_call_reaches_the_handler(context: ToolContext) -> None:
    registry = ToolRegistry()
    registry.register(_tool(properties={"n": {"type": "integer"}}))

    result = await _run(registry, context, "echo", n=3)

    assert result == ToolResultBlock("call-1", "s1:[('n', 3)]", is_error=False)


async def test_the_handler_gets_a_copy_of_the_arguments(context: ToolContext) -> None:
    async def mutate(arguments: dict[str, Any], _: ToolContext) -> str:
        arguments["injected"] = True
        return "ok"

    registry = ToolRegistry()
    registry.register(_tool(handler=mutate))
    use = ToolUseBlock("c", "echo", {"a": 1})

    await registry.run(use, context)

    assert use.input == {"a": 1}


async def test_unknown_tool_is_an_error_result_naming_the_real_ones(context: ToolContext) -> None:
    registry = ToolRegistry()
    registry.register(_tool("echo"))

    result = await _run(registry, context, "nope")

    assert result.is_error
    assert result.tool_use_id == "call-1"
    assert "unknown tool 'nope'" in result.content
    assert "echo" in result.content


async def test_arguments_that_were_not_json_are_an_error(context: ToolContext) -> None:
    registry = ToolRegistry()
    registry.register(_tool())

    result = await _run(registry, context, "echo", _raw='{"a": ')

    assert result.is_error
    assert "not a JSON object" in result.content


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": 5},
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number"},
        "flag": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "opt": {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]},
    },
    "required": ["path"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, "'path' is required"),
        ({"path": 3}, "'path' must be of type string, not integer"),
        ({"path": ""}, "'path' must be at least 1 characters long"),
        ({"path": "toolong"}, "'path' must be at most 5 characters long"),
        ({"path": "a", "count": "2"}, "'count' must be of type integer, not string"),
        ({"path": "a", "count": True}, "'count' must be of type integer, not boolean"),
        ({"path": "a", "count": 2.5}, "'count' must be of type integer, not number"),
        ({"path": "a", "count": 0}, "'count' must be at least 1"),
        ({"path": "a", "count": 11}, "'count' must be at most 10"),
        ({"path": "a", "ratio": "x"}, "'ratio' must be of type number, not string"),
        ({"path": "a", "flag": 1}, "'flag' must be of type boolean, not integer"),
        ({"path": "a", "mode": "warp"}, '\'mode\' must be one of "fast", "slow"'),
        ({"path": "a", "tags": ["x", 2]}, "'tags'[1] must be of type string, not integer"),
        ({"path": "a", "tags": ["x", "y", "z"]}, "'tags' must have at most 2 items"),
        ({"path": "a", "opt": {}}, "''opt'.k' is required"),
        ({"path": "a", "opt": {"k": "v"}}, "''opt'.k' must be of type integer, not string"),
        ({"path": "a", "extra": 1}, "unknown argument 'extra'"),
    ],
)
async def test_schema_violations_are_error_results(
    context: ToolContext, arguments: dict[str, Any], expected: str
) -> None:
    called = False

    async def handler(_: dict[str, Any], __: ToolContext) -> str:
        nonlocal called
        called = True
        return "ran"

    registry = ToolRegistry()
    registry.register(Tool("t", "d", SCHEMA, handler))

    result = await registry.run(ToolUseBlock("c", "t", arguments), context)

    assert result.is_error
    assert result.content.startswith("invalid arguments for t: ")
    assert expected in result.content
    assert not called


def test_values_that_fit_the_schema_pass() -> None:
    arguments = {
        "path": "abc",
        "count": 10,
        "ratio": 1,
        "flag": False,
        "mode": "slow",
        "tags": ["x"],
        "opt": {"k": 1},
    }

    assert schema_problem(arguments, SCHEMA) is None
    assert schema_problem(None, {"type": ["string", "null"]}) is None
    assert schema_problem({"anything": 1}, {"type": "object"}) is None


async def test_tool_error_message_reaches_the_model_as_is(context: ToolContext) -> None:
    async def refuse(_: dict[str, Any], __: ToolContext) -> str:
        raise ToolError("no such file: notes.md\ntry list_files")

    registry = ToolRegistry()
    registry.register(_tool(handler=refuse))

    result = await _run(registry, context, "echo")

    assert result == ToolResultBlock("call-1", "no such file: notes.md\ntry list_files", True)


async def test_handler_crash_is_a_short_error_without_traceback(
    context: ToolContext, caplog: pytest.LogCaptureFixture
) -> None:
    async def crash(_: dict[str, Any], __: ToolContext) -> str:
        raise KeyError("line one\n" + "x" * 5000)

    registry = ToolRegistry()
    registry.register(_tool(handler=crash))

    result = await _run(registry, context, "echo")

    assert result.is_error
    assert result.content.startswith("echo failed: KeyError: ")
    assert "\n" not in result.content
    assert "Traceback" not in result.content
    assert len(result.content) <= DEFAULT_ERROR_MESSAGE_MAX_CHARS
    assert "Traceback" in caplog.text  # operators still get it


async def test_a_hanging_handler_times_out(context: ToolContext) -> None:
    never = asyncio.Event()

    async def hang(_: dict[str, Any], __: ToolContext) -> str:
        await never.wait()
        return "unreachable"

    registry = ToolRegistry(timeout_seconds=SHORT_TIMEOUT)
    registry.register(_tool(handler=hang))

    result = await _run(registry, context, "echo")

    assert result.is_error
    assert result.content == f"echo timed out after {SHORT_TIMEOUT:g} s"


async def test_a_tool_may_set_its_own_timeout(context: ToolContext) -> None:
    async def hang(_: dict[str, Any], __: ToolContext) -> str:
        await asyncio.Event().wait()
        return "unreachable"

    registry = ToolRegistry(timeout_seconds=3600)
    registry.register(Tool("slow", "d", {"type": "object"}, hang, timeout_seconds=SHORT_TIMEOUT))

    result = await _run(registry, context, "slow")

    assert result.content == f"slow timed out after {SHORT_TIMEOUT:g} s"


async def test_a_timeout_raised_inside_the_handler_is_not_ours(context: ToolContext) -> None:
    async def upstream_timeout(_: dict[str, Any], __: ToolContext) -> str:
        raise TimeoutError

    registry = ToolRegistry()
    registry.register(_tool(handler=upstream_timeout))

    result = await _run(registry, context, "echo")

    assert result == ToolResultBlock("call-1", "echo failed: it timed out", True)


async def test_a_handler_returning_no_text_is_an_error(context: ToolContext) -> None:
    async def not_text(_: dict[str, Any], __: ToolContext) -> Any:
        return {"a": 1}

    registry = ToolRegistry()
    registry.register(_tool(handler=not_text))

    result = await _run(registry, context, "echo")

    assert result.is_error
    assert "returned no text" in result.content


async def test_cancelling_the_turn_is_not_swallowed(context: ToolContext) -> None:
    started = asyncio.Event()

    async def hang(_: dict[str, Any], __: ToolContext) -> str:
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    registry = ToolRegistry()
    registry.register(_tool(handler=hang))
    task = asyncio.create_task(_run(registry, context, "echo"))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task


# -- the size cap (policy: core.tools.truncation; tested in depth in test_truncation.py)


def _flood(text: str) -> Any:
    async def flood(_: dict[str, Any], __: ToolContext) -> str:
        return text

    return flood


def _notice(content: str) -> tuple[str, int]:
    """The text before the marker, and the character count it names."""
    match = NOTICE.search(content)
    assert match is not None, content
    return content[: match.start()], int(match.group(1).replace(",", ""))


async def test_results_are_capped_with_a_note(context: ToolContext) -> None:
    big = "".join(f"line {i:05d}\n" for i in range(2000))
    registry = ToolRegistry(max_result_chars=1000)
    registry.register(_tool(handler=_flood(big)))

    result = await _run(registry, context, "echo")

    assert not result.is_error
    assert len(result.content) <= 1000
    head, omitted = _notice(result.content)
    assert big.startswith(head)
    assert head.endswith("\n")  # cut at a line end
    assert omitted == len(big) - len(head)
    assert result.content.endswith("lines) omitted ...]")


async def test_an_error_at_the_end_survives_the_cap(context: ToolContext) -> None:
    big = "".join(f"line {i:05d}\n" for i in range(2000)) + "FAILED: 3 errors\n"
    registry = ToolRegistry(max_result_chars=1000)
    registry.register(_tool(handler=_flood(big)))

    result = await _run(registry, context, "echo")

    assert len(result.content) <= 1000
    assert result.content.startswith("line 00000\n")
    assert result.content.endswith("FAILED: 3 errors\n")


async def test_error_results_are_capped_too(context: ToolContext) -> None:
    async def loud(_: dict[str, Any], __: ToolContext) -> str:
        raise ToolError("e" * 5000)

    registry = ToolRegistry(max_result_chars=1000)
    registry.register(_tool(handler=loud))

    result = await _run(registry, context, "echo")

    assert result.is_error
    assert len(result.content) <= 1000


async def test_a_per_call_cap_overrides_the_registry_cap(context: ToolContext) -> None:
    text = "z" * 3000
    registry = ToolRegistry(max_result_chars=1000)
    registry.register(_tool(handler=_flood(text)))
    use = ToolUseBlock("c", "echo", {})

    wider = await registry.run(use, context, max_chars=5000)
    narrower = await registry.run(use, context, max_chars=500)
    default = await registry.run(use, context, max_chars=None)

    assert wider.content == text
    assert len(narrower.content) <= 500
    assert 500 < len(default.content) <= 1000


async def test_a_non_positive_per_call_cap_is_a_caller_bug(context: ToolContext) -> None:
    called = False

    async def handler(_: dict[str, Any], __: ToolContext) -> str:
        nonlocal called
        called = True
        return "ran"

    registry = ToolRegistry()
    registry.register(_tool(handler=handler))

    with pytest.raises(ValueError, match="max_chars"):
        await registry.run(ToolUseBlock("c", "echo", {}), context, max_chars=0)
    assert not called


def test_text_within_the_cap_is_untouched() -> None:
    text = "x" * 100

    assert truncate_result(text, 100) is text


def test_the_old_name_is_the_shared_policy() -> None:
    assert truncate_result is truncate_tool_result


def test_without_a_newline_near_the_end_the_cut_is_exact() -> None:
    text = "a\n" + "b" * 5000

    out = truncate_result(text, 1000)

    head, omitted = _notice(out)
    assert len(head) > 900
    assert text.startswith(head.removesuffix("\n"))
    assert omitted == len(text) - len(head.removesuffix("\n"))


@given(st.text(alphabet="ab\n ", max_size=3000), st.integers(min_value=60, max_value=2000))
def test_truncation_keeps_a_prefix_within_the_cap(text: str, max_chars: int) -> None:
    out = truncate_result(text, max_chars)

    assert len(out) <= max_chars
    if len(text) <= max_chars:
        assert out == text
    else:
        head, omitted = _notice(out)
        assert text.startswith(head)
        assert omitted == len(text) - len(head)
