"""The websocket half of the fake Discord: sessions, sequence numbers, resume.

One ``GatewayHub`` serves ``/gateway`` for every bot of a ``FakeDiscord``. It speaks
the JSON text-frame protocol discord.py 2.x expects (discord.py only inflates binary
frames, so ``?compress=`` can be ignored):

- HELLO first; every op 1 HEARTBEAT gets op 11 back, before or after IDENTIFY;
- IDENTIFY with an unknown token closes 4004, a second IDENTIFY closes 4005, a
  payload other than a heartbeat before it closes 4003, an unknown op 4001;
- READY (the bot's guilds as unavailable stubs, ``resume_gateway_url`` = this fake)
  then one GUILD_CREATE per guild;
- RESUME replays what the session missed after the given seq, then RESUMED; an
  unknown session, or one whose missed events were dropped, gets op 9 (not resumable).

Shards, as strict as Discord: IDENTIFY's ``shard`` is ``[shard_id, num_shards]`` with
``0 <= shard_id < num_shards`` (else close 4010 Invalid shard); with
``require_sharding`` a session without one, or with fewer shards than
``recommended_shards``, closes 4011 Sharding required. READY echoes ``shard`` and
lists only the guilds of that shard, a guild event reaches only the sessions whose
``shard_id == (guild_id >> 22) % num_shards``, and a DM only shard 0's. A session that
sent no ``shard`` is shard [0, 1]: it gets everything.

A session outlives its connection (as on the real gateway) so that events dispatched
while the client reconnects are replayed. A client closing with 1000/1001, or the
server closing with 4007/4009, ends the session.

Faults: ``request_reconnect`` (op 7), ``drop_connection`` (a close frame with a code),
``sever_connection`` (the TCP connection dies, no close frame), ``invalidate_session``
(op 9; when not resumable the session is forgotten and, as on the real gateway, what
is dispatched before the next READY reaches nobody) and ``replay_seen_on_resume`` (the
next RESUME also replays events the client already had: delivery is at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

OP_DISPATCH = 0
OP_HEARTBEAT = 1
OP_IDENTIFY = 2
OP_PRESENCE_UPDATE = 3
OP_VOICE_STATE_UPDATE = 4
OP_RESUME = 6
OP_RECONNECT = 7
OP_REQUEST_GUILD_MEMBERS = 8
OP_INVALID_SESSION = 9
OP_HELLO = 10
OP_HEARTBEAT_ACK = 11

INTENT_MESSAGE_CONTENT = 1 << 15
DEFAULT_HEARTBEAT_INTERVAL_MS = 41_250
# How many events a session keeps for RESUME; older gaps are not resumable.
DEFAULT_REPLAY_BUFFER = 10_000
CLOSE_INVALID_SHARD = 4010
CLOSE_SHARDING_REQUIRED = 4011
# Close codes after which the real gateway forgets the session.
_SESSION_ENDING_CLIENT_CODES = frozenset({1000, 1001})
_SESSION_ENDING_SERVER_CODES = frozenset({4007, 4009})
_MESSAGE_EVENTS = frozenset({"MESSAGE_CREATE", "MESSAGE_UPDATE"})
# Events whose payload is the guild itself (its id is the guild id).
_GUILD_OBJECT_EVENTS = frozenset({"GUILD_CREATE", "GUILD_UPDATE", "GUILD_DELETE"})


@dataclass(frozen=True, slots=True)
class Identity:
    """What the model tells the hub about a bot that identified."""

    user: Mapping[str, Any]
    application: Mapping[str, Any]
    guilds: list[dict[str, Any]]  # full GUILD_CREATE payloads


@dataclass(frozen=True, slots=True)
class IdentifyRecord:
    token: str
    intents: int
    session_id: str
    shard: tuple[int, int] | None = None  # as sent: (shard_id, num_shards)


@dataclass(frozen=True, slots=True)
class ResumeRecord:
    token: str
    session_id: str
    seq: int | None
    replayed: int


@dataclass(eq=False, slots=True)
class Session:
    session_id: str
    token: str
    bot_id: str
    intents: int
    replay_buffer: int
    shard: tuple[int, int] | None = None  # None: unsharded, i.e. shard 0 of 1
    seq: int = 0
    ws: web.WebSocketResponse | None = None
    # (seq, frame text); RESUMED is not kept: it is never replayed.
    log: deque[tuple[int, str]] = field(default_factory=deque)
    # Serialises sequence numbers and sends, so frames leave in seq order.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def message_content(self) -> bool:
        return bool(self.intents & INTENT_MESSAGE_CONTENT)

    @property
    def shard_id(self) -> int:
        return self.shard[0] if self.shard else 0

    def receives(self, guild_id: str | int | None) -> bool:
        """Discord's routing: a guild's events go to its shard, DMs to shard 0."""
        if self.shard is None:
            return True
        shard_id, num_shards = self.shard
        if guild_id is None:
            return shard_id == 0
        return shard_for(guild_id, num_shards) == shard_id


def shard_for(guild_id: str | int, num_shards: int) -> int:
    """The shard that carries a guild (Discord's formula)."""
    return (int(guild_id) >> 22) % num_shards


def _guild_of(event: str, data: Mapping[str, Any]) -> str | None:
    """The guild an event belongs to (None: a DM or another non-guild event)."""
    if event in _GUILD_OBJECT_EVENTS:
        return data.get("id")
    return data.get("guild_id")


def _frame(op: int, data: Any = None, *, event: str | None = None, seq: int | None = None) -> str:
    return json.dumps({"op": op, "d": data, "s": seq, "t": event}, separators=(",", ":"))


def _is_message_frame(text: str) -> bool:
    return json.loads(text).get("t") in _MESSAGE_EVENTS


def _withheld(session: Session, event: str, data: Mapping[str, Any]) -> bool:
    """The real gateway blanks guild message content for bots without the intent,
    except in messages that mention the bot or that the bot wrote."""
    if event not in _MESSAGE_EVENTS or session.message_content or not data.get("guild_id"):
        return False
    if (data.get("author") or {}).get("id") == session.bot_id:
        return False
    return not any(m.get("id") == session.bot_id for m in data.get("mentions") or ())


class GatewayHub:
    def __init__(
        self,
        identify: Callable[[str], Identity | None],
        changed: asyncio.Condition,
        url: Callable[[], str],
        *,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        replay_buffer: int = DEFAULT_REPLAY_BUFFER,
        recommended_shards: int = 1,
        require_sharding: bool = False,
    ) -> None:
        self._identify_bot = identify
        self.recommended_shards = recommended_shards
        self.require_sharding = require_sharding
        self._changed = changed
        self._url = url
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.replay_buffer = replay_buffer
        self.sessions: dict[str, Session] = {}
        self.identifies: list[IdentifyRecord] = []
        self.resumes: list[ResumeRecord] = []
        self.heartbeats = 0
        self._sockets: set[web.WebSocketResponse] = set()
        self._transports: dict[web.WebSocketResponse, asyncio.Transport] = {}
        self._session_numbers = itertools.count(1)
        self._replay_seen = 0  # the next RESUME replays this many already-seen events

    # -- the websocket endpoint -------------------------------------------------------

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        if request.query.get("encoding", "json") != "json":
            await ws.close(code=4002, message=b"Decode error.")  # no ETF in this fake
            return ws
        if request.query.get("v", "10") not in ("9", "10"):
            await ws.close(code=4012, message=b"Invalid API version.")
            return ws
        self._sockets.add(ws)
        if request.transport is not None:
            self._transports[ws] = request.transport
        session: Session | None = None
        try:
            await ws.send_str(_frame(OP_HELLO, {"heartbeat_interval": self.heartbeat_interval_ms}))
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    await ws.close(code=4002, message=b"Decode error.")
                    break
                session = await self._on_payload(ws, session, msg.data)
        finally:
            self._sockets.discard(ws)
            self._transports.pop(ws, None)
            if session is not None:
                self._forget_socket(session, ws)
            await self._notify()
        return ws

    async def _on_payload(
        self, ws: web.WebSocketResponse, session: Session | None, text: str
    ) -> Session | None:
        try:
            payload = json.loads(text)
            op, data = payload["op"], payload.get("d")
        except (ValueError, KeyError, TypeError):
            await ws.close(code=4002, message=b"Decode error.")
            return session
        if op == OP_HEARTBEAT:
            self.heartbeats += 1
            await ws.send_str(_frame(OP_HEARTBEAT_ACK))
            return session
        if op == OP_IDENTIFY:
            if session is not None:
                await ws.close(code=4005, message=b"Already authenticated.")
                return session
            return await self._identify(ws, data or {})
        if op == OP_RESUME:
            if session is not None:
                await ws.close(code=4005, message=b"Already authenticated.")
                return session
            return await self._resume(ws, data or {})
        if op in (OP_PRESENCE_UPDATE, OP_VOICE_STATE_UPDATE, OP_REQUEST_GUILD_MEMBERS):
            if session is None:
                await ws.close(code=4003, message=b"Not authenticated.")
            return session  # accepted and ignored: text bots do not need them
        await ws.close(code=4001, message=b"Unknown opcode.")
        return session

    async def _identify(self, ws: web.WebSocketResponse, data: Mapping[str, Any]) -> Session | None:
        token = str(data.get("token") or "")
        identity = self._identify_bot(token)
        if identity is None:
            await ws.close(code=4004, message=b"Authentication failed.")
            return None
        intents = data.get("intents")
        if not isinstance(intents, int) or intents < 0:
            await ws.close(code=4013, message=b"Invalid intent(s).")
            return None
        shard, refusal = self._check_shard(data.get("shard"))
        if refusal is not None:
            await ws.close(code=refusal[0], message=refusal[1])
            return None
        # A new IDENTIFY means the bot gave up its old session on that shard; nobody
        # will resume it. Other shards' sessions (other replicas, mid-RESUME) live on.
        stale = [
            s
            for s in self.sessions.values()
            if s.token == token and s.ws is None and s.shard_id == (shard[0] if shard else 0)
        ]
        for old in stale:
            del self.sessions[old.session_id]
        session_id = f"fake-session-{next(self._session_numbers)}-{secrets.token_hex(4)}"
        session = Session(
            session_id, token, str(identity.user["id"]), intents, self.replay_buffer, shard
        )
        self.sessions[session_id] = session
        self.identifies.append(IdentifyRecord(token, intents, session_id, shard))
        guilds = [g for g in identity.guilds if session.receives(g["id"])]
        ready: dict[str, Any] = {
            "v": 10,
            "user": dict(identity.user),
            "guilds": [{"id": g["id"], "unavailable": True} for g in guilds],
            "session_id": session_id,
            "resume_gateway_url": self._url(),
            "session_type": "normal",
            "private_channels": [],
            "relationships": [],
            "application": dict(identity.application),
        }
        if shard is not None:
            ready["shard"] = list(shard)
        async with session.lock:
            session.ws = ws
            await self._emit(session, "READY", ready)
            for guild in guilds:
                await self._emit(session, "GUILD_CREATE", guild)
        await self._notify()
        return session

    def _check_shard(self, raw: Any) -> tuple[tuple[int, int] | None, tuple[int, bytes] | None]:
        """IDENTIFY's ``shard`` as (shard_id, num_shards), or the close to answer with."""
        if raw is None:
            shard = None
        elif (
            isinstance(raw, list)
            and len(raw) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in raw)
            and 0 <= raw[0] < raw[1]
        ):
            shard = (raw[0], raw[1])
        else:
            return None, (CLOSE_INVALID_SHARD, b"Invalid shard.")
        if self.require_sharding and (shard[1] if shard else 1) < self.recommended_shards:
            return None, (CLOSE_SHARDING_REQUIRED, b"Sharding required.")
        return shard, None

    async def _resume(self, ws: web.WebSocketResponse, data: Mapping[str, Any]) -> Session | None:
        session = self.sessions.get(str(data.get("session_id")))
        seq = data.get("seq")
        after = seq if isinstance(seq, int) else 0
        if (
            session is None
            or session.token != data.get("token")
            or not self._can_replay(session, after)
        ):
            # d=false: start over with IDENTIFY (discord.py closes and re-identifies).
            await ws.send_str(_frame(OP_INVALID_SESSION, False))
            return None
        async with session.lock:
            previous, session.ws = session.ws, ws
            if previous is not None and previous is not ws:
                await previous.close(code=4000, message=b"Resumed elsewhere.")
            # Already-seen events replayed on request are messages only (never READY).
            seen_from, self._replay_seen = max(after - self._replay_seen, 0), 0
            missed = [
                text for s, text in session.log
                if s > after or (s > seen_from and _is_message_frame(text))
            ]  # fmt: skip
            for text in missed:
                if not await self._send(session, text):
                    break
            await self._emit(session, "RESUMED", {})
        self.resumes.append(ResumeRecord(session.token, session.session_id, seq, len(missed)))
        await self._notify()
        return session

    @staticmethod
    def _can_replay(session: Session, after: int) -> bool:
        if after > session.seq:
            return False
        if not session.log or after >= session.log[-1][0]:
            return True  # nothing it missed is in the log
        return session.log[0][0] <= after + 1  # the gap was not trimmed away

    def _forget_socket(self, session: Session, ws: web.WebSocketResponse) -> None:
        if session.ws is not ws:
            return  # the fake detached it itself (op 7, a drop, a newer RESUME)
        session.ws = None
        # Only the client's own clean close ends the session; aiohttp reports a code
        # for server-initiated closes too, hence the check above comes first.
        if ws.close_code in _SESSION_ENDING_CLIENT_CODES:
            self.sessions.pop(session.session_id, None)

    # -- sending ----------------------------------------------------------------------

    async def _emit(self, session: Session, event: str, data: Mapping[str, Any]) -> None:
        """Number, remember and (when connected) send one dispatch; caller holds the lock."""
        session.seq += 1
        text = _frame(OP_DISPATCH, data, event=event, seq=session.seq)
        if event != "RESUMED":
            session.log.append((session.seq, text))
            while len(session.log) > session.replay_buffer:
                session.log.popleft()
        await self._send(session, text)

    async def _send(self, session: Session, text: str) -> bool:
        ws = session.ws
        if ws is None or ws.closed:
            return False
        try:
            await ws.send_str(text)
        except (ConnectionError, RuntimeError):
            # The client is going away; the event stays in the log for its RESUME, and
            # the socket's handler detaches it from the session.
            return False
        return True

    async def dispatch(self, token: str, event: str, data: Mapping[str, Any]) -> int:
        """Send ``event`` to every session of the bot on the event's shard (buffered
        while it reconnects). Returns how many sessions got it."""
        guild_id = _guild_of(event, data)
        targets = [s for s in self.sessions.values() if s.token == token and s.receives(guild_id)]
        for session in targets:
            payload = data
            if _withheld(session, event, data):
                payload = {**data, "content": "", "embeds": [], "attachments": [], "components": []}
            async with session.lock:
                await self._emit(session, event, payload)
        return len(targets)

    # -- faults -----------------------------------------------------------------------

    def _connected(self, token: str, shard: int | None = None) -> list[Session]:
        """The bot's live connections (on ``shard`` only, when given)."""
        return [
            s
            for s in self.sessions.values()
            if s.token == token and s.ws is not None and shard in (None, s.shard_id)
        ]

    async def request_reconnect(self, token: str, *, shard: int | None = None) -> int:
        """Send op 7 to each live connection of the bot; returns how many."""
        sessions = self._connected(token, shard)
        for session in sessions:
            async with session.lock:
                # Detach first: what is dispatched from now on waits in the log for the
                # RESUME instead of going to a socket the client no longer reads.
                ws, session.ws = session.ws, None
                if ws is not None and not ws.closed:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await ws.send_str(_frame(OP_RECONNECT))
        return len(sessions)

    async def drop_connection(
        self, token: str, code: int = 4000, *, shard: int | None = None
    ) -> int:
        """Close each live connection of the bot with ``code``; returns how many."""
        sessions = self._connected(token, shard)
        for session in sessions:
            async with session.lock:
                ws, session.ws = session.ws, None
                if code in _SESSION_ENDING_SERVER_CODES:
                    self.sessions.pop(session.session_id, None)
            if ws is not None:
                await ws.close(code=code, message=b"Dropped by the fake.")
        return len(sessions)

    async def sever_connection(self, token: str, *, shard: int | None = None) -> int:
        """Kill each live TCP connection of the bot, no close frame; returns how many."""
        sessions = self._connected(token, shard)
        for session in sessions:
            async with session.lock:
                ws, session.ws = session.ws, None
            transport = self._transports.get(ws) if ws is not None else None
            if transport is not None:
                transport.abort()
        return len(sessions)

    async def invalidate_session(
        self, token: str, *, resumable: bool, shard: int | None = None
    ) -> int:
        """Send op 9 to each live connection of the bot; returns how many.

        Not resumable: the session is forgotten at once, so events dispatched until the
        client's new IDENTIFY reach no session and are never replayed (real Discord)."""
        sessions = self._connected(token, shard)
        for session in sessions:
            async with session.lock:
                ws, session.ws = session.ws, None
                if not resumable:
                    self.sessions.pop(session.session_id, None)
                if ws is not None and not ws.closed:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await ws.send_str(_frame(OP_INVALID_SESSION, resumable))
        return len(sessions)

    def replay_seen_on_resume(self, count: int) -> None:
        """The next RESUME replays ``count`` events before the client's seq as well."""
        self._replay_seen = count

    def connected(self, token: str, shard: int | None = None) -> bool:
        return bool(self._connected(token, shard))

    def connected_shards(self, token: str) -> set[int]:
        """The shard ids the bot has a live connection for."""
        return {s.shard_id for s in self._connected(token)}

    async def close(self) -> None:
        for ws in list(self._sockets):
            await ws.close(code=1001, message=b"Going away.")
        self._sockets.clear()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
