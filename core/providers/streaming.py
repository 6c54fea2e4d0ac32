"""Stream plumbing shared by the SDK-backed providers (Anthropic, OpenAI-compatible).

Both providers open an SDK stream, fold its events into a per-call state and
translate the SDK's failures into ``core.errors`` types. That loop, and the small
parsers around it, are the same for both, so they live here once; each provider keeps
what is its own: the wire format, how an event changes its state, how the SDK's errors
map, and what a finished stream must have seen.

Timeouts (``StreamTimeouts``) bound silence, not length, so a reply still producing
tokens is never cut:

- ``connect``: reaching the server (TCP and TLS, a pooled connection, sending the
  request), through the SDK's HTTP client.
- ``stall``: any wait for bytes once the request is sent, and any gap between two
  stream events. The wait for the response headers and for the first event counts as
  such a gap: llama.cpp answers its headers at once and then processes the prompt,
  but Ollama sends nothing (headers included) until the model is loaded and the prompt
  read, and a small CPU can need tens of seconds for either. It is applied twice: as
  the HTTP client's read timeout (bytes) and as a deadline on each event (``anext``),
  which also catches a server that keeps the connection alive without producing events.
- ``total``: an optional cap on the whole call (unset: none), the old behaviour.

Each ``ProviderTimeoutError`` says which limit fired.

The Anthropic SDK is given its aiohttp transport (``DefaultAioHttpClient``) instead of its
default httpx one: httpcore's pool probes every idle pooled connection (a syscall each) on
every request and every response's end, which with the 64 streams a busy gateway keeps
open cost about a sixth of the gateway's CPU under ``bench/load.py``; aiohttp's connector
takes a connection in O(1). The timeouts map across (connect → socket connect, read →
socket read, pool → connect with the pool wait), and the per-event deadline below does not
depend on the transport. The OpenAI-compatible provider keeps httpx: llama.cpp's server
advertises keep-alive but closes the connection after each streamed reply, and aiohttp,
which does not probe, then sends every other request on a dead connection (httpcore's
probe is what catches it).
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import httpx2

from parley.core.errors import MalformedResponseError, ProviderError, ProviderTimeoutError
from parley.core.providers.base import ProviderRequest, ProviderResponse, TextCallback

# The same defaults as ``RetryConfig`` (the gateway passes the configured values).
DEFAULT_CONNECT_TIMEOUT_SECONDS = 10.0
DEFAULT_STALL_TIMEOUT_SECONDS = 90.0

# Tool input that is not a JSON object is kept under this key, so the runner can tell
# the model its call was unreadable instead of failing the turn.
RAW_INPUT_KEY = "_raw"

T = TypeVar("T")
S = TypeVar("S")


class _Closable(Protocol):
    async def close(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Closable)


class EventStream(Protocol):
    """What both SDKs' async streams offer: an async context and async iteration."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, exc_type: Any, exc: Any, traceback: Any, /) -> Any: ...

    def __aiter__(self) -> AsyncIterator[Any]: ...


@dataclass(frozen=True, slots=True)
class StreamTimeouts:
    """How long a streamed call may wait, and for what (see the module docstring)."""

    connect: float = DEFAULT_CONNECT_TIMEOUT_SECONDS
    stall: float = DEFAULT_STALL_TIMEOUT_SECONDS
    total: float | None = None

    def for_http(self) -> httpx2.Timeout:
        """The SDK client's timeouts: each is per operation in httpx, never per call."""
        return httpx2.Timeout(
            connect=self.connect, pool=self.connect, write=self.connect, read=self.stall
        )

    def connect_message(self) -> str:
        return f"could not connect within {self.connect:g} s"

    def stall_message(self) -> str:
        return f"no data for {self.stall:g} s"


def total_message(seconds: float) -> str:
    return f"no complete answer within {seconds:g} s"


def _http_timeout(exc: BaseException) -> httpx2.TimeoutException | None:
    """The HTTP client's timeout behind ``exc``: the SDKs wrap it (``raise ... from``)."""
    seen: BaseException | None = exc
    for _ in range(4):  # the chain is short; a bound keeps a cyclic one harmless
        if seen is None:
            return None
        if isinstance(seen, httpx2.TimeoutException):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def timeout_error(
    exc: BaseException, timeouts: StreamTimeouts, provider: str
) -> ProviderTimeoutError | None:
    """``exc`` as a timeout error that names the limit that fired; ``None`` if it is
    not an HTTP timeout."""
    cause = _http_timeout(exc)
    if cause is None:
        return None
    if isinstance(cause, httpx2.ReadTimeout):
        message = timeouts.stall_message()
    else:  # connect, pool and write all belong to reaching the server
        message = timeouts.connect_message()
    return ProviderTimeoutError(message, provider=provider)


