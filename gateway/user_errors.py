"""What users are told when a turn cannot be answered normally.

Every text says what happened, whether the message was kept, and what to do next;
none of them leaks a stack trace or a secret.
"""

from __future__ import annotations

from core.errors import (
    AuthenticationError,
    ContextError,
    ContextOverflowError,
    OverloadedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
    WindowTooSmallError,
)

BUSY_TEXT = (
    "I'm still working through your earlier messages and my queue for this chat is full. "
    "This message was not processed: please send it again in a moment."
)
INTERNAL_ERROR_TEXT = (
    "Something went wrong on my side while answering. Your message is saved in the "
    "conversation; please try again. If it keeps happening, the operator can run `parley doctor`."
)
EMPTY_REPLY_TEXT = "(The model returned an empty reply. Try rephrasing, or /new to start afresh.)"


def describe_provider_error(exc: ProviderError, attempts: int) -> str:
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    kept = "Your message is saved in the conversation"
    if isinstance(exc, ContextOverflowError):
        numbers = ""
        if exc.observed_tokens and exc.limit:
            numbers = f" ({exc.observed_tokens:,} / {exc.limit:,} tokens)"
        return (
            f"This conversation no longer fits the model's context window{numbers}, even "
            f"after compacting{tried}. {kept}. Send /compact to summarise it harder, or /new "
            "to start a fresh session (the current one is archived, not deleted)."
        )
    if isinstance(exc, RateLimitError):
        wait = f" (it asked to wait {exc.retry_after:.0f}s)" if exc.retry_after else ""
        return f"The model provider is rate-limiting me{wait}{tried}. {kept}; try again shortly."
    if isinstance(exc, OverloadedError | ServerError):
        return f"The model provider is overloaded or failing{tried}. {kept}; try again in a minute."
    if isinstance(exc, ProviderTimeoutError):
        return f"The model provider did not answer in time{tried}. {kept}; try again."
    if isinstance(exc, ProviderConnectionError):
        return f"I could not reach the model provider{tried}. {kept}; try again later."
    if isinstance(exc, AuthenticationError):
        return (
            "The model provider refused my credentials. The operator should check the API key "
            "(ANTHROPIC_API_KEY / OPENAI_API_KEY)."
        )
    return f"The model provider returned an error: {exc.message[:300]}. {kept}."


def describe_context_error(exc: ContextError) -> str:
    """The context engine could not make a request fit, or the model's window is too small."""
    numbers = ""
    if exc.used is not None and exc.limit is not None:
        numbers = f" ({exc.used:,} / {exc.limit:,} tokens)"
    elif exc.limit is not None:
        numbers = f" ({exc.limit:,} tokens)"
    if isinstance(exc, WindowTooSmallError):
        return (
            f"The configured model's context window is too small to run{numbers}. The operator "
            "should pick a larger model or fix [context.models] in the config."
        )
    return (
        f"This message does not fit the model's context window{numbers}: {exc.message}. "
        "Your message is saved in the conversation. Send /compact to summarise the session, "
        "or /new to start a fresh one (the current one is archived, not deleted)."
    )
