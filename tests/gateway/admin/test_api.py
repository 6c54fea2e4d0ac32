"""The admin API against a running gateway on loopback, over real HTTP."""

from __future__ import annotations

import io
import os
import stat
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from parley.core.messages import TextBlock, Usage
from parley.core.providers.base import STOP_END, ProviderResponse
from parley.core.transcript import Transcript
from parley.gateway.admin.api import OPERATIONS
from parley.gateway.admin.auth import resolve_token
from parley.gateway.admin.service import _page, _reading
from parley.gateway.admin.web_app import PAGE_OPERATIONS
from parley.gateway.app import Gateway
from parley.gateway.cli.doctor_checks import _check_http
from parley.gateway.config import load_config
from parley.gateway.errors import AdminServerError, ApiError
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.admin.conftest import FACT, AdminWorld, seed_session

UNKNOWN_ID = "0" * 32


def _api_paths(world: AdminWorld) -> list[tuple[str, str]]:
    """Every authenticated route, with the seeded session's id filled in."""
    routes = [(op.method, op.path) for op in (*OPERATIONS, *PAGE_OPERATIONS) if not op.public]
    routes.append(("GET", "/chat/ws"))
    return [(m, p.replace("{id}", world.session_id)) for m, p in routes]


async def test_every_private_route_needs_the_right_token(admin_server: AdminWorld) -> None:
    wrong = {"Authorization": "Bearer " + "x" * 43}
    paths = _api_paths(admin_server)
    assert len(paths) >= 12
    async with aiohttp.ClientSession(base_url=admin_server.base_url) as session:
        for method, path in paths:
            for headers in ({}, wrong, {"Authorization": admin_server.token}):  # no scheme
                async with session.request(method, path, headers=headers) as response:
                    assert response.status == 401, (method, path, headers)
                    body = await response.json()
                    assert body["error"] == "unauthorized" and body["message"]
                    assert response.headers["WWW-Authenticate"] == "Bearer"
    # Nothing was changed by the refused POSTs.
    record = await admin_server.gateway.registry.get(admin_server.session_id)
    assert record is not None and record.status == "active"


async def test_public_routes_answer_without_a_token(admin_server: AdminWorld) -> None:
    async with aiohttp.ClientSession(base_url=admin_server.base_url) as session:
        async with session.get("/health") as response:
            health = await response.json()
            assert response.status == 200 and health["ready"] is True
            assert set(health["checks"]["channels"]) == {"test", "web"}
        for path in ("/", "/chat", "/static/inspector.js", "/static/style.css"):
            async with session.get(path) as response:
                assert response.status == 200, path
                assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        for path in ("/static/..%2Fapi.py", "/static/nope.js", "/static/index.html"):
            async with session.get(path) as response:
                assert response.status == 404, path
                assert (await response.json())["error"] == "not_found"


