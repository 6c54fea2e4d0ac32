"""Property-based runs of the admin API against its own OpenAPI document (schemathesis).

Positive run: for every operation the document lists, hypothesis draws schema-valid
requests (with the valid bearer token) and each response must not be a 5xx, must have a
documented status code and content type, and must match the documented response schema.
Negative run: requests that violate the document must never get a 5xx.

Event loop and threads: the `admin_server` fixture serves from this test's event loop,
while schemathesis' `case.call` is synchronous (`requests`). Calling it on the loop would
block the very loop that must answer it (a deadlock until the request times out). So each
operation's whole hypothesis run executes in a worker thread via `asyncio.to_thread`: the
loop stays free to serve while it awaits the thread, and only one thread talks to the
server at a time, so runs stay repeatable. (schemathesis' ASGI/WSGI transports do not
apply: the admin API is an aiohttp app, and a real loopback socket also covers the
middlewares and aiohttp's own request parsing.)
"""

from __future__ import annotations

import asyncio
import collections
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

import parley.gateway.admin

MAX_EXAMPLES = 25

CONFORMANCE = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]
NO_SERVER_ERROR = [schemathesis.checks.not_a_server_error]

STATIC_FILES = sorted(
    p.name for p in (Path(parley.gateway.admin.__file__).parent / "static").iterdir()
)

RESET = ("POST", "/api/sessions/{id}/reset")
COMPACT = ("POST", "/api/sessions/{id}/compact")

# GET /chat/ws succeeds only with 101 Switching Protocols, which a plain HTTP request
# cannot get: it is fuzzed like the rest (no 5xx, documented status and body), but is
# exempt from the "succeeded at least once" guard.
NO_PLAIN_HTTP_SUCCESS = {"GET /chat/ws"}

# Operations left out of the negative run, each because its document leaves nothing to
# violate: GET /static/{name} takes any string as its one (path) parameter, so hypothesis
# could draw no invalid request at all (it reports Unsatisfiable). Operations without
# parameters or a body are left out for the same reason, by the filter in the test.
NOTHING_TO_VIOLATE = {("GET", "/static/{name}")}


@dataclass
class Step:
    operation: Any  # schemathesis APIOperation
    mode: GenerationMode
    checks: list[Any]
    max_examples: int = MAX_EXAMPLES
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.operation.label}{self.note}"


def _key(operation: Any) -> tuple[str, str]:
    return (operation.method.upper(), operation.path)


def _describe(exc: BaseException) -> str:
    """A failure as text. Schemathesis' own group renders every check that failed, with a
    curl command; hypothesis wraps several distinct failures in a plain group."""
    if isinstance(exc, FailureGroup):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup):
        return "\n".join(_describe(sub) for sub in exc.exceptions)
    return "".join(traceback.format_exception_only(exc)).strip()


async def _load_operations(base_url: str, token: str) -> list[Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{base_url}/api/openapi.json", headers={"Authorization": f"Bearer {token}"}
        ) as response,
    ):
        assert response.status == 200, await response.text()
        document = await response.json()
    # An explicit default config: no schemathesis.toml found up the tree changes the run.
    schema = schemathesis.openapi.from_dict(document, config=SchemathesisConfig())
    schema.validate()  # the document itself is valid OpenAPI 3.1
    # An operation schemathesis cannot read fails here (`ok()` raises), none is dropped.
    operations = [result.ok() for result in schema.get_all_operations()]
    keys = {_key(op) for op in operations}
    assert {RESET, COMPACT} <= keys, "the ordering below refers to operations that are gone"
    return sorted(operations, key=lambda op: (op.path, op.method.upper()))


