"""Hostile input through every inbound path, driven by the corpus in ``tests/corpus/``.

One running gateway per path; each test walks its whole corpus and reports every case
that went wrong at once. For every case: no crash, no 5xx, a clear error or a safe
placeholder, nothing written outside the state directory, and a valid message sent
after the hostile ones is still answered.

Corpus strings may hold ``@REP(<text>,<n>)@`` (``<text>`` repeated ``n`` times) so the
files stay small; ``@ID@`` and friends are filled in per case (see each runner).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import discord
import pytest
from telegram import Update
from yarl import URL

from parley.channels.discord_adapter import DiscordChannel
from parley.channels.telegram import SECRET_HEADER, TelegramChannel
from parley.core.messages import ToolResultBlock
from parley.core.providers.anthropic import to_wire_messages
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from parley.gateway.routing import SESSION_KEY_RE
from tests.channels import discord_support as ds
from tests.channels.telegram_helpers import FAST_BACKOFF, TOKEN, fake_telegram, loopback_only
from tests.channels.telegram_helpers import make_config as telegram_config
from tests.fakes.discord_api import user_payload
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.admin.conftest import AdminWorld, admin_server, tool_call  # noqa: F401

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
SECRET = "hostile-secret_1"
VICTIM = 5001
_REP = re.compile(r"@REP\((.*?),(\d+)\)@", re.DOTALL)
_SESSION_FILE = re.compile(r"[0-9a-f]{32}\.jsonl")
WS_PROTOCOL = "parley.chat.v1"
LIMIT = 10.0


# -- the corpus ----------------------------------------------------------------------------


def expand(value: Any) -> Any:
    if isinstance(value, str):
        return _REP.sub(lambda m: m[1] * int(m[2]), value)
    if isinstance(value, list):
        return [expand(v) for v in value]
    if isinstance(value, dict):
        return {k: expand(v) for k, v in value.items()}
    return value


def corpus(name: str) -> list[dict[str, Any]]:
    return expand(json.loads((CORPUS / name).read_text(encoding="utf-8")))


def deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


def fill(value: Any, marks: dict[str, Any]) -> Any:
    """Placeholders: a string equal to a mark becomes its value; inside strings, its text."""
    if isinstance(value, str):
        if value in marks:
            return marks[value]
        for mark, replacement in marks.items():
            if mark in value:
                value = value.replace(mark, str(replacement))
        return value
    if isinstance(value, list):
        return [fill(v, marks) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, marks) for k, v in value.items()}
    return value


def patch(target: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    """Apply a case's ``rename``, ``delete`` and ``set`` (dotted paths) to a copy."""
    data = copy.deepcopy(target)
    for old, new in case.get("rename", {}).items():
        data[new] = data.pop(old)
    for dotted in case.get("delete", []):
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node.pop(last, None)
    for dotted, value in case.get("set", {}).items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


@dataclass
class Failures:
    """Problems found, reported together. A case marked ``known_issue`` in the corpus
    (a bug whose fix lies outside the files these tests may change) fails softly: the
    test ends as xfail while it still fails, and passes once it is fixed."""

    path: str
    problems: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    known_cases: dict[str, str] = field(default_factory=dict)

    def expect_known(self, case: dict[str, Any]) -> None:
        if "known_issue" in case:
            self.known_cases[case["name"]] = case["known_issue"]

    def check(self, ok: bool, case: str, what: str) -> None:
        if ok:
            return
        if case in self.known_cases:
            self.known.append(f"{self.path}/{case}: {what} [{self.known_cases[case]}]")
        else:
            self.problems.append(f"{self.path}/{case}: {what}")

    def assert_none(self) -> None:
        assert not self.problems, "\n".join(self.problems)
        if self.known:
            pytest.xfail("known issues outside this suite's files:\n" + "\n".join(self.known))


