"""A strict fake of Anthropic's Messages API for the real ``anthropic`` SDK.

``async with FakeAnthropic() as fake:`` then point the SDK at ``fake.base_url`` (the
SDK adds ``/v1/messages``). What it checks, like the real service:

- a key, as ``Authorization: Bearer`` (SDK 2.x) or ``x-api-key`` (older SDKs): 401;
- the body: model, max_tokens, non-empty messages with alternating roles, non-empty
  text blocks, every ``tool_result`` answering a ``tool_use`` of the previous message
  and every ``tool_use`` answered in the next one, at most 4 ``cache_control``
  blocks: 400 ``invalid_request_error`` with the real wording where known;
- the context window (``context_window``) on every request, counting tools, system
  and messages, with the two real overflow messages.

Usage reports prompt caching as the real service does (see ``PrefixCache``): the
prompt is cut into segments (tools, system blocks, message blocks); a prefix that
ends at a ``cache_control`` block and has at least ``min_cache_tokens`` is written;
a later request reads the longest live prefix found at a block boundary within 20
blocks before one of its breakpoints. An entry lives ``cache_ttl_seconds`` on
``fake.clock``, and each read restarts that. ``input_tokens`` is what is neither read
nor written. ``fake.billing`` keeps the running totals.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from tests.fakes.llm_common import (
    CACHE_LOOKBACK_BLOCKS,
    DEFAULT_CACHE_TTL_SECONDS,
    Billing,
    FakeLLMServer,
    Hang,
    HttpError,
    MeasuredSegment,
    RawResponse,
    Reply,
    Step,
    StreamError,
    ToolCall,
    bearer_or_api_key,
    estimate_tokens,
    json_response,
    measure_segments,
    retry_headers,
    split_text,
)

MAX_CACHE_BREAKPOINTS = 4
IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


class InvalidRequest(Exception):
    """A body the real API would reject with 400 invalid_request_error."""


def rate_limited(
    retry_after: float | None = None, retry_after_ms: float | None = None
) -> HttpError:
    headers = retry_headers(retry_after, retry_after_ms)
    return HttpError(
        429,
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests per minute.",
        headers,
    )


def overloaded() -> HttpError:
    return HttpError(529, "overloaded_error", "Overloaded")


def server_error() -> HttpError:
    return HttpError(500, "api_error", "Internal server error")


def prompt_too_long(observed: int, limit: int) -> HttpError:
    return HttpError(
        400, "invalid_request_error", f"prompt is too long: {observed} tokens > {limit} maximum"
    )


def request_too_large() -> HttpError:
    return HttpError(
        413, "request_too_large", "Request exceeds the maximum allowed number of bytes."
    )


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


_TEXT_BLOCK_FIELDS = frozenset({"type", "text", "cache_control", "citations"})


def _check_block(block: Any, where: str) -> None:
    if not isinstance(block, dict) or "type" not in block:
        raise InvalidRequest(f"{where}: Input should be a valid dictionary or object")
    kind = block["type"]
    if kind == "text":
        # The real API validates blocks strictly: a field it does not know (a runtime's
        # own bookkeeping leaking onto the wire) is a 400, not ignored.
        extra = sorted(set(block) - _TEXT_BLOCK_FIELDS)
        if extra:
            raise InvalidRequest(f"{where}.{extra[0]}: Extra inputs are not permitted")
        text = block.get("text")
        if not isinstance(text, str) or not text:
            raise InvalidRequest(f"{where}: text content blocks must be non-empty")
        if not text.strip():
            raise InvalidRequest(f"{where}: text content blocks must contain non-whitespace text")
    elif kind == "image":
        source = block.get("source") or {}
        if source.get("type") != "base64" or not source.get("data"):
            raise InvalidRequest(f"{where}.source: image source data is required")
        try:
            base64.b64decode(source["data"], validate=True)
        except ValueError:
            raise InvalidRequest(f"{where}.source.data: invalid base64 data") from None
        if source.get("media_type") not in IMAGE_MEDIA_TYPES:
            raise InvalidRequest(
                f"{where}.source.media_type: Input should be one of 'image/jpeg', "
                "'image/png', 'image/gif' or 'image/webp'"
            )
    elif kind == "tool_use":
        if not block.get("id") or not block.get("name") or not isinstance(block.get("input"), dict):
            raise InvalidRequest(f"{where}: tool_use blocks need id, name and an object input")
    elif kind == "tool_result":
        if not block.get("tool_use_id"):
            raise InvalidRequest(f"{where}.tool_use_id: Field required")
    else:
        raise InvalidRequest(f"{where}.type: unknown content block type {kind!r}")


def _blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or [])


def validate(body: Any) -> None:
    """Raise ``InvalidRequest`` for what the real API rejects (the parts we know)."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise InvalidRequest("max_tokens: Field required")
    if max_tokens < 1:
        raise InvalidRequest("max_tokens: Input should be greater than or equal to 1")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages: Field required")
    if not messages:
        raise InvalidRequest("messages: at least one message is required")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            raise InvalidRequest("system: Input should be a valid list")
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text":
                raise InvalidRequest(f"system.{i}: Input should be a text block")
            _check_block(block, f"system.{i}")
    for i, tool in enumerate(body.get("tools") or []):
        if not isinstance(tool, dict) or not tool.get("name"):
            raise InvalidRequest(f"tools.{i}.name: Field required")
        if not isinstance(tool.get("input_schema"), dict):
            raise InvalidRequest(f"tools.{i}.input_schema: Field required")

    previous_role = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if role == previous_role:
            raise InvalidRequest(
                f'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row'
            )
        previous_role = role
        blocks = _blocks(message)
        last = i == len(messages) - 1
        if not blocks and not (last and role == "assistant"):
            raise InvalidRequest(
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        for j, block in enumerate(blocks):
            _check_block(block, f"messages.{i}.content.{j}")
            if block["type"] == "tool_use" and role != "assistant":
                raise InvalidRequest(
                    f"messages.{i}.content.{j}: tool_use blocks are only allowed in "
                    "assistant messages"
                )
            if block["type"] == "tool_result" and role != "user":
                raise InvalidRequest(
                    f"messages.{i}.content.{j}: tool_result blocks are only allowed in "
                    "user messages"
                )
    _check_tool_pairs(messages)
    _check_cache_breakpoints(body)


def _check_tool_pairs(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        blocks = _blocks(message)
        if message["role"] == "user":
            asked = set()
            if i > 0:
                asked = {b["id"] for b in _blocks(messages[i - 1]) if b["type"] == "tool_use"}
            for j, block in enumerate(blocks):
                if block["type"] == "tool_result" and block["tool_use_id"] not in asked:
                    raise InvalidRequest(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block['tool_use_id']}. Each `tool_result` block "
                        "must have a corresponding `tool_use` block in the previous message."
                    )
        elif i + 1 < len(messages):
            uses = [b["id"] for b in blocks if b["type"] == "tool_use"]
            answered = {
                b["tool_use_id"] for b in _blocks(messages[i + 1]) if b["type"] == "tool_result"
            }
            missing = [u for u in uses if u not in answered]
            if missing:
                raise InvalidRequest(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message."
                )


def prompt_segments(body: Mapping[str, Any]) -> tuple[list[Any], list[int]]:
    """The prompt as ordered segments, and the indexes of those marked cache_control."""
    segments: list[Any] = []
    breakpoints: list[int] = []

    def add(item: Any) -> None:
        if isinstance(item, dict) and "cache_control" in item:
            breakpoints.append(len(segments))
            item = {k: v for k, v in item.items() if k != "cache_control"}
        segments.append(item)

    for tool in body.get("tools") or []:
        add(tool)
    system = body.get("system")
    if isinstance(system, str) and system:
        add({"type": "text", "text": system})
    elif isinstance(system, list):
        for block in system:
            add(block)
    for message in body.get("messages") or []:
        segments.append({"role": message.get("role")})
        for block in _blocks(message):
            add(block)
    return segments, breakpoints


def block_indexes(segments: list[Any]) -> list[int]:
    """The segments that are content blocks (tools and system blocks count as blocks),
    not the role markers that open each message: the cache's lookback counts blocks."""
    return [i for i, s in enumerate(segments) if not (isinstance(s, dict) and s.keys() == {"role"})]


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The deterministic size of a request's prompt: tools, system and messages."""
    segments, _ = prompt_segments(body)
    return sum(estimate_tokens(s) for s in segments)


def _check_cache_breakpoints(body: Mapping[str, Any]) -> None:
    _, breakpoints = prompt_segments(body)
    if len(breakpoints) > MAX_CACHE_BREAKPOINTS:
        raise InvalidRequest(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(breakpoints)}."
        )


