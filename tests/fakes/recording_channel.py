"""A channel at the seam that records what the gateway sends it."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime

from parley.channels.base import (
    OPEN_POLICY,
    Attachment,
    AttachmentUnavailable,
    ChannelCapabilities,
    ChatPolicy,
    ChatType,
    DeliveryResult,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
    WebhookRoute,
)


class RecordingChannel:
    capabilities = ChannelCapabilities()

    def __init__(self, name: str = "test") -> None:
        self.name = name
        self.handler: InboundHandler | None = None
        self.sent: list[OutboundMessage] = []
        self.fail_next: list[Exception] = []
        self.chat_policy: ChatPolicy = OPEN_POLICY  # what policy() answers, for tests
        self.typing_calls: list[tuple[str, str | None, str]] = []
        # Attachments' bytes by ref, served by fetch_attachment (the platform's file API).
        self.files: dict[str, bytes] = {}
        self._ids = itertools.count(1)
        self._changed = asyncio.Condition()

    async def start(self, handler: InboundHandler) -> None:
        self.handler = handler

    async def stop(self) -> None:
        self.handler = None

    def policy(self, message: InboundMessage) -> ChatPolicy:
        return self.chat_policy

    def webhook_routes(self) -> list[WebhookRoute]:
        return []

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        if self.fail_next:
            raise self.fail_next.pop(0)
        self.sent.append(message)
        async with self._changed:
            self._changed.notify_all()
        return DeliveryResult((f"out-{next(self._ids)}",), 1, datetime.now(UTC))

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        self.typing_calls.append((chat_id, thread_id, account))

    async def fetch_attachment(
        self, message: InboundMessage, attachment: Attachment, max_bytes: int
    ) -> bytes:
        data = self.files.get(attachment.ref)
        if data is None:
            raise AttachmentUnavailable("no such file")
        if len(data) > max_bytes:
            raise AttachmentUnavailable(f"{len(data)} bytes", too_large=True)
        return data

    async def wait_sent(self, count: int, limit_s: float = 10.0) -> list[OutboundMessage]:
        async with asyncio.timeout(limit_s), self._changed:
            await self._changed.wait_for(lambda: len(self.sent) >= count)
        return self.sent

    def inbound(
        self,
        text: str,
        *,
        sender: str = "alice",
        message_id: str | None = None,
        chat_type: ChatType = "direct",
        chat_id: str | None = None,
        thread_id: str | None = None,
        automated: bool = False,
        mentions_bot: bool = False,
        reply_to_text: str | None = None,
        attachments: tuple[Attachment, ...] = (),
    ) -> InboundMessage:
        return InboundMessage(
            channel=self.name,
            account="default",
            chat_type=chat_type,
            chat_id=chat_id or sender,
            sender_id=sender,
            sender_name=sender.title(),
            text=text,
            message_id=message_id or f"m-{next(self._ids)}",
            timestamp=datetime.now(UTC),
            thread_id=thread_id,
            automated=automated,
            mentions_bot=mentions_bot,
            reply_to_text=reply_to_text,
            attachments=attachments,
        )