# -- the state directory -------------------------------------------------------------------


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_confined(root: Path, home: Path, before: dict[str, tuple[int, int]]) -> None:
    """Nothing outside ``home`` (within ``root``) changed; nothing inside has a hostile name."""
    after = tree(root)
    prefix = str(home.relative_to(root)) + "/"
    outside_before = {k: v for k, v in before.items() if not k.startswith(prefix)}
    outside_after = {k: v for k, v in after.items() if not k.startswith(prefix)}
    assert outside_after == outside_before, "files changed outside the state directory"
    for name in after:
        assert "\x00" not in name and "/../" not in f"/{name}/", name
        if name.startswith(prefix + "sessions/"):
            assert _SESSION_FILE.fullmatch(Path(name).name), name


async def assert_keys_well_formed(gateway: Gateway) -> None:
    for status in ("active", "archived"):
        page = await gateway.registry.list(status=status, limit=500)
        for record in page.sessions:
            assert SESSION_KEY_RE.fullmatch(record.key), record.key


# -- raw HTTP (headers and targets that aiohttp's client would tidy up) ----------------------


@dataclass
class RawResponse:
    status: int
    body: bytes


async def raw_request(
    base: str,
    method: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
) -> RawResponse:
    url = URL(base)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    head = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: " + url.host.encode()]
    head += [name + b": " + value for name, value in headers]
    head += [b"Content-Length: " + str(len(body)).encode(), b"Connection: close"]

    async def send() -> None:
        # The server may answer (413) and hang up before the body is through.
        with contextlib.suppress(ConnectionError, OSError):
            writer.write(b"\r\n".join(head) + b"\r\n\r\n")
            for start in range(0, len(body), 1 << 16):
                writer.write(body[start : start + (1 << 16)])
                await writer.drain()
            await writer.drain()

    sending = asyncio.create_task(send())
    try:
        async with asyncio.timeout(LIMIT):
            status_line = await reader.readline()
            rest = await reader.read()
    finally:
        await sending
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    parts = status_line.split()
    assert len(parts) >= 2, f"no HTTP status line: {status_line!r}"
    return RawResponse(int(parts[1]), rest.partition(b"\r\n\r\n")[2])


def header_value(spec: Any, marks: dict[str, str]) -> bytes | None:
    if spec is None:
        return None
    if isinstance(spec, dict):
        return bytes.fromhex(spec["hex"])
    return fill(spec, marks).encode("utf-8", "surrogatepass")


# -- Telegram: webhook posts into a running gateway ------------------------------------------


@dataclass
class TelegramWorld:
    gateway: Gateway
    fake: Any
    url: str
    base: str


def quiet_config(home: Path) -> Any:
    """A gateway config for one corpus path: memory off, no retries, a free port."""
    return load_config(
        env={
            "PARLEY_HOME": str(home),
            "PARLEY_SESSION__TIMEZONE": "UTC",
            "PARLEY_MEMORY__ENABLED": "false",
            "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
            "PARLEY_HTTP__PORT": "0",
        }
    )


@asynccontextmanager
async def telegram_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    loopback_only(monkeypatch)
    home = tmp_path / "home"
    loaded = quiet_config(home)
    async with fake_telegram() as fake:
        accounts = {
            "default": {
                "token": TOKEN, "api_base_url": fake.base_url,
                "webhook_url": "http://127.0.0.1:9/telegram/default", "webhook_secret": SECRET,
            }
        }  # fmt: skip
        channel = TelegramChannel(
            telegram_config(fake, mode="webhook", dm_policy="open", accounts=accounts),
            backoff=FAST_BACKOFF,
        )
        async with Gateway(loaded, channels=[channel], provider=ScriptedProvider()) as gateway:
            assert gateway.http is not None
            base = gateway.http.url("").rstrip("/")
            yield TelegramWorld(gateway, fake, base + "/telegram/default", base)


def telegram_update(chat_id: int, text: str, update_id: int) -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id, "date": 1_700_000_000,
            "chat": {"id": chat_id, "type": "private"},
            "from": {"id": chat_id, "is_bot": False, "first_name": "Tess"}, "text": text,
        },
    }  # fmt: skip


