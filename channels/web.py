"""The web chat: a browser talks to the gateway over one websocket (``GET /chat/ws``).

Protocol ``parley.chat.v1`` (JSON text frames; see the admin contract):

    client -> server   {"type": "hello", "client_id", "name"?, "history"?: true}
                                                                 first frame, within 10 s
                       {"type": "message", "id", "text", "files"?}
                                                                 files: [{"name", "type",
                                                                 "data" (base64)}]
    server -> client   {"type": "ready", "client_id"}            after hello
                       {"type": "history", "messages": [...]}    after ready, when asked
                                                                 and there is any
                       {"type": "ack", "id"}                     the message is durable
                       {"type": "typing"}                        working; every 10 s
                       {"type": "draft", "id", "text", "blocks"?, "reset"}
                       {"type": "reply", "id", "reply_to", "text", "blocks"?, "draft"?}
                       {"type": "error", "message", "id"}        the socket stays open

A ``draft`` is a reply being written (``web_markdown``'s node tree in ``blocks``; the whole
text so far each time; ``reset``: null, "retry", "next_call" or "withdrawn", see
``ReplyDraft``): never kept, never logged, sent to the open tabs only. Its ``id`` names
the reply: the ``reply`` that carries it as ``draft`` takes the draft's place. ``history``
(``web_history``) is the client's recent conversation: items
``{"role": "user", "id", "text", "at"}`` and ``{"role": "bot", "id", "reply_to", "text",
"blocks"?, "at"}``, oldest first. Bot text is untrusted: the page builds ``blocks`` with
DOM calls, and shows ``text`` as text when ``blocks`` is absent.

The gateway's HTTP middleware checks the admin token (the browser sends it as the
subprotocol ``bearer.<token>``); this adapter never sees it. A client is the browser
profile (its ``client_id`` lives in localStorage; case-insensitive, the server speaks
it in lowercase) and may hold several sockets (tabs):
replies go to all of them, and replies sent while none is open wait in a bounded
per-client backlog, in memory, flushed after the next hello.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from parley.channels.base import (
    OPEN_POLICY,
    Attachment,
    AttachmentUnavailable,
    ChannelCapabilities,
    ChannelStartError,
    ChatPolicy,
    DeliveryError,
    DeliveryResult,
    InboundHandler,
    InboundMessage,
    InboundNotStored,
    OutboundMessage,
    ReplyDraft,
    WebhookRoute,
)
from parley.channels.config import WebConfig
from parley.channels.web_history import ChatLog
from parley.channels.web_markdown import markdown_tree
from parley.channels.web_uploads import Upload, UploadRefused, UploadSpool, read_files

logger = logging.getLogger("parley.channels.web")

PROTOCOL = "parley.chat.v1"
WS_PATH = "/chat/ws"
HELLO_TIMEOUT_SECONDS = 10.0
HEARTBEAT_SECONDS = 30.0
# The page stops showing "working" after 30 s without a word: the gateway repeats it.
TYPING_REFRESH_SECONDS = 10.0
# Markdown is rendered on a worker thread past this size (a dense reply of 10,000
# characters takes ~15 ms), and not at all past the cap (the page shows the text).
RENDER_INLINE_CHARS = 2_000
RENDER_MAX_CHARS = 200_000
# Frames longer than this (files ride in them) are parsed on a worker thread.
INLINE_FRAME_CHARS = 256 * 1024
# Replies sent, remembered so a draft that comes late does not reappear.
FINISHED_KEYS = 1024
DEFAULT_SENDER_NAME = "web user"
MAX_NAME_CHARS = 64
# Private close codes (4000-4999): 4400 a protocol error, 4429 too many clients.
CLOSE_BAD_HELLO = 4400
CLOSE_TOO_MANY = 4429
CLOSE_GOING_AWAY = 1001

_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TYPING_FRAME = json.dumps({"type": "typing"})
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(eq=False)  # identity hashing: sockets live in sets
class _Socket:
    ws: web.WebSocketResponse
    client_id: str | None = None  # set by hello
    name: str = DEFAULT_SENDER_NAME  # set by hello
    # Serialises writes, so the hello's ready + backlog flush goes out before any reply
    # that a concurrent send() has for this socket.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A reply waiting for a tab: the frame to send, the entry to log once sent."""

    frame: str
    entry: dict[str, Any]


