"""AiohttpRequest: python-telegram-bot's requests on aiohttp, through the real ``Bot``.

A small aiohttp server on 127.0.0.1 (port 0) stands in for the Bot API where the
strict fake has no say (multipart uploads, downloads, a server that never answers);
the channel's own tests run every other call through it against the fake.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import BodyPartReader, web
from telegram import Bot, ReplyParameters
from telegram.error import BadRequest, NetworkError, TimedOut

from parley.channels.telegram_http import AiohttpRequest

TOKEN = "123:abc"
WAIT = 10.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def message(text: str = "") -> dict[str, Any]:
    return {
        "message_id": 7,
        "date": 0,
        "chat": {"id": 42, "type": "private"},
        "text": text,
        "document": {"file_id": "f1", "file_unique_id": "u1", "file_name": "notes.txt"},
    }


class Api:
    """Records each request; answers with ``handler``."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.handler: Handler = self.ok
        self.release = asyncio.Event()

    async def ok(self, request: web.Request) -> web.StreamResponse:
        record: dict[str, Any] = {
            "path": request.path,
            "method": request.method,
            "content_type": request.content_type,
            "user_agent": request.headers.get("User-Agent", ""),
            "host": request.host,
            "proxy_authorization": request.headers.get("Proxy-Authorization"),
        }
        if request.content_type == "multipart/form-data":
            parts: dict[str, Any] = {}
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                assert isinstance(part, BodyPartReader)  # no nested multipart here
                parts[part.name or ""] = (part.filename, bytes(await part.read()))
            record["parts"] = parts
        elif request.method == "POST":
            record["form"] = dict(await request.post())
        self.seen.append(record)
        if request.path.startswith("/file/"):
            return web.Response(body=b"the file's bytes")
        if request.path.endswith("/getMe"):
            me = {"id": 123, "is_bot": True, "first_name": "B", "username": "b_bot"}
            return web.json_response({"ok": True, "result": me})
        return web.json_response({"ok": True, "result": message()})

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        # Bot start-up (getMe) is always answered: the tests are about sendMessage.
        if request.path.endswith("/sendMessage"):
            return await self.handler(request)
        return await self.ok(request)


@pytest.fixture
async def api() -> AsyncIterator[tuple[Api, str]]:
    state = Api()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.dispatch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        state.release.set()
        await runner.cleanup()


def bot_on(base: str, request: AiohttpRequest) -> Bot:
    return Bot(TOKEN, base_url=f"{base}/bot", base_file_url=f"{base}/file/bot", request=request)


async def test_a_message_goes_as_a_form_with_ptbs_user_agent(api: tuple[Api, str]) -> None:
    state, base = api
    async with bot_on(base, AiohttpRequest(4)) as bot:
        sent = await bot.send_message(
            42, "héllo ✓", parse_mode="HTML", reply_parameters=ReplyParameters(5)
        )
    assert sent.message_id == 7
    [seen] = [s for s in state.seen if s["path"].endswith("/sendMessage")]
    assert seen["content_type"] == "application/x-www-form-urlencoded"
    assert seen["form"]["chat_id"] == "42"
    assert seen["form"]["text"] == "héllo ✓"
    assert seen["form"]["parse_mode"] == "HTML"
    assert json.loads(seen["form"]["reply_parameters"]) == {"message_id": 5}
    assert "python-telegram-bot" in seen["user_agent"]


async def test_a_file_goes_as_multipart_with_its_name(api: tuple[Api, str]) -> None:
    state, base = api
    async with bot_on(base, AiohttpRequest(2)) as bot:
        await bot.send_document(42, document=b"line one\n", filename="notes.txt", caption="x")
    [seen] = [s for s in state.seen if s["path"].endswith("/sendDocument")]
    assert seen["content_type"] == "multipart/form-data"
    assert seen["parts"]["chat_id"] == (None, b"42")
    assert seen["parts"]["caption"] == (None, b"x")
    assert seen["parts"]["document"] == ("notes.txt", b"line one\n")


async def test_a_download_is_a_get_of_the_file_url(api: tuple[Api, str]) -> None:
    state, base = api
    async with AiohttpRequest(1) as request:
        data = await request.retrieve(f"{base}/file/bot{TOKEN}/documents/notes.txt")
    assert data == b"the file's bytes"
    assert state.seen[-1]["method"] == "GET"


