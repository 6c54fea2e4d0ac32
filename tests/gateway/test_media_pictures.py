"""Pictures end to end: a photo sent on Telegram, Discord or the web chat reaches the
model (the real anthropic and openai SDKs against their fakes) as an image block,
downscaled, kept in the media store by reference (never inline in the transcript),
counted, pruned after three completed turns, and a placeholder for a model without
vision or a file the store no longer keeps."""

from __future__ import annotations

import asyncio
import base64
import json
import stat
from pathlib import Path

import aiohttp
import pytest

from parley.channels.telegram import TelegramChannel
from parley.core.media import image_tokens
from parley.gateway import app as app_module
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.channels.discord_support import ANN, LIMIT
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.telegram_helpers import FAST_BACKOFF, TOKEN, USERNAME, Sleeps, loopback_only
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.llm_common import Reply
from tests.fakes.telegram_api import FakeTelegram
from tests.gateway.media_support import (
    ALICE,
    all_text,
    chat_bodies,
    decoded_size,
    discord_world,
    images_of,
    llm_env,
    picture,
    telegram_world,
    web_world,
)

PROTOCOL = "parley.chat.v1"


def media_files(home: Path) -> list[Path]:
    found = (home / "media").rglob("*")
    return sorted(p for p in found if p.is_file() and "uploads" not in p.parts)


def transcript_text(home: Path) -> str:
    return "\n".join(p.read_text() for p in (home / "sessions").rglob("*.jsonl"))


async def test_telegram_photo_reaches_anthropic_downscaled_and_by_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    async with telegram_world(home, monkeypatch) as w:
        photo = w.fake.photo(TOKEN, picture(2400, 1600), 2400, 1600)
        reply = await w.send(caption="what is on this?", extra=photo)
        assert reply == "seen"
        [body] = chat_bodies(w.llm)
        [(media_type, data)] = images_of(body)
        assert media_type == "image/jpeg"
        assert decoded_size(data) == ("JPEG", (1200, 800))  # the longer side at 1,200
        assert "what is on this?" in all_text(body)
        assert "[image photo.jpg, 1200×800]" in all_text(body)  # named for the model
        assert w.fake.downloads == ["photos/file_1.jpg"]  # through getFile's path
        # Nothing kept with the session's messages holds the picture's bytes: the
        # request's base64 (and its encoded body) lived only as long as the call.
        page = await w.gateway.registry.list(status="active")
        transcript = await w.gateway.transcript(page.sessions[0])
        kept = [
            repr(getattr(e.message, "_derived", None))
            for e in transcript.live_entries()
            if e.type == "message"
        ]
        assert kept and not any(data[1000:1100] in k for k in kept)
        assert any("token count" in k for k in kept)  # what is kept is small
    # Stored once, owner-only, referred to from the transcript and never inlined there.
    [stored] = media_files(home)
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    for folder in stored.relative_to(home / "media").parents:
        assert stat.S_IMODE((home / "media" / folder).stat().st_mode) == 0o700
    assert decoded_size(stored.read_bytes()) == ("JPEG", (1200, 800))
    text = transcript_text(home)
    assert str(stored.relative_to(home / "media")) in text
    assert data[500:700] not in text
    images = [b for e in map(json.loads, text.splitlines()) for b in _blocks(e)
              if b.get("type") == "image"]  # fmt: skip
    assert images and all("data" not in b and b["ref"] for b in images)
    # The user message was counted with the picture as (width × height) / 750 tokens.
    [entry] = [e for e in map(json.loads, text.splitlines()) if '"ref"' in json.dumps(e)]
    [count] = entry["tokens"].values()
    assert image_tokens(1200, 800) == 1280 and count >= 1280


def _blocks(entry: dict[str, object]) -> list[dict[str, object]]:
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


async def test_a_picture_is_pruned_after_three_completed_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        photo = w.fake.photo(TOKEN, picture(640, 480), 640, 480)
        await w.send(caption="remember this chart", extra=photo)
        for n in range(4):
            await w.send(text=f"and then {n}")
        bodies = chat_bodies(w.llm)
        assert [len(images_of(b)) for b in bodies] == [1, 1, 1, 1, 0]
        last = all_text(bodies[-1])
        assert "[image photo.jpg, 640×480: sent earlier, no longer shown to the model]" in last
        assert "remember this chart" in last  # the words stay


