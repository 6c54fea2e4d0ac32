"""The HTTP server's connection limits (gateway.http_limits) against the real gateway:
silent, half-sent, idle and slow-body connections are closed on their deadlines; past
the connection cap (or the descriptor limit) /health still answers; open web chat
websockets are exempt. Timeouts are short and every wait ends on something observed
(the server closing the socket), with generous overall bounds."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from parley.gateway.config import HttpConfig, load_config
from parley.gateway.errors import ConfigFileError
from parley.gateway.http_limits import (
    BASE_RESERVED_FDS,
    MIN_CONNECTIONS,
    connection_budget,
    reserved_descriptors,
)
from tests.gateway.admin.conftest import AdminWorld, admin_world
from tests.gateway.memory_helpers import use_hashing_embedder

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = "parley.chat.v1"
SHORT = 0.5  # the deadline under test
LONG = "30"  # the deadlines not under test: far longer than any wait below
WAIT = 15.0  # an overall bound on any one wait
NO_SESSION = "0" * 32  # well-formed, unknown: 404 once the body is read
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(autouse=True)
def _embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    use_hashing_embedder(monkeypatch)


async def _no_seed(world: AdminWorld) -> str:
    return ""


@asynccontextmanager
async def served(tmp_path: Path, **http: object) -> AsyncIterator[AdminWorld]:
    """The gateway with ``[http]`` fields set (the rest of its deadlines long)."""
    fields = {
        "header_timeout_seconds": LONG,
        "body_timeout_seconds": LONG,
        "keepalive_timeout_seconds": LONG,
        **{k: str(v) for k, v in http.items()},
    }
    env = {f"PARLEY_HTTP__{k.upper()}": v for k, v in fields.items()}
    async with admin_world(tmp_path / "home", _no_seed, **env) as world:
        yield world


def _port(world: AdminWorld) -> int:
    assert world.gateway.http is not None
    return world.gateway.http.port


def _stats(world: AdminWorld) -> dict[str, int]:
    assert world.gateway.http is not None
    return world.gateway.http.connection_stats


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (within WAIT)."""
    received = bytearray()
    async with asyncio.timeout(WAIT):
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return bytes(received)


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response (status, body) on a kept-alive connection."""
    async with asyncio.timeout(WAIT):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        return int(lines[0].split()[1]), await reader.readexactly(length)


def _close(writer: asyncio.StreamWriter) -> None:
    with suppress(Exception):
        writer.close()


# -- deadlines ---------------------------------------------------------------------------


async def test_a_silent_socket_is_closed_after_the_header_timeout(tmp_path: Path) -> None:
    async with served(tmp_path, header_timeout_seconds=SHORT) as world:
        reader, writer = await _connect(_port(world))
        started = time.monotonic()
        received = await _until_closed(reader)
        elapsed = time.monotonic() - started
        _close(writer)
        assert received == b""  # it asked for nothing: no answer, just closed
        assert SHORT * 0.9 <= elapsed < WAIT
        assert _stats(world)["header_timeouts"] == 1


@pytest.mark.parametrize(
    "sent",
    [b"GET /hea", b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */"],
    ids=["half-a-request-line", "headers-without-their-end"],
)
async def test_a_half_sent_request_gets_408_and_is_closed(tmp_path: Path, sent: bytes) -> None:
    async with served(tmp_path, header_timeout_seconds=SHORT) as world:
        reader, writer = await _connect(_port(world))
        started = time.monotonic()
        writer.write(sent)
        await writer.drain()
        received = await _until_closed(reader)
        elapsed = time.monotonic() - started
        _close(writer)
        assert received.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        body = json.loads(received.split(b"\r\n\r\n", 1)[1])
        assert body["error"] == "request_timeout" and "headers" in body["message"]
        assert SHORT * 0.9 <= elapsed < WAIT
        assert _stats(world)["header_timeouts"] == 1


async def test_dribbled_bytes_do_not_extend_the_header_deadline(tmp_path: Path) -> None:
    """Slow-loris: a byte every 50 ms never completes the headers; the deadline counts
    from the connection opening, whatever arrives after."""
    async with served(tmp_path, header_timeout_seconds=SHORT) as world:
        reader, writer = await _connect(_port(world))
        started = time.monotonic()

        async def dribble() -> None:
            request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"a" * 10_000
            with suppress(ConnectionError):
                for byte in request:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.05)

        sender = asyncio.create_task(dribble())
        try:
            received = await _until_closed(reader)
        finally:
            sender.cancel()
            _close(writer)
        elapsed = time.monotonic() - started
        assert received.startswith(b"HTTP/1.1 408")
        assert SHORT * 0.9 <= elapsed < 10 * SHORT  # not reset by each byte


async def test_an_idle_keep_alive_connection_is_closed_after_the_keepalive_limit(
    tmp_path: Path,
) -> None:
    async with served(
        tmp_path, keepalive_timeout_seconds=SHORT, header_timeout_seconds=10
    ) as world:
        reader, writer = await _connect(_port(world))
        for _ in range(2):  # kept alive between requests while they keep coming
            writer.write(HEALTH)
            await writer.drain()
            status, _body = await _response(reader)
            assert status == 200
        answered = time.monotonic()
        received = await _until_closed(reader)
        elapsed = time.monotonic() - answered
        _close(writer)
        assert received == b""
        # The keep-alive limit, not the (ten-second) header timeout, closed it.
        assert SHORT * 0.9 <= elapsed < 8.0
        stats = _stats(world)
        assert stats["idle_closed"] == 1 and stats["header_timeouts"] == 0


async def test_a_slow_body_is_cut_off_with_408(tmp_path: Path) -> None:
    async with served(tmp_path, body_timeout_seconds=SHORT) as world:
        reader, writer = await _connect(_port(world))
        head = (
            f"POST /api/sessions/{NO_SESSION}/compact HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {world.token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        writer.write(head.encode() + b'{"focus": ')  # 10 of the 100 bytes promised
        await writer.drain()
        started = time.monotonic()
        received = await _until_closed(reader)
        elapsed = time.monotonic() - started
        _close(writer)
        assert received.startswith(b"HTTP/1.1 408 ")
        body = json.loads(received.split(b"\r\n\r\n", 1)[1])
        assert "body did not arrive" in body["message"]
        assert SHORT * 0.9 <= elapsed < WAIT
        assert _stats(world)["body_timeouts"] == 1


async def test_a_body_sent_in_time_is_read(tmp_path: Path) -> None:
    """The body deadline cuts nothing short: a body in two parts within it is served."""
    async with served(tmp_path, body_timeout_seconds=5) as world:
        reader, writer = await _connect(_port(world))
        body = b'{"focus": "x"}'
        head = (
            f"POST /api/sessions/{NO_SESSION}/compact HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {world.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body[:5])
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(body[5:])
        await writer.drain()
        status, answer = await _response(reader)
        _close(writer)
        assert status == 404 and json.loads(answer)["error"] == "not_found"
        assert _stats(world)["body_timeouts"] == 0


# -- the connection cap ------------------------------------------------------------------


async def test_past_the_cap_health_still_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Silent sockets that would live for two minutes: each fresh connection displaces
    the oldest, so /health gets in at once; the shedding is logged once."""
    cap, flood = 8, 60
    caplog.set_level(logging.WARNING, logger="parley.gateway.http")
    async with served(
        tmp_path, max_connections=cap, header_timeout_seconds=120, keepalive_timeout_seconds=120
    ) as world:
        port = _port(world)
        silent = [await _connect(port) for _ in range(flood)]
        started = time.monotonic()
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                world.url("/health"), timeout=aiohttp.ClientTimeout(total=WAIT)
            ) as response,
        ):
            assert response.status == 200
        latency = time.monotonic() - started
        assert latency < 3.0
        # The oldest were closed, in order, to make room.
        shed = flood + 1 - cap
        for reader, _writer in silent[:shed]:
            assert await _until_closed(reader) == b""
        stats = _stats(world)
        assert stats["shed"] >= shed and stats["open"] <= cap and stats["refused"] == 0
        for _reader, writer in silent:
            _close(writer)
    warnings = [r for r in caplog.records if "connection cap" in r.getMessage()]
    assert len(warnings) == 1  # at most once a minute, however many were shed