async def test_an_error_answer_is_ptbs_error(api: tuple[Api, str]) -> None:
    state, base = api

    async def refuse(request: web.Request) -> web.StreamResponse:
        body = {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"}
        return web.json_response(body, status=400)

    state.handler = refuse
    async with bot_on(base, AiohttpRequest(1)) as bot:
        with pytest.raises(BadRequest, match=r"(?i)chat not found"):
            await bot.send_message(42, "x")


async def test_a_server_that_does_not_answer_in_time_is_a_timeout(api: tuple[Api, str]) -> None:
    state, base = api

    async def hang(request: web.Request) -> web.StreamResponse:
        await state.release.wait()
        return web.json_response({"ok": True, "result": message()})

    state.handler = hang
    async with bot_on(base, AiohttpRequest(1, read_timeout=0.2)) as bot:
        async with asyncio.timeout(WAIT):
            with pytest.raises(TimedOut):
                await bot.send_message(42, "x")


async def test_a_full_pool_times_out_waiting_and_sends_nothing(api: tuple[Api, str]) -> None:
    state, base = api
    arrived = asyncio.Event()
    texts: list[str] = []

    async def hold(request: web.Request) -> web.StreamResponse:
        texts.append(str((await request.post())["text"]))
        arrived.set()
        await state.release.wait()
        return web.json_response({"ok": True, "result": message()})

    state.handler = hold
    # aiohttp counts the wait for a connection into the connect limit: 0.5 s here.
    request = AiohttpRequest(1, pool_timeout=0.2, connect_timeout=0.3, read_timeout=WAIT)
    async with bot_on(base, request) as bot:
        first = asyncio.create_task(bot.send_message(42, "first"))
        async with asyncio.timeout(WAIT):
            await arrived.wait()
            with pytest.raises(TimedOut):
                await bot.send_message(42, "second")  # the one connection is taken
        state.release.set()
        async with asyncio.timeout(WAIT):
            await first
    assert texts == ["first"]  # the second never reached the server


async def test_a_proxy_from_the_environment_carries_the_request_and_its_credentials(
    api: tuple[Api, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The local server plays the proxy: a request for a host that does not resolve
    # can reach the "Bot API" only through it.
    state, base = api
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # the other scheme's: unused
    monkeypatch.setenv("HTTP_PROXY", base.replace("http://", "http://ann:s3cret@"))
    async with bot_on("http://api.telegram.invalid", AiohttpRequest(2)) as bot:
        await bot.send_message(42, "through the proxy")
        await bot.send_message(42, "and again")
    sent = [s for s in state.seen if s["path"].endswith("/sendMessage")]
    assert [s["form"]["text"] for s in sent] == ["through the proxy", "and again"]
    assert {s["host"] for s in sent} == {"api.telegram.invalid"}
    assert {s["proxy_authorization"] for s in sent} == {"Basic YW5uOnMzY3JldA=="}


async def test_an_https_request_tunnels_with_the_credentials_on_its_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A proxy that reads the CONNECT and refuses it: what it saw is the assertion.
    seen: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://ann:s3cret@127.0.0.1:{port}")
    try:
        async with AiohttpRequest(1) as request:
            with pytest.raises(NetworkError):
                await request.post(f"https://api.telegram.invalid/bot{TOKEN}/getMe")
    finally:
        server.close()
        await server.wait_closed()
    [connect] = seen
    assert connect.startswith(b"CONNECT api.telegram.invalid:443 ")
    assert b"Proxy-Authorization: Basic YW5uOnMzY3JldA==" in connect


async def test_all_proxy_is_taken_and_no_proxy_goes_direct(
    api: tuple[Api, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, base = api
    monkeypatch.setenv("ALL_PROXY", base)
    async with bot_on("http://api.telegram.invalid", AiohttpRequest(1)) as bot:
        await bot.send_message(42, "via all_proxy")
    assert state.seen[-1]["host"] == "api.telegram.invalid"
    assert state.seen[-1]["proxy_authorization"] is None
    # NO_PROXY (127.0.0.1, set for every test) wins: with every proxy pointing at a
    # closed port, the request still arrives, straight.
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    async with bot_on(base, AiohttpRequest(1)) as bot:
        await bot.send_message(42, "direct")
    assert state.seen[-1]["form"]["text"] == "direct"


async def test_percent_encoded_credentials_and_a_proxy_without_a_scheme(
    api: tuple[Api, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, base = api
    host_port = base.removeprefix("http://")
    monkeypatch.setenv("HTTP_PROXY", f"ann%40home:p%3As%20s@{host_port}")  # no scheme: http
    async with bot_on("http://api.telegram.invalid", AiohttpRequest(1)) as bot:
        await bot.send_message(42, "through the proxy")
    expected = "Basic " + base64.b64encode(b"ann@home:p:s s").decode()
    assert state.seen[-1]["host"] == "api.telegram.invalid"
    assert state.seen[-1]["proxy_authorization"] == expected


async def test_a_proxy_aiohttp_cannot_use_is_refused_and_a_socks_all_proxy_passed_over(
    api: tuple[Api, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state, base = api
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("HTTP_PROXY", "socks5://127.0.0.1:9")
    async with AiohttpRequest(1) as request:
        for _ in range(2):  # refused the same way each time, nothing sent
            with pytest.raises(NetworkError, match="only http:// proxies"):
                await request.post(f"{base}/bot{TOKEN}/getMe")
    assert state.seen == []

    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.setenv("ALL_PROXY", "socks5h://127.0.0.1:9")  # set for other tools
    async with AiohttpRequest(1) as request:
        await request.post(f"{base}/bot{TOKEN}/getMe")
    assert state.seen[-1]["path"].endswith("/getMe")
    assert "ALL_PROXY is a socks5h proxy" in caplog.text


async def test_no_proxy_names_a_host_and_port(
    api: tuple[Api, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, base = api
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, base.removeprefix("http://"))
    async with bot_on(base, AiohttpRequest(1)) as bot:
        await bot.send_message(42, "straight to the port NO_PROXY names")
    assert state.seen[-1]["form"]["text"] == "straight to the port NO_PROXY names"


async def test_a_refused_connection_is_a_network_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens there now.
    async with AiohttpRequest(1) as request:
        async with asyncio.timeout(WAIT):
            with pytest.raises(NetworkError, match="aiohttp"):
                await request.post(f"http://127.0.0.1:{port}/bot{TOKEN}/getMe")


async def test_a_closed_request_refuses_and_starts_again() -> None:
    request = AiohttpRequest(1)
    with pytest.raises(RuntimeError, match="not initialized"):
        await request.do_request("http://127.0.0.1:9/x", "GET")
    await request.initialize()
    await request.shutdown()
    await request.shutdown()  # twice is fine
    with pytest.raises(RuntimeError, match="not initialized"):
        await request.do_request("http://127.0.0.1:9/x", "GET")
    with pytest.raises(ValueError, match="pool"):
        AiohttpRequest(0)
