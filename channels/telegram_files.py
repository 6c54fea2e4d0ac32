"""Files people send on Telegram (described by ``telegram_inbound.attachments_of``):
fetching them through the Bot API's own file download (``getFile``, then
``/file/bot<token>/<path>``: python-telegram-bot's ``File.download_as_bytearray``).

The Bot API serves files of at most 20 MB to a bot; ``getFile`` refuses larger ones.
"""

from __future__ import annotations

from telegram import Bot
from telegram.error import TelegramError

from parley.channels.base import Attachment, AttachmentUnavailable


async def fetch_file(bot: Bot, attachment: Attachment, max_bytes: int) -> bytes:
    """The file's bytes; ``AttachmentUnavailable`` when Telegram refuses it or it is
    larger than ``max_bytes`` (checked on getFile's size before downloading)."""
    try:
        file = await bot.get_file(attachment.ref)
        if file.file_size is not None and file.file_size > max_bytes:
            raise AttachmentUnavailable(f"{file.file_size} bytes", too_large=True)
        data = bytes(await file.download_as_bytearray())
    except TelegramError as exc:
        too_large = "too big" in str(exc).lower()
        raise AttachmentUnavailable(f"Telegram: {exc}", too_large=too_large) from exc
    if len(data) > max_bytes:
        raise AttachmentUnavailable(f"{len(data)} bytes", too_large=True)
    return data
