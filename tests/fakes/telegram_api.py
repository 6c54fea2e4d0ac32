"""A strict fake of the Telegram Bot API for the real python-telegram-bot ``Bot``.

``async with FakeTelegram() as fake:``, ``fake.add_bot(token, username)``, then point
PTB at ``fake.base_url + "/bot"`` (files: ``+ "/file/bot"``). What it checks, like the
real service: the token (401), the method (404), known chats (400 chat not found),
blocked users (403), text length after entity parsing (``max_text_length`` counted in
``length_unit``), strict HTML (``telegram_html``), forum threads, reply targets, one
long poll per bot (409) and no polling while a webhook is set (409).

Message ids are numbered like Telegram's: in private chats and basic groups by the
receiving account (one counter per bot, shared by all its private chats and groups, so
a bot sees ids interleave across them); in supergroups and channels by the chat (every
member sees the same ids). ``editMessageReplyMarkup`` tells the bot's own messages from
others' and missing ones, as the real service does; successful ones are in ``edits``.
Sent messages carry the ``entities`` of their HTML (``html_entities``).
``editMessageText`` checks its text as ``sendMessage`` does, then the same way: missing
(400 message to edit not found), not the bot's (message can't be edited), the same text,
entities and inline keyboard as now (message is not modified;
no ``reply_markup`` removes the keyboard, as for real); it counts in the per-chat flood
window like a send. Done, the stored message changes (``edit_date``) and is returned;
``text_edits`` has it. ``deleteMessage``: missing (message to delete not found); the
bot's own messages anywhere and incoming ones in private chats go (the real rules);
others' in groups only after ``grant_delete`` (else message can't be deleted), and
nothing older than 48 hours (private chats: message can't be deleted for everyone).
Deleted messages are gone for edits and replies; ``deletions`` has them.
``message(chat_id, message_id)``/``message_text`` read a stored message as it is now
(``sent`` keeps what each send returned); ``call_counts`` counts calls per method.

Files: ``add_file(token, data)`` makes a file the bot can fetch (a ``file_id`` for that
bot only, as on Telegram); ``photo``/``document``/``voice`` build the message fields
for it (pass them as ``push_message(extra=...)``). ``getFile`` answers its
``file_path`` (400 ``invalid file_id`` for an unknown id, 400 ``file is too big`` past
``max_download_bytes``, 20 MB like the real service), and ``GET /file/bot<token>/<path>``
serves the bytes (404 for an unknown path or token); downloads are in ``downloads``.

Tests push updates with ``push_message``/``push_update``: they wait for ``getUpdates``
or, once a webhook is set, are POSTed to it in order; a non-2xx answer keeps the
update pending until ``redeliver()``. ``fail_next``/``flood`` script errors (a
``getUpdates`` failure scripted while a long poll is pending answers that poll, as a
proxy or flood control would); ``drop_next`` closes the connection without an answer;
``go_offline``/``go_online`` refuse every connection meanwhile. Every successful send
is in ``sent``; ``wait_sent`` waits for it without sleeping. ``fail_next``/``flood``
work for every method (e.g. ``flood("editMessageText", 3)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import re
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import aiohttp
from aiohttp import web

from tests.fakes.telegram_html import EntityParseError, _Parser, visible_text

DEFAULT_MAX_TEXT_LENGTH = 4096
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024  # what getFile serves a bot at most
WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to"
    " delete the webhook first"
)
POLL_CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance"
    " is running"
)
BLOCKED = "Forbidden: bot was blocked by the user"
NOT_MODIFIED = (
    "message is not modified: specified new message content and reply markup are exactly"
    " the same as a current content and reply markup of the message"
)
DELETE_WINDOW_SECONDS = 48 * 3600  # "only if it was sent less than 48 hours ago"
# Chat types whose messages the chat numbers (the same ids for every member); in the
# others (private chats, basic groups) each account numbers what it receives.
CHAT_NUMBERED = frozenset({"supergroup", "channel"})
DROP = 0  # a _Failure status: the connection is closed, no answer at all
# What the real server sends when allowed_updates was never given.
DEFAULT_ALLOWED_UPDATES = frozenset(
    {"message", "edited_message", "channel_post", "edited_channel_post", "callback_query",
     "inline_query", "chosen_inline_result", "my_chat_member", "poll", "poll_answer"}
)  # fmt: skip
_COMMAND = re.compile(r"/[A-Za-z0-9_]{1,32}(?:@[A-Za-z0-9_]{3,32})?")
_MENTION = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{4,31}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
LengthUnit = Literal["code_points", "utf16"]
Handler = Callable[["_Bot", dict[str, Any]], Awaitable[Any]]


def utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def auto_entities(text: str) -> list[dict[str, Any]]:
    """The entities Telegram adds by itself: a leading /command and @mentions."""
    entities: list[dict[str, Any]] = []
    command = _COMMAND.match(text)
    if command:
        entities.append({"type": "bot_command", "offset": 0, "length": utf16_units(command[0])})
    for match in _MENTION.finditer(text, command.end() if command else 0):
        offset = utf16_units(text[: match.start()])
        entities.append({"type": "mention", "offset": offset, "length": utf16_units(match[0])})
    return entities


_HTML_ENTITY_TYPES = {
    "b": "bold", "strong": "bold", "i": "italic", "em": "italic", "u": "underline",
    "ins": "underline", "s": "strikethrough", "strike": "strikethrough",
    "del": "strikethrough", "span": "spoiler", "tg-spoiler": "spoiler", "code": "code",
    "pre": "pre", "blockquote": "blockquote", "a": "text_link", "tg-emoji": "custom_emoji",
}  # fmt: skip


class _EntityParser(_Parser):
    """``telegram_html``'s parser, also keeping the entities each tag makes."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.entities: list[dict[str, Any]] = []
        self._starts: list[tuple[int, dict[str, str]]] = []
        self._attrs: dict[str, str] = {}

    def _offset(self) -> int:
        return utf16_units("".join(self.out))

    def attributes(self, name: str, index: int, start: int) -> dict[str, str]:
        self._attrs = super().attributes(name, index, start)
        return self._attrs

    def tag(self) -> None:
        depth = len(self.open)
        super().tag()
        if len(self.open) > depth:
            self._starts.append((self._offset(), self._attrs))

    def end_tag(self, start: int) -> None:
        name = self.open[-1][0] if self.open else ""
        super().end_tag(start)
        offset, attrs = self._starts.pop()
        length = self._offset() - offset
        if length <= 0:
            return  # Telegram drops empty entities
        entity: dict[str, Any] = {"type": _HTML_ENTITY_TYPES[name], "offset": offset,
                                  "length": length}  # fmt: skip
        if name == "a":
            entity["url"] = attrs.get("href", "")
        elif name == "tg-emoji":
            entity["custom_emoji_id"] = attrs.get("emoji-id", "")
        elif name == "blockquote" and "expandable" in attrs:
            entity["type"] = "expandable_blockquote"
        self.entities.append(entity)