async def post_update(
    world: TelegramWorld, body: bytes, *, secret: bytes | None = SECRET.encode(), **kw: Any
) -> RawResponse:
    headers = [(b"Content-Type", kw.get("content_type", "application/json").encode())]
    if secret is not None:
        headers.append((SECRET_HEADER.encode(), secret))
    return await raw_request(
        world.base, kw.get("method", "POST"), b"/telegram/default", headers, body
    )


async def test_telegram_webhook_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts, cases = corpus("texts.json"), corpus("telegram_updates.json")
    before = tree(tmp_path)
    failures = Failures("telegram")
    async with telegram_world(tmp_path, monkeypatch) as w:
        for chat in (VICTIM, *range(600_000, 600_100), *range(700_000, 700_200)):
            w.fake.add_chat(chat)
        victim = await post_update(w, json.dumps(telegram_update(VICTIM, "hi", 1)).encode())
        assert victim.status == 200
        await w.gateway.wait_idle()
        victim_key = f"agent:main:telegram:direct:{VICTIM}"
        record = await w.gateway.registry.get_active(victim_key)
        assert record is not None
        victim_entries = record.entry_count

        expected: list[tuple[str, int, str]] = []  # (case, chat id, reply expectation)
        for i, case in enumerate(texts):
            chat = 600_000 + i
            body = json.dumps(telegram_update(chat, case["text"], 100 + i)).encode()
            response = await post_update(w, body)
            failures.check(response.status == 200, case["name"], f"status {response.status}")
            wanted = {"reply": "reply", "blank": "none", "any": "any"}[case["expect"]]
            expected.append((f"text:{case['name']}", chat, wanted))

        for i, case in enumerate(cases):
            chat = 700_000 + i
            marks = {"@ID@": chat, "@DEEP900@": deep(900)}
            update = telegram_update(chat, f"case {case['name']}", 1000 + i)
            if "nest_reply" in case:
                inner = update["message"]
                for level in range(case["nest_reply"]):
                    inner["reply_to_message"] = {
                        "message_id": level + 1, "date": 1_700_000_000, "text": f"r{level}",
                        "chat": {"id": chat, "type": "private"},
                    }  # fmt: skip
                    inner = inner["reply_to_message"]
            update = fill(patch(update, case), marks)
            if "raw_hex" in case:
                body = bytes.fromhex(case["raw_hex"])
            elif "raw" in case:
                raw = case["raw"].replace("@BASE@", json.dumps(update)).replace("@ID@", str(chat))
                body = raw.encode(case.get("encoding", "utf-8"), "surrogatepass")
            elif "size" in case:
                body = b" " * case["size"]
            else:
                body = json.dumps(update).encode("utf-8", "surrogatepass")
            secret: bytes | None = SECRET.encode()
            if "secret_raw_hex" in case:
                secret = bytes.fromhex(case["secret_raw_hex"])
            elif "secret" in case:
                secret = None if case["secret"] is None else case["secret"].encode()
            kw = {k: case[k] for k in ("content_type", "method") if k in case}
            failures.expect_known(case)
            try:
                response = await post_update(w, body, secret=secret, **kw)
            except (AssertionError, OSError, TimeoutError) as exc:
                failures.check(False, case["name"], f"no answer: {exc!r}")
                continue
            failures.check(
                response.status in case["status"],
                case["name"],
                f"status {response.status}, expected {case['status']}",
            )
            expected.append((case["name"], chat, case["reply"]))

        await w.gateway.wait_idle()
        awaited = [chat for _, chat, wanted in expected if wanted == "reply"]
        with contextlib.suppress(TimeoutError):  # reported per case below
            await w.fake.wait_until(lambda: all(w.fake.sent_to(c) for c in awaited), timeout=5)
        for name, chat, wanted in expected:
            count = len(w.fake.sent_to(chat))
            if wanted == "reply":
                failures.check(count >= 1, name, "no reply")
            elif wanted == "none":
                failures.check(count == 0, name, f"{count} unexpected replies")

        # Nothing lost: the gateway still answers, and no forged id reached the victim.
        final = await post_update(
            w, json.dumps(telegram_update(VICTIM, "still there?", 9)).encode()
        )
        assert final.status == 200
        await w.fake.wait_until(lambda: len(w.fake.sent_to(VICTIM)) >= 2, timeout=LIMIT)
        await w.gateway.wait_idle()
        record = await w.gateway.registry.get_active(victim_key)
        assert record is not None
        # Two entries per answered turn (user + assistant) plus delivery records: the
        # victim's own second message is the only growth allowed.
        after_own = record.entry_count - victim_entries
        assert 0 < after_own <= victim_entries, (victim_entries, record.entry_count)
        await assert_keys_well_formed(w.gateway)
    failures.assert_none()
    assert_confined(tmp_path, tmp_path / "home", before)


