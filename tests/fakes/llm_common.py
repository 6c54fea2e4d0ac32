"""What the fake Anthropic and OpenAI servers share: the script, the lifecycle, tokens.

A test scripts the next answers with ``fake.enqueue(step, ...)``; each request takes
the next step, and an empty script gets the fake's default echo reply. Steps:

- ``Reply``: a normal streamed answer (text and/or tool calls).
- ``HttpError``: an error status with the service's error envelope and headers.
- ``StreamError``: HTTP 200, maybe some text, then an error inside the stream.
- ``Hang``: no answer (before the headers, or after some text) until the fake stops.
- ``RawResponse``: bytes as given, for answers the client cannot read.

When the script is empty, ``fake.responder`` (if set) is asked for a step by the
request body, before the default echo: benchmarks answer by content that way.

Token counts use one deterministic estimate (about 4 characters per token over the
JSON of each prompt segment) for usage, context-window checks and cache accounting,
so tests can predict them exactly. Cache entries expire on ``fake.clock`` (virtual
time in tests and benchmarks, so nothing sleeps).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import heapq
import json
import math
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Self

from aiohttp import web

DEFAULT_API_KEY = "sk-test"
CHARS_PER_TOKEN = 4
# Anthropic's ephemeral cache: an entry lives 5 minutes, refreshed each time it is read.
DEFAULT_CACHE_TTL_SECONDS = 300.0
# A read looks for entries at the breakpoint's own block boundary and the 19 before
# it (20 positions in all); an older prefix needs a breakpoint nearer to it.
CACHE_LOOKBACK_BLOCKS = 20
# Anthropic's prices relative to plain input: reads 10%, 5-minute writes 125%.
CACHE_READ_PRICE = 0.1
CACHE_WRITE_PRICE = 1.25
_WORDS = re.compile(r"\S+\s*|\s+")


def estimate_tokens(value: Any) -> int:
    """Deterministic token estimate of one value (its compact JSON, ~4 chars a token)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class MeasuredSegment(NamedTuple):
    """A prompt segment's canonical JSON (keys sorted: what the cache hashes) and its
    ``estimate_tokens`` (sorting keys does not change the compact JSON's length)."""

    canonical: str
    tokens: int


def measure_segments(segments: Sequence[Any]) -> list[MeasuredSegment]:
    """Each segment encoded once: a request's window check, usage and cache accounting
    all read these, instead of encoding every segment again for each (a long history
    made the fake slower than the bot it measures)."""
    measured = []
    for segment in segments:
        canonical = json.dumps(segment, sort_keys=True, separators=(",", ":"))
        tokens = estimate_tokens(segment if isinstance(segment, str) else canonical)
        measured.append(MeasuredSegment(canonical, tokens))
    return measured


