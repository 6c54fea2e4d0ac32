"""The vocabulary shared by every channel adapter and the gateway.

An adapter turns a platform event into an ``InboundMessage`` and hands it to the
``InboundHandler`` it was started with; the gateway answers by calling the
adapter's ``send`` with an ``OutboundMessage`` and records the ``DeliveryResult``
it gets back (a real result or an exception, never a guess).

ChannelError
├── DeliveryError          the platform refused or failed a send
│   └── RecipientBlocked   the user blocked the bot; do not retry
└── ChannelStartError      the adapter could not start
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

ChatType = Literal["direct", "group", "thread"]


class ChannelError(Exception):
    """Base of every error raised by ``channels``."""


class DeliveryError(ChannelError):
    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class RecipientBlocked(DeliveryError):
    pass


class ChannelStartError(ChannelError):
    pass


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One message from a person, normalised. ``text`` has platform markup stripped."""

    channel: str  # "terminal", "telegram", "discord", ...
    account: str  # which bot account received it ("default" for single-account channels)
    chat_type: ChatType
    chat_id: str  # the DM partner, group or channel id
    sender_id: str
    sender_name: str
    text: str
    message_id: str  # unique per (channel, account); the inbox dedupes on it
    timestamp: datetime
    mentions_bot: bool = False
    thread_id: str | None = None
    reply_to_text: str | None = None
    automated: bool = False  # heartbeats, cron events: never reset a session


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A reply. ``route`` carries what the adapter needs to address it (chat, thread, reply-to)."""

    channel: str
    account: str
    chat_id: str
    text: str
    thread_id: str | None = None
    reply_to_message_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What the platform said: the ids of the messages it created."""

    platform_message_ids: tuple[str, ...]
    parts: int = 1
    delivered_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ChannelCapabilities:
    max_message_chars: int | None = None
    markdown: bool = False
    typing_indicator: bool = False
    threads: bool = False
    extra: dict[str, str] = field(default_factory=dict)


InboundHandler = Callable[[InboundMessage], Awaitable[None]]


@runtime_checkable
class Channel(Protocol):
    """A running platform adapter with an explicit lifecycle."""

    name: str
    capabilities: ChannelCapabilities

    async def start(self, handler: InboundHandler) -> None:
        """Connect and begin delivering inbound messages to ``handler``."""

    async def stop(self) -> None:
        """Disconnect; idempotent."""

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        """Deliver a reply or raise ``DeliveryError``."""

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        """Show that a reply is being prepared (best effort)."""
