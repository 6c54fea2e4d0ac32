"""Connection limits for the gateway's HTTP server: time bounds on reading a request
and a cap on open connections, so silent or slow sockets cannot hold descriptors.

aiohttp bounds none of this itself: a socket that connects and sends nothing, or half a
request line, or a body one byte a minute, stays open for its keep-alive hour. Here
every connection is in one phase at a time, each with its own deadline:

- ``new``: connected, no complete request yet; its line and headers must arrive within
  ``header_timeout`` of the connection opening (bytes arriving do not extend it);
- ``idle``: kept alive between requests; closed after ``keepalive_timeout``;
- ``headers``: the first bytes of a later request arrived; the rest of its line and
  headers within ``header_timeout`` of them;
- ``body``: headers parsed; the body must arrive in full within ``body_timeout``;
- ``busy``: a handler runs (or a websocket is open): no deadline. Websockets keep
  themselves alive with their own heartbeat.

An expired request gets ``408`` (JSON, like every other error) when it had sent
something, then its connection is closed. Past ``max_connections`` open connections,
a new one makes the server close the oldest connection that is not busy (silent,
half-sent, idle, mid-body, or not reading its response); only when every other
connection is busy is the new one refused with ``503``. So sockets held open by an
attacker cannot keep ``/health`` out: each fresh connection displaces one of theirs.

``max_connections`` is lowered to fit the process's descriptor limit (``ulimit -n``),
minus what the rest of the gateway keeps open and the accept backlog, so ``accept``
never fails for lack of descriptors.

The hooks are a ``web.AppRunner`` whose server makes ``RequestHandler`` subclasses;
they read a few of the handler's private attributes (aiohttp is pinned, and
``tests/gateway/test_http_limits.py`` exercises every phase against the real server).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("parley.gateway.http")

# Descriptors kept for everything but HTTP connections: state.db and memory.db with
# their journals, the platforms' and providers' client connection pools, log files,
# the listening socket. Open transcripts (SQLite backend) or the PostgreSQL pool come
# on top (``reserved_descriptors``).
BASE_RESERVED_FDS = 128
MAX_BACKLOG = 128
MIN_CONNECTIONS = 16
# A handler whose body read was cut off gets this long to answer its 408 and finish.
CLOSE_GRACE_SECONDS = 5.0
REPORT_INTERVAL_SECONDS = 60.0

_NEW, _HEADERS, _BODY, _BUSY, _IDLE, _CLOSING, _CLOSED = (
    "new",
    "headers",
    "body",
    "busy",
    "idle",
    "closing",
    "closed",
)
_SHEDDABLE = frozenset({_NEW, _HEADERS, _BODY, _IDLE})


@dataclass(frozen=True, slots=True)
class HttpLimits:
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    max_connections: int  # effective: already fitted to the descriptor limit
    backlog: int = MAX_BACKLOG


def nofile_soft_limit() -> int | None:
    """The process's RLIMIT_NOFILE soft limit, or None when unlimited or unknown."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    return int(soft)


def reserved_descriptors(backend: str, max_open_transcripts: int, pool_size: int) -> int:
    """Descriptors the gateway may hold besides HTTP connections."""
    extra = pool_size + 2 if backend == "postgres" else max_open_transcripts
    return BASE_RESERVED_FDS + extra


