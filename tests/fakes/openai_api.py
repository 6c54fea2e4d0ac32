"""A strict fake of the OpenAI chat completions API for the real ``openai`` SDK.

``async with FakeOpenAI() as fake:`` then point the SDK at ``fake.base_url`` (which
includes ``/v1``). Like the real service (and the servers that copy it) it checks:

- a key, as ``Authorization: Bearer`` or ``x-api-key``: 401 ``invalid_api_key``;
- the body: model, non-empty messages with known roles, ``tool`` messages answering
  the ``tool_calls`` of the assistant message before them, every tool call answered,
  string ``arguments``, ``stream_options`` only with ``stream``, user content parts
  (``text``, ``image_url`` with an http(s) URL or a base64 data URL of JPEG, PNG, GIF
  or WebP): 400;
- the context window (``context_window``) with the overflow body of the chosen
  ``dialect``: ``"openai"`` (code ``context_length_exceeded``), ``"vllm"`` (a
  top-level error object) or ``"llamacpp"`` (``exceed_context_size_error``).

Streams are ``data:`` lines only, ending with ``data: [DONE]``; with
``stream_options.include_usage`` a last chunk carries usage (``report_usage=False``
imitates servers that never send it). Cached tokens: the longest prompt prefix (in
whole messages) already seen, as OpenAI's automatic prefix caching reports it.

Speech to text (``POST /v1/audio/transcriptions``, multipart ``file`` and ``model``)
answers the words ``transcripts`` holds for the file's SHA-256; every request is in
``transcription_requests``.

Embeddings (``POST /v1/embeddings``) are as strict as the real endpoint: the same key
check (none when the fake has ``api_key=None``, like a local Ollama), a known set of
parameters, ``input`` a string or a list of 1 to 2,048 non-empty strings, each at most
8,192 tokens and 300,000 in all (the usual ~4 characters a token), ``encoding_format``
``float`` or ``base64``, ``dimensions`` between 1 and the model's width. Vectors are a
hashed bag of words (``hashed_embedding``): deterministic, unit length, and texts that
share words point the same way; ``dimensions`` shortens and renormalises them the way
OpenAI's models do. Failures come from their own queue, ``enqueue_embeddings``, so a
test of embeddings never eats a chat step: ``HttpError``, ``RawResponse``, ``Hang`` or
``EditEmbeddings`` (the correct body, then changed: see ``wrong_count`` and friends).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import numpy as np
from aiohttp import web

from tests.fakes.llm_common import (
    FakeLLMServer,
    Hang,
    HttpError,
    RawResponse,
    RecordedRequest,
    Reply,
    Step,
    StreamError,
    bearer_or_api_key,
    estimate_tokens,
    json_response,
    retry_headers,
    split_text,
)

Dialect = Literal["openai", "vllm", "llamacpp"]
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
EMBEDDINGS_PATH = "/v1/embeddings"
EMBEDDING_PARAMS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
MAX_EMBEDDING_INPUTS = 2048
MAX_EMBEDDING_INPUT_TOKENS = 8192
MAX_EMBEDDING_REQUEST_TOKENS = 300_000
DEFAULT_EMBEDDING_DIMENSIONS = 64
MAX_BODY_BYTES = 32 * 1024 * 1024
_WORDS_RE = re.compile(r"\w+")


class InvalidRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def rate_limited(
    retry_after: float | None = None, retry_after_ms: float | None = None
) -> HttpError:
    headers = retry_headers(retry_after, retry_after_ms)
    return HttpError(
        429,
        "requests",
        "Rate limit reached for requests. Please try again shortly.",
        headers,
        code="rate_limit_exceeded",
    )


def context_length_exceeded(observed: int, limit: int) -> HttpError:
    """OpenAI's overflow refusal, as the service words it."""
    return HttpError(
        400,
        "invalid_request_error",
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {observed} tokens. Please reduce the length of the messages.",
        code="context_length_exceeded",
    )


def server_error() -> HttpError:
    return HttpError(500, "server_error", "The server had an error while processing your request.")


def overloaded() -> HttpError:
    return HttpError(
        503, "server_error", "The engine is currently overloaded, please try again later"
    )