def html_entities(html: str) -> list[dict[str, Any]]:
    """The entities Telegram makes of ``html`` (call after ``visible_text`` accepted it)."""
    parser = _EntityParser(html)
    parser.run()
    return sorted(parser.entities, key=lambda e: (e["offset"], -e["length"], e["type"]))


class ApiError(Exception):
    def __init__(self, status: int, description: str, parameters: dict[str, Any] | None = None):
        super().__init__(description)
        self.status, self.description, self.parameters = status, description, parameters


def bad_request(reason: str) -> ApiError:
    return ApiError(400, f"Bad Request: {reason}")


@dataclass(frozen=True, slots=True)
class SentMessage:
    token: str
    bot_username: str
    chat_id: int
    text: str  # as sent (with markup)
    visible_text: str  # what the user sees
    parse_mode: str | None
    message_thread_id: int | None
    reply_to_message_id: int | None
    message_id: int
    message: dict[str, Any]  # the Message object returned (usable as push_message reply_to)
    # time.perf_counter() when the fake accepted it (benchmarks measure latency with it)
    received_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class MarkupEdit:
    """A successful ``editMessageReplyMarkup``."""

    token: str
    chat_id: int
    message_id: int
    reply_markup: dict[str, Any] | None  # None: the keyboard was removed
    message: dict[str, Any]  # the edited Message object returned


@dataclass(frozen=True, slots=True)
class TextEdit:
    """A successful ``editMessageText``."""

    token: str
    chat_id: int
    message_id: int
    text: str  # as sent (with markup)
    visible_text: str  # what the user sees now
    parse_mode: str | None
    message: dict[str, Any]  # the edited Message object returned
    received_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class Deletion:
    """A successful ``deleteMessage``."""

    token: str
    chat_id: int
    message_id: int
    message: dict[str, Any]  # the message as it was when deleted
    received_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class ChatActionRecord:
    token: str
    chat_id: int
    action: str
    message_thread_id: int | None


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    token: str
    update_id: int
    status: int  # 0: the connection failed


@dataclass(frozen=True, slots=True)
class ApiCall:
    token: str
    method: str
    params: dict[str, Any]


@dataclass(slots=True)
class _Failure:
    method: str
    status: int  # DROP: close the connection without answering
    description: str
    parameters: dict[str, Any] | None
    times: int
    token: str | None


@dataclass(slots=True)
class _Bot:
    token: str
    user: dict[str, Any]
    update_ids: Any  # itertools.count
    updates: list[dict[str, Any]] = field(default_factory=list)  # not yet confirmed
    allowed_updates: frozenset[str] = DEFAULT_ALLOWED_UPDATES
    poll_generation: int = 0
    webhook: dict[str, Any] | None = None
    webhook_paused: bool = False  # after a failed delivery, until redeliver()
    webhook_task: asyncio.Task[None] | None = None
    last_webhook_error: str | None = None
    # Ids of messages in its private chats and basic groups: the account's own counter.
    next_message_id: int = 1


@dataclass(slots=True)
class _Chat:
    id: int
    type: str
    title: str | None = None
    first_name: str | None = None
    username: str | None = None
    is_forum: bool = False
    bots: set[str] | None = None  # tokens that know this chat; None: every bot
    topics: set[int] = field(default_factory=set)
    deleters: set[str] = field(default_factory=set)  # tokens allowed to delete any message
    # Stored messages by id, per numbering: one map for the whole chat when the chat
    # numbers its messages (key ""), else one per receiving bot (key: its token), since
    # two bots' counters give the same ids to different messages.
    messages: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    next_message_id: int = 1  # used only when the chat numbers its messages
    recent_sends: deque[float] = field(default_factory=deque)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "type": self.type}
        if self.type == "private":
            data["first_name"] = self.first_name or "User"
        else:
            data["title"] = self.title or f"Group {self.id}"
        if self.username:
            data["username"] = self.username
        if self.is_forum:
            data["is_forum"] = True
        return data

    @property
    def numbers_messages(self) -> bool:
        return self.type in CHAT_NUMBERED

    def messages_of(self, token: str) -> dict[int, dict[str, Any]]:
        """The messages as ``token``'s bot sees them, by id."""
        return self.messages.setdefault("" if self.numbers_messages else token, {})


