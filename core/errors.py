"""Every exception the agent runtime raises.

CoreError
├── ProviderError                  a model provider call failed (typed, never a bare SDK error)
│   ├── RateLimitError             429; retryable, may carry retry_after
│   ├── OverloadedError            529 / 503 / "overloaded" mid-stream; retryable
│   ├── ProviderTimeoutError       no answer, or a stream that hung; retryable
│   ├── ProviderConnectionError    refused / reset / DNS; retryable
│   ├── ServerError                other 5xx; retryable
│   ├── ContextOverflowError       the prompt does not fit the model's window
│   ├── AuthenticationError        bad or missing key
│   ├── InvalidRequestError        any other 4xx
│   └── MalformedResponseError     the provider answered something we cannot read
├── ContextError                   the context engine cannot make a request fit
│   ├── WindowTooSmallError        the model's window is below the hard minimum (no call made)
│   ├── ContextBudgetError         even after compaction and trimming the request is too big
│   └── CompactionError            a compaction could not be made (the history is kept)
│       └── SummaryError           the summariser failed after its retries
├── TranscriptError                a transcript cannot be opened or written
├── ToolError                      a tool refused or failed (told to the model, not to users)
├── MemoryIndexError               the long-term memory index cannot be read or written
│   └── EmbedderError              an embedding provider failed (typed; retryable or not)
│       └── EmbedderUnavailableError   not installed, not configured, or locked out
└── ConfigError                    a core config value is unusable at run time
"""

from __future__ import annotations


class CoreError(Exception):
    """Base of every error raised by ``core``."""


class ProviderError(CoreError):
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.status = status
        self.retry_after = retry_after


class RateLimitError(ProviderError):
    retryable = True


class OverloadedError(ProviderError):
    retryable = True


class ProviderTimeoutError(ProviderError):
    retryable = True


class ProviderConnectionError(ProviderError):
    retryable = True


class ServerError(ProviderError):
    retryable = True


# What a context error is about, so a person is told what can help: the history
# (/compact or /new can), the newest message alone (shorter parts can, nothing else),
# or the system prompt and tools alone (only the operator can).
CAUSE_HISTORY = "history"
CAUSE_MESSAGE = "message"
CAUSE_SYSTEM = "system"


class ContextOverflowError(ProviderError):
    """The request did not fit; ``observed_tokens``/``limit`` come from the error text if given.

    ``prompt_only``: the numbers count the prompt alone (a server that refuses only a
    prompt longer than its window, or a reply stopped because the window filled);
    None: not known (the provider's ``facts.prompt_only_window`` says). ``cause`` is set
    when the turn is given up (``CAUSE_*``)."""

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        observed_tokens: int | None = None,
        limit: int | None = None,
        prompt_only: bool | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status=status)
        self.observed_tokens = observed_tokens
        self.limit = limit
        self.prompt_only = prompt_only
        self.cause = cause


class AuthenticationError(ProviderError):
    pass


class InvalidRequestError(ProviderError):
    pass


class MalformedResponseError(ProviderError):
    pass


class ContextError(CoreError):
    """Base of the context engine's errors; ``used``/``limit`` are tokens when known."""

    def __init__(self, message: str, *, used: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.used = used
        self.limit = limit


class WindowTooSmallError(ContextError):
    pass


class ContextBudgetError(ContextError):
    """``cause``: what does not fit (``CAUSE_HISTORY``, ``CAUSE_MESSAGE``, ``CAUSE_SYSTEM``)."""

    def __init__(
        self,
        message: str,
        *,
        used: int | None = None,
        limit: int | None = None,
        cause: str = CAUSE_HISTORY,
    ) -> None:
        super().__init__(message, used=used, limit=limit)
        self.cause = cause


class CompactionError(ContextError):
    pass


class SummaryError(CompactionError):
    pass


class TranscriptError(CoreError):
    pass


class ToolError(CoreError):
    pass


class ConfigError(CoreError):
    pass


class MemoryIndexError(CoreError):
    pass


class EmbedderError(MemoryIndexError):
    """An embedding call failed; ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, provider: str = "", retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.retryable = retryable


class EmbedderUnavailableError(EmbedderError):
    pass