# The polling path: the same updates, served by the fake's getUpdates. Cases that only
# make sense over HTTP (raw bodies, sizes, secrets, methods) are the webhook's.
_HTTP_ONLY = ("raw", "raw_hex", "size", "secret", "secret_raw_hex", "method", "content_type")
# PTB parses a whole getUpdates batch at once; one update it cannot parse fails the batch,
# and the adapter retries the same offset for ever: every later message waits behind it.
# Until channels/telegram.py skips such an update, these are probed against the parser (a
# known issue) rather than served; set this to True once it is fixed.
SERVE_UNPARSEABLE_UPDATES = True


def telegram_parse_problem(update: dict[str, Any]) -> str | None:
    try:
        Update.de_json(json.loads(json.dumps(update)), None)
    except Exception as exc:
        return repr(exc)
    return None


async def test_telegram_polling_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = corpus("texts.json")
    cases = [c for c in corpus("telegram_updates.json") if not any(k in c for k in _HTTP_ONLY)]
    before = tree(tmp_path)
    failures = Failures("telegram-polling")
    loopback_only(monkeypatch)
    home = tmp_path / "home"
    loaded = quiet_config(home)
    async with fake_telegram() as fake:
        channel = TelegramChannel(telegram_config(fake, dm_policy="open"), backoff=FAST_BACKOFF)
        async with Gateway(loaded, channels=[channel], provider=ScriptedProvider()) as gateway:
            expected: list[tuple[str, int, str]] = []
            for i, case in enumerate(texts):
                chat = 600_000 + i
                fake.add_chat(chat)
                fake.push_update(TOKEN, telegram_update(chat, case["text"], 100 + i))
                wanted = {"reply": "reply", "blank": "none", "any": "any"}[case["expect"]]
                expected.append((f"text:{case['name']}", chat, wanted))
            for i, case in enumerate(cases):
                chat = 700_000 + i
                fake.add_chat(chat)
                failures.expect_known(case)
                update = telegram_update(chat, f"case {case['name']}", 1000 + i)
                update = fill(patch(update, case), {"@ID@": chat, "@DEEP900@": deep(900)})
                if "update_id" not in update or not isinstance(update["update_id"], int):
                    continue  # the fake numbers updates itself; such a case is the webhook's
                update["update_id"] = 1000 + i
                problem = telegram_parse_problem(update)
                if problem is not None and not SERVE_UNPARSEABLE_UPDATES:
                    failures.known.append(
                        f"telegram-polling/{case['name']}: PTB cannot parse it ({problem}); "
                        "served, it would wedge polling [channels/telegram.py: the getUpdates "
                        "loop retries the failing batch for ever]"
                    )
                    continue
                try:
                    fake.push_update(TOKEN, update)
                except (AttributeError, TypeError, KeyError):
                    continue  # the fake reads the chat itself: shapes it cannot hold

                wanted = case["reply"] if 200 in case["status"] else "none"
                expected.append((case["name"], chat, wanted))
            # Nothing lost: a plain message after all of them is answered.
            fake.add_chat(VICTIM)
            fake.push_update(TOKEN, telegram_update(VICTIM, "still there?", 5000))
            try:
                await fake.wait_until(lambda: fake.sent_to(VICTIM), timeout=LIMIT)
            except TimeoutError:
                failures.problems.append("telegram-polling: the last message was not answered")
            await gateway.wait_idle()
            for name, chat, wanted in expected:
                count = len(fake.sent_to(chat))
                if wanted == "reply":
                    failures.check(count >= 1, name, "no reply")
                elif wanted == "none":
                    failures.check(count == 0, name, f"{count} unexpected replies")
            await assert_keys_well_formed(gateway)
    failures.assert_none()
    assert_confined(tmp_path, home, before)