async def test_at_the_cap_with_every_connection_busy_a_new_one_is_refused(
    tmp_path: Path,
) -> None:
    """Open websockets are busy, not idle: they are never shed; a newcomer gets 503."""
    async with served(tmp_path, max_connections=2) as world, aiohttp.ClientSession() as session:
        sockets = [await _chat(session, world, f"tab-{i}") for i in range(2)]
        reader, writer = await _connect(_port(world))
        received = await _until_closed(reader)
        _close(writer)
        assert received.startswith(b"HTTP/1.1 503 ")
        assert b"Retry-After: 1" in received
        assert _stats(world)["refused"] == 1
        for i, ws in enumerate(sockets):
            await _talk(ws, f"tab {i} still here")
            await ws.close()


# -- websockets --------------------------------------------------------------------------


async def _chat(
    session: aiohttp.ClientSession, world: AdminWorld, client_id: str
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(
        world.url("/chat/ws"), protocols=(PROTOCOL, f"bearer.{world.token}")
    )
    await ws.send_json({"type": "hello", "client_id": client_id, "name": "Ada"})
    assert (await ws.receive_json(timeout=WAIT)) == {"type": "ready", "client_id": client_id}
    return ws


async def _talk(ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
    """A message and its reply."""
    message_id = uuid.uuid4().hex
    await ws.send_json({"type": "message", "id": message_id, "text": text})
    while True:
        frame: dict[str, Any] = await ws.receive_json(timeout=WAIT)
        assert frame["type"] != "error", frame
        if frame["type"] == "reply" and frame["reply_to"] == message_id:
            assert frame["text"] == f"echo: {text}"
            return


async def test_an_open_websocket_outlives_the_idle_and_header_limits(tmp_path: Path) -> None:
    async with (
        served(
            tmp_path,
            header_timeout_seconds=SHORT,
            keepalive_timeout_seconds=SHORT,
            body_timeout_seconds=SHORT,
        ) as world,
        aiohttp.ClientSession() as session,
    ):
        ws = await _chat(session, world, "tab-1")
        # Two plain connections opened after it, closed by their deadlines: the
        # websocket has been quiet for longer than either limit since.
        reader, writer = await _connect(_port(world))
        writer.write(HEALTH)
        await writer.drain()
        assert (await _response(reader))[0] == 200
        assert await _until_closed(reader) == b""
        _close(writer)
        reader, writer = await _connect(_port(world))
        assert await _until_closed(reader) == b""
        _close(writer)
        stats = _stats(world)
        assert stats["idle_closed"] == 1 and stats["header_timeouts"] == 1
        assert not ws.closed
        await _talk(ws, "after the idle limit")
        await ws.close()


# -- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("header_timeout_seconds", 0),
        ("header_timeout_seconds", -1),
        ("header_timeout_seconds", math.nan),
        ("header_timeout_seconds", math.inf),
        ("header_timeout_seconds", "soon"),
        ("body_timeout_seconds", 0),
        ("body_timeout_seconds", 3601),
        ("keepalive_timeout_seconds", -5),
        ("keepalive_timeout_seconds", math.inf),
        ("max_connections", 0),
        ("max_connections", -1),
        ("max_connections", 10_000_000),
        ("max_connections", 1.5),
    ],
)
def test_config_rejects_nonsense(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        HttpConfig.model_validate({field: value})


def test_config_errors_name_the_field_and_defaults_are_safe() -> None:
    with pytest.raises(ConfigFileError) as caught:
        load_config(env={"PARLEY_HTTP__MAX_CONNECTIONS": "0"})
    assert [p for p, _ in caught.value.problems] == ["http.max_connections"]
    loaded = load_config(env={"PARLEY_HTTP__HEADER_TIMEOUT_SECONDS": "2.5"})
    assert loaded.config.http.header_timeout_seconds == 2.5
    http = HttpConfig()
    assert http.header_timeout_seconds < http.body_timeout_seconds
    assert http.keepalive_timeout_seconds > 60  # above common load balancers' idle timeouts
    assert http.max_connections == 512


def test_the_connection_cap_fits_the_descriptor_limit() -> None:
    sqlite = reserved_descriptors("sqlite", 256, 10)
    assert sqlite == BASE_RESERVED_FDS + 256
    assert reserved_descriptors("postgres", 256, 10) == BASE_RESERVED_FDS + 12
    # The common default soft limit: 1024 − 384 reserved − 128 backlog = the default cap.
    assert connection_budget(512, sqlite, 1024) == (512, 128)
    assert connection_budget(512, sqlite, 65536) == (512, 128)
    assert connection_budget(512, sqlite, None) == (512, 128)
    cap, backlog = connection_budget(512, 136, 256)
    assert (cap, backlog) == (256 - 136 - 32, 32)
    # Too low to honour the reserve: a small floor keeps the server usable.
    assert connection_budget(512, sqlite, 128)[0] == MIN_CONNECTIONS


# -- the descriptor limit, for real --------------------------------------------------------


async def test_silent_sockets_beyond_the_descriptor_limit_cannot_keep_health_out(
    tmp_path: Path,
) -> None:
    """The incident: a gateway with 256 descriptors, 300 silent sockets (more than it
    could ever hold) and deadlines of two minutes. /health answers at once, and the
    server never ran out of descriptors (asyncio logged no failed accept)."""
    soft, flood = 256, 300
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.gateway.http_limits_child",
        str(tmp_path / "home"),
        str(soft),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    silent: list[asyncio.StreamWriter] = []
    try:
        ready = json.loads(await asyncio.wait_for(child.stdout.readline(), 60))
        assert ready["nofile"] == soft
        cap = ready["max_connections"]
        assert cap < soft // 2  # fitted to the limit, far below the configured 512
        for _ in range(flood):
            _reader, writer = await asyncio.wait_for(_connect(ready["port"]), WAIT)
            silent.append(writer)
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{ready['port']}/health"
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=WAIT)) as response:
                assert response.status == 200
        latency = time.monotonic() - started
        print(f"/health under {flood} silent sockets, cap {cap}: {latency * 1000:.0f} ms")
        assert latency < 3.0
        child.stdin.write(b"stats\n")
        await child.stdin.drain()
        stats = json.loads(await asyncio.wait_for(child.stdout.readline(), WAIT))
        assert stats["accept_errors"] == 0
        assert stats["shed"] >= flood + 1 - cap and stats["open"] <= cap
        assert await asyncio.wait_for(child.wait(), 60) == 0
    finally:
        for writer in silent:
            _close(writer)
        if child.returncode is None:
            child.kill()
            await child.wait()
