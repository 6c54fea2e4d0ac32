"""Worlds and files for the media tests: pictures made with Pillow, a PDF with a text
layer written by hand, and gateways on the fake Telegram / Discord / web chat with the
fake Anthropic or OpenAI API behind them."""

from __future__ import annotations

import base64
import io
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from parley.channels.discord_adapter import DiscordChannel
from parley.channels.telegram import TelegramChannel
from parley.channels.web import WebChannel
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.channels.discord_support import BOT_ID, LIMIT, fake_discord
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.telegram_helpers import FAST_BACKOFF, TOKEN, USERNAME, Sleeps, loopback_only
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.llm_common import FakeLLMServer, Reply
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegram

ALICE = 5001
BOB = 5002


def picture(width: int, height: int, *, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """A picture with some structure (a gradient), encoded as ``fmt``."""
    image = Image.new(mode, (width, height))
    pixels = image.load()
    assert pixels is not None
    for x in range(0, width, max(1, width // 64)):
        for y in range(0, height, max(1, height // 64)):
            value = (x * 255 // width, y * 255 // height, 128)
            pixels[x, y] = (*value, 200) if mode == "RGBA" else value
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def decoded_size(data: str | bytes) -> tuple[str, tuple[int, int]]:
    """(format, size) of a picture given as bytes or base64."""
    raw = base64.b64decode(data) if isinstance(data, str) else data
    with Image.open(io.BytesIO(raw)) as image:
        return str(image.format), image.size


def text_pdf(*pages: str) -> bytes:
    """A minimal PDF whose pages carry ``pages`` as a text layer (Helvetica)."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b""]
    kids = []
    for text in pages:
        stream = zlib.compress(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1"))
        content = len(objects) + 1
        objects.append(
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream)
            + stream
            + b"\nendstream"
        )
        page = len(objects) + 1
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 << /Type /Font /Subtype /Type1 "
            b"/BaseFont /Helvetica >> >> >> >>" % content
        )
        kids.append(page)
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids),
        len(kids),
    )
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def chat_bodies(llm: FakeLLMServer) -> list[dict[str, Any]]:
    """The bodies of the model requests (Anthropic messages or OpenAI completions)."""
    paths = ("/v1/messages", "/v1/chat/completions")
    return [r.body for r in llm.requests if r.path in paths]


def user_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The newest user message's content blocks/parts, whichever API."""
    for message in reversed(body["messages"]):
        if message["role"] == "user":
            content = message["content"]
            return content if isinstance(content, list) else [{"type": "text", "text": content}]
    return []


def all_text(body: dict[str, Any]) -> str:
    """Every text of every message of a request (system prompt excluded)."""
    parts = []
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [b.get("text", "") for b in content if b.get("type") == "text"]
    return "\n".join(parts)


def images_of(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(media type, base64) of every image in a request, Anthropic or OpenAI."""
    found = []
    for message in body["messages"]:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "image":
                source = block["source"]
                found.append((source["media_type"], source["data"]))
            elif block.get("type") == "image_url":
                head, _, data = block["image_url"]["url"].partition(";base64,")
                found.append((head.removeprefix("data:"), data))
    return found


def llm_env(home: Path, llm: FakeLLMServer, **extra: str) -> dict[str, str]:
    """A gateway on the fake (Anthropic or OpenAI), memory off unless ``extra`` says."""
    llm.responder = lambda body: Reply(text="seen")
    env = {
        "PARLEY_HOME": str(home),
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_MEMORY__ENABLED": "false",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
        "PARLEY_HTTP__PORT": "0",
    }
    if isinstance(llm, FakeAnthropic):
        env |= {
            "ANTHROPIC_API_KEY": llm.api_key,
            "ANTHROPIC_BASE_URL": llm.base_url,
            "PARLEY_PROVIDERS__ANTHROPIC__MODEL": "claude-test-model",
        }
    else:
        env |= {
            "PARLEY_PROVIDERS__DEFAULT": "openai",
            "OPENAI_API_KEY": llm.api_key,
            "OPENAI_BASE_URL": llm.base_url,
            "PARLEY_PROVIDERS__OPENAI__MODEL": "gpt-test-model",
        }
    return env | extra


class TelegramWorld:
    def __init__(self, fake: FakeTelegram, llm: FakeLLMServer, gateway: Gateway, home: Path):
        self.fake, self.llm, self.gateway, self.home = fake, llm, gateway, home

    async def send(self, chat_id: int = ALICE, **message: Any) -> str:
        """Push a message, wait for its answer; the answer's visible text."""
        before = len(self.fake.sent)
        update = self.fake.push_message(TOKEN, chat_id=chat_id, **message)
        await self.fake.wait_polled(TOKEN, update["update_id"] + 1)
        await self.gateway.wait_idle()
        sent = (await self.fake.wait_sent(before + 1))[-1]
        # As it reads now: a streamed reply's first draft is edited into the reply.
        return self.fake.message_text(sent.chat_id, sent.message_id) or ""


def new_llm(api: str) -> FakeLLMServer:
    return FakeAnthropic() if api == "anthropic" else FakeOpenAI()


@asynccontextmanager
async def telegram_world(
    home: Path, monkeypatch: pytest.MonkeyPatch, *, api: str = "anthropic", **env: str
) -> AsyncIterator[TelegramWorld]:
    loopback_only(monkeypatch)
    async with FakeTelegram(length_unit="utf16") as fake, new_llm(api) as llm:
        fake.add_bot(TOKEN, USERNAME, bot_id=int(TOKEN.split(":")[0]))
        settings = llm_env(home, llm, **env) | {
            "TELEGRAM_BOT_TOKEN": TOKEN,
            "TELEGRAM_API_BASE_URL": fake.base_url,
            "PARLEY_CHANNELS__TELEGRAM__DM_POLICY": "open",
            "PARLEY_CHANNELS__TELEGRAM__POLL_TIMEOUT_SECONDS": "1",
        }
        loaded = load_config(env=settings)
        channel = TelegramChannel(
            loaded.config.channels.telegram, sleep=Sleeps(), backoff=FAST_BACKOFF
        )
        async with Gateway(loaded, channels=[channel]) as gateway:
            yield TelegramWorld(fake, llm, gateway, home)


class DiscordWorld:
    def __init__(self, fake: FakeDiscord, llm: FakeLLMServer, gateway: Gateway) -> None:
        self.fake, self.llm, self.gateway = fake, llm, gateway

    def replies(self) -> list[Any]:
        return [m for m in self.fake.sent if m.bot_id == BOT_ID]

    def reply_texts(self) -> list[str]:
        """The bot's messages as they read now (a streamed draft edited into its reply)."""
        return [self.fake.message(m.id)["content"] for m in self.replies()]


@asynccontextmanager
async def discord_world(
    home: Path, monkeypatch: pytest.MonkeyPatch, *, api: str = "openai", **env: str
) -> AsyncIterator[DiscordWorld]:
    async with fake_discord(monkeypatch) as fake, new_llm(api) as llm:
        settings = llm_env(home, llm, **env) | {
            "DISCORD_BOT_TOKEN": DISCORD_TOKEN,
            "PARLEY_CHANNELS__DISCORD__DM_POLICY": "open",
            "PARLEY_CHANNELS__DISCORD__API_BASE_URL": fake.api_base,
            "PARLEY_CHANNELS__DISCORD__GATEWAY_URL": fake.gateway_url,
        }
        loaded = load_config(env=settings)
        channel = DiscordChannel(loaded.config.channels.discord, ready_timeout=LIMIT)
        async with Gateway(loaded, channels=[channel]) as gateway:
            yield DiscordWorld(fake, llm, gateway)


@asynccontextmanager
async def web_world(
    home: Path, *, api: str = "anthropic", **env: str
) -> AsyncIterator[tuple[Gateway, FakeLLMServer, str]]:
    """A gateway with the web chat (uploads kept under the media store); yields it, the
    fake model and the admin token."""
    async with new_llm(api) as llm:
        loaded = load_config(env=llm_env(home, llm, **env))
        web = WebChannel(loaded.config.channels.web, upload_dir=loaded.media_dir / "uploads")
        async with Gateway(loaded, channels=[web]) as gateway:
            assert gateway.http is not None
            yield gateway, llm, gateway.http.token.value