def echo_text(body: Mapping[str, Any]) -> str:
    """The default reply: what the last message said, echoed."""
    said: list[str] = []
    for block in _blocks(body["messages"][-1]):
        if block["type"] == "text":
            said.append(block["text"])
        elif block["type"] == "tool_result":
            content = block.get("content")
            said.append(content if isinstance(content, str) else json.dumps(content))
    return "echo: " + " ".join(said)


class FakeAnthropic(FakeLLMServer):
    """The fake Messages API; ``script`` steps are in ``tests.fakes.llm_common``."""

    api_key: str  # always checked here (None is for a local OpenAI-style server)

    def __init__(
        self,
        *,
        api_key: str = "sk-test",
        context_window: int | None = None,
        min_cache_tokens: int = 0,
        cache_ttl_seconds: float = DEFAULT_CACHE_TTL_SECONDS,
        cache_lookback_blocks: int = CACHE_LOOKBACK_BLOCKS,
        clock: Callable[[], float] | None = None,
        keep_requests: int | None = None,
    ) -> None:
        super().__init__(
            api_key=api_key, context_window=context_window, keep_requests=keep_requests
        )
        self.min_cache_tokens = min_cache_tokens
        self.cache_ttl_seconds = cache_ttl_seconds
        self.cache_lookback_blocks = cache_lookback_blocks
        if clock is not None:
            self.clock = clock
        self.billing = Billing()
        self.usages: list[dict[str, int]] = []  # per answered request, in order

    @property
    def requests_bodies(self) -> list[Any]:
        """The bodies of the ``/v1/messages`` requests, in order (count_tokens excluded)."""
        return [r.body for r in self.requests if r.path == "/v1/messages"]

    @property
    def last_usage(self) -> dict[str, int] | None:
        return self.usages[-1] if self.usages else None

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        return app

    # -- helpers -----------------------------------------------------------------------

    def _error(
        self, status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        request_id = self.next_id("req_")
        body = {
            "type": "error",
            "error": {"type": error_type, "message": message},
            "request_id": request_id,
        }
        return json_response(status, body, {"request-id": request_id, **(headers or {})})

    def _auth_failure(self, request: web.Request) -> web.Response | None:
        key = bearer_or_api_key(request)
        if key is None:
            return self._error(401, "authentication_error", "x-api-key header is required")
        if key != self.api_key:
            return self._error(401, "authentication_error", "invalid x-api-key")
        return None

    def _overflow(self, body: Mapping[str, Any], prompt_tokens: int) -> web.Response | None:
        window = self.context_window
        if window is None:
            return None
        if prompt_tokens > window:
            return self._error(
                400,
                "invalid_request_error",
                f"prompt is too long: {prompt_tokens} tokens > {window} maximum",
            )
        if prompt_tokens + body["max_tokens"] > window:
            return self._error(
                400,
                "invalid_request_error",
                f"input length and `max_tokens` exceed context limit: {prompt_tokens} + "
                f"{body['max_tokens']} > {window}, decrease input length or `max_tokens` "
                "and try again",
            )
        return None

    def _usage(
        self,
        step: Step,
        segments: list[Any],
        breakpoints: list[int],
        measured: list[MeasuredSegment],
    ) -> dict[str, int]:
        """Account the prompt against the cache, bill it, and return the usage."""
        total = sum(m.tokens for m in measured)
        read, written = self.cache.account(
            segments,
            breakpoints,
            self.min_cache_tokens,
            now=self.clock(),
            ttl_seconds=self.cache_ttl_seconds,
            lookback_blocks=self.cache_lookback_blocks,
            block_indexes=block_indexes(segments),
            measured=measured,
        )
        output = self._output_tokens(self._sent_reply(step))
        usage = {
            "input_tokens": total - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "output_tokens": output,
        }
        self.billing.add(
            input_tokens=usage["input_tokens"], read=read, written=written, output_tokens=output
        )
        self.usages.append(usage)
        if self.keep_requests is not None:
            del self.usages[: -self.keep_requests]
        return usage

    @staticmethod
    def _sent_reply(step: Step) -> Reply:
        """What the model says for ``step``: the reply, or the text sent before a failure."""
        if isinstance(step, Reply):
            return step
        return Reply(getattr(step, "partial_text", "") or "")

    # -- handlers ------------------------------------------------------------------------

    async def _count_tokens(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if (failure := self._auth_failure(request)) is not None:
            return failure
        return json_response(
            200, {"input_tokens": prompt_tokens(body if isinstance(body, dict) else {})}
        )

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        if (failure := self._auth_failure(request)) is not None:
            return failure
        try:
            validate(body)
        except InvalidRequest as exc:
            return self._error(400, "invalid_request_error", str(exc))
        segments, breakpoints = prompt_segments(body)
        measured = measure_segments(segments)
        if (overflow := self._overflow(body, sum(m.tokens for m in measured))) is not None:
            return overflow
        step: Step = self.next_step(body) or Reply(echo_text(body))
        if isinstance(step, HttpError):
            if step.body is not None:
                return json_response(step.status, step.body, step.headers)
            return self._error(step.status, step.error_type, step.message, step.headers)
        if isinstance(step, RawResponse):
            return web.Response(
                status=step.status, body=step.body, headers={"Content-Type": step.content_type}
            )
        if isinstance(step, Hang) and step.partial_text is None:
            return await self.hang_response(request)
        usage = self._usage(step, segments, breakpoints, measured)
        if not body.get("stream"):
            if not isinstance(step, Reply):
                return self._error(500, "api_error", "this step needs stream: true")
            return json_response(200, self._whole_message(body, step, usage))
        return await self._stream(request, body, step, usage)

    def _whole_message(
        self, body: Mapping[str, Any], reply: Reply, usage: dict[str, int]
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for call in reply.tool_calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id or self.next_id("toolu_"),
                    "name": call.name,
                    "input": dict(call.input),
                }
            )
        return {
            "id": self.next_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": self._stop_reason(reply),
            "stop_sequence": None,
            "usage": usage,
        }

    @staticmethod
    def _stop_reason(reply: Reply) -> str:
        return reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")

    @staticmethod
    def _output_tokens(reply: Reply) -> int:
        spent = estimate_tokens(reply.text) + sum(
            estimate_tokens(c.arguments_text()) for c in reply.tool_calls
        )
        return max(1, spent)

    async def _stream(
        self, request: web.Request, body: Mapping[str, Any], step: Step, usage: dict[str, int]
    ) -> web.StreamResponse:
        if isinstance(step, Reply) and step.hold is not None:
            await step.hold.wait()
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "request-id": self.next_id("req_"),
            }
        )
        await response.prepare(request)
        send = self.write_quietly
        message = {
            "id": self.next_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Output is reported at the end (message_delta), as the real stream does.
            "usage": {**usage, "output_tokens": 1},
        }
        await send(response, _sse("message_start", {"type": "message_start", "message": message}))
        reply = self._sent_reply(step)
        index = 0
        if reply.text:
            await send(
                response,
                _sse(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                ),
            )
            await send(response, _sse("ping", {"type": "ping"}))
            for n, piece in enumerate(split_text(reply.text, reply.chunk_chars)):
                if reply.pause is not None and n == reply.pause[0]:
                    await reply.pause[1].wait()
                if reply.chunk_seconds and n:
                    await asyncio.sleep(reply.chunk_seconds)
                delta = {"type": "text_delta", "text": piece}
                await send(
                    response,
                    _sse(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": 0, "delta": delta},
                    ),
                )
            if not isinstance(step, Reply):
                return await self._break_off(response, step)
            await send(
                response, _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
            )
            index = 1
        elif not isinstance(step, Reply):
            return await self._break_off(response, step)
        for call in reply.tool_calls:
            await self._send_tool_use(response, index, call)
            index += 1
        stop = {"stop_reason": self._stop_reason(reply), "stop_sequence": None}
        await send(
            response,
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": stop,
                    "usage": {"output_tokens": self._output_tokens(reply)},
                },
            ),
        )
        await send(response, _sse("message_stop", {"type": "message_stop"}))
        return response

    async def _send_tool_use(
        self, response: web.StreamResponse, index: int, call: ToolCall
    ) -> None:
        block = {
            "type": "tool_use",
            "id": call.id or self.next_id("toolu_"),
            "name": call.name,
            "input": {},
        }
        await self.write_quietly(
            response,
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            ),
        )
        # Split the JSON in three like the real service does in small pieces.
        for piece in split_text(call.arguments_text(), max(1, len(call.arguments_text()) // 3 + 1)):
            delta = {"type": "input_json_delta", "partial_json": piece}
            await self.write_quietly(
                response,
                _sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                ),
            )
        await self.write_quietly(
            response, _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        )

    async def _break_off(self, response: web.StreamResponse, step: Step) -> web.StreamResponse:
        if isinstance(step, StreamError):
            error = {"type": "error", "error": {"type": step.error_type, "message": step.message}}
            await self.write_quietly(response, _sse("error", error))
            return response
        await self.wait_released()  # a Hang that already sent its partial text
        return response
