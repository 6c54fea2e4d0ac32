"""The vocabulary shared by every channel adapter and the gateway.

An adapter turns a platform event into an ``InboundMessage`` and hands it to the
``InboundHandler`` it was started with; the gateway answers by calling the
adapter's ``send`` with an ``OutboundMessage`` and records the ``DeliveryResult``
it gets back (a real result or an exception, never a guess).

ChannelError
├── DeliveryError          the platform refused or failed a send
│   └── RecipientBlocked   the user blocked the bot; do not retry
├── ChannelStartError      the adapter could not start
├── AttachmentUnavailable  an attachment could not be fetched (gone, refused, too big)
├── UploadRefused          a web chat frame's files cannot be taken (web_uploads)
└── InboundNotStored       the gateway could not make a message durable (raised by
                           the handler); hand the same message again later

Who may talk to the bot is the gateway's decision, made with the ``ChatPolicy`` the
adapter resolves from its own config (``Channel.policy``): the adapter knows its
platform's group, guild and channel ids, the gateway owns pairing state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from aiohttp import web

ChatType = Literal["direct", "group", "thread"]
# Who may open a direct conversation: anyone, listed user ids, or people an operator
# approved with a pairing code.
DmPolicy = Literal["open", "allowlist", "pairing"]
# When the bot answers in a group: only when mentioned or replied to, or always.
Activation = Literal["mention", "always"]


class ChannelError(Exception):
    """Base of every error raised by ``channels``."""


class DeliveryError(ChannelError):
    """A send failed. ``delivered`` holds the ids of parts that did go out before it
    (a long reply is several messages): resending would duplicate them."""

    def __init__(
        self, message: str, *, retryable: bool = False, delivered: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.delivered = delivered


class RecipientBlocked(DeliveryError):
    pass


class ChannelStartError(ChannelError):
    pass


class InboundNotStored(ChannelError):
    """The inbound handler could not store the message (state storage refuses writes).

    Unlike any other handler failure this is not the message's fault, so an adapter
    must not give up on it as a poisoned update: it keeps the message (or leaves it
    unacknowledged with the platform) and hands it over again with a backoff until the
    handler takes it or the adapter stops. The gateway has already told the sender."""


class AttachmentUnavailable(ChannelError):
    """``fetch_attachment`` could not bring the file: the platform no longer has it,
    refused it, or it is larger than the caller's limit (``too_large``)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


