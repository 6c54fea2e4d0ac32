"""Property-based run of the admin API against its own OpenAPI document (schemathesis).

For every operation the document lists, hypothesis draws schema-valid requests (with the
valid bearer token) and each response must: not be a 5xx, have a documented status code,
have a documented content type, and match the documented response schema.

Event loop and threads: the `admin_server` fixture serves from this test's event loop,
while schemathesis' `case.call` is synchronous (`requests`). Calling it on the loop would
block the very loop that must answer it (a deadlock until the request times out). So each
operation's whole hypothesis run executes in a worker thread via `asyncio.to_thread`: the
loop stays free to serve while it awaits the thread, and only one thread talks to the
server at a time, so runs stay repeatable. (schemathesis' ASGI/WSGI transports do not
apply: the admin API is an aiohttp app, and going through a real loopback socket also
covers the middlewares and aiohttp's own parsing.)
"""

from __future__ import annotations

import asyncio
import collections
import traceback
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

import gateway.admin

MAX_EXAMPLES = 25

STATIC_FILES = sorted(p.name for p in (Path(gateway.admin.__file__).parent / "static").iterdir())

# GET /chat/ws succeeds only with 101 Switching Protocols, which a plain HTTP request
# cannot get: it is fuzzed like the rest (no 5xx, documented status and body), but is
# exempt from the "succeeded at least once" guard at the end.
NO_PLAIN_HTTP_SUCCESS = {"GET /chat/ws"}

CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]

HYPOTHESIS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI failures reproduce locally
    database=None,  # nothing written to .hypothesis/
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# Operations that change the fixture session run after every other one. Reset archives
# the session, after which compact answers 409 and the read-only session operations
# would see only an archived session; so compact runs before reset, and reset last.
LAST = {("POST", "/api/sessions/{id}/compact"): 1, ("POST", "/api/sessions/{id}/reset"): 2}


def _order(operation: Any) -> tuple[int, str, str]:
    key = (operation.method.upper(), operation.path)
    return (LAST.get(key, 0), operation.path, operation.method.upper())


def _describe(exc: BaseException) -> str:
    """A failure as text. Schemathesis' own group renders every check that failed, with a
    curl command; hypothesis wraps several distinct failures in a plain group."""
    if isinstance(exc, FailureGroup):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup):
        return "\n".join(_describe(sub) for sub in exc.exceptions)
    return "".join(traceback.format_exception_only(exc)).strip()


async def _fetch_document(base_url: str, token: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{base_url}/api/openapi.json", headers={"Authorization": f"Bearer {token}"}
        ) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


def _fuzz_operation(
    operation: Any,
    base_url: str,
    auth: dict[str, str],
    session_id: str,
    statuses: collections.Counter[int],
) -> None:
    """Run hypothesis for one operation; synchronous, meant for a worker thread."""
    strategy = operation.as_strategy(headers=auth)
    # Generated path parameters almost never name something that exists, so they would only
    # exercise the 404 branch: draw real ones too (the fixture's session, the shipped files).
    real: dict[str, list[str]] = {"{id}": [session_id], "{name}": STATIC_FILES}
    for placeholder, values in real.items():
        if placeholder in operation.path:
            name = placeholder.strip("{}")
            existing = [
                operation.as_strategy(headers=auth, path_parameters={name: value})
                for value in values
            ]
            strategy = st.one_of(*existing, strategy)

    @HYPOTHESIS
    @given(case=strategy)
    def run(case: Any) -> None:
        with requests.Session() as http:
            response = case.call(base_url=base_url, session=http, headers=auth)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    run()


async def test_every_operation_conforms_to_the_openapi_document(admin_server: Any) -> None:
    base_url = admin_server.base_url
    auth = {"Authorization": f"Bearer {admin_server.token}"}
    document = await _fetch_document(base_url, admin_server.token)

    # An explicit default config: no schemathesis.toml found up the tree changes this run.
    schema = schemathesis.openapi.from_dict(document, config=SchemathesisConfig())
    schema.validate()  # the document itself is valid OpenAPI

    operations = []
    for result in schema.get_all_operations():
        operations.append(result.ok())  # an operation schemathesis cannot read fails here
    assert operations, "the document lists no operations"
    operations.sort(key=_order)
    documented = {(op.method.upper(), op.path) for op in operations}
    assert set(LAST) <= documented, (
        f"ordering refers to unknown operations: {set(LAST) - documented}"
    )

    failures: list[str] = []
    seen: dict[str, collections.Counter[int]] = {}
    for operation in operations:
        statuses: collections.Counter[int] = collections.Counter()
        seen[operation.label] = statuses
        try:
            await asyncio.to_thread(
                _fuzz_operation, operation, base_url, auth, admin_server.session_id, statuses
            )
        # FailureGroup (and hypothesis' group around several) is a BaseExceptionGroup.
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"{operation.label}:\n{_describe(exc)}")
    report = "\n".join(f"  {label}: {dict(sorted(c.items()))}" for label, c in seen.items())
    if failures:
        pytest.fail("\n\n".join(failures) + f"\n\nstatuses seen:\n{report}", pytrace=False)
    # Guard against a vacuous pass (say, every request answered 401 and 401 is documented):
    # every operation must have succeeded at least once.
    never_ok = [
        label
        for label, c in seen.items()
        if label not in NO_PLAIN_HTTP_SUCCESS and not any(200 <= s < 300 for s in c)
    ]
    assert not never_ok, f"never a 2xx: {never_ok}\nstatuses seen:\n{report}"