# -- Discord: gateway events from the fake, into a running gateway ---------------------------


# discord.py parses MESSAGE_CREATE/UPDATE before the adapter sees anything, and an
# exception in its parser would end ``Client.start``. The adapter guards the parsers
# (channels/discord_client.py) and restarts a client that stops
# (channels/discord_adapter.py), so such payloads are sent over the gateway too.
DISPATCH_PARSER_FAILURES = True


def discord_parse_problem(channel: DiscordChannel, event: str, payload: Any) -> str | None:
    """What discord.py's parser raises on ``payload`` (None: it parses)."""
    if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE"):
        return None
    state = channel._accounts["default"].client._connection
    try:
        target, _ = state._get_guild_channel(payload)
        discord.Message(channel=target, data=payload, state=state)
    except Exception as exc:
        return repr(exc)
    return None


def discord_user(i: int) -> dict[str, str]:
    return {"id": str(720_000_000_000_000_000 + i), "username": f"user{i}", "global_name": f"U{i}"}


async def test_discord_event_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts, cases = corpus("texts.json"), corpus("discord_events.json")
    before = tree(tmp_path)
    failures = Failures("discord")
    home = tmp_path / "home"
    loaded = quiet_config(home)
    async with ds.fake_discord(monkeypatch) as fake:
        channel = DiscordChannel(ds.make_config(fake, dm_policy="open"), ready_timeout=ds.LIMIT)
        async with Gateway(loaded, channels=[channel], provider=ScriptedProvider()) as gateway:
            expected: list[tuple[str, str, str]] = []
            template: dict[str, Any] | None = None
            for i, case in enumerate(texts):
                user = discord_user(i)
                dm = fake.add_dm(ds.TOKEN, user)
                pushed = await fake.push_message(
                    ds.TOKEN, channel_id=dm, content=case["text"], author=user
                )
                template = template or pushed
                wanted = {"reply": "reply", "blank": "none", "any": "any"}[case["expect"]]
                expected.append((f"text:{case['name']}", dm, wanted))
            assert template is not None
            for i, case in enumerate(cases):
                user = discord_user(1000 + i)
                dm = fake.add_dm(ds.TOKEN, user)
                payload = copy.deepcopy(template)
                payload.update(
                    id=fake.snowflake(), channel_id=dm, author=user_payload(user),
                    content=f"case {case['name']}",
                )  # fmt: skip
                payload = patch(payload, case)
                event = case.get("event", "MESSAGE_CREATE")
                problem = discord_parse_problem(channel, event, payload)
                if problem is not None and not DISPATCH_PARSER_FAILURES:
                    failures.known.append(
                        f"discord/{case['name']}: discord.py's parser raises {problem}; "
                        "sent over the gateway it would stop the client "
                        "[channels/discord_client.py: no parser guard]"
                    )
                    continue
                await fake.gateway.dispatch(ds.TOKEN, event, payload)
                expected.append((case["name"], dm, case["reply"]))

            # Nothing lost: a plain message after all of it is answered.
            last_user = discord_user(9999)
            last_dm = fake.add_dm(ds.TOKEN, last_user)
            await fake.push_message(
                ds.TOKEN, channel_id=last_dm, content="still there?", author=last_user
            )
            await fake.wait_until(lambda: fake.sent_to(last_dm), timeout=LIMIT)
            await gateway.wait_idle()
            awaited = [dm for _, dm, wanted in expected if wanted == "reply"]
            with contextlib.suppress(TimeoutError):  # reported per case below
                await fake.wait_until(lambda: all(fake.sent_to(d) for d in awaited), timeout=5)
            for name, dm, wanted in expected:
                count = len(fake.sent_to(dm))
                if wanted == "reply":
                    failures.check(count >= 1, name, "no reply")
                elif wanted == "none":
                    failures.check(count == 0, name, f"{count} unexpected replies")
            assert channel.connected()
            await assert_keys_well_formed(gateway)
    failures.assert_none()
    assert_confined(tmp_path, home, before)


