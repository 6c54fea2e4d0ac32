"""Anthropic Messages API provider (``anthropic.AsyncAnthropic``, always streaming).

Translation of our messages:

- ``tool_result`` messages become ``user`` messages with ``tool_result`` blocks, and
  consecutive messages of one role are merged, since the API wants roles to
  alternate; in a merged user message the tool results come first, as the API asks.
- Empty or whitespace-only text blocks are dropped (the API rejects them), and a
  message left with nothing is skipped. An image with no data becomes the text
  ``[image]``.
- Prompt caching: ephemeral ``cache_control`` breakpoints (the API allows 4) on the
  last tool spec, on the system prompt (one text block), on the last block of the
  newest message, and, from 3 wire messages on, on the last block of the newest user
  message before the final one. The prefix (tools, system, history) is stable from
  turn to turn, and the service only looks back about 20 blocks from a breakpoint for
  an earlier entry: the fourth breakpoint sits exactly where the previous call (the
  previous turn, or the previous step of a tool loop) put its last one, so that call's
  prefix is read however many blocks the new assistant answer and tool results add.

Stop reasons: ``model_context_window_exceeded`` (HTTP 200, the model filled the
window while writing) is returned as ``STOP_OVERFLOW`` with the content it produced,
not raised: the text is valid and paid for, and the runner decides whether to keep it
and compact before the next call. An overflow *rejected* up front (HTTP 400/413) is
raised as ``ContextOverflowError``. Other unknown reasons pass through unchanged.

Tool input that is not a JSON object (a truncated stream, a model slip) is kept as
``{"_raw": "<text>"}`` so the runner can report it back to the model.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2
from anthropic import AsyncStream
from anthropic.types import RawMessageStreamEvent

from parley.core.errors import (
    AuthenticationError,
    MalformedResponseError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
)
from parley.core.messages import (
    Block,
    Message,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from parley.core.providers.anthropic_wire import (
    RequestEncoder,
)
from parley.core.providers.base import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    STOP_REFUSAL,
    STOP_TOOL_USE,
    ProviderRequest,
    ProviderResponse,
    TextCallback,
)
from parley.core.providers.retry import classify_status_error
from parley.core.providers.streaming import (
    StreamingProvider,
    StreamTimeouts,
    drive_stream,
    error_body,
    parse_json_object,
)

PROVIDER_NAME = "anthropic"

_STOP_REASONS: dict[str, str] = {
    "end_turn": STOP_END,
    "stop_sequence": STOP_END,
    "tool_use": STOP_TOOL_USE,
    "max_tokens": STOP_MAX_TOKENS,
    "model_context_window_exceeded": STOP_OVERFLOW,
    "refusal": STOP_REFUSAL,
}


# One encoder for the two readers below: each encoder keeps its encodings on the
# messages under its own key, so an encoder per call would leave a copy on them per call.
_READER_ENCODER = RequestEncoder()


def to_wire_messages(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, Any]]:
    """Our messages in the API's shape, without cache breakpoints: what ``RequestEncoder``
    sends, as data (for reading it and for tests)."""
    return list(json.loads(_READER_ENCODER.messages_json(messages)))


def build_params(request: ProviderRequest) -> dict[str, Any]:
    """A request's body as data, ``stream`` left out: what ``RequestEncoder`` sends."""
    return dict(json.loads(_READER_ENCODER.body(request, request.model, stream=False)))


@dataclass(slots=True)
class _BlockState:
    kind: str
    parts: list[str] = field(default_factory=list)
    tool_id: str = ""
    tool_name: str = ""
    initial_input: dict[str, Any] | None = None

    def finish(self) -> Block | None:
        if self.kind == "text":
            text = "".join(self.parts)
            return TextBlock(text) if text else None
        if self.kind == "tool_use":
            raw = "".join(self.parts)
            tool_input = parse_json_object(raw) if raw else dict(self.initial_input or {})
            return ToolUseBlock(self.tool_id, self.tool_name, tool_input)
        return None  # thinking and server-tool blocks are not part of our vocabulary


@dataclass(slots=True)
class _Assembler:
    """Builds the response from raw stream events."""

    started: bool = False
    stopped: bool = False
    model: str = ""
    stop_reason: str | None = None
    blocks: dict[int, _BlockState] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)

    def take_usage(self, raw: Any) -> None:
        for key in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ):
            value = getattr(raw, key, None)
            if isinstance(value, int):
                # message_delta carries cumulative counts: the latest value wins.
                self.usage[key] = value

    def response(self) -> ProviderResponse:
        content = tuple(b for _, s in sorted(self.blocks.items()) if (b := s.finish()) is not None)
        reason = self.stop_reason or STOP_END
        usage = Usage(
            input_tokens=self.usage.get("input_tokens", 0),
            output_tokens=self.usage.get("output_tokens", 0),
            cache_read_tokens=self.usage.get("cache_read_input_tokens", 0),
            cache_write_tokens=self.usage.get("cache_creation_input_tokens", 0),
        )
        return ProviderResponse(content, _STOP_REASONS.get(reason, reason), usage, self.model)