def split_text(text: str, chunk_chars: int = 0) -> list[str]:
    """Deltas for ``text``: word by word, or fixed-size pieces when ``chunk_chars`` > 0."""
    if not text:
        return []
    if chunk_chars > 0:
        return [text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars)]
    return _WORDS.findall(text)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    input: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None
    # Sent as the arguments text instead of the JSON of ``input`` (to test bad JSON).
    raw_arguments: str | None = None

    def arguments_text(self) -> str:
        if self.raw_arguments is not None:
            return self.raw_arguments
        return json.dumps(dict(self.input), separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Reply:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: str | None = None  # None: the natural one for the content
    chunk_chars: int = 0
    # Set: the stream waits for it before its first event (a reply that takes a while,
    # for as long as the test needs, without sleeping).
    hold: asyncio.Event | None = None
    # Set: after this many text deltas the stream waits for the event (a reply written
    # slowly: what was streamed so far is out, the rest comes when the test says).
    pause: tuple[int, asyncio.Event] | None = None
    # Seconds between text deltas: a model writing at a pace (for benchmarks; tests use
    # ``pause``, which waits for the test rather than for the clock).
    chunk_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class HttpError:
    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    code: str | None = None  # OpenAI's ``code`` field
    body: Mapping[str, Any] | None = None  # replaces the whole envelope when given


@dataclass(frozen=True, slots=True)
class StreamError:
    error_type: str
    message: str
    partial_text: str = ""


@dataclass(frozen=True, slots=True)
class Hang:
    # None: never send the headers; a string: start the stream, send it, then stall.
    partial_text: str | None = None


@dataclass(frozen=True, slots=True)
class RawResponse:
    body: bytes
    status: int = 200
    content_type: str = "text/event-stream"


Step = Reply | HttpError | StreamError | Hang | RawResponse


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


def bearer_or_api_key(request: web.Request) -> str | None:
    """The key the client sent: ``Authorization: Bearer`` or ``x-api-key``."""
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def json_response(status: int, body: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


class PrefixCache:
    """Which prompt prefixes a prompt cache holds, and until when.

    Only a prefix that ends at a breakpoint is written, and only when it has at least
    ``min_tokens``. A read takes the longest live entry among the block boundaries
    within ``lookback_blocks`` of some breakpoint of the request (the real cache does
    not search further back), and refreshes that entry's lifetime. Time is whatever
    the caller passes as ``now``, so a fake clock can jump forward.
    """

    def __init__(self) -> None:
        self._expires: dict[str, float] = {}
        # (expiry, key) for every expiry ever set, soonest first: dropping what expired
        # pops from here rather than scanning every entry on every request, which under
        # a long load test (100,000 entries) made the fake slower with each minute. An
        # entry refreshed since leaves a stale pair behind, skipped when popped.
        self._due: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._expires)

    def clear(self) -> None:
        self._expires.clear()
        self._due.clear()

    def account(
        self,
        segments: Sequence[Any],
        breakpoints: Sequence[int],
        min_tokens: int,
        *,
        now: float = 0.0,
        ttl_seconds: float = math.inf,
        lookback_blocks: int | None = None,
        block_indexes: Sequence[int] | None = None,
        measured: Sequence[MeasuredSegment] | None = None,
    ) -> tuple[int, int]:
        """(read, written) tokens for a prompt cut at ``breakpoints`` (segment indexes).

        ``block_indexes`` are the segments that end a content block (None: all of
        them); ``lookback_blocks`` None searches every boundary before a breakpoint.
        ``measured`` is ``measure_segments(segments)`` when the caller has it already.
        """
        if not breakpoints:
            return 0, 0
        self._drop_expired(now)
        last = max(breakpoints)
        if measured is None:
            measured = measure_segments(segments[: last + 1])
        chain = hashlib.sha256()
        keys: list[str] = []
        sizes: list[int] = []
        tokens = 0
        for segment in measured[: last + 1]:
            chain.update(segment.canonical.encode())
            keys.append(chain.hexdigest())
            tokens += segment.tokens
            sizes.append(tokens)
        candidates = self._candidates(last, breakpoints, lookback_blocks, block_indexes)
        hits = [i for i in candidates if keys[i] in self._expires and sizes[i] >= min_tokens]
        read = 0
        if hits:
            best = max(hits, key=lambda i: sizes[i])
            read = sizes[best]
            self._keep(keys[best], now + ttl_seconds)
        written = 0
        for index in breakpoints:
            if sizes[index] >= min_tokens:
                self._keep(keys[index], now + ttl_seconds)
                written = max(written, sizes[index] - read)
        return read, written

    @staticmethod
    def _candidates(
        last: int,
        breakpoints: Sequence[int],
        lookback_blocks: int | None,
        block_indexes: Sequence[int] | None,
    ) -> set[int]:
        boundaries = sorted(
            i for i in (range(last + 1) if block_indexes is None else block_indexes) if i <= last
        )
        if lookback_blocks is None:
            return set(boundaries)
        found: set[int] = set()
        for point in breakpoints:
            end = bisect.bisect_right(boundaries, point)
            found.update(boundaries[max(0, end - lookback_blocks) : end])
        return found

    def _keep(self, key: str, until: float) -> None:
        self._expires[key] = until
        heapq.heappush(self._due, (until, key))

    def _drop_expired(self, now: float) -> None:
        while self._due and self._due[0][0] <= now:
            until, key = heapq.heappop(self._due)
            if self._expires.get(key) == until:  # not refreshed since
                del self._expires[key]


@dataclass(slots=True)
class Billing:
    """What the fake would have charged so far, in tokens."""

    requests: int = 0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0

    def add(self, *, input_tokens: int, read: int, written: int, output_tokens: int) -> None:
        self.requests += 1
        self.input_tokens += input_tokens
        self.cache_read_tokens += read
        self.cache_write_tokens += written
        self.output_tokens += output_tokens

    @property
    def prompt_tokens(self) -> int:
        """Every prompt token, however it was billed."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def cache_read_share(self) -> float:
        """The part of all prompt tokens that was read from the cache (0.0 when none)."""
        total = self.prompt_tokens
        return self.cache_read_tokens / total if total else 0.0

    def weighted_input(
        self, read_price: float = CACHE_READ_PRICE, write_price: float = CACHE_WRITE_PRICE
    ) -> float:
        """Prompt tokens at plain-input price: reads and writes at their relative price."""
        return (
            self.input_tokens
            + read_price * self.cache_read_tokens
            + write_price * self.cache_write_tokens
        )


def retry_headers(retry_after: float | None, retry_after_ms: float | None) -> dict[str, str]:
    """The headers both APIs use to say how long to wait before a retry."""
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
    if retry_after_ms is not None:
        headers["retry-after-ms"] = f"{retry_after_ms:g}"
    return headers


class FakeLLMServer:
    """aiohttp app on 127.0.0.1, port 0, with the script, recording and lifecycle."""

    api_path_prefix = ""

    def __init__(
        self,
        *,
        api_key: str | None = DEFAULT_API_KEY,
        model: str = "fake-model",
        context_window: int | None = None,
        keep_requests: int | None = None,
    ) -> None:
        self.api_key = api_key  # None: no key is checked (a local server)
        self.model = model
        self.context_window = context_window
        self.requests: list[RecordedRequest] = []
        # How many of the newest requests (and usages) are kept; None: all. A load test
        # sends ~100,000, each with a whole history: all kept, they grew its process past
        # 3 GiB, and the collector's pauses landed in the latency it measures.
        self.keep_requests = keep_requests
        self.script: deque[Step] = deque()
        self.hangs_started = 0
        self.hang_started = asyncio.Event()  # for tests that act while a request hangs
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._counter = 0
        self.cache = PrefixCache()
        # Read for cache lifetimes; tests and benchmarks swap in a virtual clock.
        self.clock: Callable[[], float] = time.monotonic
        # Asked for a step when the script is empty (None from it: the default reply).
        self.responder: Callable[[dict[str, Any]], Step | None] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def make_app(self) -> web.Application:  # pragma: no cover - overridden
        raise NotImplementedError

    async def start(self) -> None:
        """Listen on a free port; after a ``stop()``, on the same port again, so a test
        can take the service down (connection refused) and bring it back."""
        if self._release.is_set():
            self._release = asyncio.Event()
            self.hang_started = asyncio.Event()
        runner = web.AppRunner(self.make_app(), handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", self._port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        # Hung handlers wait on this event; without it cleanup would wait for them.
        self._release.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}{self.api_path_prefix}"

    # -- script and records -------------------------------------------------------------

    def enqueue(self, *steps: Step) -> None:
        self.script.extend(steps)

    def next_step(self, body: Any = None) -> Step | None:
        """The next scripted step; else the responder's answer for ``body``; else None."""
        if self.script:
            return self.script.popleft()
        if self.responder is not None and isinstance(body, dict):
            return self.responder(body)
        return None

    def next_id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter:06d}"

    async def record(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(
            RecordedRequest(request.method, request.path, dict(request.headers), body)
        )
        if self.keep_requests is not None:
            del self.requests[: -self.keep_requests]
        return body

    @property
    def last_body(self) -> Any:
        return self.requests[-1].body

    async def wait_released(self) -> None:
        self.hangs_started += 1
        self.hang_started.set()
        await self._release.wait()

    async def hang_response(self, request: web.Request) -> web.StreamResponse:
        """Answer nothing until the fake stops (then drop the connection)."""
        await self.wait_released()
        raise web.HTTPServiceUnavailable()

    @staticmethod
    async def write_quietly(response: web.StreamResponse, data: bytes) -> bool:
        """Write to a stream whose client may have gone; False when it has."""
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write(data)
            return True
        return False
