"""The web chat through the whole gateway: token on the upgrade, routing, commands."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.gateway.admin.conftest import AdminWorld

PROTOCOL = "parley.chat.v1"


async def _connect(
    session: aiohttp.ClientSession, world: AdminWorld, client_id: str, token: str | None = None
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(
        world.url("/chat/ws"), protocols=(PROTOCOL, f"bearer.{token or world.token}")
    )
    await ws.send_json({"type": "hello", "client_id": client_id, "name": "Web Wendy"})
    assert (await ws.receive_json(timeout=5)) == {"type": "ready", "client_id": client_id}
    return ws


async def _until(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    while True:
        frame = await ws.receive_json(timeout=10)
        if frame["type"] == kind:
            return frame


async def test_the_upgrade_needs_the_token(admin_server: AdminWorld) -> None:
    async with aiohttp.ClientSession() as session:
        for protocols in ((PROTOCOL,), (PROTOCOL, "bearer." + "x" * 43)):
            try:
                await session.ws_connect(admin_server.url("/chat/ws"), protocols=protocols)
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 401
            else:
                raise AssertionError(f"upgraded without the right token: {protocols}")


async def test_a_web_message_is_a_session_with_commands(admin_server: AdminWorld) -> None:
    gateway = admin_server.gateway
    async with aiohttp.ClientSession() as session:
        ws = await _connect(session, admin_server, "browser-1")
        await ws.send_json({"type": "message", "id": "m1", "text": "hello from the web"})
        assert (await _until(ws, "ack"))["id"] == "m1"
        reply = await _until(ws, "reply")
        assert reply["text"] == "echo: hello from the web" and reply["reply_to"] == "m1"
        record = await gateway.registry.get_active("agent:main:web:direct:browser-1")
        assert record is not None and record.display_name == "Web Wendy"
        # The same id again (a resend after a reconnect) is acknowledged, not answered twice.
        await ws.send_json({"type": "message", "id": "m1", "text": "hello from the web"})
        assert (await _until(ws, "ack"))["id"] == "m1"
        await ws.send_json({"type": "message", "id": "m2", "text": "/status"})
        status = await _until(ws, "reply")
        assert status["reply_to"] == "m2" and "scripted-model" in status["text"]
        await ws.send_json({"type": "message", "id": "m3", "text": "/new"})
        started = await _until(ws, "reply")
        assert started["text"].startswith("Started a new session")
        await ws.close()
    archived = await gateway.registry.get(record.session_id)
    assert archived is not None and archived.status == "archived"
    requests = [r for r in admin_server.provider.requests if "hello from the web" in str(r)]
    assert len(requests) == 1


async def test_hostile_text_is_kept_safely(admin_server: AdminWorld) -> None:
    text = "lone \ud800 surrogate, bidi \u202e and NUL \x00 end"
    async with aiohttp.ClientSession() as session:
        ws = await _connect(session, admin_server, "browser-2")
        await ws.send_str(
            '{"type": "message", "id": "h1", "text": "lone \\ud800 surrogate, '
            'bidi \\u202e and NUL \\u0000 end"}'
        )
        assert (await _until(ws, "ack"))["id"] == "h1"
        reply = await _until(ws, "reply")
        await ws.close()
    assert reply["reply_to"] == "h1" and "surrogate" in reply["text"]
    async with aiohttp.ClientSession(headers=admin_server.headers) as session:
        url = admin_server.url("/api/sessions")
        async with session.get(url, params={"channel": "web"}) as response:
            (item,) = (await response.json())["items"]
        async with session.get(admin_server.url(f"/api/sessions/{item['id']}/transcript")) as r:
            assert r.status == 200
            entries = (await r.json())["items"]
    said = entries[0]["message"]["content"][0]["text"]
    # The surrogate and the NUL (no store can hold either) cost a character each.
    assert said == text.replace("\ud800", "\ufffd").replace("\x00", "\ufffd")
