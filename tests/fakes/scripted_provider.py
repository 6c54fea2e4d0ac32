"""A provider at the seam, for gateway tests that are not about a wire protocol.

Each call pops the next scripted step: a ``ProviderResponse``, an exception to
raise, or a function of the request. With the script empty it asks ``responder``
(when set; it may return None) and otherwise echoes the last user text, so tests can
tell which message a reply answers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from parley.core.messages import TextBlock, Usage
from parley.core.prompt import is_turn_context
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse, TextCallback

Step = ProviderResponse | BaseException | Callable[[ProviderRequest], ProviderResponse]


def echo_text(request: ProviderRequest) -> str:
    """The last thing the user said, without the turn context that rides at its tail."""
    last = request.messages[-1]
    said = [b.text for b in last.content if isinstance(b, TextBlock) and not is_turn_context(b)]
    return f"echo: {said[-1] if said else '?'}"


class ScriptedProvider:
    name = "scripted"

    def __init__(self, model: str = "scripted-model", *, gate: asyncio.Event | None = None) -> None:
        self.model = model
        self.script: deque[Step] = deque()
        self.requests: list[ProviderRequest] = []
        self.gate = gate  # when set, each call waits for it (to hold a turn open)
        self.closed = False
        self.responder: Callable[[ProviderRequest], ProviderResponse | None] | None = None

    def push(self, *steps: Step) -> None:
        self.script.extend(steps)

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        self.requests.append(request)
        if self.gate is not None:
            await self.gate.wait()
        step: Any = self.script.popleft() if self.script else None
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            step = step(request)
        if step is None and self.responder is not None:
            step = self.responder(request)
        if step is None:
            text = echo_text(request)
            step = ProviderResponse((TextBlock(text),), STOP_END, Usage(10, 5), self.model)
        if on_text is not None:
            await on_text(step.message.text)
        return step

    async def aclose(self) -> None:
        self.closed = True
