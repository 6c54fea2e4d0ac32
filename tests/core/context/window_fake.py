"""A provider that enforces its context window the way a llama.cpp server does.

- It counts the prompt with its own tokenizer (``TOKENIZER_RATIO`` times cl100k, plus a
  chat template's few tokens per message): a small model's tokenizer is not the
  engine's, so the engine's estimate is off by a margin it must learn.
- A prompt longer than the window is refused with ``ContextOverflowError`` carrying
  ``n_prompt_tokens`` / ``n_ctx`` (``observed_tokens`` / ``limit``, prompt only).
- Otherwise the reply is written until it is done, until ``max_tokens``
  (``STOP_MAX_TOKENS``), or until prompt plus reply reach the window
  (``STOP_OVERFLOW``, what was written so far).

Its ``facts`` say what llama.cpp's ``/props`` would: the window, counted prompt-only.
What it answers is ``responder``'s choice (a function of the request): a text, or an
``Answer`` with tool calls (written after the text, and lost with it when cut).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parley.core.errors import ContextOverflowError
from parley.core.messages import Block, TextBlock, ToolUseBlock, Usage
from parley.core.providers.base import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    STOP_TOOL_USE,
    ModelFacts,
    ProviderRequest,
    ProviderResponse,
    TextCallback,
)
from parley.core.tokens import default_counter

TOKENIZER_RATIO = 1.15
TEMPLATE_TOKENS_PER_MESSAGE = 5


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    calls: tuple[ToolUseBlock, ...] = ()


Responder = Callable[[ProviderRequest], "str | Answer"]


class WindowFake:
    name = "llama-fake"

    def __init__(
        self,
        window: int,
        responder: Responder,
        *,
        model: str = "smol",
        summaries: bool = True,
        tokenizer_ratio: float = TOKENIZER_RATIO,
    ) -> None:
        self.model = model
        self.ratio = tokenizer_ratio
        self.window = window
        self.responder = responder
        self.supports_summaries = summaries
        self.facts = ModelFacts(
            context_window=window,
            source="llama.cpp /props",
            prompt_only_window=True,
            server="llama.cpp",
        )
        self.counter = default_counter()
        self.requests: list[ProviderRequest] = []
        self.refused = 0  # prompts over the window
        self.stopped = 0  # replies the window cut off

    def prompt_tokens(self, request: ProviderRequest) -> int:
        raw = self.counter.request(request.system, request.messages, request.tools)
        return int(raw * self.ratio) + TEMPLATE_TOKENS_PER_MESSAGE * (len(request.messages) + 1)

    def _tokens(self, text: str) -> int:
        return int(self.counter.text(text) * self.ratio)

    def _prefix(self, text: str, tokens: int) -> str:
        return self.counter.prefix(text, max(0, int(tokens / self.ratio)))

    async def complete(
        self, request: ProviderRequest, on_text: TextCallback | None = None
    ) -> ProviderResponse:
        self.requests.append(request)
        prompt = self.prompt_tokens(request)
        if prompt > self.window:
            self.refused += 1
            raise ContextOverflowError(
                f"request ({prompt} tokens) exceeds the available context size "
                f"({self.window} tokens)",
                provider=self.name,
                status=400,
                observed_tokens=prompt,
                limit=self.window,
            )
        answer = self.responder(request)
        if isinstance(answer, str):
            answer = Answer(answer)
        text, calls = answer.text, answer.calls
        # A call is written as its JSON after the text: it costs tokens like text.
        wanted = self._tokens(text) + sum(self._tokens(str(c.input)) + 8 for c in calls)
        room = self.window - prompt
        stop = STOP_TOOL_USE if calls else STOP_END
        if wanted > min(room, request.max_tokens):
            if room < request.max_tokens:
                stop, written = STOP_OVERFLOW, room
                self.stopped += 1
            else:
                stop, written = STOP_MAX_TOKENS, request.max_tokens
            text, calls = self._prefix(text, written), ()
        if on_text is not None and text:
            await on_text(text)
        blocks: tuple[Block, ...] = ((TextBlock(text),) if text else ()) + calls
        out = self._tokens(text) + sum(self._tokens(str(c.input)) + 8 for c in calls)
        return ProviderResponse(blocks, stop, Usage(prompt, out), self.model)

    async def aclose(self) -> None:
        return None