def _fuzz(step: Step, base_url: str, auth: dict[str, str], session_id: str) -> dict[int, int]:
    """One operation's hypothesis run; synchronous, meant for a worker thread."""
    statuses: collections.Counter[int] = collections.Counter()
    operation = step.operation

    def strategy(**fixed: str) -> st.SearchStrategy[Any]:
        return operation.as_strategy(step.mode, headers=auth, path_parameters=fixed or None)

    # Generated path parameters almost never name something that exists, so they would
    # only exercise the 404 branch: draw real ones too (the fixture's session, the files).
    options = [strategy()]
    if "{id}" in operation.path:
        options.insert(0, strategy(id=session_id))
    if "{name}" in operation.path:
        options[:0] = [strategy(name=name) for name in STATIC_FILES]

    @settings(
        max_examples=step.max_examples,
        deadline=None,
        derandomize=True,  # the same examples on every run: a CI failure reproduces locally
        database=None,  # nothing written to .hypothesis/
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=st.one_of(*options))
    def run(case: Any) -> None:
        with requests.Session() as http:
            response = case.call(base_url=base_url, session=http, headers=auth)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=step.checks)

    run()
    return dict(sorted(statuses.items()))


async def _run(world: Any, steps: list[Step]) -> dict[str, dict[int, int]]:
    """Every step in order; all failures reported together, with the statuses seen."""
    auth = {"Authorization": f"Bearer {world.token}"}
    failures: list[str] = []
    seen: dict[str, dict[int, int]] = {}
    for step in steps:
        try:
            seen[step.label] = await asyncio.to_thread(
                _fuzz, step, world.base_url, auth, world.session_id
            )
        # FailureGroup (and hypothesis' group around several) is a BaseExceptionGroup.
        except (Exception, BaseExceptionGroup) as exc:
            seen[step.label] = {}
            failures.append(f"{step.label}:\n{_describe(exc)}")
    report = "\n".join(f"  {label}: {statuses}" for label, statuses in seen.items())
    if failures:
        pytest.fail("\n\n".join(failures) + f"\n\nstatuses seen:\n{report}", pytrace=False)
    return seen


async def test_valid_requests_get_documented_answers(admin_server: Any) -> None:
    operations = await _load_operations(admin_server.base_url, admin_server.token)
    by_key = {_key(op): op for op in operations}
    # Compact and reset change the fixture session, so they run after everything else, and
    # reset (which archives it) last of all. Then the session operations run once more,
    # briefly, against the archived session: compact must answer 409 there, the reads
    # must still conform.
    first = [op for op in operations if _key(op) not in (COMPACT, RESET)]
    steps = [Step(op, GenerationMode.POSITIVE, CONFORMANCE) for op in first]
    steps += [
        Step(by_key[COMPACT], GenerationMode.POSITIVE, CONFORMANCE),
        Step(by_key[RESET], GenerationMode.POSITIVE, CONFORMANCE),
    ]
    steps += [
        Step(op, GenerationMode.POSITIVE, CONFORMANCE, max_examples=10, note=" (archived)")
        for op in operations
        if "{id}" in op.path and _key(op) != RESET
    ]
    seen = await _run(admin_server, steps)

    # Guard against a vacuous pass (say, every request answered 401, which is documented):
    # every operation must have succeeded at least once in its main run.
    never_ok = [
        step.label
        for step in steps
        if not step.note
        and step.label not in NO_PLAIN_HTTP_SUCCESS
        and not any(200 <= status < 300 for status in seen[step.label])
    ]
    assert not never_ok, f"never a 2xx: {never_ok}\nstatuses seen: {seen}"
    assert seen[by_key[RESET].label].get(200) == 1  # archived once, then 409 / 404
    archived = seen[f"{by_key[COMPACT].label} (archived)"]
    assert archived.get(409), f"compact of an archived session: {archived}"


async def test_invalid_requests_never_get_a_server_error(admin_server: Any) -> None:
    # Only operations with something to violate: without parameters or a body, negative
    # generation has nothing to draw from (hypothesis would report Unsatisfiable). The
    # token header is always the valid one (a wrong token is covered by the auth tests).
    operations = await _load_operations(admin_server.base_url, admin_server.token)
    assert {_key(op) for op in operations} >= NOTHING_TO_VIOLATE
    steps = [
        Step(op, GenerationMode.NEGATIVE, NO_SERVER_ERROR)
        for op in sorted(operations, key=lambda op: _key(op) == RESET)  # reset last
        if (op.path_parameters or op.query or op.body) and _key(op) not in NOTHING_TO_VIOLATE
    ]
    assert steps
    await _run(admin_server, steps)