async def test_a_deleted_media_file_is_a_placeholder_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    async with telegram_world(home, monkeypatch) as w:
        await w.send(caption="a receipt", extra=w.fake.photo(TOKEN, picture(300, 200), 300, 200))
        for stored in media_files(home):
            stored.unlink()  # retention, or an operator
        assert await w.send(text="what did it say?") == "seen"
        last = all_text(chat_bodies(w.llm)[-1])
        assert "[image photo.jpg, 300×200: no longer kept]" in last
        assert not images_of(chat_bodies(w.llm)[-1])


async def test_a_model_without_vision_gets_a_placeholder_with_the_caption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An OpenAI-compatible server at a base URL: no vision unless configured.
    async with telegram_world(tmp_path / "home", monkeypatch, api="openai") as w:
        await w.send(caption="is this a cat?", extra=w.fake.photo(TOKEN, picture(50, 40), 50, 40))
        [body] = chat_bodies(w.llm)
        assert not images_of(body)
        text = all_text(body)
        assert "is this a cat?" in text
        assert "[image photo.jpg, 50×40: the current model cannot see images" in text


async def test_discord_picture_reaches_openai_as_an_image_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"PARLEY_PROVIDERS__OPENAI__VISION": "true"}
    async with discord_world(tmp_path / "home", monkeypatch, **env) as w:
        dm = w.fake.add_dm(DISCORD_TOKEN, ANN)
        png = picture(300, 200, fmt="PNG", mode="RGBA")
        spec = {"filename": "diagram.png", "content_type": "image/png", "data": png,
                "width": 300, "height": 200}  # fmt: skip
        await w.fake.push_message(
            DISCORD_TOKEN, channel_id=dm, content="explain", author=ANN, attachments=[spec]
        )
        await w.fake.wait_until(lambda: bool(w.replies()), LIMIT)
        await w.gateway.wait_idle()
        [body] = chat_bodies(w.llm)
        [(media_type, data)] = images_of(body)
        assert media_type == "image/png"  # transparency kept
        assert decoded_size(data) == ("PNG", (300, 200))
        assert "explain" in all_text(body) and "diagram.png, 300×200" in all_text(body)
        assert len(w.fake.cdn_fetches) == 1


async def test_web_chat_picture_reaches_the_model(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with web_world(home) as (gateway, llm, token), aiohttp.ClientSession() as session:
        assert gateway.http is not None
        ws = await session.ws_connect(
            gateway.http.url("/chat/ws"), protocols=(PROTOCOL, f"bearer.{token}")
        )
        await ws.send_json({"type": "hello", "client_id": "browser-1"})
        assert (await ws.receive_json(timeout=5))["type"] == "ready"
        data = base64.b64encode(picture(1600, 1600)).decode()
        await ws.send_json({"type": "message", "id": "m1", "text": "look",
                            "files": [{"name": "snap.jpg", "type": "image/jpeg",
                                       "data": data}]})  # fmt: skip
        while (frame := await ws.receive_json(timeout=10))["type"] != "reply":
            assert frame["type"] != "error", frame
        assert frame["text"] == "seen"
        [body] = chat_bodies(llm)
        [(_, sent)] = images_of(body)
        assert decoded_size(sent) == ("JPEG", (1200, 1200))
        assert "snap.jpg, 1200×1200" in all_text(body)
        await ws.close()
    uploads = [p for p in (home / "media" / "uploads").rglob("*") if p.is_file()]
    assert len(uploads) == 1 and stat.S_IMODE(uploads[0].stat().st_mode) == 0o600


async def test_web_chat_refuses_a_file_over_its_limit(tmp_path: Path) -> None:
    env = {"PARLEY_CHANNELS__WEB__MAX_UPLOAD_BYTES": "2048"}
    async with web_world(tmp_path / "home", **env) as (gateway, llm, token):
        assert gateway.http is not None
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(
                gateway.http.url("/chat/ws"), protocols=(PROTOCOL, f"bearer.{token}")
            )
            await ws.send_json({"type": "hello", "client_id": "browser-2"})
            await ws.receive_json(timeout=5)
            data = base64.b64encode(b"x" * 4096).decode()
            await ws.send_json({"type": "message", "id": "m1", "text": "here",
                                "files": [{"name": "big.txt", "type": "text/plain",
                                           "data": data}]})  # fmt: skip
            frame = await ws.receive_json(timeout=5)
            assert frame["type"] == "error" and "big.txt" in frame["message"]
            assert "limit" in frame["message"]
            await ws.close()
        assert not chat_bodies(llm)


async def test_telegram_photo_too_large_is_refused_and_the_caption_still_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"PARLEY_MEDIA__MAX_IMAGE_BYTES": "2048"}
    async with telegram_world(tmp_path / "home", monkeypatch, **env) as w:
        big = picture(800, 800)
        assert len(big) > 2048
        reply = await w.send(caption="my holiday", extra=w.fake.photo(TOKEN, big, 800, 800))
        assert reply.startswith("(I could not read photo.jpg: it is ")
        assert "the limit is 2 kB" in reply and reply.endswith("seen")
        [body] = chat_bodies(w.llm)
        assert "my holiday" in all_text(body) and not images_of(body)
        assert w.fake.downloads == []  # refused on the declared size, nothing fetched


