"""Fetching a file someone sent on Telegram: getFile, then the file download, through
python-telegram-bot against the fake Bot API (which refuses what Telegram refuses)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from parley.channels.base import Attachment, AttachmentUnavailable
from tests.channels.telegram_helpers import (
    TOKEN,
    Inbox,
    fake_telegram,
    loopback_only,
    running_channel,
)
from tests.fakes.telegram_api import FakeTelegram


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    loopback_only(monkeypatch)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with fake_telegram() as server:
        yield server


async def test_a_document_is_fetched_and_limits_hold(fake: FakeTelegram) -> None:
    inbox = Inbox()
    async with running_channel(fake, inbox) as channel:
        notes = fake.document(TOKEN, b"# notes\n", "n.md", "text/markdown")
        fake.push_message(TOKEN, chat_id=42, caption="notes", extra=notes)
        [message] = await inbox.wait(1)
        [attachment] = message.attachments
        assert (attachment.kind, attachment.name, attachment.size) == ("document", "n.md", 8)
        assert await channel.fetch_attachment(message, attachment, 100) == b"# notes\n"
        assert fake.downloads == ["documents/file_1.md"]
        assert [c.method for c in fake.calls if c.method == "getFile"] == ["getFile"]
        # Larger than the caller's limit: refused on getFile's size, nothing downloaded.
        with pytest.raises(AttachmentUnavailable) as small:
            await channel.fetch_attachment(message, attachment, 4)
        assert small.value.too_large and fake.downloads == ["documents/file_1.md"]
        # Past the Bot API's own limit: getFile refuses ("file is too big").
        fake.max_download_bytes = 4
        with pytest.raises(AttachmentUnavailable) as refused:
            await channel.fetch_attachment(message, attachment, 100)
        assert refused.value.too_large
        # A file id this bot never saw.
        unknown = Attachment("document", "nope")
        with pytest.raises(AttachmentUnavailable, match="Telegram: Invalid file_id"):
            await channel.fetch_attachment(message, unknown, 100)


async def test_the_fake_serves_files_only_at_their_path(fake: FakeTelegram) -> None:
    file = fake.add_file(TOKEN, b"abc")
    async with aiohttp.ClientSession() as session:
        get_file = f"{fake.base_url}/bot{TOKEN}/getFile"
        async with session.post(get_file, json={"file_id": file["file_id"]}) as response:
            path = (await response.json())["result"]["file_path"]
        async with session.get(f"{fake.base_url}/file/bot{TOKEN}/{path}") as response:
            assert response.status == 200 and await response.read() == b"abc"
        for wrong in (f"/file/bot{TOKEN}/documents/none.bin", f"/file/bot9:X/{path}"):
            async with session.get(fake.base_url + wrong) as response:
                assert response.status == 404