@dataclass(frozen=True, slots=True)
class EditEmbeddings:
    """A 200 whose body is the correct one passed through ``edit`` (to break it)."""

    edit: Callable[[dict[str, Any]], Any]


EmbeddingStep = HttpError | RawResponse | Hang | EditEmbeddings


def wrong_count() -> EditEmbeddings:
    """One embedding fewer than there were inputs."""
    return EditEmbeddings(lambda body: {**body, "data": body["data"][:-1]})


def missing_data() -> EditEmbeddings:
    return EditEmbeddings(lambda body: {k: v for k, v in body.items() if k != "data"})


def non_finite() -> EditEmbeddings:
    """The first number of the first vector is NaN (``json`` writes it as ``NaN``)."""

    def edit(body: dict[str, Any]) -> dict[str, Any]:
        body["data"][0]["embedding"][0] = float("nan")
        return body

    return EditEmbeddings(edit)


def wrong_width(width: int) -> EditEmbeddings:
    """Every vector cut (or zero-padded) to ``width`` numbers."""

    def edit(body: dict[str, Any]) -> dict[str, Any]:
        for item in body["data"]:
            vector = item["embedding"]
            item["embedding"] = (vector + [0.0] * width)[:width]
        return body

    return EditEmbeddings(edit)


def malformed_json() -> RawResponse:
    return RawResponse(b'{"object": "list", "data": [', content_type="application/json")


