"""Files sent in the web chat: checked in the frame, kept in the spool before the
message is handed over, fetched back only for the client that sent them."""

from __future__ import annotations

import base64
import dataclasses
import stat
from pathlib import Path

import pytest

from parley.channels.base import AttachmentUnavailable
from parley.channels.config import WebConfig
from parley.channels.web_uploads import UploadRefused, read_files
from tests.channels.test_web import serve


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_frames_files_are_checked() -> None:
    [upload] = read_files([{"name": "a/b.md", "type": "Text/Markdown", "data": b64(b"# hi")}],
                          max_bytes=100, max_files=2)  # fmt: skip
    assert (upload.name, upload.mime_type, upload.data, upload.kind) == (
        "a_b.md",
        "text/markdown",
        b"# hi",
        "document",
    )
    assert read_files(None, max_bytes=1, max_files=1) == []
    refusals = [
        ("nope", "files must be a list"),
        ([{"name": "x", "data": b64(b"1")}] * 3, "at most 2 files"),
        ([{"name": "x", "data": "!!!"}], "x: data is not base64"),
        ([{"name": "big", "data": b64(b"x" * 101)}], "big is larger than the limit of 100"),
        ([{"name": "", "data": ""}], "each file needs a name"),
        ([{"name": "x", "type": "no type", "data": ""}], "not a media type"),
        ([7], "each file must be an object"),
    ]
    for raw, reason in refusals:
        with pytest.raises(UploadRefused, match=reason):
            read_files(raw, max_bytes=100, max_files=2)


async def test_a_file_is_spooled_and_only_its_client_reads_it(tmp_path: Path) -> None:
    spool = tmp_path / "media" / "uploads"
    async for chat in serve(WebConfig(), upload_dir=spool):
        ws = await chat.connect("tab-1")
        files = [{"name": "cat.png", "type": "image/png", "data": b64(b"\x89PNG...")}]
        await ws.send_json({"type": "message", "id": "m1", "text": "", "files": files})
        assert (await ws.receive_json(timeout=5)) == {"type": "ack", "id": "m1"}
        [message] = chat.inbox.messages
        [attachment] = message.attachments
        assert (attachment.kind, attachment.name, attachment.size) == ("image", "cat.png", 7)
        assert message.text == "[image: cat.png]"  # no words: the file speaks for itself
        [kept] = [p for p in spool.rglob("*") if p.is_file()]
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
        channel = chat.channel
        assert await channel.fetch_attachment(message, attachment, 100) == b"\x89PNG..."
        with pytest.raises(AttachmentUnavailable) as too_big:
            await channel.fetch_attachment(message, attachment, 3)
        assert too_big.value.too_large
        other = dataclasses.replace(message, chat_id="tab-2")
        with pytest.raises(AttachmentUnavailable, match="no longer kept"):
            await channel.fetch_attachment(other, attachment, 100)  # another client's file
        kept.unlink()  # retention: the reference stays, the file is gone
        with pytest.raises(AttachmentUnavailable, match="no longer kept"):
            await channel.fetch_attachment(message, attachment, 100)


async def test_without_a_spool_files_are_refused(tmp_path: Path) -> None:
    async for chat in serve(WebConfig()):
        ws = await chat.connect("tab-1")
        files = [{"name": "a.txt", "type": "text/plain", "data": b64(b"x")}]
        await ws.send_json({"type": "message", "id": "m1", "text": "hi", "files": files})
        frame = await ws.receive_json(timeout=5)
        assert frame == {"type": "error", "message": "this web chat does not take files",
                         "id": "m1"}  # fmt: skip
        assert chat.inbox.messages == []