AttachmentKind = Literal["image", "document", "voice"]


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that came with a message, described, not fetched: the inbox keeps this
    (the platform's own reference), and the gateway fetches the bytes through the
    adapter (``AttachmentSource``) when the turn runs, again after a restart."""

    kind: AttachmentKind
    ref: str  # the platform's reference: a Telegram file_id, a Discord URL, a web upload
    name: str = ""
    mime_type: str = ""
    size: int | None = None  # bytes, as the platform declared it (None: not said)
    width: int | None = None
    height: int | None = None
    duration: float | None = None  # seconds (voice)

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> Attachment:
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        return cls(**known)  # type: ignore[arg-type]  # written by to_dict


class EarlierMessage(NamedTuple):
    """A group message the bot was not addressed in, kept as context (``group_context``)."""

    sender_id: str
    sender_name: str
    text: str
    timestamp: str  # ISO 8601, with its offset
    attachments: tuple[Attachment, ...] = ()  # its files, described (fetched if taken)


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
    # Mentioned, replied to, or sent a bare "/cmd" (not "/cmd@other_bot"): the group
    # activation rule "mention" answers only these.
    mentions_bot: bool = False
    thread_id: str | None = None
    reply_to_text: str | None = None  # the replied-to (or quoted) text, for context
    guild_id: str | None = None  # Discord: the guild a channel belongs to (for its rules)
    automated: bool = False  # heartbeats, cron events: never reset a session
    edited: bool = False  # an edit of an earlier message, delivered under the edit rule
    # Set by the gateway, never by an adapter: what others said in the group since the
    # bot last answered there, not addressed to it, oldest first. Kept with the message
    # in the inbox, so a turn run after a restart still has it.
    group_context: tuple[EarlierMessage, ...] = ()
    # Pictures, documents and voice notes that came with it (described, not fetched).
    attachments: tuple[Attachment, ...] = ()
    # Those of the message it replies to, in the same chat: "what is on this?" sent
    # as a reply to a photo is about that photo.
    reply_attachments: tuple[Attachment, ...] = ()


@runtime_checkable
class AttachmentSource(Protocol):
    """An adapter that can fetch an attachment's bytes through its platform's own file
    API (Telegram getFile, Discord's attachment URL, a web chat upload). Raises
    ``AttachmentUnavailable``; never reads more than ``max_bytes``."""

    async def fetch_attachment(
        self, message: InboundMessage, attachment: Attachment, max_bytes: int
    ) -> bytes: ...


@dataclass(frozen=True, slots=True)
class SeenMark:
    """The newest message the gateway stored from one conversation (for ``catch_up``)."""

    account: str
    chat_id: str
    thread_id: str | None
    message_id: str


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A reply. ``route`` carries what the adapter needs to address it (chat, thread, reply-to)."""

    channel: str
    account: str
    chat_id: str
    text: str
    thread_id: str | None = None
    reply_to_message_id: str | None = None
    # Names this reply for the platform's own duplicate check where it has one
    # (Discord's message nonce): a second send of the same reply, after a crash left
    # the first one's fate unknown, returns the first message instead of a new one.
    idempotency_key: str | None = None
    # Parts of a long reply already out (found by ``reconcile``): send from this one.
    first_part: int = 0
    # The platform ids of messages that showed this reply while it was written, before
    # a restart (``ReplyDraft.held``): the adapter edits them into the reply's parts
    # instead of sending those parts again, and removes the ones left over.
    shown: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What the platform said: the ids of the messages it created."""

    platform_message_ids: tuple[str, ...]
    parts: int = 1
    delivered_at: datetime | None = None


# The typing grace of platforms where an indicator is an API call (``typing_delay_seconds``):
# replies faster than this read as immediate.
TYPING_DELAY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ChannelCapabilities:
    max_message_chars: int | None = None
    markdown: bool = False
    typing_indicator: bool = False
    threads: bool = False
    # How often the typing indicator must be refreshed to stay visible (Telegram shows
    # it for 5 s, Discord for 10 s); None: it does not expire.
    typing_refresh_seconds: float | None = None
    # How long a turn may take before the first indicator is sent. Platforms where each
    # indicator is an API call (Telegram, Discord) wait a moment: a reply that arrives
    # within it needs no "typing…" (Telegram asks bots to send chat actions only when a
    # reply will take noticeable time), and under load the call would cost as much CPU
    # as the reply's own send.
    typing_delay_seconds: float = 0.0
    extra: dict[str, str] = field(default_factory=dict)
    # The adapter shows a reply while it is being written (``LiveDrafts``).
    live_drafts: bool = False
    # Its drafts are messages on the platform (Telegram, Discord edit one in place): the
    # gateway records their ids like a reply's parts, so a restart finishes them.
    draft_messages: bool = False
    # How often a draft may go out: per direct chat, and per group (None: the same).
    draft_interval_seconds: float = 0.15
    draft_group_interval_seconds: float | None = None


# Why the text a draft showed so far is void: the model call failed and is tried again;
# a later model call of the turn (after tools) writes the reply instead; or the turn ended
# with nothing to send (a silent reply), so the draft goes away.
DraftReset = Literal["retry", "next_call", "withdrawn"]

# How a chat platform shows a reply while it is written: not at all, in a message
# edited as the text grows, or a paragraph-sized message at a time.
StreamMode = Literal["off", "partial", "block"]


@dataclass(frozen=True, slots=True)
class ReplyDraft:
    """A preview of a reply the model is still writing: ephemeral, never stored, never
    retried. The reply itself still goes out through ``send`` with the same ``key`` as its
    ``OutboundMessage.idempotency_key``; an adapter replaces the draft with it (the text
    must not show twice) and ignores a draft for a key it already sent."""

    channel: str
    account: str
    chat_id: str
    key: str  # the idempotency key the final reply will carry
    text: str  # the whole text so far (not a delta): each draft replaces the last one
    thread_id: str | None = None
    reply_to_message_id: str | None = None
    # Set when what was shown before is void: drop it, then show ``text`` (often "").
    reset: DraftReset | None = None
    # What the agent is doing besides writing (a tool, a compaction), shown until done.
    status: str | None = None
    # Messages that showed this reply before a restart (``OutboundMessage.shown``):
    # taken over, not sent anew.
    held: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ChatPolicy:
    """What the adapter's config says about one conversation; the gateway enforces it."""

    activation: Activation = "always"
    dm_policy: DmPolicy = "open"
    allow_from: frozenset[str] = frozenset()  # user ids, lowercased
    # A group where the bot waits to be addressed: how many of the messages not
    # addressed to it the gateway keeps, to show the model when it is (0: none).
    group_context_messages: int = 0


OPEN_POLICY = ChatPolicy()


InboundHandler = Callable[[InboundMessage], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class WebhookRoute:
    """An HTTP endpoint an adapter needs on the gateway's server (Telegram webhooks,
    the web chat's websocket).

    The handler must answer 2xx only after the inbound handler returned: the platform
    then stops redelivering, so the message has to be durable by then. The gateway
    asks for its admin token on every route unless ``public`` says the route checks
    a credential of its own (Telegram's webhook secret).
    """

    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    public: bool = False


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

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        """Show that a reply is being prepared (best effort)."""

    def policy(self, message: InboundMessage) -> ChatPolicy:
        """The access and activation rules that apply to this message."""

    def webhook_routes(self) -> Sequence[WebhookRoute]:
        """Endpoints to mount on the gateway's HTTP server (none for most adapters).

        An adapter may also define ``connected() -> bool`` (the gateway's /health asks
        it; one without it counts as connected while it runs), and
        ``catch_up(marks: Sequence[SeenMark]) -> None``: called before ``start`` with
        the newest stored message of each recently active conversation, so a platform
        that does not redeliver (Discord) can read back what was sent while the bot
        was down.

        A platform without a duplicate check of its own (Telegram) may define the pair
        that lets a restart tell whether a reply went out before a crash (see
        ``SendRecovery``): ``async send_mark(message) -> str | None``, where the platform's
        message numbering stands in that chat before a send (the gateway stores it
        with the reply, before sending), and ``reconcile(message, mark, recorded)``.
        A platform with one (Discord's nonce) uses ``OutboundMessage.idempotency_key``."""


@runtime_checkable
class LiveDrafts(Protocol):
    """What a channel with ``capabilities.live_drafts`` offers: a reply shown as it is
    written. Best effort: a draft that fails is logged by the gateway and forgotten.

    A channel whose drafts are messages (``capabilities.draft_messages``) returns the
    platform ids of the messages that now show the reply, in order; the others None."""

    async def draft(self, draft: ReplyDraft) -> tuple[str, ...] | None: ...


# Does the gateway hold this platform message id as the delivery of some reply?
RecordedCheck = Callable[[str], Awaitable[bool]]


@runtime_checkable
class SendRecovery(Protocol):
    """What a channel that can look for its own earlier messages offers the gateway.

    ``reconcile`` returns the ids of the bot's messages in ``message``'s chat created
    after ``mark`` that ``recorded`` does not claim for another reply, in order, at
    most as many as the reply has parts: the parts that went out. None when it cannot
    tell: then the gateway sends the reply again, since a reply sent twice beats one
    never sent."""

    async def send_mark(self, message: OutboundMessage) -> str | None: ...

    async def reconcile(
        self, message: OutboundMessage, mark: str, recorded: RecordedCheck
    ) -> tuple[str, ...] | None: ...