async def test_a_corrupt_picture_is_refused_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        bad = {"document": {**w.fake.add_file(TOKEN, b"\xff\xd8 not really"),
                            "file_name": "scan.jpg", "mime_type": "image/jpeg"}}  # fmt: skip
        reply = await w.send(caption="see attached", extra=bad)
        assert "(I could not read scan.jpg: it is not a picture that can be read" in reply
        assert "see attached" in all_text(chat_bodies(w.llm)[0])


async def test_a_photo_recorded_before_a_crash_still_reaches_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inbox keeps the attachment's reference: a message whose turn a stop cut short
    is answered after the restart, with its picture."""
    home = tmp_path / "home"
    loopback_only(monkeypatch)
    monkeypatch.setattr(app_module, "STOP_DRAIN_SECONDS", 0.05)  # the stop cuts the turn
    async with FakeTelegram(length_unit="utf16") as fake, FakeAnthropic() as llm:
        fake.add_bot(TOKEN, USERNAME, bot_id=int(TOKEN.split(":")[0]))
        settings = llm_env(home, llm) | {
            "TELEGRAM_BOT_TOKEN": TOKEN,
            "TELEGRAM_API_BASE_URL": fake.base_url,
            "PARLEY_CHANNELS__TELEGRAM__DM_POLICY": "open",
            "PARLEY_CHANNELS__TELEGRAM__POLL_TIMEOUT_SECONDS": "1",
        }
        loaded = load_config(env=settings)
        never = asyncio.Event()
        llm.script.append(Reply(text="lost", hold=never))  # the first life never answers
        photo = fake.photo(TOKEN, picture(400, 300), 400, 300)
        channel = TelegramChannel(loaded.config.channels.telegram, sleep=Sleeps(),
                                  backoff=FAST_BACKOFF)  # fmt: skip
        async with Gateway(loaded, channels=[channel]) as gateway:
            update = fake.push_message(TOKEN, chat_id=ALICE, caption="after the crash", extra=photo)
            await fake.wait_polled(TOKEN, update["update_id"] + 1)
            await fake.wait_until(lambda: len(chat_bodies(llm)) == 1, 10)
            [item] = await gateway.inbox.open_items()
            assert item.message.attachments[0].kind == "image"  # the reference is durable
        assert not fake.sent
        channel = TelegramChannel(loaded.config.channels.telegram, sleep=Sleeps(),
                                  backoff=FAST_BACKOFF)  # fmt: skip
        async with Gateway(loaded, channels=[channel]) as gateway:
            await fake.wait_sent(1)
            await gateway.wait_idle()
        assert fake.sent[0].visible_text == "seen"
        last = chat_bodies(llm)[-1]
        assert "after the crash" in all_text(last)
        [(_, data)] = images_of(last)
        assert decoded_size(data) == ("JPEG", (400, 300))