def translate_error(exc: BaseException) -> ProviderError:
    """Any failure from the SDK or its HTTP stack, as one of our typed errors."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
        return ProviderTimeoutError(str(exc), provider=PROVIDER_NAME)
    if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
        return ProviderConnectionError(str(exc) or type(exc).__name__, provider=PROVIDER_NAME)
    if isinstance(exc, anthropic.APIStatusError):
        body = error_body(exc.body)
        message = exc.api_message or (str(body.get("message", "")) if body else "") or str(exc)
        return classify_status_error(
            provider=PROVIDER_NAME,
            status=exc.status_code,
            message=message,
            error_type=exc.type,
            code=exc.error_code,
            headers=exc.response.headers,
            body=body,
        )
    if isinstance(exc, anthropic.CredentialsError):
        return AuthenticationError(str(exc), provider=PROVIDER_NAME)
    # Unreadable JSON in an event, a validation failure, a stream error: the answer
    # itself is what we could not use.
    return MalformedResponseError(
        f"unreadable answer: {type(exc).__name__}: {exc}", provider=PROVIDER_NAME
    )


class AnthropicProvider(StreamingProvider[anthropic.AsyncAnthropic]):
    """``Provider`` for the Anthropic Messages API."""

    name = PROVIDER_NAME
    # The encoded blocks of the messages this provider sends, made on first use.
    _encoder: RequestEncoder | None = None

    def _open_client(
        self, api_key: str, base_url: str | None, timeouts: StreamTimeouts
    ) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            api_key=api_key,
            base_url=base_url,
            max_retries=0,
            timeout=timeouts.for_http(),
            open_telemetry=False,
            # The SDK's aiohttp transport (see ``streaming.py``: why not httpcore's pool).
            http_client=anthropic.DefaultAioHttpClient(timeout=timeouts.for_http()),
        )

    async def _stream(
        self, request: ProviderRequest, on_text: TextCallback | None
    ) -> ProviderResponse:
        encoder = self._encoder
        if encoder is None:
            encoder = self._encoder = RequestEncoder()

        def send() -> Awaitable[AsyncStream[RawMessageStreamEvent]]:
            # The body comes encoded (anthropic_wire.py): messages.create would copy
            # and re-encode the whole history on every call. Encoded inside the call,
            # so that a body the API cannot take (a NaN in a tool input) fails the
            # call, as it did in the SDK.
            body = encoder.body(request, request.model or self.model)
            return self._client.post(
                "/v1/messages",
                cast_to=anthropic.types.Message,
                content=body,
                stream=True,
                stream_cls=AsyncStream[RawMessageStreamEvent],
            )

        state = await drive_stream(
            send,
            _Assembler(),
            self._apply,
            translate_error,
            on_text,
            provider=PROVIDER_NAME,
            unit="event",
            timeouts=self.timeouts,
        )
        if not state.started:
            raise MalformedResponseError("the answer was not a message stream", provider=self.name)
        if not state.stopped:
            raise ProviderConnectionError(
                "the stream ended before message_stop", provider=self.name
            )
        return state.response()

    @staticmethod
    def _apply(state: _Assembler, event: Any) -> str:
        """Fold one event into ``state``; return the text delta it carried, if any."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            message = getattr(event, "message", None)
            state.started = True
            state.model = str(getattr(message, "model", "") or "")
            state.take_usage(getattr(message, "usage", None))
        elif kind == "content_block_start":
            block = getattr(event, "content_block", None)
            block_kind = str(getattr(block, "type", ""))
            slot = _BlockState(block_kind)
            if block_kind == "tool_use":
                slot.tool_id = str(getattr(block, "id", ""))
                slot.tool_name = str(getattr(block, "name", ""))
                initial = getattr(block, "input", None)
                slot.initial_input = initial if isinstance(initial, dict) else None
            elif block_kind == "text" and (text := getattr(block, "text", "")):
                slot.parts.append(text)
            state.blocks[int(getattr(event, "index", len(state.blocks)))] = slot
        elif kind == "content_block_delta":
            current = state.blocks.get(int(getattr(event, "index", -1)))
            delta = getattr(event, "delta", None)
            delta_kind = getattr(delta, "type", None)
            if current is None:
                raise MalformedResponseError(
                    "a delta for a block never started", provider=PROVIDER_NAME
                )
            if delta_kind == "text_delta":
                text = str(getattr(delta, "text", ""))
                current.parts.append(text)
                return text
            if delta_kind == "input_json_delta":
                current.parts.append(str(getattr(delta, "partial_json", "")))
        elif kind == "message_delta":
            delta = getattr(event, "delta", None)
            reason = getattr(delta, "stop_reason", None)
            if reason:
                state.stop_reason = str(reason)
            state.take_usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            state.stopped = True
        return ""