class _Signal:
    """notify_all that plain (sync) code can call: waiters re-check after each pulse.

    Unlike asyncio.Condition it needs no lock, so the sync ``push_message`` can wake
    long polls and ``wait_*`` callers directly.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def pulse(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_for(self, ready: Callable[[], bool], limit_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit_s):
                while not ready():
                    await self._event.wait()
        return ready()


class FakeTelegram:
    def __init__(
        self,
        *,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
        length_unit: LengthUnit = "code_points",
    ) -> None:
        self.max_text_length = max_text_length
        self.length_unit: LengthUnit = length_unit
        self.refuse_entities = False  # refuse any parse_mode, to test plain-text fallback
        # Per-chat flood control (off when None): at most this many sends per window.
        self.chat_flood_limit: int | None = None
        self.chat_flood_window = 1.0
        self.clock: Callable[[], float] = time.monotonic
        self.blocked: set[int] = set()
        self.sent: list[SentMessage] = []
        self.edits: list[MarkupEdit] = []
        self.text_edits: list[TextEdit] = []
        self.deletions: list[Deletion] = []
        self.actions: list[ChatActionRecord] = []
        self.calls: list[ApiCall] = []
        # Calls per method by its documented name ("editMessageText"), failed ones too.
        self.call_counts: Counter[str] = Counter()
        self.webhook_deliveries: list[WebhookDelivery] = []
        self.max_download_bytes = MAX_DOWNLOAD_BYTES
        # Files by (token, file_id): (file_path, bytes); paths served by (token, path).
        self._files: dict[tuple[str, str], tuple[str, bytes]] = {}
        self._paths: dict[tuple[str, str], bytes] = {}
        self.downloads: list[str] = []  # file paths fetched, in order
        # Called with every API call as it arrives, before it is answered.
        self.call_hooks: list[Callable[[ApiCall], None]] = []
        # Methods held (lowercase): their calls wait until ``release`` (a slow server).
        self._held: dict[str, asyncio.Event] = {}
        self._bots: dict[str, _Bot] = {}
        self._chats: dict[int, _Chat] = {}
        self._failures: list[_Failure] = []
        self._signal = _Signal()
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._transports: set[asyncio.Transport] = set()  # connections seen
        self._session: aiohttp.ClientSession | None = None
        self._port = 0
        handlers: dict[str, Handler] = {
            "getMe": self._get_me,
            "setWebhook": self._set_webhook,
            "deleteWebhook": self._delete_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "editMessageReplyMarkup": self._edit_message_reply_markup,
            "deleteMessage": self._delete_message,
            "sendChatAction": self._send_chat_action,
            "getFile": self._get_file,
        }
        # Method names are case-insensitive: by lowercase name, (documented name, handler).
        self._methods = {name.lower(): (name, h) for name, h in handlers.items()}

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site, self._port = runner, site, int(runner.addresses[0][1])

    async def go_offline(self) -> None:
        """Refuse new connections and cut every open one (a network outage)."""
        if self._site is not None:
            site, self._site = self._site, None
            await site.stop()
        for transport in self._transports:
            transport.abort()
        self._transports.clear()

    async def go_online(self) -> None:
        """Listen again, on the same port."""
        if self._site is None and self._runner is not None:
            site = web.TCPSite(self._runner, "127.0.0.1", self._port)
            await site.start()
            self._site = site

    async def stop(self) -> None:
        # Pending long polls wait on the signal: release them, or cleanup waits for them.
        self._stopping = True
        self._signal.pulse()
        for held in self._held.values():
            held.set()
        tasks = [b.webhook_task for b in self._bots.values() if b.webhook_task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    # -- set-up and scripting ------------------------------------------------------------

    def add_bot(
        self, token: str, username: str, first_name: str = "Parley", bot_id: int | None = None
    ) -> dict[str, Any]:
        head = token.split(":", 1)[0]
        user = {
            "id": bot_id if bot_id is not None else (int(head) if head.isdigit() else 1),
            "is_bot": True,
            "first_name": first_name,
            "username": username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }
        self._bots[token] = _Bot(token, user, itertools.count(100_001))
        return dict(user)

    def add_chat(
        self,
        chat_id: int,
        chat_type: str = "private",
        *,
        title: str | None = None,
        first_name: str | None = None,
        username: str | None = None,
        is_forum: bool = False,
        topics: tuple[int, ...] = (),
        token: str | None = None,
    ) -> dict[str, Any]:
        """Make a chat known (to ``token``'s bot only, or to every bot)."""
        chat = self._chats.get(chat_id)
        if chat is None:
            chat = _Chat(chat_id, chat_type, title, first_name, username, is_forum, set())
            self._chats[chat_id] = chat
        chat.is_forum = chat.is_forum or is_forum
        chat.topics.update(topics)
        if token is None:
            chat.bots = None
        elif chat.bots is not None:
            chat.bots.add(token)
        return chat.as_dict()

    def block(self, chat_id: int) -> None:
        self.blocked.add(chat_id)

    def unblock(self, chat_id: int) -> None:
        self.blocked.discard(chat_id)

    def fail_next(
        self,
        method: str,
        status: int,
        description: str,
        parameters: dict[str, Any] | None = None,
        times: int = 1,
        token: str | None = None,
    ) -> None:
        self._failures.append(
            _Failure(method.lower(), status, description, parameters, times, token)
        )
        self._signal.pulse()  # a pending long poll takes a getUpdates failure at once

    def hold(self, method: str) -> None:
        """Calls of ``method`` arrive (``calls``, hooks) but are not answered until
        ``release``: a server slow to answer, made deterministic."""
        self._held.setdefault(method.lower(), asyncio.Event())

    def release(self, method: str) -> None:
        held = self._held.pop(method.lower(), None)
        if held is not None:
            held.set()

    def drop_next(self, method: str, times: int = 1, token: str | None = None) -> None:
        """The next ``times`` calls of ``method`` lose their connection, unanswered."""
        self.fail_next(method, DROP, "connection dropped", times=times, token=token)

    def grant_delete(self, chat_id: int, token: str) -> None:
        """``token``'s bot becomes an admin of the group allowed to delete any message."""
        self._chats[chat_id].deleters.add(token)

    def clear_failures(self) -> None:
        """Forget every scripted failure not yet used (the fault is over)."""
        self._failures.clear()

    def flood(self, method: str, retry_after: int, times: int = 1) -> None:
        self.fail_next(
            method, 429, f"Too Many Requests: retry after {retry_after}",
            {"retry_after": retry_after}, times,
        )  # fmt: skip

    # -- records -------------------------------------------------------------------------

    def sent_to(self, chat_id: int | str) -> list[SentMessage]:
        return [m for m in self.sent if m.chat_id == int(chat_id)]

    def message(
        self, chat_id: int | str, message_id: int, token: str | None = None
    ) -> dict[str, Any] | None:
        """The stored message as it is now (edits applied; None: unknown or deleted).
        In private chats and basic groups ids are per bot: give ``token`` when more than
        one bot was added."""
        chat = self._chats.get(int(chat_id))
        if chat is None:
            return None
        if token is None and not chat.numbers_messages:
            if len(self._bots) != 1:
                raise ValueError("FakeTelegram.message: which bot's numbering? (token=)")
            token = next(iter(self._bots))
        return chat.messages_of(token or "").get(message_id)

    def message_text(
        self, chat_id: int | str, message_id: int, token: str | None = None
    ) -> str | None:
        """The text the user sees now in that message (None: unknown or deleted)."""
        found = self.message(chat_id, message_id, token)
        return None if found is None else found.get("text")

    def pending_updates(self, token: str) -> list[dict[str, Any]]:
        return list(self._bot(token).updates)

    def webhook_of(self, token: str) -> dict[str, Any] | None:
        return self._bot(token).webhook

    # Each wait has its own bound so a test waiting for what never comes fails fast.
    async def wait_sent(
        self,
        count: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[SentMessage]:
        await self._wait(lambda: len(self.sent) >= count, timeout, f"{count} sent messages")
        return list(self.sent)

    async def wait_actions(
        self,
        count: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[ChatActionRecord]:
        await self._wait(lambda: len(self.actions) >= count, timeout, f"{count} chat actions")
        return list(self.actions)

    async def wait_webhook(
        self,
        count: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[WebhookDelivery]:
        ready = lambda: len(self.webhook_deliveries) >= count  # noqa: E731
        await self._wait(ready, timeout, f"{count} webhook deliveries")
        return list(self.webhook_deliveries)

    async def wait_polled(
        self,
        token: str,
        offset: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> None:
        """Until the bot confirmed every update before ``offset`` (asked getUpdates for it)."""
        bot = self._bot(token)
        confirmed = lambda: not any(u["update_id"] < offset for u in bot.updates)  # noqa: E731
        await self._wait(confirmed, timeout, f"offset {offset}")

    async def wait_calls(
        self,
        method: str,
        count: int = 1,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[ApiCall]:
        """Until ``count`` calls of ``method`` (any bot) arrived; e.g. a long poll is out."""
        name = method.lower()
        matching = lambda: [c for c in self.calls if c.method.lower() == name]  # noqa: E731
        await self._wait(lambda: len(matching()) >= count, timeout, f"{count} {method} calls")
        return matching()

    async def wait_until(
        self,
        predicate: Callable[[], bool],
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> None:
        """Wait (no polling) until ``predicate()`` holds after some request or push."""
        await self._wait(predicate, timeout, "state matching the predicate")

    async def _wait(self, ready: Callable[[], bool], limit_s: float, what: str) -> None:
        if not await self._signal.wait_for(ready, limit_s):
            raise TimeoutError(f"FakeTelegram: no {what} within {limit_s} s")

    # -- pushing updates -------------------------------------------------------------------

    def push_update(self, token: str, update: dict[str, Any]) -> dict[str, Any]:
        bot = self._bot(token)
        update = dict(update)
        update.setdefault("update_id", next(bot.update_ids))
        for kind in ("message", "edited_message"):
            chat = (update.get(kind) or {}).get("chat")
            if chat:
                self.add_chat(chat["id"], chat["type"], title=chat.get("title"), token=token)
        bot.updates.append(update)
        self._signal.pulse()
        self._kick_webhook(bot)
        return update

    def push_message(
        self,
        token: str,
        *,
        chat_id: int,
        text: str | None = None,
        chat_type: str = "private",
        chat_title: str | None = None,
        sender_id: int | None = None,
        sender_first_name: str = "Alice",
        sender_last_name: str | None = None,
        sender_username: str | None = None,
        sender_is_bot: bool = False,
        caption: str | None = None,
        photo: bool = False,
        voice: int | None = None,  # duration in seconds
        document: str | None = None,  # file name
        sticker: str | None = None,  # emoji
        video: int | None = None,  # duration in seconds
        audio: int | None = None,  # duration in seconds
        location: tuple[float, float] | None = None,
        reply_to: dict[str, Any] | None = None,  # a Message object (e.g. SentMessage.message)
        quote_text: str | None = None,
        message_thread_id: int | None = None,
        is_topic_message: bool = False,
        is_forum: bool = False,
        entities: list[dict[str, Any]] | None = None,
        edit: bool = False,
        message_id: int | None = None,
        extra: dict[str, Any] | None = None,  # merged into the message as is
    ) -> dict[str, Any]:
        self._bot(token)
        first_name = sender_first_name if chat_type == "private" else None
        self.add_chat(chat_id, chat_type, title=chat_title, first_name=first_name,
                      is_forum=is_forum, token=token)  # fmt: skip
        chat = self._chats[chat_id]
        if message_thread_id is not None:
            chat.topics.add(message_thread_id)
        sender: dict[str, Any] = {
            "id": sender_id if sender_id is not None else (chat_id if chat_id > 0 else 4242),
            "is_bot": sender_is_bot,
            "first_name": sender_first_name,
        }
        if sender_last_name:
            sender["last_name"] = sender_last_name
        if sender_username:
            sender["username"] = sender_username
        now = int(time.time())
        messages = chat.messages_of(token)
        message: dict[str, Any]
        if edit:
            # Without an id: the last message in this chat as this bot sees it.
            mid = message_id if message_id is not None else max(messages, default=0)
            original = messages.get(mid, {})
            date = int(original.get("date", now))
            message = {"message_id": mid, "date": date, "edit_date": max(now, date + 1)}
        else:
            mid = self._new_message_id(self._bots[token], chat, message_id)
            message = {"message_id": mid, "date": now}
        message.update(chat=chat.as_dict(), **{"from": sender})
        for key, value in (("text", text), ("caption", caption)):
            if value is not None:
                message[key] = value
                found = auto_entities(value) if entities is None else entities
                if found:
                    message["entities" if key == "text" else "caption_entities"] = found
        message.update(_media(photo, voice, document, sticker, video, audio, location))
        if message_thread_id is not None:
            message["message_thread_id"] = message_thread_id
            if is_topic_message:
                message["is_topic_message"] = True
        if reply_to is not None:
            # Like Telegram: the replied-to message comes without its own reply.
            message["reply_to_message"] = {
                k: v for k, v in reply_to.items() if k != "reply_to_message"
            }
        elif is_topic_message and chat.is_forum and message_thread_id is not None:
            # In forum topics every message "replies" to the topic's creation message.
            message["reply_to_message"] = {
                "message_id": message_thread_id, "date": now, "chat": chat.as_dict(),
                "from": sender, "message_thread_id": message_thread_id,
                "is_topic_message": True,
                "forum_topic_created": {"name": f"Topic {message_thread_id}", "icon_color": 0},
            }  # fmt: skip
        if quote_text is not None:
            message["quote"] = {"text": quote_text, "position": 0}
        message.update(extra or {})
        messages[mid] = message
        return self.push_update(token, {"edited_message" if edit else "message": message})

    # -- webhook delivery ------------------------------------------------------------------

    def redeliver(self) -> None:
        """Retry pending webhook updates after a failed delivery (Telegram retries later)."""
        for bot in self._bots.values():
            bot.webhook_paused = False
            self._kick_webhook(bot)

    def _kick_webhook(self, bot: _Bot) -> None:
        if bot.webhook is None or bot.webhook_paused or self._stopping or not bot.updates:
            return
        if bot.webhook_task is None or bot.webhook_task.done():
            bot.webhook_task = asyncio.create_task(self._deliver_webhook(bot))

    async def _deliver_webhook(self, bot: _Bot) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        while bot.webhook is not None and bot.updates and not self._stopping:
            update, hook = bot.updates[0], bot.webhook
            headers = {"Content-Type": "application/json"}
            if hook.get("secret_token"):
                headers["X-Telegram-Bot-Api-Secret-Token"] = hook["secret_token"]
            try:
                async with self._session.post(
                    hook["url"], data=json.dumps(update), headers=headers
                ) as response:
                    status = response.status
                    await response.read()
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            self.webhook_deliveries.append(WebhookDelivery(bot.token, update["update_id"], status))
            self._signal.pulse()
            if not 200 <= status < 300:
                bot.webhook_paused = True
                bot.last_webhook_error = f"Wrong response from the webhook: {status}"
                return
            if bot.updates and bot.updates[0] is update:
                bot.updates.pop(0)

    # -- HTTP --------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        bot = self._bots.get(request.match_info["token"])
        if bot is None:
            return _error(ApiError(401, "Unauthorized"))
        method = request.match_info["method"]
        known = self._methods.get(method.lower())
        if known is None:
            return _error(ApiError(404, "Not Found"))
        name, handler = known
        self.call_counts[name] += 1
        if request.transport is not None:
            self._transports = {t for t in self._transports if not t.is_closing()}
            self._transports.add(request.transport)
        params = await _read_params(request)
        call = ApiCall(bot.token, method, params)
        self.calls.append(call)
        for hook in self.call_hooks:
            hook(call)
        self._signal.pulse()
        if (held := self._held.get(method.lower())) is not None:
            await held.wait()
        try:
            self._take_failure(bot.token, method.lower())
            result = await handler(bot, params)
        except ApiError as exc:
            if exc.status == DROP:
                if request.transport is not None:
                    request.transport.abort()  # the client sees the connection die
                return web.Response(status=502)  # never written: the socket is gone
            return _error(exc)
        return web.json_response({"ok": True, "result": result})

    def _pending_failure(self, token: str, method: str) -> bool:
        return any(f.method == method and f.token in (None, token) for f in self._failures)

    def _take_failure(self, token: str, method: str) -> None:
        for failure in self._failures:
            if failure.method == method and failure.token in (None, token):
                failure.times -= 1
                if failure.times <= 0:
                    self._failures.remove(failure)
                raise ApiError(failure.status, failure.description, failure.parameters)

    def _bot(self, token: str) -> _Bot:
        if token not in self._bots:
            raise KeyError(f"FakeTelegram: no bot with token {token!r} (add_bot first)")
        return self._bots[token]

    # -- methods -------------------------------------------------------------------------

    async def _get_me(self, bot: _Bot, params: dict[str, Any]) -> Any:
        return bot.user

    async def _set_webhook(self, bot: _Bot, params: dict[str, Any]) -> Any:
        url = str(params.get("url") or "")
        if not url:
            return await self._delete_webhook(bot, params)
        secret = params.get("secret_token")
        if secret is not None and not _SECRET.fullmatch(str(secret)):
            raise bad_request("secret token contains unallowed characters")
        if _flag(params, "drop_pending_updates"):
            bot.updates.clear()
        allowed = _json_param(params, "allowed_updates")
        if allowed is not None:
            bot.allowed_updates = frozenset(allowed) or DEFAULT_ALLOWED_UPDATES
        bot.webhook = {"url": url, "secret_token": secret}
        bot.webhook_paused = False
        self._signal.pulse()  # a pending long poll must not keep waiting
        self._kick_webhook(bot)
        return True

    async def _delete_webhook(self, bot: _Bot, params: dict[str, Any]) -> Any:
        bot.webhook = None
        if _flag(params, "drop_pending_updates"):
            bot.updates.clear()
        return True

    async def _get_webhook_info(self, bot: _Bot, params: dict[str, Any]) -> Any:
        info: dict[str, Any] = {
            "url": bot.webhook["url"] if bot.webhook else "",
            "has_custom_certificate": False,
            "pending_update_count": len(bot.updates),
        }
        if bot.webhook:
            info.update(max_connections=40, allowed_updates=sorted(bot.allowed_updates))
        if bot.last_webhook_error:
            info.update(last_error_date=int(time.time()), last_error_message=bot.last_webhook_error)
        return info

    async def _get_updates(self, bot: _Bot, params: dict[str, Any]) -> Any:
        if bot.webhook is not None:
            raise ApiError(409, WEBHOOK_CONFLICT)
        offset = _int_param(params, "offset")
        limit = min(max(_int_param(params, "limit") or 100, 1), 100)
        timeout = max(float(params.get("timeout") or 0), 0.0)
        allowed = _json_param(params, "allowed_updates")
        if allowed is not None:
            bot.allowed_updates = frozenset(allowed) or DEFAULT_ALLOWED_UPDATES
        if offset is not None:
            # Asking for ``offset`` confirms every update before it; a negative one keeps
            # only the last -offset updates.
            bot.updates = (
                bot.updates[offset:] if offset < 0
                else [u for u in bot.updates if u["update_id"] >= offset]
            )  # fmt: skip
        # The real server never stores updates of kinds the bot did not ask for.
        bot.updates = [u for u in bot.updates if _kind(u) in bot.allowed_updates]
        bot.poll_generation += 1
        generation = bot.poll_generation
        self._signal.pulse()  # wakes an earlier poll of this bot: it ends in a conflict
        superseded = lambda: bot.poll_generation != generation  # noqa: E731
        await self._signal.wait_for(
            lambda: self._stopping or superseded() or bot.webhook is not None or bool(bot.updates)
            or self._pending_failure(bot.token, "getupdates"),
            timeout,
        )  # fmt: skip
        if superseded():
            raise ApiError(409, POLL_CONFLICT)
        # A failure scripted while this poll waited answers it (e.g. a 502 from a proxy).
        self._take_failure(bot.token, "getupdates")
        return [u for u in bot.updates if _kind(u) in bot.allowed_updates][:limit]

    def _chat_for(self, bot: _Bot, params: dict[str, Any]) -> _Chat:
        raw = params.get("chat_id")
        try:
            chat = self._chats.get(int(str(raw)))
        except ValueError:
            chat = None  # "@channel" usernames: the fake knows none
        if chat is None or (chat.bots is not None and bot.token not in chat.bots):
            raise bad_request("chat not found")
        return chat

    def _new_message_id(self, bot: _Bot, chat: _Chat, explicit: int | None = None) -> int:
        """The next id from the counter this chat's messages take theirs from (the chat's,
        or the receiving bot's); an ``explicit`` id moves that counter past it."""
        owner: _Bot | _Chat = chat if chat.numbers_messages else bot
        mid = owner.next_message_id if explicit is None else explicit
        owner.next_message_id = max(owner.next_message_id, mid + 1)
        return mid

    def _thread(self, chat: _Chat, params: dict[str, Any]) -> int | None:
        thread = _int_param(params, "message_thread_id")
        if thread is not None and chat.is_forum and thread not in chat.topics and thread != 1:
            raise bad_request("message thread not found")
        return thread

    def _measure(self, text: str) -> int:
        return utf16_units(text) if self.length_unit == "utf16" else len(text)

    def _visible(self, text: str, parse_mode: str | None) -> str:
        if not parse_mode:
            return text
        if self.refuse_entities:
            raise bad_request("can't parse entities: Can't find end of the entity at byte offset 0")
        if parse_mode.lower() == "html":
            try:
                return visible_text(text)
            except EntityParseError as exc:
                raise bad_request(f"can't parse entities: {exc}") from None
        if parse_mode.lower() in ("markdown", "markdownv2"):
            return text  # not parsed: the adapter sends HTML
        raise bad_request(f"unsupported parse_mode {parse_mode!r}")

    def _flood_check(self, chat: _Chat) -> None:
        if self.chat_flood_limit is None:
            return
        now, window = self.clock(), self.chat_flood_window
        while chat.recent_sends and chat.recent_sends[0] <= now - window:
            chat.recent_sends.popleft()
        if len(chat.recent_sends) >= self.chat_flood_limit:
            wait = max(1, math.ceil(chat.recent_sends[0] + window - now))
            raise ApiError(429, f"Too Many Requests: retry after {wait}", {"retry_after": wait})
        chat.recent_sends.append(now)

    async def _send_message(self, bot: _Bot, params: dict[str, Any]) -> Any:
        chat = self._chat_for(bot, params)
        if chat.id in self.blocked:
            raise ApiError(403, BLOCKED)
        thread = self._thread(chat, params)
        reply = _json_param(params, "reply_parameters") or {}
        reply_id = _int_param(reply, "message_id") or _int_param(params, "reply_to_message_id")
        messages = chat.messages_of(bot.token)
        if reply_id is not None and reply_id not in messages:
            if not _flag(reply, "allow_sending_without_reply"):
                raise bad_request("message to be replied not found")
            reply_id = None
        markup = _inline_markup(params, inline_only=False)
        text, parse_mode, visible, entities = self._message_text(params)
        self._flood_check(chat)
        message: dict[str, Any] = {
            "message_id": self._new_message_id(bot, chat), "date": int(time.time()),
            "chat": chat.as_dict(), "from": bot.user, "text": visible,
        }  # fmt: skip
        if entities:
            message["entities"] = entities
        if thread is not None:
            message["message_thread_id"] = thread
            if chat.is_forum:
                message["is_topic_message"] = True
        if reply_id is not None:
            original = messages[reply_id]
            message["reply_to_message"] = {
                k: original[k] for k in ("message_id", "date", "chat", "from", "text")
                if k in original
            }  # fmt: skip
        if markup is not None:
            message["reply_markup"] = markup
        messages[message["message_id"]] = message
        record = SentMessage(
            token=bot.token, bot_username=bot.user["username"], chat_id=chat.id, text=text,
            visible_text=visible, parse_mode=parse_mode, message_thread_id=thread,
            reply_to_message_id=reply_id, message_id=message["message_id"], message=message,
        )  # fmt: skip
        self.sent.append(record)
        self._signal.pulse()
        return message

    def _message_text(
        self, params: dict[str, Any]
    ) -> tuple[str, str | None, str, list[dict[str, Any]]]:
        """(text as sent, parse_mode, visible text, entities) of a text to send or edit,
        checked as the real service checks it."""
        text = str(params.get("text") or "")
        parse_mode = str(params.get("parse_mode") or "") or None
        visible = self._visible(text, parse_mode)
        if not visible.strip():
            raise bad_request("message text is empty")
        if self._measure(visible) > self.max_text_length:
            raise bad_request("message is too long")
        if parse_mode and parse_mode.lower() == "html":
            entities = html_entities(text)
        elif parse_mode:
            entities = []  # Markdown is not parsed (the adapter sends HTML)
        else:
            given = _json_param(params, "entities") or []
            if not isinstance(given, list) or not all(isinstance(e, dict) for e in given):
                raise bad_request("can't parse entities JSON object")
            entities = sorted(given, key=lambda e: (e.get("offset", 0), -e.get("length", 0)))
        return text, parse_mode, visible, entities

    def _own_message(self, bot: _Bot, chat: _Chat, params: dict[str, Any]) -> dict[str, Any]:
        """The bot's own stored message an edit names, or the real service's error."""
        mid = _int_param(params, "message_id")
        original = chat.messages_of(bot.token).get(mid or 0)
        if original is None:
            raise bad_request("message to edit not found")
        if (original.get("from") or {}).get("id") != bot.user["id"]:
            raise bad_request("message can't be edited")
        return original

    async def _edit_message_text(self, bot: _Bot, params: dict[str, Any]) -> Any:
        if params.get("inline_message_id") and params.get("chat_id") in (None, ""):
            raise bad_request("MESSAGE_ID_INVALID")  # the fake sends no inline messages
        if not _int_param(params, "message_id"):
            raise bad_request("message identifier is not specified")
        chat = self._chat_for(bot, params)
        if chat.id in self.blocked:
            raise ApiError(403, BLOCKED)
        markup = _inline_markup(params, inline_only=True)
        text, parse_mode, visible, entities = self._message_text(params)
        original = self._own_message(bot, chat, params)
        if (
            original.get("text") == visible
            and original.get("entities", []) == entities
            and original.get("reply_markup") == markup
        ):
            raise bad_request(NOT_MODIFIED)
        self._flood_check(chat)
        edited = {
            k: v for k, v in original.items() if k not in ("entities", "reply_markup", "edit_date")
        }
        edited["text"] = visible
        edited["edit_date"] = max(int(time.time()), int(original.get("date", 0)))
        if entities:
            edited["entities"] = entities
        if markup is not None:
            edited["reply_markup"] = markup
        mid = edited["message_id"]
        chat.messages_of(bot.token)[mid] = edited
        self.text_edits.append(TextEdit(bot.token, chat.id, mid, text, visible, parse_mode, edited))
        self._signal.pulse()
        return edited

    async def _delete_message(self, bot: _Bot, params: dict[str, Any]) -> Any:
        mid = _int_param(params, "message_id")
        if not mid:
            raise bad_request("message identifier is not specified")
        chat = self._chat_for(bot, params)
        if chat.id in self.blocked:
            raise ApiError(403, BLOCKED)
        messages = chat.messages_of(bot.token)
        found = messages.get(mid)
        if found is None:
            raise bad_request("message to delete not found")
        own = (found.get("from") or {}).get("id") == bot.user["id"]
        private = chat.type == "private"
        too_old = time.time() - int(found.get("date", 0)) >= DELETE_WINDOW_SECONDS
        if too_old or not (own or private or bot.token in chat.deleters):
            raise bad_request(
                "message can't be deleted for everyone" if private else "message can't be deleted"
            )
        del messages[mid]
        self.deletions.append(Deletion(bot.token, chat.id, mid, found))
        self._signal.pulse()
        return True

    async def _edit_message_reply_markup(self, bot: _Bot, params: dict[str, Any]) -> Any:
        mid = _int_param(params, "message_id")
        if not mid:  # absent, or 0: what the real server reads as absent
            raise bad_request("message identifier is not specified")
        chat = self._chat_for(bot, params)
        if chat.id in self.blocked:
            raise ApiError(403, BLOCKED)
        markup = _inline_markup(params, inline_only=True)
        messages = chat.messages_of(bot.token)
        original = messages.get(mid)
        if original is None:
            raise bad_request("message to edit not found")
        if (original.get("from") or {}).get("id") != bot.user["id"]:
            raise bad_request("message can't be edited")
        if original.get("reply_markup") == markup:
            raise bad_request(NOT_MODIFIED)
        edited = {k: v for k, v in original.items() if k != "reply_markup"}
        if markup is not None:
            edited["reply_markup"] = markup
        messages[mid] = edited
        self.edits.append(MarkupEdit(bot.token, chat.id, mid, markup, edited))
        self._signal.pulse()
        return edited

    async def _send_chat_action(self, bot: _Bot, params: dict[str, Any]) -> Any:
        chat = self._chat_for(bot, params)
        if chat.id in self.blocked:
            raise ApiError(403, BLOCKED)
        thread = self._thread(chat, params)
        self.actions.append(ChatActionRecord(bot.token, chat.id, str(params.get("action")), thread))
        self._signal.pulse()
        return True

    # -- files -----------------------------------------------------------------------------

    def add_file(self, token: str, data: bytes, *, folder: str = "documents",
                 extension: str = "bin") -> dict[str, Any]:  # fmt: skip
        """A file the bot ``token`` may fetch: its ``file_id``, ``file_unique_id`` and
        ``file_size`` (the fields every file object of a message carries)."""
        self._bot(token)
        number = len(self._files) + 1
        file_id = f"BQACAgIAAx{number:06d}{hashlib.sha256(data).hexdigest()[:12]}"
        path = f"{folder}/file_{number}.{extension}"
        self._files[(token, file_id)] = (path, data)
        self._paths[(token, path)] = data
        return {"file_id": file_id, "file_unique_id": f"AgAD{number:06d}", "file_size": len(data)}

    def photo(self, token: str, data: bytes, width: int, height: int) -> dict[str, Any]:
        """``extra`` for a photo message: one size (the real one), as Telegram sends the
        largest last."""
        file = self.add_file(token, data, folder="photos", extension="jpg")
        return {"photo": [{**file, "width": width, "height": height}]}

    def document(self, token: str, data: bytes, name: str, mime_type: str) -> dict[str, Any]:
        file = self.add_file(token, data, extension=name.rsplit(".", 1)[-1][:8] or "bin")
        return {"document": {**file, "file_name": name, "mime_type": mime_type}}

    def voice(self, token: str, data: bytes, duration: int) -> dict[str, Any]:
        file = self.add_file(token, data, folder="voice", extension="oga")
        return {"voice": {**file, "duration": duration, "mime_type": "audio/ogg"}}

    async def _get_file(self, bot: _Bot, params: dict[str, Any]) -> Any:
        found = self._files.get((bot.token, str(params.get("file_id"))))
        if found is None:
            raise bad_request("invalid file_id")
        path, data = found
        if len(data) > self.max_download_bytes:
            raise bad_request("file is too big")
        number = path.rsplit("_", 1)[-1].split(".")[0]
        return {"file_id": params["file_id"], "file_unique_id": f"AgAD{int(number):06d}",
                "file_size": len(data), "file_path": path}  # fmt: skip

    async def _download(self, request: web.Request) -> web.Response:
        data = self._paths.get((request.match_info["token"], request.match_info["path"]))
        if data is None:
            return _error(ApiError(404, "Not Found"))
        self.downloads.append(request.match_info["path"])
        self._signal.pulse()
        return web.Response(body=data, content_type="application/octet-stream")


def _kind(update: dict[str, Any]) -> str:
    return next((k for k in update if k != "update_id"), "")


def _media(
    photo: bool,
    voice: int | None,
    document: str | None,
    sticker: str | None,
    video: int | None,
    audio: int | None,
    location: tuple[float, float] | None,
) -> dict[str, Any]:
    """Minimal realistic media objects (ids are made up, sizes plausible)."""
    ids = {"file_id": "AgACAgIAAxk", "file_unique_id": "AQADx"}
    media: dict[str, Any] = {}
    if photo:
        media["photo"] = [
            {**ids, "width": w, "height": h, "file_size": w * h // 10}
            for w, h in ((90, 67), (320, 240), (1280, 960))
        ]
    if voice is not None:
        media["voice"] = {**ids, "duration": voice, "mime_type": "audio/ogg"}
    if document is not None:
        media["document"] = {**ids, "file_name": document, "mime_type": "application/octet-stream"}
    if sticker is not None:
        media["sticker"] = {**ids, "width": 512, "height": 512, "is_animated": False,
                            "is_video": False, "type": "regular", "emoji": sticker}  # fmt: skip
    if video is not None:
        media["video"] = {**ids, "width": 640, "height": 360, "duration": video}
    if audio is not None:
        media["audio"] = {**ids, "duration": audio, "title": "Track", "performer": "Artist"}
    if location is not None:
        media["location"] = {"latitude": location[0], "longitude": location[1]}
    return media


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key)
    return value is True or str(value).lower() in ("true", "1")


def _int_param(params: dict[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise bad_request(f"field {key!r} must be an integer") from None


def _inline_markup(params: dict[str, Any], *, inline_only: bool) -> dict[str, Any] | None:
    """The inline keyboard in ``reply_markup`` (None: none, or an empty one). Messages
    keep only inline keyboards; edits take nothing else (``inline_only``)."""
    markup = _json_param(params, "reply_markup")
    if not markup:
        return None
    if not isinstance(markup, dict):
        raise bad_request("can't parse reply keyboard markup JSON object")
    keyboard = markup.get("inline_keyboard")
    if keyboard is None:
        if inline_only:
            raise bad_request("inline keyboard expected")
        return None  # a reply keyboard: shown by the client, not part of the message
    if not isinstance(keyboard, list) or not all(isinstance(row, list) for row in keyboard):
        raise bad_request('field "inline_keyboard" of the InlineKeyboardMarkup must be an Array')
    if not any(keyboard):
        return None
    return {"inline_keyboard": keyboard}


def _json_param(params: dict[str, Any], key: str) -> Any:
    """dicts and lists arrive as JSON text from forms, as values from JSON bodies."""
    value = params.get(key)
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise bad_request(f"can't parse {key} JSON object") from None


async def _read_params(request: web.Request) -> dict[str, Any]:
    params: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        body = await request.json()
        if isinstance(body, dict):
            params.update(body)
    elif request.can_read_body:
        form = await request.post()
        for key, value in form.items():
            params[key] = value if isinstance(value, str) else getattr(value, "filename", "")
    return params


def _error(exc: ApiError) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": exc.status, "description": exc.description}
    if exc.parameters:
        body["parameters"] = exc.parameters
    return web.json_response(body, status=exc.status)
