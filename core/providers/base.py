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


@runtime_checkable
class Provider(Protocol):
    """A model provider. ``name`` is the provider family, ``model`` the model id in use."""

    name: str
    model: str

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse: ...

    async def aclose(self) -> None: ...