def connection_budget(configured: int, reserved: int, soft_limit: int | None) -> tuple[int, int]:
    """``(max_connections, backlog)`` that fit under ``soft_limit`` descriptors.

    Up to ``backlog`` connections are accepted in one go before any is looked at, so
    the backlog is budgeted too. Below ``MIN_CONNECTIONS`` the limit is too low to
    honour the reserve; the floor keeps the server usable (and the start-up warning
    says to raise ``ulimit -n``).
    """
    if soft_limit is None:
        return configured, MAX_BACKLOG
    backlog = max(8, min(MAX_BACKLOG, soft_limit // 8))
    room = soft_limit - reserved - backlog
    return min(configured, max(room, MIN_CONNECTIONS)), backlog


def _raw_response(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    body = json.dumps({"error": code, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


def _seconds(value: float) -> str:
    return f"{value:g} s"


class ConnectionGuard:
    """The open connections of one server, oldest first; sheds at the cap and keeps
    counts of what it closed and why."""

    def __init__(self, limits: HttpLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._open: dict[GuardedHandler, None] = {}
        self._clock = clock
        self._last_report: float | None = None
        self._unreported = {"shed": 0, "refused": 0}
        self.stats = {
            "header_timeouts": 0,
            "body_timeouts": 0,
            "idle_closed": 0,
            "shed": 0,
            "refused": 0,
        }
        self.header_408 = _raw_response(
            408,
            "Request Timeout",
            "request_timeout",
            f"the request line and headers did not arrive within {_seconds(limits.header_timeout)}",
        )
        self.refusal_503 = _raw_response(
            503,
            "Service Unavailable",
            "unavailable",
            "too many open connections; retry shortly",
            "Retry-After: 1\r\n",
        )

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def opened(self, handler: GuardedHandler) -> None:
        self._open[handler] = None
        if len(self._open) <= self.limits.max_connections:
            return
        victim = next(
            (h for h in self._open if h is not handler and h.sheddable),
            None,
        )
        if victim is None:
            self._count("refused")
            self._open.pop(handler, None)
            handler.refuse(self.refusal_503)
        else:
            self._count("shed")
            self._open.pop(victim, None)
            victim.shed()

    def closed(self, handler: GuardedHandler) -> None:
        self._open.pop(handler, None)

    def timed_out(self, what: str) -> None:
        self.stats[what] += 1

    def _count(self, what: str) -> None:
        self.stats[what] += 1
        self._unreported[what] += 1
        now = self._clock()
        if self._last_report is not None and now - self._last_report < REPORT_INTERVAL_SECONDS:
            return
        self._last_report = now
        shed, refused = self._unreported["shed"], self._unreported["refused"]
        self._unreported = {"shed": 0, "refused": 0}
        log.warning(
            "HTTP server at its connection cap (%d): closed %d idle or unfinished "
            "connection(s), refused %d new one(s) (reported at most every %d s; "
            "[http] max_connections)",
            self.limits.max_connections,
            shed,
            refused,
            REPORT_INTERVAL_SECONDS,
        )


class GuardedHandler(RequestHandler):
    """aiohttp's protocol with the phase deadlines described in the module docstring."""

    __slots__ = ("_body", "_guard", "_handling", "_partial", "_phase", "_timer")

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._phase = _NEW
        self._timer: asyncio.TimerHandle | None = None
        self._body: Any = None  # the StreamReader of a body still arriving
        self._partial = False  # bytes of a request whose headers are not complete
        self._handling = False  # a parsed request has not been answered yet

    # -- what the guard asks -----------------------------------------------------------

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def sheddable(self) -> bool:
        """Idle or unfinished, or not reading what it is sent."""
        return self._phase in _SHEDDABLE or (self._phase == _BUSY and self.writing_paused)

    def shed(self) -> None:
        self._close_now()

    def refuse(self, response: bytes) -> None:
        if self.transport is not None:
            self.transport.write(response)
        self._close_now()

    # -- aiohttp's hooks -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._enter(_NEW, self._guard.limits.header_timeout)
        self._guard.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_timer()
        self._phase = _CLOSED
        self._guard.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase in (_CLOSED, _CLOSING) or self._upgraded or self._payload_parser is not None:
            super().data_received(data)  # a websocket's frames, or nothing left to time
            return
        if data and self._phase == _IDLE:
            self._enter(_HEADERS, self._guard.limits.header_timeout)
        if data and self._phase in (_NEW, _HEADERS):
            self._partial = True
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._parsed()
        elif self._phase == _BODY and self._body is not None and self._body.is_eof():
            self._body_arrived()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        result = await super().finish_response(request, resp, start_time)
        if self._phase == _CLOSING:
            self.force_close()  # its 408 is written; no lingering over the rest of the body
        elif self._phase != _CLOSED and not self._upgraded:
            if self._messages:  # pipelined, or parsed after a declined upgrade
                self._parsed()
            else:
                self._handling = False
                if self._phase != _BODY or self._body is None or self._body.is_eof():
                    self._body = None
                    self._enter(_IDLE, self._guard.limits.keepalive_timeout)
        return result

    # -- the phases ----------------------------------------------------------------------

    def _parsed(self) -> None:
        """A request's headers are in: its body, if still arriving, is on the clock."""
        self._handling = True
        self._partial = False
        payload = self._messages[-1][1] if self._messages else None
        if payload is not None and not payload.is_eof():
            if self._phase != _BODY or self._body is not payload:
                self._enter(_BODY, self._guard.limits.body_timeout)
            self._body = payload
        else:
            self._body = None
            self._enter(_BUSY, None)

    def _body_arrived(self) -> None:
        self._body = None
        if self._handling:
            self._enter(_BUSY, None)
        else:
            self._enter(_IDLE, self._guard.limits.keepalive_timeout)

    def _enter(self, phase: str, timeout: float | None) -> None:
        self._cancel_timer()
        self._phase = phase
        if timeout is not None and self.transport is not None:
            self._timer = self._loop.call_later(timeout, self._expired)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        phase = self._phase
        if phase in (_NEW, _HEADERS):
            self._guard.timed_out("header_timeouts")
            if self._partial and self.transport is not None:
                self.transport.write(self._guard.header_408)
            log.debug("HTTP: closed a connection whose request headers did not arrive")
            self._close_now()
        elif phase == _IDLE:
            self._guard.timed_out("idle_closed")
            self._close_now()
        elif phase == _BODY:
            body = self._body
            if body is None or body.is_eof():
                self._body_arrived()
                return
            self._guard.timed_out("body_timeouts")
            log.debug("HTTP: cut off a request body that did not arrive in time")
            if not self._handling:  # answered already; only the rest of the body was due
                self._close_now()
                return
            # The handler reading it gets a 408 (through the JSON error middleware),
            # then the connection closes; a handler that does not finish is cut off.
            limit = _seconds(self._guard.limits.body_timeout)
            body.set_exception(
                web.HTTPRequestTimeout(text=f"the request body did not arrive within {limit}")
            )
            self._enter(_CLOSING, CLOSE_GRACE_SECONDS)
        elif phase == _CLOSING:
            self._close_now()

    def _close_now(self) -> None:
        self._cancel_timer()
        self._phase = _CLOSED
        self._guard.closed(self)
        self.force_close()


class GuardedServer(web.Server):
    """aiohttp's low-level server, making ``GuardedHandler`` protocols."""

    def __init__(self, plain: web.Server, guard: ConnectionGuard) -> None:
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **plain._kwargs,
        )
        self.guard = guard

    def __call__(self) -> GuardedHandler:
        return GuardedHandler(self, guard=self.guard, loop=self._loop, **self._kwargs)


class GuardedAppRunner(web.AppRunner):
    """``web.AppRunner`` serving through a ``GuardedServer``. aiohttp's own keep-alive
    timer stays as a backstop that never fires before the guard's deadlines."""

    def __init__(self, app: web.Application, limits: HttpLimits, **kwargs: Any) -> None:
        kwargs["keepalive_timeout"] = limits.keepalive_timeout + limits.header_timeout
        super().__init__(app, **kwargs)
        self.guard = ConnectionGuard(limits)

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return GuardedServer(plain, self.guard)