# -- the web chat ----------------------------------------------------------------------------


async def connect(
    session: aiohttp.ClientSession, world: AdminWorld, hello: Any = None, **kw: Any
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(
        world.url("/chat/ws"), protocols=(WS_PROTOCOL, f"bearer.{world.token}"), **kw
    )
    if hello is not None:
        await ws.send_str(hello)
    return ws


async def next_frame(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any] | None:
    """The next frame that is not a typing notice; None when the socket closed."""
    while True:
        msg = await ws.receive(timeout=LIMIT)
        if msg.type != aiohttp.WSMsgType.TEXT:
            return None
        frame = json.loads(msg.data)
        if frame.get("type") != "typing":
            return frame


async def outcome(ws: aiohttp.ClientWebSocketResponse, message_id: str) -> list[str]:
    """The frame types about one message, sorted: ["ack", "reply"], ["error"], or what came.
    (A command's reply can come before the ack.)"""
    kinds: list[str] = []
    while "error" not in kinds and not {"ack", "reply"} <= set(kinds):
        frame = await next_frame(ws)
        if frame is None:
            return sorted([*kinds, "closed"])
        if frame.get("id") == message_id or frame.get("reply_to") == message_id:
            kinds.append(frame["type"])
    return sorted(kinds)


async def test_web_chat_corpus(admin_server: AdminWorld, tmp_path: Path) -> None:  # noqa: F811
    world = admin_server
    texts, cases = corpus("texts.json"), corpus("web_frames.json")
    before = tree(tmp_path)
    failures = Failures("web")
    hello = json.dumps({"type": "hello", "client_id": "hostile-1"})
    async with aiohttp.ClientSession() as session:
        ws = await connect(session, world, hello)
        assert (await next_frame(ws)) == {"type": "ready", "client_id": "hostile-1"}
        for i, case in enumerate(texts):
            message_id = f"t{i}"
            await ws.send_str(
                json.dumps({"type": "message", "id": message_id, "text": case["text"]})
            )
            kinds = await outcome(ws, message_id)
            if case["expect"] == "blank":
                failures.check(kinds == ["error"], case["name"], f"got {kinds}")
            else:
                failures.check(kinds == ["ack", "reply"], case["name"], f"got {kinds}")

        for i, case in enumerate(cases):
            message_id = f"f{i}"
            client = f"hostile-h{i}"
            marks = {"@ID@": message_id, "@CLIENT@": client, "@DEEP900@": deep(900)}
            name, expect = case["name"], case["expect"]
            if any(k in case for k in ("hello", "hello_raw", "hello_binary")):
                fresh = await connect(session, world)
                if "hello_binary" in case:
                    await fresh.send_bytes(bytes.fromhex(case["hello_binary"]))
                else:
                    raw = case.get("hello_raw") or json.dumps(fill(case["hello"], marks))
                    await fresh.send_str(raw)
                frame = await next_frame(fresh)
                got = "closed" if frame is None else frame["type"]
                if expect == "refused":
                    failures.check(got == "error", name, f"got {frame}")
                    failures.check(await next_frame(fresh) is None, name, "still open")
                    failures.check(fresh.close_code == 4400, name, f"close {fresh.close_code}")
                else:
                    failures.check(got == "ready", name, f"got {frame}")
                await fresh.close()
                continue
            if ws.closed:  # an earlier case closed it unexpectedly (reported there)
                ws = await connect(session, world, hello)
                assert (await next_frame(ws))["type"] == "ready"  # type: ignore[index]
            if "binary" in case:
                await ws.send_bytes(bytes.fromhex(case["binary"]))
            elif "raw_text_hex" in case:
                await ws._writer.send_frame(
                    bytes.fromhex(case["raw_text_hex"]), aiohttp.WSMsgType.TEXT
                )
            elif "size" in case:
                body = json.dumps({"type": "message", "id": message_id, "text": "x" * case["size"]})
                # The server refuses the frame and closes before it is through.
                with contextlib.suppress(ConnectionError):
                    await ws.send_str(body)
            elif "raw" in case:
                await ws.send_str(fill(case["raw"], marks))
            else:
                await ws.send_str(json.dumps(fill(case["frame"], marks)))
            if expect == "closed":
                frame = await next_frame(ws)
                failures.check(frame is None, name, f"socket stayed open: {frame}")
                failures.check(ws.close_code in (1006, 1007, 1009), name, f"close {ws.close_code}")
                ws = await connect(session, world, hello)
                assert (await next_frame(ws))["type"] == "ready"  # type: ignore[index]
                continue
            if expect == "ack":
                kinds = await outcome(ws, message_id)
                failures.check(kinds == ["ack", "reply"], name, f"got {kinds}")
                continue
            frame = await next_frame(ws)
            failures.check(
                frame is not None and frame["type"] == "error" and bool(frame["message"]),
                name,
                f"got {frame}",
            )
        # Nothing lost: the same socket still works.
        await ws.send_str(json.dumps({"type": "message", "id": "last", "text": "still there?"}))
        assert await outcome(ws, "last") == ["ack", "reply"]
        await ws.close()
    await world.gateway.wait_idle()
    await assert_keys_well_formed(world.gateway)
    failures.assert_none()
    assert_confined(tmp_path, world.home, before)


# -- the admin API ---------------------------------------------------------------------------


async def test_admin_api_corpus(admin_server: AdminWorld, tmp_path: Path) -> None:  # noqa: F811
    world = admin_server
    cases = corpus("admin_requests.json")
    before = tree(tmp_path)
    failures = Failures("admin")
    token = world.token
    cursor = base64.urlsafe_b64encode(b"[" * 5000 + b"]" * 5000).decode().rstrip("=")
    marks = {
        "@SESSION@": world.session_id, "@TOKEN@": f"Bearer {token}",
        "@TOKEN_PREFIX@": f"Bearer {token[:-1]}", "@TOKEN_UPPER@": f"Bearer {token.swapcase()}",
        "@TOKENQ@": token, "@DEEPCURSOR@": cursor,
    }  # fmt: skip
    record = await world.gateway.registry.get(world.session_id)
    assert record is not None
    for case in cases:
        name = case["name"]
        path = case["path"]
        target = (
            bytes.fromhex(path["hex"]) if isinstance(path, dict) else fill(path, marks).encode()
        )
        headers: list[tuple[bytes, bytes]] = []
        auth = header_value(None if case["token"] == "none" else case["token"], marks)
        if case["token"] == "valid":
            auth = f"Bearer {token}".encode()
        if auth is not None:
            headers.append((b"Authorization", auth))
        if case.get("websocket"):
            headers += [
                (b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"),
                (b"Sec-WebSocket-Version", b"13"),
                (b"Sec-WebSocket-Key", base64.b64encode(b"0123456789abcdef")),
            ]  # fmt: skip
            if "subprotocol_hex" in case:
                headers.append((b"Sec-WebSocket-Protocol", bytes.fromhex(case["subprotocol_hex"])))
            else:
                headers.append(
                    (b"Sec-WebSocket-Protocol", case.get("subprotocol", WS_PROTOCOL).encode())
                )
        if "content_type" in case:
            headers.append((b"Content-Type", case["content_type"].encode()))
        if "size" in case:
            body = b" " * case["size"]
        elif "body_hex" in case:
            body = bytes.fromhex(case["body_hex"])
        else:
            body = case.get("body", "").encode("utf-8", "surrogatepass")
        try:
            response = await raw_request(world.base_url, case["method"], target, headers, body)
        except (AssertionError, OSError, TimeoutError) as exc:
            failures.check(False, name, f"no answer: {exc!r}")
            continue
        failures.check(
            response.status in case["status"],
            name,
            f"status {response.status}, expected {case['status']}: {response.body[:200]!r}",
        )
        # aiohttp's HTTP parser refuses a malformed request line or header itself, with a
        # plain-text 400, before the application (and its JSON errors) sees anything.
        plain_ok = case.get("http_parser") and response.status == 400
        if response.status >= 400 and response.status not in (414, 431) and not plain_ok:
            try:
                error = json.loads(response.body)
                clear = isinstance(error, dict) and bool(error.get("message"))
            except ValueError:
                clear = False
            failures.check(clear, name, f"no clear JSON error: {response.body[:200]!r}")
        if response.status == 401:
            failures.check(token.encode() not in response.body, name, "token leaked")
    # Nothing lost: the seeded session is intact and the API still answers.
    after = await world.gateway.registry.get(world.session_id)
    assert after is not None and after.status == "active"
    assert after.entry_count >= record.entry_count
    ok = await raw_request(
        world.base_url, "GET", b"/api/sessions", [(b"Authorization", f"Bearer {token}".encode())]
    )
    assert ok.status == 200
    failures.assert_none()
    assert_confined(tmp_path, world.home, before)


# -- prompt injection inside tool results -----------------------------------------------------


def _blocks_holding(messages: Any, marker: str) -> list[Any]:
    return [b for m in messages for b in m.content if marker in str(b)]


async def test_injected_tool_output_stays_inside_its_result_block(
    admin_server: AdminWorld,  # noqa: F811
) -> None:
    world = admin_server
    gateway, channel, provider = world.gateway, world.channel, world.provider
    workspace = gateway.loaded.workspace
    failures = Failures("tool-result")
    for i, case in enumerate(corpus("tool_injections.json")):
        marker = f"INJ-MARKER-{i}"
        name = f"evil-{i}.md"
        (workspace / name).write_bytes(
            f"{case['text']}\n{marker}\n".encode("utf-8", "surrogatepass")
        )
        before = len(provider.requests)
        provider.push(tool_call("read_file", path=name))
        sent = len(channel.sent)
        await gateway.handle_inbound(channel.inbound(f"read {name}", sender=f"reader{i}"))
        await channel.wait_sent(sent + 1)
        await gateway.wait_idle()
        request = provider.requests[before + 1]  # the call that carries the tool result
        holding = _blocks_holding(request.messages, marker)
        failures.check(len(holding) == 1, case["name"], f"{len(holding)} blocks hold it")
        failures.check(
            all(isinstance(b, ToolResultBlock) for b in holding), case["name"], f"{holding}"
        )
        failures.check(
            marker not in request.system,
            case["name"],
            "in the system prompt",
        )
        wire = to_wire_messages(request.messages)
        wire_holding = [b for m in wire for b in m["content"] if marker in json.dumps(b)]
        failures.check(
            [b["type"] for b in wire_holding] == ["tool_result"],
            case["name"],
            f"wire blocks {wire_holding}",
        )
        failures.check(
            all(marker not in b.get("text", "") for m in wire for b in m["content"]),
            case["name"],
            "marker in a text block",
        )
        # The reply quoting the user (the echo) never carries the file's text as its own.
        reply = channel.sent[-1].text
        failures.check(marker not in reply, case["name"], f"reply echoed it: {reply!r}")
    failures.assert_none()
