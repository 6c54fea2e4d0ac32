"""Stream plumbing shared by the SDK-backed providers (Anthropic, OpenAI-compatible).

Both providers open an SDK stream, fold its events into a per-call state and
translate the SDK's failures into ``core.errors`` types, under one overall deadline.
That loop, and the small parsers around it, are the same for both, so they live here
once; each provider keeps what is its own: the wire format, how an event changes its
state, how the SDK's errors map, and what a finished stream must have seen.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from parley.core.errors import MalformedResponseError, ProviderError, ProviderTimeoutError
from parley.core.providers.base import ProviderRequest, ProviderResponse, TextCallback

DEFAULT_TIMEOUT_SECONDS = 120.0

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

    async def __aexit__(self, *exc_info: object) -> Any: ...

    def __aiter__(self) -> AsyncIterator[Any]: ...


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


async def within_deadline(work: Awaitable[T], seconds: float, provider: str) -> T:
    """``work``, or ``ProviderTimeoutError`` when the whole answer takes over ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError as exc:
        raise ProviderTimeoutError(
            f"no complete answer within {seconds:g} s", provider=provider
        ) from exc


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
) -> S:
    """Open the stream and fold every event into ``state``, passing text deltas on.

    ``apply`` returns the text an event carried ("" for none); ``unit`` names an
    event in error messages ("event", "chunk"). Failures from opening or reading the
    stream go through ``translate``; ``state`` is returned for the provider to check
    that the stream was complete.
    """
    try:
        stream = await open_stream()
    except Exception as exc:
        raise translate(exc) from exc
    async with stream:
        events = stream.__aiter__()
        while True:
            # Only the SDK's side is translated: an exception from on_text is the
            # caller's own and passes through untouched.
            try:
                event = await anext(events)
            except StopAsyncIteration:
                break
            except Exception as exc:
                raise translate(exc) from exc
            text = _fold(apply, state, event, provider, unit)
            if text and on_text is not None:
                await on_text(text)
    return state


class StreamingProvider(ABC, Generic[ClientT]):
    """Construction, the overall deadline and closing, for a provider built on an SDK
    client; a subclass opens its client and reads one answer from its stream."""

    name: str

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self._client = self._open_client(api_key, base_url, timeout)

    @abstractmethod
    def _open_client(self, api_key: str, base_url: str | None, timeout: float) -> ClientT:
        """The SDK client, with its own retries off (``call_with_retry`` retries)."""

    @abstractmethod
    async def _stream(
        self, request: ProviderRequest, on_text: TextCallback | None
    ) -> ProviderResponse:
        """One streamed answer; the deadline is applied by ``complete``."""

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        return await within_deadline(self._stream(request, on_text), self.timeout, self.name)

    async def aclose(self) -> None:
        await self._client.close()
