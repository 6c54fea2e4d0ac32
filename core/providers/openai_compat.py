"""OpenAI-compatible chat completions provider (``openai.AsyncOpenAI``, always streaming).

Works against OpenAI itself and the servers that copy its API (vLLM, llama.cpp,
Ollama, LM Studio...); ``base_url`` includes ``/v1``.

Translation of our messages:

- The system prompt is the first ``system`` message.
- Assistant ``tool_use`` blocks become ``tool_calls`` whose ``arguments`` are JSON text;
  ``tool_result`` blocks become ``role: "tool"`` messages carrying ``tool_call_id``
  (an error result is prefixed with ``[error]``, the format has no flag for it).
  Other blocks that ride in a tool-result message follow as a user message.
- Images are data URLs; an image with no data becomes the text ``[image]``.
- ``max_completion_tokens`` is sent to OpenAI itself, ``max_tokens`` to any other
  server, since most compatible servers know only the older name.

Streaming: text deltas go to ``on_text``; tool calls are put back together by their
``index``. Arguments that are not a JSON object are kept as ``{"_raw": "<text>"}``
rather than failing the turn, so the runner can tell the model its call was
unreadable. Usage: ``prompt_tokens`` minus cached (``cached_tokens``) and cache
writes is ``input``; servers that send no usage give zeros.

The window's edge: llama.cpp and Ollama accept any prompt that fits and stop the reply
with ``finish_reason: "length"`` when prompt + output fill the window, exactly as when
the reply reaches ``max_tokens``. Such a reply is ``STOP_OVERFLOW`` (the runner compacts
and asks again), not ``STOP_MAX_TOKENS``, when the usage shows it: prompt + output reach
the known window, or the output stopped short of the request's ``max_tokens`` (only the
window stops it there). A server whose own output cap is below the request's (llama.cpp's
``--n-predict``) is misread as overflow by the second rule; without usage, nothing can be
told and ``length`` stays ``STOP_MAX_TOKENS``.

What the server says of its model: ``start()`` (awaited by the gateway) asks the server
once (``core.providers.discovery``) and keeps the answer as ``facts``; ``context_window``
and ``supports_tools`` read it. Tool schemas are not sent to a server that said its
model's template has no tool support.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai

from parley.core.errors import (
    MalformedResponseError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
)
from parley.core.media import gone_placeholder
from parley.core.messages import (
    Block,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    Usage,
)
from parley.core.providers.base import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    STOP_REFUSAL,
    STOP_TOOL_USE,
    ModelFacts,
    ProviderRequest,
    ProviderResponse,
    TextCallback,
)
from parley.core.providers.discovery import (
    DEFAULT_DISCOVERY_TIMEOUT_SECONDS,
    discover_openai_compat,
    is_openai_itself,
)
from parley.core.providers.retry import classify_status_error
from parley.core.providers.streaming import (
    DEFAULT_CONNECT_TIMEOUT_SECONDS,
    DEFAULT_STALL_TIMEOUT_SECONDS,
    StreamingProvider,
    StreamTimeouts,
    drive_stream,
    error_body,
    parse_json_object,
)

log = logging.getLogger("parley.core.providers.openai_compat")

PROVIDER_NAME = "openai"
IMAGE_PLACEHOLDER = "[image]"
ERROR_RESULT_PREFIX = "[error] "

_FINISH_REASONS: dict[str, str] = {
    "stop": STOP_END,
    "tool_calls": STOP_TOOL_USE,
    "function_call": STOP_TOOL_USE,
    "length": STOP_MAX_TOKENS,
    "content_filter": STOP_REFUSAL,
}


def _image_part(block: ImageBlock) -> dict[str, Any]:
    if not block.data:  # stored pictures are resolved before (core.media)
        return {"type": "text", "text": gone_placeholder(block) if block.ref else IMAGE_PLACEHOLDER}
    url = f"data:{block.media_type};base64,{block.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_content(blocks: list[Block]) -> str | list[dict[str, Any]]:
    """Plain text as a string (what every compatible server reads), else content parts."""
    if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
        return blocks[0].text
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(block))
    return parts


def _assistant_message(message: Message) -> dict[str, Any]:
    text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
    wire: dict[str, Any] = {"role": "assistant", "content": text or None}
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in message.content
        if isinstance(b, ToolUseBlock)
    ]
    if calls:
        wire["tool_calls"] = calls
    elif wire["content"] is None:
        wire["content"] = ""
    return wire


def to_wire_messages(system: str, messages: tuple[Message, ...] | list[Message]) -> list[dict]:
    wire: list[dict[str, Any]] = []
    if system.strip():
        wire.append({"role": "system", "content": system})
    for message in messages:
        if message.role == "assistant":
            wire.append(_assistant_message(message))
            continue
        others: list[Block] = []
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                content = block.content
                if block.is_error:
                    content = ERROR_RESULT_PREFIX + content
                wire.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
            elif isinstance(block, TextBlock | ImageBlock):
                others.append(block)
        if others:
            wire.append({"role": "user", "content": _user_content(others)})
    return wire


def to_wire_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in tools
    ]


@dataclass(slots=True)
class _CallState:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Assembler:
    chunks: int = 0
    model: str = ""
    text: list[str] = field(default_factory=list)
    calls: dict[int, _CallState] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    # The raw figures, None until a usage object says them: the window's edge is judged
    # on them (``prompt_tokens`` counts cached tokens too).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def take_usage(self, raw: Any) -> None:
        prompt = getattr(raw, "prompt_tokens", None) or 0
        output = getattr(raw, "completion_tokens", None) or 0
        details = getattr(raw, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) or 0
        written = getattr(details, "cache_write_tokens", None) or 0
        self.prompt_tokens, self.completion_tokens = int(prompt), int(output)
        self.usage = Usage(
            input_tokens=max(0, int(prompt) - int(cached) - int(written)),
            output_tokens=int(output),
            cache_read_tokens=int(cached),
            cache_write_tokens=int(written),
        )

    def stopped_by_window(self, max_tokens: int, window: int | None) -> bool:
        """Whether a ``length`` finish was the window's, not ``max_tokens``'s: a reply
        short of its own cap whose prompt and output reached the window the server
        published. Without that window (vLLM and OpenAI refuse prompt + max_tokens up
        front instead) a short "length" is a server-side output cap (``--n-predict``,
        a Modelfile's ``num_predict``), which a compaction would not cure. A reply that
        reached ``max_tokens`` too would be cut the same way on a retry."""
        if self.completion_tokens is None or self.prompt_tokens is None:
            return False  # no usage: nothing to tell them apart by
        if window is None or self.completion_tokens >= max_tokens:
            return False
        return self.prompt_tokens + self.completion_tokens >= window

    def response(self) -> ProviderResponse:
        content: list[Block] = []
        text = "".join(self.text)
        if text:
            content.append(TextBlock(text))
        for index, call in sorted(self.calls.items()):
            call_id = call.id or f"call_{index}"  # some local servers send no id
            content.append(
                ToolUseBlock(call_id, call.name, parse_json_object("".join(call.arguments)))
            )
        reason = self.finish_reason or STOP_END
        stop = _FINISH_REASONS.get(reason, reason)
        if self.calls and stop == STOP_END:
            stop = STOP_TOOL_USE  # Ollama and others say "stop" after a tool call
        return ProviderResponse(tuple(content), stop, self.usage, self.model)


def translate_error(exc: BaseException) -> ProviderError:
    """Any failure from the SDK or its HTTP stack, as one of our typed errors."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
        return ProviderTimeoutError(str(exc), provider=PROVIDER_NAME)
    if isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
        return ProviderConnectionError(str(exc) or type(exc).__name__, provider=PROVIDER_NAME)
    if isinstance(exc, openai.APIError) and not isinstance(exc, openai.APIResponseValidationError):
        # A status error, or an error object inside a 200 stream (status None).
        body = error_body(exc.body)
        message = str(body.get("message") or "") if body else ""
        status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
        headers = exc.response.headers if isinstance(exc, openai.APIStatusError) else None
        error_type = exc.type if isinstance(exc.type, str) else None
        return classify_status_error(
            provider=PROVIDER_NAME,
            status=status,
            message=message or exc.message,
            error_type=error_type,
            code=exc.code,
            headers=headers,
            body=body,
        )
    return MalformedResponseError(
        f"unreadable answer: {type(exc).__name__}: {exc}", provider=PROVIDER_NAME
    )


def _call_slot(state: _Assembler, call: Any) -> _CallState:
    """The call a tool-call delta belongs to: by ``index``, or, for servers that send
    none, the latest call unless the delta brings a new id."""
    index = getattr(call, "index", None)
    if index is None:
        index = max(state.calls) if state.calls else 0
        current = state.calls.get(index)
        call_id = getattr(call, "id", None)
        if current is not None and call_id and current.id and current.id != call_id:
            index += 1
    return state.calls.setdefault(int(index), _CallState())


class OpenAICompatProvider(StreamingProvider[openai.AsyncOpenAI]):
    """``Provider`` for OpenAI and OpenAI-compatible chat completions servers.

    ``discovery_timeout`` bounds ``start()``'s questions to the server.
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        model: str,
        api_key: str,
        base_url: str | None = None,
        timeout: float | None = None,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT_SECONDS,
        discovery_timeout: float = DEFAULT_DISCOVERY_TIMEOUT_SECONDS,
        vision: bool | None = True,
    ) -> None:
        """``vision``: whether the model sees images; None: what the server says at
        ``start`` (llama.cpp's /props, Ollama's /api/show), no until it does."""
        super().__init__(
            model,
            api_key,
            base_url,
            timeout,
            connect_timeout=connect_timeout,
            stall_timeout=stall_timeout,
            vision=vision is True,
        )
        self._vision_from_server = vision is None
        self._api_key = api_key
        self.discovery_timeout = discovery_timeout
        self.facts = ModelFacts()
        self._started = False
        self._sampling: dict[str, float] = {}

    @property
    def context_window(self) -> int | None:
        """The window the server said it runs the model with; ``None`` when unknown."""
        return self.facts.context_window

    def use_sampling(self, hints: Mapping[str, float]) -> bool:
        """Send llama.cpp's sampling fields (``repeat_penalty``…: the small profile's
        guard against looping) with every request, when the server is llama.cpp: others
        ignore or refuse fields they do not know. True when they will be sent."""
        self._sampling = dict(hints) if self.facts.server == "llama.cpp" else {}
        return bool(self._sampling)

    @property
    def supports_tools(self) -> bool:
        """False only when the server said the model's template cannot take tools."""
        return self.facts.supports_tools is not False

    async def discover(self) -> ModelFacts:
        """Ask the server about the model (bounded, never raising for what the server
        does) and keep the answer as ``facts``."""
        self.facts = await discover_openai_compat(
            self.base_url, self.model, api_key=self._api_key, seconds=self.discovery_timeout
        )
        return self.facts

    async def start(self) -> None:
        """Discover once. Never fails and never hangs: a server that says nothing in
        time leaves the facts empty (the configured figures apply)."""
        if self._started:
            return
        self._started = True
        try:
            # A margin over the probes' own bound, for a session that is slow to close.
            async with asyncio.timeout(self.discovery_timeout + 1.0):
                facts = await self.discover()
        except Exception as exc:  # nothing a probe does may stop the gateway starting
            self.facts = ModelFacts()
            log.info(
                "could not ask %s about %s: %s: %s",
                self.base_url,
                self.model,
                type(exc).__name__,
                exc,
            )
            return
        if self._vision_from_server and facts.supports_vision is not None:
            self.vision = facts.supports_vision
            log.info("%s: vision %s (%s)", self.model, "on" if self.vision else "off", facts.source)
        if facts.server == "openai":
            return  # OpenAI publishes no window: the model table applies
        if facts.context_window is None and facts.supports_tools is None:
            log.info(
                "%s said nothing of %s's window; the configured one applies",
                self.base_url or "the server",
                self.model,
            )
            return
        log.info(
            "%s: window %s tokens (%s), tools %s",
            self.model,
            facts.context_window if facts.context_window is not None else "unknown",
            facts.source or "not said",
            {True: "supported", False: "not supported", None: "not said"}[facts.supports_tools],
        )

    def _open_client(
        self, api_key: str, base_url: str | None, timeouts: StreamTimeouts
    ) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeouts.for_http()
        )

    @property
    def _max_tokens_key(self) -> str:
        return "max_completion_tokens" if is_openai_itself(self.base_url) else "max_tokens"

    def build_params(self, request: ProviderRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": to_wire_messages(request.system, request.messages),
            self._max_tokens_key: request.max_tokens,
            "stream_options": {"include_usage": True},
        }
        # Whether a model gets tools is the gateway's decision (the server's word, or the
        # operator's [context.models] tools override): what the request holds is sent.
        if request.tools:
            params["tools"] = to_wire_tools(request.tools)
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if self._sampling:
            params["extra_body"] = dict(self._sampling)
        return params

    async def _stream(
        self, request: ProviderRequest, on_text: TextCallback | None
    ) -> ProviderResponse:
        # The parameters are built inside the translated call, so tool input that
        # json.dumps cannot serialise still ends as a ProviderError, not a TypeError.
        state = await drive_stream(
            lambda: self._client.chat.completions.create(**self.build_params(request), stream=True),
            _Assembler(),
            self._apply,
            translate_error,
            on_text,
            provider=PROVIDER_NAME,
            unit="chunk",
            timeouts=self.timeouts,
        )
        if state.chunks == 0:
            raise MalformedResponseError(
                "the answer was not a completion stream", provider=self.name
            )
        if state.finish_reason is None:
            raise ProviderConnectionError(
                "the stream ended before a finish_reason", provider=self.name
            )
        response = state.response()
        if response.stop_reason == STOP_MAX_TOKENS and state.stopped_by_window(
            request.max_tokens, self.facts.context_window
        ):
            # The text is kept (valid and paid for); the runner decides what to do.
            response = ProviderResponse(
                response.content, STOP_OVERFLOW, response.usage, response.model
            )
        return response

    @staticmethod
    def _apply(state: _Assembler, chunk: Any) -> str:
        """Fold one chunk into ``state``; return the text delta it carried, if any."""
        choices = getattr(chunk, "choices", None)
        if not isinstance(choices, list):
            raise MalformedResponseError("a stream chunk without choices", provider=PROVIDER_NAME)
        state.chunks += 1
        state.model = str(getattr(chunk, "model", "") or state.model)
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            state.take_usage(usage)
        text = ""
        for choice in choices:
            if getattr(choice, "index", 0) != 0:
                continue  # we never ask for n > 1
            delta = getattr(choice, "delta", None)
            piece = getattr(delta, "content", None)
            if isinstance(piece, str) and piece:
                state.text.append(piece)
                text += piece
            for call in getattr(delta, "tool_calls", None) or ():
                slot = _call_slot(state, call)
                if getattr(call, "id", None) and not slot.id:
                    slot.id = str(call.id)
                function = getattr(call, "function", None)
                if name := getattr(function, "name", None):
                    slot.name += str(name)
                if arguments := getattr(function, "arguments", None):
                    slot.arguments.append(str(arguments))
            reason = getattr(choice, "finish_reason", None)
            if reason:
                state.finish_reason = str(reason)
        return text