def _sendable(text: str) -> str:
    """``text`` with lone surrogates (JSON lets a client or a model send them; UTF-8 has
    no bytes for them, so the frame could not be sent) replaced, as the gateway stores them."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _draft_id(key: str) -> str:
    """The draft's name on the wire: stable for the reply, not its key (which holds ids)."""
    return "d" + hashlib.blake2s(key.encode(), digest_size=8).hexdigest()


async def _render(text: str) -> list[Any] | None:
    """``text`` as Markdown blocks, or None (the page shows it as text)."""
    if len(text) > RENDER_MAX_CHARS:
        return None
    try:
        if len(text) <= RENDER_INLINE_CHARS:
            return markdown_tree(text)
        return await asyncio.to_thread(markdown_tree, text)
    except Exception:  # a renderer bug costs the formatting, never the reply
        logger.exception("web chat: rendering Markdown failed")
        return None


def _frame(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields}, ensure_ascii=False)


def _error(message: str, message_id: str | None = None) -> str:
    return _frame("error", message=message, id=message_id)


class WebChannel:
    name = "web"
    capabilities = ChannelCapabilities(
        max_message_chars=None,
        markdown=True,
        typing_indicator=True,
        threads=False,
        typing_refresh_seconds=TYPING_REFRESH_SECONDS,
        live_drafts=True,
    )

    def __init__(
        self,
        config: WebConfig,
        *,
        hello_timeout: float = HELLO_TIMEOUT_SECONDS,
        upload_dir: Path | None = None,
    ) -> None:
        """``hello_timeout``: how long a new socket may stay silent (tests shrink it);
        ``upload_dir``: where files sent with messages are kept (None: none taken)."""
        self.config = config
        self._spool = UploadSpool(upload_dir) if upload_dir and config.max_files else None
        self._hello_timeout = hello_timeout
        self._handler: InboundHandler | None = None
        self._running = False
        self._sockets: set[_Socket] = set()  # every open socket, greeted or not
        self._clients: dict[str, set[_Socket]] = {}  # greeted sockets by client id
        # Oldest-touched client first, so the cap on clients drops the most stale one.
        # Each kept reply: its frame, and its entry for the log once a tab got it.
        self._backlogs: OrderedDict[str, deque[_Kept]] = OrderedDict()
        self._log = ChatLog()
        self._finished: OrderedDict[str, None] = OrderedDict()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, handler: InboundHandler) -> None:
        if self._running:
            raise ChannelStartError("the web chat is already running")
        self._handler = handler
        self._running = True
        logger.info("web chat: serving %s", WS_PATH)

    async def stop(self) -> None:
        self._running = False
        self._handler = None
        sockets = list(self._sockets)
        if sockets:
            # The sockets' own handlers see the close and unregister themselves.
            await asyncio.gather(
                *(
                    s.ws.close(code=CLOSE_GOING_AWAY, message=b"server shutting down")
                    for s in sockets
                ),
                return_exceptions=True,
            )

    def connected(self) -> bool:
        return self._running

    def policy(self, message: InboundMessage) -> ChatPolicy:
        # Anyone who reaches the socket already holds the admin token.
        return OPEN_POLICY

    def webhook_routes(self) -> list[WebhookRoute]:
        return [WebhookRoute("GET", WS_PATH, self._on_socket)]

    # -- outbound ----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        if not self._running:
            raise DeliveryError("the web chat is not running", retryable=True)
        client_id = message.chat_id
        if not _ID_RE.fullmatch(client_id):
            raise DeliveryError(f"not a web chat client id: {client_id!r}")
        server_id = uuid.uuid4().hex
        reply_to = message.reply_to_message_id
        if reply_to is not None:
            # Inbound ids are "<client_id>:<client message id>"; the browser knows the latter.
            _, sep, rest = reply_to.partition(":")
            reply_to = rest if sep else reply_to
        text = _sendable(message.text)
        fields: dict[str, Any] = {"id": server_id, "reply_to": reply_to, "text": text}
        blocks = await _render(text)
        if blocks is not None:
            fields["blocks"] = blocks
        key = message.idempotency_key
        if key is not None:
            fields["draft"] = _draft_id(key)
            self._finished[key] = None
            while len(self._finished) > FINISHED_KEYS:
                self._finished.popitem(last=False)
        now = datetime.now(UTC)
        frame = _frame("reply", **fields)
        kept = _Kept(frame, {"role": "bot", **fields, "at": now.isoformat()})
        tried: set[_Socket] = set()
        while True:
            # A tab may finish its hello while we write to one that is closing: try it too
            # rather than leave the reply in a backlog nobody flushes until the next hello.
            fresh = [s for s in self._clients.get(client_id, ()) if s not in tried]
            if not fresh:
                self._keep(client_id, [kept])
                break
            tried.update(fresh)
            results = await asyncio.gather(*(self._write(s, frame) for s in fresh))
            if any(results):
                self._log.add(client_id, kept.entry)
                break
        return DeliveryResult((server_id,), 1, now)

    async def draft(self, draft: ReplyDraft) -> None:
        """Show a reply being written in the client's open tabs (none open: dropped)."""
        if draft.key in self._finished or not self._clients.get(draft.chat_id):
            return
        text = _sendable(draft.text)
        fields: dict[str, Any] = {"id": _draft_id(draft.key), "text": text}
        if text:
            blocks = await _render(text)
            if blocks is not None:
                fields["blocks"] = blocks
        fields["reset"] = draft.reset
        if draft.status:  # a tool or a compaction at work, shown under the text
            fields["status"] = draft.status
        if draft.key in self._finished:  # the reply went out while this one rendered
            return
        frame = _frame("draft", **fields)
        sockets = list(self._clients.get(draft.chat_id, ()))
        await asyncio.gather(*(self._write(s, frame) for s in sockets))

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        sockets = list(self._clients.get(chat_id, ()))
        if sockets:
            await asyncio.gather(*(self._write(s, _TYPING_FRAME) for s in sockets))

    def _keep(self, client_id: str, frames: Iterable[_Kept], *, front: bool = False) -> None:
        """Queue replies for a client with no open socket; the oldest go when it is full."""
        frames = list(frames)
        backlog = self._backlogs.get(client_id)
        if not frames:
            return
        if backlog is None:
            if len(self._backlogs) >= self.config.max_clients:
                dropped_id, dropped = self._backlogs.popitem(last=False)
                logger.warning(
                    "web chat: too many clients with kept replies; dropped %d for %s",
                    len(dropped),
                    dropped_id,
                )
            backlog = self._backlogs[client_id] = deque(maxlen=self.config.backlog)
        else:
            self._backlogs.move_to_end(client_id)
        merged = frames + list(backlog) if front else list(backlog) + frames
        overflow = len(merged) - self.config.backlog
        if overflow > 0:
            logger.warning(
                "web chat: backlog of %s is full (%d); dropped the %d oldest replies",
                client_id,
                self.config.backlog,
                overflow,
            )
        backlog.clear()
        backlog.extend(merged)  # maxlen keeps the newest

    async def _write(self, sock: _Socket, text: str) -> bool:
        async with sock.lock:
            return await self._write_locked(sock, text)

    @staticmethod
    async def _write_locked(sock: _Socket, text: str) -> bool:
        if sock.ws.closed:
            return False
        try:
            await sock.ws.send_str(text)
        except (ConnectionError, RuntimeError) as exc:  # closing under us: the peer left
            logger.debug("web chat: write failed (%s)", exc)
            return False
        return True

    # -- the socket --------------------------------------------------------------------

    async def _on_socket(self, request: web.Request) -> web.StreamResponse:
        if not self._running:
            return web.json_response(
                {"error": "unavailable", "message": "the web chat is not running"}, status=503
            )
        offered = request.headers.get("Sec-WebSocket-Protocol", "")
        if PROTOCOL not in (p.strip() for p in offered.split(",")):
            # Without it the browser would reject the handshake anyway; say why instead.
            return web.json_response(
                {"error": "bad_request", "message": f"offer the subprotocol {PROTOCOL}"},
                status=400,
            )
        # Room for a full-length text however the browser encodes it, plus the envelope.
        ws = web.WebSocketResponse(
            protocols=(PROTOCOL,),
            heartbeat=HEARTBEAT_SECONDS,
            max_msg_size=self._max_frame(),
        )
        await ws.prepare(request)
        sock = _Socket(ws)
        self._sockets.add(sock)
        try:
            if not self._running:  # stop() ran while we were upgrading
                await ws.close(code=CLOSE_GOING_AWAY, message=b"server shutting down")
            elif await self._greet(sock):
                await self._serve(sock)
        finally:
            self._sockets.discard(sock)
            if sock.client_id is not None:
                peers = self._clients.get(sock.client_id)
                if peers is not None:
                    peers.discard(sock)
                    if not peers:
                        del self._clients[sock.client_id]
                logger.debug("web chat: %s disconnected", sock.client_id)
            if not ws.closed:
                await ws.close()
        return ws

    def _max_frame(self) -> int:
        """Room for a full-length text however the browser encodes it, the files (base64)
        a message may carry, and the envelope."""
        files = 0
        if self._spool is not None:
            files = self.config.max_files * ((self.config.max_upload_bytes + 2) // 3 * 4 + 1024)
        return 4 * self.config.max_text_chars + 4096 + files

    async def fetch_attachment(
        self, message: InboundMessage, attachment: Attachment, max_bytes: int
    ) -> bytes:
        """``AttachmentSource``: an upload of the message's own client, from the spool."""
        if self._spool is None:
            raise AttachmentUnavailable("this web chat keeps no uploads")
        return await self._spool.read(message.chat_id, attachment.ref, max_bytes)

    async def _greet(self, sock: _Socket) -> bool:
        """Wait for the hello; register the socket, send ready and the kept replies."""
        ws = sock.ws
        try:
            msg = await ws.receive(timeout=self._hello_timeout)
        except TimeoutError:
            await self._refuse(sock, f"no hello within {self._hello_timeout:g} s")
            return False
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return False
        hello = _parse(msg.data) if msg.type == WSMsgType.TEXT else None
        if hello is None or hello.get("type") != "hello":
            await self._refuse(sock, 'the first frame must be {"type": "hello", "client_id": ...}')
            return False
        client_id, name = hello.get("client_id"), hello.get("name")
        if not isinstance(client_id, str) or not _ID_RE.fullmatch(client_id):
            await self._refuse(sock, "client_id must be 1-64 of A-Z a-z 0-9 _ -")
            return False
        if name is not None and not isinstance(name, str):
            await self._refuse(sock, "name must be a string")
            return False
        # Client ids are case-insensitive: session keys are lowercased by routing, so
        # "AbC" and "abc" must be one client everywhere, not two sharing one session.
        client_id = client_id.lower()
        if client_id not in self._clients and len(self._clients) >= self.config.max_clients:
            logger.warning("web chat: refused %s (%d clients)", client_id, len(self._clients))
            await self._refuse(sock, "too many web chat clients", code=CLOSE_TOO_MANY)
            return False
        async with sock.lock:
            # Register and take the backlog without yielding: a send() from here on
            # finds this socket and queues behind the lock, after the kept replies.
            sock.client_id = client_id
            self._clients.setdefault(client_id, set()).add(sock)
            kept = self._backlogs.pop(client_id, None) or deque()
            sock.name = " ".join((name or "").split())[:MAX_NAME_CHARS] or DEFAULT_SENDER_NAME
            if not await self._write_locked(sock, _frame("ready", client_id=client_id)):
                self._keep(client_id, kept, front=True)
                return False
            # What the client saw before (another tab, before a reload), then what it
            # has not seen yet.
            history = self._log.frame(client_id) if hello.get("history") is True else None
            if history is not None and not await self._write_locked(sock, history):
                self._keep(client_id, kept, front=True)
                return False
            while kept:
                if not await self._write_locked(sock, kept[0].frame):
                    self._keep(client_id, kept, front=True)
                    return False
                self._log.add(client_id, kept.popleft().entry)
        logger.debug("web chat: %s connected", client_id)
        return True

    async def _refuse(self, sock: _Socket, reason: str, *, code: int = CLOSE_BAD_HELLO) -> None:
        await self._write(sock, _error(reason))
        await sock.ws.close(code=code, message=reason.encode()[:120])

    async def _serve(self, sock: _Socket) -> None:
        # One frame at a time: the handler's await keeps a socket's messages in order.
        while True:
            msg = await sock.ws.receive()
            if msg.type == WSMsgType.TEXT:
                await self._on_frame(sock, msg.data)
            elif msg.type == WSMsgType.BINARY:
                await self._write(sock, _error("binary frames are not supported; send JSON text"))
            else:  # CLOSE, CLOSING, CLOSED, ERROR (e.g. a frame over max_msg_size)
                return

    async def _on_frame(self, sock: _Socket, data: str) -> None:
        # A frame carrying files can be megabytes: parsed (and decoded) off the loop.
        large = len(data) > INLINE_FRAME_CHARS
        frame = await asyncio.to_thread(_parse, data) if large else _parse(data)
        if frame is None:
            await self._write(sock, _error("a frame must be a JSON object"))
            return
        kind = frame.get("type")
        if kind == "hello":
            await self._write(sock, _error("hello was already received"))
            return
        if kind != "message":
            await self._write(sock, _error(f"unknown frame type: {str(kind)[:40]!r}"))
            return
        message_id = frame.get("id")
        if not isinstance(message_id, str) or not _ID_RE.fullmatch(message_id):
            await self._write(sock, _error("id must be 1-64 of A-Z a-z 0-9 _ -"))
            return
        text = frame.get("text", "")
        try:
            raw_files = frame.get("files")
            files = await asyncio.to_thread(self._files, raw_files) if raw_files else []
        except UploadRefused as exc:
            await self._write(sock, _error(str(exc), message_id))
            return
        if not isinstance(text, str) or not (text.strip() or files):
            await self._write(sock, _error("text must be a non-empty string", message_id))
            return
        limit = self.config.max_text_chars
        if len(text) > limit:
            await self._write(
                sock,
                _error(f"text is {len(text):,} characters; the limit is {limit:,}", message_id),
            )
            return
        handler, client_id = self._handler, sock.client_id
        if handler is None or client_id is None:
            await self._write(sock, _error("the web chat is not running", message_id))
            return
        attachments: tuple[Attachment, ...] = ()
        if files and self._spool is not None:
            # Kept before the message is handed over: the inbox records the references.
            attachments = tuple([await self._spool.keep(client_id, f) for f in files])
            if not text.strip():
                text = " ".join(f"[{a.kind}: {a.name}]" for a in attachments)
        inbound = InboundMessage(
            channel=self.name,
            account="default",
            chat_type="direct",
            chat_id=client_id,
            sender_id=client_id,
            sender_name=sock.name,
            text=text,
            message_id=f"{client_id}:{message_id}",
            timestamp=datetime.now(UTC),
            mentions_bot=True,
            attachments=attachments,
        )
        # Logged before the handler runs: a command (/status) is answered inside it, and
        # the answer must come after the question in the history a reload replays.
        logged = self._log.add(
            client_id,
            {
                "role": "user",
                "id": message_id,
                "text": _sendable(text),
                "at": inbound.timestamp.isoformat(),
            },
        )
        try:
            await handler(inbound)
        except asyncio.CancelledError:
            if logged:
                self._log.discard(client_id, "user", message_id)
            raise
        except Exception as exc:
            if logged:  # not taken: it is not part of the conversation
                self._log.discard(client_id, "user", message_id)
            if isinstance(exc, InboundNotStored):  # storage refuses writes: expected, no trace
                logger.warning("web chat: %s not stored: %s", inbound.message_id, exc)
                await self._write(sock, _error("the message was not saved; try again", message_id))
                return
            # Not acked: the browser may send it again under the same id (the inbox dedupes).
            logger.exception("web chat: handling %s failed", inbound.message_id)
            await self._write(sock, _error("the message was not accepted; try again", message_id))
            return
        await self._write(sock, _frame("ack", id=message_id))

    def _files(self, raw: Any) -> list[Upload]:
        if raw is None:
            return []
        if self._spool is None:
            raise UploadRefused("this web chat does not take files")
        config = self.config
        return read_files(raw, max_bytes=config.max_upload_bytes, max_files=config.max_files)


def _parse(data: str) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the stack
        return None
    return value if isinstance(value, dict) else None