def hashed_embedding(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector: each word adds +-1 in two hashed buckets."""
    vector = np.zeros(dimensions)
    for word in _WORDS_RE.findall(text.lower()) or [text]:
        digest = hashlib.blake2b(word.encode(), digest_size=16).digest()
        for k in range(2):
            bucket = int.from_bytes(digest[4 * k : 4 * k + 4], "little") % dimensions
            vector[bucket] += 1.0 if digest[8 + k] & 1 else -1.0
    return _unit(vector)


def _unit(vector: np.ndarray) -> list[float]:
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:  # words that cancel out: any fixed direction beats a zero vector
        vector = np.zeros(len(vector))
        vector[0], norm = 1.0, 1.0
    return [float(x) for x in vector / norm]


def _validate_embeddings(body: Any, width: int) -> list[str]:
    """The inputs of a valid embeddings request; ``InvalidRequest`` as OpenAI words it."""
    if not isinstance(body, dict):
        raise InvalidRequest("We could not parse the JSON body of your request.")
    unknown = sorted(set(body) - EMBEDDING_PARAMS)
    if unknown:
        raise InvalidRequest(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("you must provide a model parameter", "model")
    raw = body.get("input")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidRequest(
            "'$.input' is invalid. Please check the API reference: "
            "https://platform.openai.com/docs/api-reference.",
            "input",
        )
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(
            f"'$.input' is too long: {len(texts)} inputs, at most {MAX_EMBEDDING_INPUTS}", "input"
        )
    total = 0
    for i, text in enumerate(texts):
        if not text:
            raise InvalidRequest(f"'$.input[{i}]' is invalid: it must not be empty", "input")
        tokens = estimate_tokens(text)
        if tokens > MAX_EMBEDDING_INPUT_TOKENS:
            raise InvalidRequest(
                f"This model's maximum context length is {MAX_EMBEDDING_INPUT_TOKENS} tokens, "
                f"however you requested {tokens} tokens ({tokens} in your prompt; 0 for the "
                "completion). Please reduce your prompt; or completion length.",
                "input",
            )
        total += tokens
    if total > MAX_EMBEDDING_REQUEST_TOKENS:
        raise InvalidRequest(
            f"Requested {total} tokens, max {MAX_EMBEDDING_REQUEST_TOKENS} tokens per request",
            "input",
        )
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise InvalidRequest(
            f"Invalid value: '{body['encoding_format']}'. Supported values are: 'float' and "
            "'base64'.",
            "encoding_format",
        )
    dims = body.get("dimensions")
    if dims is not None and (
        not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= width
    ):
        raise InvalidRequest(
            f"Invalid value for 'dimensions' = {dims}. Must be between 1 and {width}.",
            "dimensions",
        )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise InvalidRequest("Invalid type for 'user': expected a string.", "user")
    return texts


_DATA_URL = re.compile(r"data:(image/(?:jpeg|png|gif|webp));base64,([A-Za-z0-9+/]+={0,2})")


def _check_part(part: Any, where: str) -> None:
    """A user content part as the API checks it: text, or an image_url whose url is an
    http(s) URL or a base64 data URL of a supported image type."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InvalidRequest("Invalid type for 'text': expected a string.", f"{where}.text")
        return
    if kind == "image_url":
        url = (part.get("image_url") or {}).get("url")
        if not isinstance(url, str):
            raise InvalidRequest("Missing required parameter: 'url'.", f"{where}.image_url.url")
        if url.startswith(("http://", "https://")):
            return
        match = _DATA_URL.fullmatch(url)
        if match is None:
            raise InvalidRequest("Invalid image URL: expected a base64 data URL.", where)
        try:
            base64.b64decode(match[2], validate=True)
        except ValueError:
            raise InvalidRequest("Invalid base64 image data.", where) from None
        return
    raise InvalidRequest(f"Invalid value: '{kind}'. Supported values are: 'text' and "
                         "'image_url'.", f"{where}.type")  # fmt: skip


def image_parts(body: Mapping[str, Any]) -> list[str]:
    """The data URLs of every image part of a chat request, in order."""
    return [
        part["image_url"]["url"]
        for message in body.get("messages", [])
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def _validate(body: Any) -> None:
    if not isinstance(body, dict):
        raise InvalidRequest("We could not parse the JSON body of your request.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("[] is too short - 'messages'", "messages")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    pending: list[str] = []  # tool_call ids still owed a tool message
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise InvalidRequest(
                f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                "'user', 'tool', and 'developer'.",
                f"messages[{i}].role",
            )
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                raise InvalidRequest(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            pending.remove(call_id)
            continue
        if pending:
            raise InvalidRequest(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}",
                "messages",
            )
        if role == "assistant":
            for j, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function") or {}
                if not isinstance(function.get("arguments"), str):
                    raise InvalidRequest(
                        "Invalid type for 'arguments': expected a string.",
                        f"messages[{i}].tool_calls[{j}].function.arguments",
                    )
                pending.append(call.get("id"))
            if message.get("content") is None and not message.get("tool_calls"):
                raise InvalidRequest(
                    "Invalid value for 'content': expected a string, got null.",
                    f"messages.[{i}].content",
                )
        elif message.get("content") is None:
            raise InvalidRequest(
                "Invalid value for 'content': expected a string, got null.",
                f"messages.[{i}].content",
            )
        elif isinstance(message["content"], list):
            for j, part in enumerate(message["content"]):
                _check_part(part, f"messages[{i}].content[{j}]")
    if pending:
        raise InvalidRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}",
            "messages",
        )


def prompt_segments(body: Mapping[str, Any]) -> list[Any]:
    return [{"tools": body.get("tools") or []}, *list(body.get("messages") or [])]


def _echo(body: Mapping[str, Any]) -> str:
    content = body["messages"][-1].get("content")
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
    return f"echo: {content or ''}"


class FakeOpenAI(FakeLLMServer):
    """The fake chat completions and embeddings API; ``script`` steps are in
    ``tests.fakes.llm_common``, embedding steps in ``embedding_script``."""

    api_path_prefix = "/v1"

    def __init__(
        self,
        *,
        api_key: str | None = "sk-test",
        context_window: int | None = None,
        dialect: Dialect = "openai",
        report_usage: bool = True,
        min_cache_tokens: int = 0,
        embedding_dimensions: int = DEFAULT_EMBEDDING_DIMENSIONS,
        reverse_embeddings: bool = False,
    ) -> None:
        # None: no key is checked (a local server).
        super().__init__(api_key=api_key, context_window=context_window)
        self.dialect = dialect
        self.report_usage = report_usage
        self.min_cache_tokens = min_cache_tokens
        self.embedding_dimensions = embedding_dimensions
        # Lists the vectors last to first (indexes still right): clients must use ``index``.
        self.reverse_embeddings = reverse_embeddings
        self.embedding_script: deque[EmbeddingStep] = deque()
        # Speech to text: the words for an audio file, by the SHA-256 of its bytes.
        self.transcripts: dict[str, str] = {}
        self.transcription_requests: list[dict[str, Any]] = []

    def make_app(self) -> web.Application:
        # aiohttp's 1 MB default would answer 413 long before the API's own limits do.
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_post(EMBEDDINGS_PATH, self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        return app

    async def _transcriptions(self, request: web.Request) -> web.Response:
        """Speech to text: multipart ``file`` and ``model`` required; the words are the
        ones ``transcripts`` holds for the file's SHA-256 (else "unintelligible")."""
        failure = self._auth_failure(request)
        if failure is not None:
            return failure
        fields: dict[str, Any] = {}
        try:
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, aiohttp.BodyPartReader) or part.name is None:
                    continue
                if part.name == "file":
                    fields["file"] = await part.read(decode=False)
                    fields["filename"] = part.filename
                else:
                    fields[part.name] = await part.text()
        except (ValueError, AssertionError):
            return self._error(400, "invalid_request_error", "Expected multipart form data.")
        if "file" not in fields or not fields.get("model"):
            return self._error(400, "invalid_request_error", "file and model are required.")
        self.transcription_requests.append(fields)
        digest = hashlib.sha256(bytes(fields["file"])).hexdigest()
        return web.json_response({"text": self.transcripts.get(digest, "unintelligible")})

    def enqueue_embeddings(self, *steps: EmbeddingStep) -> None:
        self.embedding_script.extend(steps)

    @property
    def embedding_requests(self) -> list[RecordedRequest]:
        """The recorded embeddings requests, oldest first."""
        return [r for r in self.requests if r.path == EMBEDDINGS_PATH]

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def _error(
        status: int,
        error_type: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
        return json_response(status, body, headers)

    def _auth_failure(self, request: web.Request) -> web.Response | None:
        key = bearer_or_api_key(request)
        if self.api_key is None or key == self.api_key:
            return None
        shown = "" if key is None else f"{key[:3]}***"
        message = (
            "You didn't provide an API key."
            if key is None
            else f"Incorrect API key provided: {shown}."
        )
        return self._error(401, "invalid_request_error", message, code="invalid_api_key")

    def _overflow(self, body: Mapping[str, Any], prompt: int) -> web.Response | None:
        window = self.context_window
        if window is None:
            return None
        wanted = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        if self.dialect == "llamacpp":
            if prompt <= window:
                return None
            error = {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": window,
            }
            return json_response(400, {"error": error})
        if prompt + wanted <= window:
            return None
        if prompt > window:
            message = (
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {prompt} tokens. Please reduce the length of the messages."
            )
        else:
            message = (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {prompt + wanted} tokens ({prompt} in the messages, {wanted} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        if self.dialect == "vllm":
            top = {
                "object": "error",
                "message": message,
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
            return json_response(400, top)
        return self._error(
            400, "invalid_request_error", message, code="context_length_exceeded", param="messages"
        )

    def _usage(self, body: Mapping[str, Any], reply: Reply) -> dict[str, Any]:
        segments = prompt_segments(body)
        prompt = sum(estimate_tokens(s) for s in segments)
        # Automatic prefix caching: every whole-message prefix is a candidate.
        cached, _ = self.cache.account(segments, list(range(len(segments))), self.min_cache_tokens)
        completion = max(
            1,
            estimate_tokens(reply.text)
            + sum(estimate_tokens(c.arguments_text()) for c in reply.tool_calls),
        )
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def _chunk(
        self,
        body: Mapping[str, Any],
        chunk_id: str,
        delta: dict[str, Any],
        finish: str | None = None,
    ) -> bytes:
        data: dict[str, Any] = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if (body.get("stream_options") or {}).get("include_usage") and self.report_usage:
            data["usage"] = None
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    # -- handlers ------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        await self.record(request)
        if (failure := self._auth_failure(request)) is not None:
            return failure
        return json_response(
            200,
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}],
            },
        )

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        if (failure := self._auth_failure(request)) is not None:
            return failure
        try:
            texts = _validate_embeddings(body, self.embedding_dimensions)
        except InvalidRequest as exc:
            return self._error(400, "invalid_request_error", str(exc), param=exc.param)
        step = self.embedding_script.popleft() if self.embedding_script else None
        if isinstance(step, HttpError):
            if step.body is not None:
                return json_response(step.status, step.body, step.headers)
            return self._error(
                step.status, step.error_type, step.message, code=step.code, headers=step.headers
            )
        if isinstance(step, RawResponse):
            return web.Response(
                status=step.status, body=step.body, headers={"Content-Type": step.content_type}
            )
        if isinstance(step, Hang):
            return await self.hang_response(request)
        answer = self._embedding_body(body, texts)
        if isinstance(step, EditEmbeddings):
            answer = step.edit(answer)
        return json_response(200, answer)

    def _embedding_body(self, body: Mapping[str, Any], texts: list[str]) -> dict[str, Any]:
        width = body.get("dimensions") or self.embedding_dimensions
        data: list[dict[str, Any]] = []
        for index, text in enumerate(texts):
            full = hashed_embedding(text, self.embedding_dimensions)
            vector: Any = _unit(np.asarray(full[:width]))
            if body.get("encoding_format") == "base64":
                vector = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        if self.reverse_embeddings:
            data.reverse()
        tokens = sum(estimate_tokens(t) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        if (failure := self._auth_failure(request)) is not None:
            return failure
        try:
            _validate(body)
        except InvalidRequest as exc:
            return self._error(400, "invalid_request_error", str(exc), param=exc.param)
        prompt = sum(estimate_tokens(s) for s in prompt_segments(body))
        if (overflow := self._overflow(body, prompt)) is not None:
            return overflow
        step: Step = self.next_step(body) or Reply(_echo(body))
        if isinstance(step, HttpError):
            if step.body is not None:
                return json_response(step.status, step.body, step.headers)
            return self._error(
                step.status, step.error_type, step.message, code=step.code, headers=step.headers
            )
        if isinstance(step, RawResponse):
            return web.Response(
                status=step.status, body=step.body, headers={"Content-Type": step.content_type}
            )
        if isinstance(step, Hang) and step.partial_text is None:
            return await self.hang_response(request)
        reply = step if isinstance(step, Reply) else Reply(getattr(step, "partial_text", "") or "")
        usage = self._usage(body, reply)
        if not body.get("stream"):
            return json_response(200, self._whole_completion(body, reply, usage))
        return await self._stream(request, body, step, reply, usage)

    def _whole_completion(
        self, body: Mapping[str, Any], reply: Reply, usage: dict[str, Any]
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id or self.next_id("call_"),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_text()},
                }
                for c in reply.tool_calls
            ]
        finish = reply.stop_reason or ("tool_calls" if reply.tool_calls else "stop")
        return {
            "id": self.next_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": usage if self.report_usage else None,
        }

    async def _stream(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        step: Step,
        reply: Reply,
        usage: dict[str, Any],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)
        send = self.write_quietly
        chunk_id = self.next_id("chatcmpl-")
        await send(response, self._chunk(body, chunk_id, {"role": "assistant", "content": ""}))
        for piece in split_text(reply.text, reply.chunk_chars):
            await send(response, self._chunk(body, chunk_id, {"content": piece}))
        if isinstance(step, StreamError):
            error = {
                "error": {
                    "message": step.message,
                    "type": step.error_type,
                    "param": None,
                    "code": None,
                }
            }
            await send(response, b"data: " + json.dumps(error).encode() + b"\n\n")
            return response
        if isinstance(step, Hang):
            await self.wait_released()
            return response
        for index, call in enumerate(reply.tool_calls):
            arguments = call.arguments_text()
            start = {
                "index": index,
                "id": call.id or self.next_id("call_"),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            await send(response, self._chunk(body, chunk_id, {"tool_calls": [start]}))
            for piece in split_text(arguments, max(1, len(arguments) // 3 + 1)):
                await send(
                    response,
                    self._chunk(
                        body,
                        chunk_id,
                        {"tool_calls": [{"index": index, "function": {"arguments": piece}}]},
                    ),
                )
        finish = reply.stop_reason or ("tool_calls" if reply.tool_calls else "stop")
        await send(response, self._chunk(body, chunk_id, {}, finish))
        if (body.get("stream_options") or {}).get("include_usage") and self.report_usage:
            last = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body["model"],
                "system_fingerprint": None,
                "choices": [],
                "usage": usage,
            }
            await send(
                response, b"data: " + json.dumps(last, separators=(",", ":")).encode() + b"\n\n"
            )
        await send(response, b"data: [DONE]\n\n")
        return response
