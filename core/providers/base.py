"""The one seam between the runtime and a model provider.

A provider takes a ``ProviderRequest`` (stable system prompt, history, tools) and
returns a ``ProviderResponse``. It always streams from the service when it can,
handing text deltas to ``on_text`` as they arrive, and raises only
``core.errors.ProviderError`` subclasses. Retries are not the provider's job:
``core.providers.retry.call_with_retry`` wraps every call with one bounded policy,
so each SDK is built with its own retries off.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from parley.core.messages import Block, Message, ToolSpec, Usage

TextCallback = Callable[[str], Awaitable[None]]

# Why a call stopped, normalised across providers.
STOP_END = "end_turn"
STOP_TOOL_USE = "tool_use"
STOP_MAX_TOKENS = "max_tokens"
STOP_OVERFLOW = "context_overflow"
STOP_REFUSAL = "refusal"


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    model: str
    system: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 1024
    temperature: float | None = None


@dataclass(frozen=True, slots=True)
class ProviderResponse:
    content: tuple[Block, ...]
    stop_reason: str
    usage: Usage = field(default_factory=Usage)
    model: str = ""

    @property
    def message(self) -> Message:
        return Message("assistant", self.content)


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a provider learnt about its model from the server or the model file.

    Filled by a provider's optional ``async discover() -> ModelFacts`` (called once at
    start, never failing: an unreachable or silent server gives an empty ``ModelFacts``)
    and kept as its ``facts`` attribute. ``None`` means "not said", never "no".
    """

    context_window: int | None = None
    # Where the window figure came from, for `parley doctor` and /status:
    # "llama.cpp /props", "ollama /api/show", "vllm /v1/models", "gguf metadata", ...
    source: str = ""
    supports_tools: bool | None = None
    # The server refuses a request only when the prompt alone exceeds the window and
    # then stops the reply when prompt + output reach it (llama.cpp, Ollama), instead of
    # refusing prompt + max_tokens up front (OpenAI, vLLM, Anthropic).
    prompt_only_window: bool | None = None
    server: str = ""  # "llama.cpp", "ollama", "vllm", "openai", "embedded"
    supports_vision: bool | None = None  # the model reads images (llama.cpp, Ollama say)


@runtime_checkable
class Provider(Protocol):
    """A model provider. ``name`` is the provider family, ``model`` the model id in use."""

    name: str
    model: str

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse: ...

    async def aclose(self) -> None: ...