async def test_session_list_filters_and_pages(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    ids = {admin_server.session_id}
    for sender in ("bob", "carol", "dave"):
        ids.add(await seed_session(admin_server, sender))
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        async with client.get("/api/sessions", params=params) as response:
            assert response.status == 200
            page = await response.json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    stamps = []
    async with client.get("/api/sessions") as response:
        stamps = [item["updated_at"] for item in (await response.json())["items"]]
    assert stamps == sorted(stamps, reverse=True)
    async with client.get("/api/sessions", params={"q": "CAROL"}) as response:
        found = (await response.json())["items"]
    assert [item["display_name"] for item in found] == ["Carol"]
    async with client.get("/api/sessions", params={"channel": "telegram"}) as response:
        assert (await response.json())["items"] == []
    async with client.get("/api/sessions", params={"agent": "main", "status": "active"}) as r:
        assert len((await r.json())["items"]) == 4
    for bad in ({"limit": "0"}, {"limit": "x"}, {"status": "gone"}, {"cursor": "bm9wZQ"}):
        async with client.get("/api/sessions", params=bad) as response:
            assert response.status == 400, bad
            assert (await response.json())["error"] == "bad_request"


async def test_session_detail_has_counters_and_cache_share(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    async with client.get(f"/api/sessions/{admin_server.session_id}") as response:
        detail = await response.json()
    record = await admin_server.gateway.registry.get(admin_server.session_id)
    assert record is not None
    assert detail["tokens"]["input"] == record.usage.input_tokens > 0
    assert detail["turn_count"] == record.turn_count == 2
    assert detail["cache_read_share"] == 0.0  # the scripted provider reads no cache
    assert detail["window_tokens"] == admin_server.gateway.window_for(record)
    async with client.get("/api/sessions/NOT-AN-ID") as response:
        assert response.status == 400
    async with client.get(f"/api/sessions/{UNKNOWN_ID}/transcript") as response:
        assert response.status == 404
        assert (await response.json())["error"] == "not_found"


async def test_transcript_pages_line_up_with_the_file(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    base = f"/api/sessions/{admin_server.session_id}/transcript"
    items: list[dict] = []
    cursor = None
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        async with client.get(base, params=params) as response:
            page = await response.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [item["index"] for item in items] == list(range(page["total"]))
    kinds = [item["type"] for item in items]
    assert "compaction" in kinds and "custom" in kinds
    blocks = [
        b["type"] for item in items if item["type"] == "message" for b in item["message"]["content"]
    ]
    assert "tool_use" in blocks and "tool_result" in blocks
    texts = [
        b.get("text", "") for i in items if i["type"] == "message" for b in i["message"]["content"]
    ]
    assert any(FACT in text for text in texts)
    async with client.get(base, params={"cursor": "-1"}) as response:
        assert response.status == 400


async def test_context_sections_add_up_to_the_total(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    async with client.get(f"/api/sessions/{admin_server.session_id}/context") as response:
        context = await response.json()
    assert sum(s["tokens"] for s in context["sections"]) == context["total_tokens"]
    kinds = {s["kind"] for s in context["sections"]}
    assert {"system", "file", "tools", "summary", "history"} <= kinds
    files = {s["name"] for s in context["sections"] if s["kind"] == "file"}
    assert "AGENTS.md" in files
    assert context["window_tokens"] == context["report"]["window"] > context["total_tokens"]
    assert context["report"]["history"]["summary_tokens"] > 0


async def test_compactions_list_trigger_tokens_summary_and_ledger(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    async with client.get(f"/api/sessions/{admin_server.session_id}/compactions") as response:
        (item,) = (await response.json())["items"]
    assert item["trigger"] == "manual"
    assert (item["tokens_before"], item["tokens_after"]) == (1200, 400)
    assert item["ledger"] == {"identifiers": ["notes.md"]}


async def test_compact_runs_in_the_lane_and_is_recorded(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    world = admin_server
    # More turns, so there is something to fold into a summary.
    for n in range(6):
        # Usage as a real provider reports it: the engine sizes the context from it.
        reply = ProviderResponse((TextBlock(f"noted {n}"),), STOP_END, Usage(3000 + n * 120, 8))
        world.provider.push(reply)
        await world.gateway.handle_inbound(world.channel.inbound(f"note {n}: " + "words " * 80))
    await world.gateway.wait_idle()
    before = await world.gateway.registry.get(world.session_id)
    assert before is not None
    summary = ProviderResponse((TextBlock("Alice keeps a spare key."),), STOP_END, Usage(9, 6))
    world.provider.responder = lambda request: summary
    url = f"/api/sessions/{world.session_id}/compact"
    async with client.post(url, json={"focus": "the spare key"}) as response:
        result = await response.json()
    assert response.status == 200, result
    assert result["outcome"] == "compacted", result
    assert result["tokens_after"] < result["tokens_before"]
    after = await world.gateway.registry.get(world.session_id)
    assert after is not None and after.compaction_count == before.compaction_count + 1
    async with client.get(f"/api/sessions/{world.session_id}/compactions") as response:
        items = (await response.json())["items"]
    assert len(items) == 2 and items[-1]["trigger"] == "manual"
    # The detail counts them by strategy and trigger, from the transcript.
    async with client.get(f"/api/sessions/{world.session_id}") as response:
        detail = await response.json()
    figures = detail["compactions"]
    assert figures["count"] == 2 and sum(figures["by_strategy"].values()) == 2
    assert figures["by_trigger"] == dict(Counter(item["trigger"] for item in items))
    assert (figures["last_tokens_before"], figures["last_tokens_after"]) == (
        result["tokens_before"],
        result["tokens_after"],
    )
    window = detail["window_tokens"]
    assert detail["context_utilisation"] == round(after.context_tokens / window, 4)
    asked = world.provider.requests[-1]
    assert "the spare key" in asked.system + "".join(m.text for m in asked.messages)
    for body in (b"{", b"[]", b'{"focus": 3}', b'{"other": 1}'):
        headers = {"Content-Type": "application/json"}
        async with client.post(url, data=body, headers=headers) as response:
            assert response.status == 400, body
    async with client.post(url, data=b"x", headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 415


async def test_reset_archives_and_the_next_message_starts_a_new_session(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    world = admin_server
    async with client.post(f"/api/sessions/{world.session_id}/reset") as response:
        assert response.status == 200
        assert (await response.json())["status"] == "archived"
    record = await world.gateway.registry.get(world.session_id)
    assert record is not None and record.status == "archived"
    assert record.archived_reason == "admin"
    async with client.get(f"/api/sessions/{world.session_id}/transcript") as response:
        last = (await response.json())["items"][-1]
    assert last["type"] == "custom" and last["custom_type"] == "reset"
    assert last["data"] == {"reason": "admin"}
    async with client.post(f"/api/sessions/{world.session_id}/reset") as response:
        assert response.status == 409
    async with client.post(f"/api/sessions/{world.session_id}/compact") as response:
        assert response.status == 409
    sent = len(world.channel.sent)
    await world.gateway.handle_inbound(world.channel.inbound("hello again"))
    await world.channel.wait_sent(sent + 1)
    async with client.get("/api/sessions", params={"status": "active", "q": "alice"}) as r:
        (fresh,) = (await r.json())["items"]
    assert fresh["id"] != world.session_id and fresh["turn_count"] == 1


async def test_oversized_bodies_are_refused_with_json(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    url = f"/api/sessions/{admin_server.session_id}/compact"
    body = b'{"focus": "' + b"a" * (2 << 20) + b'"}'
    headers = {"Content-Type": "application/json"}
    async with client.post(url, data=io.BytesIO(body), headers=headers) as r:
        assert r.status == 413
        assert (await r.json())["error"] == "payload_too_large"


async def test_memory_status_and_search(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    async with client.get("/api/memory/search", params={"q": "spare key teapot"}) as response:
        found = await response.json()
    async with client.get("/api/memory/status") as response:
        status = await response.json()
    assert status["enabled"] is True and status["chunks"] > 0  # the search synced first
    assert any("teapot" in hit["snippet"] for hit in found["items"])
    scope = found["items"][0]["scope"]
    # The operator sees every audience, each hit labelled with whose it is.
    hit = next(h for h in found["items"] if "teapot" in h["snippet"])
    assert hit["scope"].startswith("person:") and hit["audience"] == (
        "person " + hit["scope"].removeprefix("person:")
    )
    async with client.get(
        "/api/memory/search", params={"q": "teapot", "scope": "person:nobody"}
    ) as r:
        assert (await r.json())["items"] == []
    async with client.get("/api/memory/search", params={"q": "teapot", "scope": scope}) as r:
        assert (await r.json())["items"]
    async with client.get("/api/memory/search") as response:
        assert response.status == 400


async def test_metrics_count_what_happened(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    async with client.get("/api/memory/search", params={"q": "teapot"}):
        pass
    async with client.get("/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("parley_inbound_messages_total", (("channel", "test"),))] == 2
    delivered = (("channel", "test"), ("outcome", "delivered"))
    assert samples[("parley_replies_total", delivered)] == 2
    assert samples[("parley_turns_total", (("channel", "test"), ("outcome", "ok")))] == 2
    assert samples[("parley_tokens_total", (("kind", "input"),))] > 0
    assert samples[("parley_memory_search_latency_seconds_count", ())] >= 1
    assert ("parley_lane_active_runs", ()) in samples


async def test_openapi_lists_exactly_the_mounted_routes(
    admin_server: AdminWorld, client: aiohttp.ClientSession
) -> None:
    async with client.get("/api/openapi.json") as response:
        document = await response.json()
    assert document["openapi"].startswith("3.")
    documented = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    http = admin_server.gateway.http
    assert http is not None and http._runner is not None
    mounted = {
        (route.method, route.resource.canonical)
        for route in http._runner.app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    assert documented == mounted
    schemas = document["components"]["schemas"]
    for path, item in document["paths"].items():
        for operation in item.values():
            for response in operation["responses"].values():
                for content in response.get("content", {}).values():
                    ref = content["schema"].get("$ref", "")
                    assert not ref or ref.rsplit("/", 1)[1] in schemas, (path, ref)


async def test_errors_never_leak_a_stack_trace(
    admin_server: AdminWorld, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internals /etc/passwd")

    monkeypatch.setattr(admin_server.gateway.registry, "list", broken)
    async with client.get("/api/sessions") as response:
        assert response.status == 500
        body = await response.text()
    assert "secret internals" not in body and "Traceback" not in body
    assert '"error": "internal"' in body
    async with client.put("/api/sessions") as response:
        assert response.status == 405
        assert (await response.json())["error"] == "method_not_allowed"


async def test_health_is_503_when_a_channel_is_down(admin_server: AdminWorld) -> None:
    admin_server.channel.connected = lambda: False  # type: ignore[attr-defined]
    async with (
        aiohttp.ClientSession(base_url=admin_server.base_url) as session,
        session.get("/health") as response,
    ):
        assert response.status == 503
        health = await response.json()
    assert health["ready"] is False and health["live"] is True
    assert health["checks"]["channels"]["test"] == {"ok": False, "detail": "not connected"}


def test_a_public_address_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(AdminServerError, match="without a token"):
        resolve_token(None, "0.0.0.0", tmp_path / "admin.token")
    with pytest.raises(AdminServerError, match="too short"):
        resolve_token("short", "0.0.0.0", tmp_path / "admin.token")
    token = resolve_token("a-long-enough-token-123", "0.0.0.0", tmp_path / "admin.token")
    assert token.source == "config" and not (tmp_path / "admin.token").exists()


def test_a_loopback_token_is_generated_once_and_kept_private(tmp_path: Path) -> None:
    path = tmp_path / "home" / "admin.token"
    first = resolve_token(None, "127.0.0.1", path)
    assert first.source == "generated" and len(first.value) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = resolve_token(None, "::1", path)
    assert again.source == "file" and again.value == first.value
    assert again.matches(first.value) and not again.matches(first.value[:-1] + "x")


async def test_admin_env_overrides_and_refusal_through_the_gateway(tmp_path: Path) -> None:
    env = {
        "PARLEY_HOME": str(tmp_path),
        "PARLEY_ADMIN_HOST": "0.0.0.0",
        "PARLEY_ADMIN_PORT": "0",
        "PARLEY_MEMORY__ENABLED": "false",
    }
    loaded = load_config(env=env)
    assert (loaded.config.http.host, loaded.config.http.port) == ("0.0.0.0", 0)
    gateway = Gateway(loaded, channels=[RecordingChannel()], provider=ScriptedProvider())
    with pytest.raises(AdminServerError, match="without a token"):
        await gateway.start()
    token = "t" * 24
    loaded = load_config(env={**env, "PARLEY_ADMIN_HOST": "127.0.0.1", "PARLEY_ADMIN_TOKEN": token})
    async with Gateway(loaded, channels=[RecordingChannel()], provider=ScriptedProvider()) as gw:
        assert gw.http is not None and gw.http.token.value == token
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession() as session,
            session.get(gw.http.url("/api/sessions"), headers=headers) as response,
        ):
            assert response.status == 200


def test_doctor_checks_the_admin_server_setup(tmp_path: Path) -> None:
    base = {"PARLEY_HOME": str(tmp_path)}
    ok = _check_http(load_config(env=base))
    assert ok.severity == "ok" and "will be generated" in ok.detail
    assert not (tmp_path / "admin.token").exists()  # the doctor writes nothing
    public = _check_http(load_config(env={**base, "PARLEY_ADMIN_HOST": "0.0.0.0"}))
    assert public.severity == "error" and "without a token" in public.detail
    weak = _check_http(load_config(env={**base, "PARLEY_ADMIN_TOKEN": "abc"}))
    assert weak.severity == "error" and "too short" in weak.detail


async def test_a_transcript_closed_mid_read_is_a_conflict(tmp_path: Path) -> None:
    transcript = Transcript.create(tmp_path / "t.jsonl", "a" * 32, "agent:main:x:direct:y")
    transcript.close()  # what a reset does to an active session's transcript
    with pytest.raises(ApiError) as caught:
        await _reading(_page, transcript, 0, 10)
    assert caught.value.status == 409


async def test_a_restarted_gateway_serves_again(tmp_path: Path) -> None:
    env = {
        "PARLEY_HOME": str(tmp_path),
        "PARLEY_HTTP__PORT": "0",
        "PARLEY_MEMORY__ENABLED": "false",
    }
    gateway = Gateway(
        load_config(env=env), channels=[RecordingChannel()], provider=ScriptedProvider()
    )
    for _ in range(2):
        async with gateway:
            assert gateway.http is not None
            headers = {"Authorization": f"Bearer {gateway.http.token.value}"}
            async with (
                aiohttp.ClientSession() as session,
                session.get(gateway.http.url("/metrics"), headers=headers) as response,
            ):
                text = await response.text()
            assert text.count("# TYPE parley_lane_active_runs gauge") == 1