def parse_json_object(raw: str) -> dict[str, Any]:
    """Streamed tool input as a dict: ``{}`` when empty, ``{RAW_INPUT_KEY: raw}`` when
    it is not a JSON object (a truncated stream, a model slip)."""
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {RAW_INPUT_KEY: raw}
    return parsed if isinstance(parsed, dict) else {RAW_INPUT_KEY: raw}


def error_body(body: object) -> Mapping[str, Any] | None:
    """The error object of an API error body, which both APIs may nest under ``error``."""
    if isinstance(body, Mapping):
        inner = body.get("error")
        return inner if isinstance(inner, Mapping) else body
    return None


async def within_deadline(
    work: Awaitable[T], seconds: float | None, provider: str, message: str | None = None
) -> T:
    """``work``, or ``ProviderTimeoutError`` when it takes over ``seconds`` (``None``: no
    limit). Only this deadline's expiry becomes that error: a ``TimeoutError`` raised
    inside ``work`` passes through as it is."""
    if seconds is None:
        return await work
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await work
    except TimeoutError as exc:
        if not deadline.expired():
            raise
        raise ProviderTimeoutError(message or total_message(seconds), provider=provider) from exc


def _fold(apply: Callable[[S, Any], str], state: S, event: Any, provider: str, unit: str) -> str:
    """Apply one event; an event whose fields have the wrong types is a malformed answer."""
    try:
        return apply(state, event)
    except ProviderError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise MalformedResponseError(f"unreadable stream {unit}: {exc}", provider=provider) from exc


async def drive_stream(
    open_stream: Callable[[], Awaitable[EventStream]],
    state: S,
    apply: Callable[[S, Any], str],
    translate: Callable[[BaseException], ProviderError],
    on_text: TextCallback | None,
    *,
    provider: str,
    unit: str,
    timeouts: StreamTimeouts | None = None,
) -> S:
    """Open the stream and fold every event into ``state``, passing text deltas on.

    ``apply`` returns the text an event carried ("" for none); ``unit`` names an
    event in error messages ("event", "chunk"). Failures from opening or reading the
    stream go through ``translate`` (HTTP timeouts first become a ``ProviderTimeoutError``
    naming the limit); ``state`` is returned for the provider to check that the stream
    was complete. No event within ``timeouts.stall`` seconds (the first one included)
    is a stall; time spent in ``on_text`` is the caller's and is not counted.
    """
    limits = timeouts or StreamTimeouts()

    def failed(exc: Exception) -> ProviderError:
        return timeout_error(exc, limits, provider) or translate(exc)

    try:
        # The HTTP client bounds connecting and each read; this bounds a server that
        # trickles header bytes forever.
        stream = await within_deadline(
            open_stream(),
            limits.connect + limits.stall,
            provider,
            f"no answer within {limits.connect + limits.stall:g} s",
        )
    except ProviderTimeoutError:
        raise
    except Exception as exc:
        raise failed(exc) from exc
    async with stream:
        events = stream.__aiter__()
        while True:
            # Only the SDK's side is translated: an exception from on_text is the
            # caller's own and passes through untouched.
            deadline = asyncio.timeout(limits.stall)
            try:
                async with deadline:
                    event = await anext(events)
            except StopAsyncIteration:
                break
            except TimeoutError as exc:
                if not deadline.expired():
                    raise failed(exc) from exc
                raise ProviderTimeoutError(limits.stall_message(), provider=provider) from exc
            except Exception as exc:
                raise failed(exc) from exc
            text = _fold(apply, state, event, provider, unit)
            if text and on_text is not None:
                await on_text(text)
    return state


class StreamingProvider(ABC, Generic[ClientT]):
    """Construction, the timeouts and closing, for a provider built on an SDK client; a
    subclass opens its client and reads one answer from its stream.

    ``timeout`` is the optional cap on a whole call (``None``: none); ``connect_timeout``
    and ``stall_timeout`` bound silence (see the module docstring).
    """

    name: str

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str | None = None,
        timeout: float | None = None,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT_SECONDS,
        vision: bool = True,
    ) -> None:
        self.model = model
        self.base_url = base_url
        # Whether the model sees images: stored pictures go to it inline, else as a
        # placeholder with the words sent with them (core.media).
        self.vision = vision
        self.timeouts = StreamTimeouts(connect=connect_timeout, stall=stall_timeout, total=timeout)
        self._client = self._open_client(api_key, base_url, self.timeouts)

    @abstractmethod
    def _open_client(self, api_key: str, base_url: str | None, timeouts: StreamTimeouts) -> ClientT:
        """The SDK client, with its own retries off (``call_with_retry`` retries) and
        ``timeouts.for_http()`` as its timeouts."""

    @abstractmethod
    async def _stream(
        self, request: ProviderRequest, on_text: TextCallback | None
    ) -> ProviderResponse:
        """One streamed answer, through ``drive_stream`` with ``self.timeouts``; the
        whole-call cap is applied by ``complete``."""

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        return await within_deadline(self._stream(request, on_text), self.timeouts.total, self.name)

    async def aclose(self) -> None:
        await self._client.close()
