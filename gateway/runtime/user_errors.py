"""What users are told when a turn cannot be answered normally.

Every text says what happened, whether the message was kept, and what to do next;
none of them leaks a stack trace or a secret.
"""

from __future__ import annotations

import math

from parley.core.errors import (
    CAUSE_HISTORY,
    CAUSE_MESSAGE,
    CAUSE_SYSTEM,
    AuthenticationError,
    ContextError,
    ContextOverflowError,
    MalformedResponseError,
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
# A turn that the disk refused (a transcript or state.db write).
STORAGE_ERROR_TEXT = (
    "I could not write to my storage (the server's disk is full or read-only), so I could "
    "not answer this message and it may not have been saved. Please send it again in a "
    "while; the operator can see what failed in the log or with `parley doctor`."
)
# Sent (once per message) when state.db cannot record an inbound message.
NOT_RECORDED_TEXT = (
    "I can't take messages right now: my storage is full or read-only, so this message "
    "was not saved. If it is not answered in a few minutes, please send it again."
)
EMPTY_REPLY_TEXT = "(The model returned an empty reply. Try rephrasing, or /new to start afresh.)"


def _wait_text(seconds: float) -> str:
    """A server's retry-after as a person would say it (whole seconds, then minutes)."""
    if seconds < 90:
        return f"{math.ceil(seconds)} seconds"
    return f"about {math.ceil(seconds / 60)} minutes"


def describe_provider_error(exc: ProviderError, attempts: int) -> str:
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    kept = "Your message is saved in the conversation"
    if isinstance(exc, ContextOverflowError):
        numbers = _token_numbers(exc.observed_tokens, exc.limit)
        if exc.cause == CAUSE_MESSAGE:
            # Nothing but the newest message is left to send: compacting or starting
            # afresh cannot make it smaller.
            return (
                f"Your message is too long for the model's context window{numbers}, even "
                f"with the rest of the conversation left out{tried}. {kept}, but I cannot "
                "answer it as it is: please send it in shorter parts."
            )
        return (
            f"This conversation no longer fits the model's context window{numbers}, even "
            f"after compacting{tried}. {kept}. Send /compact to summarise it harder, or /new "
            "to start a fresh session (the current one is archived, not deleted)."
        )
    if isinstance(exc, RateLimitError):
        # Under a second is what a retry already waited out: only a real wait is news.
        if exc.retry_after is not None and exc.retry_after >= 1:
            wait = _wait_text(exc.retry_after)
            return (
                f"The model provider is rate-limiting me{tried} and asked to wait {wait}. "
                f"{kept}; send it again after that."
            )
        return f"The model provider is rate-limiting me{tried}. {kept}; try again shortly."
    if isinstance(exc, OverloadedError):
        return f"The model provider is overloaded right now{tried}. {kept}; try again in a minute."
    if isinstance(exc, ServerError):
        if exc.status in (None, 200):  # an error event inside a stream that had started
            return (
                f"The model provider broke off its answer with an error{tried}. {kept}; try again."
            )
        return (
            f"The model provider had an internal error (HTTP {exc.status}){tried}. {kept}; "
            "try again in a minute."
        )
    if isinstance(exc, ProviderTimeoutError):
        return f"The model provider did not answer in time{tried}. {kept}; try again."
    if isinstance(exc, ProviderConnectionError):
        return f"I could not reach the model provider{tried}. {kept}; try again later."
    if isinstance(exc, MalformedResponseError):
        # The parser's complaint means nothing to a user; the log has it.
        return (
            f"The model provider sent an answer I could not read{tried}. {kept}; try again. "
            "If it keeps happening, the operator should check the provider's base URL."
        )
    if isinstance(exc, AuthenticationError):
        return (
            "The model provider refused my credentials. The operator should check the API key "
            "(ANTHROPIC_API_KEY / OPENAI_API_KEY)."
        )
    return f"The model provider returned an error: {exc.message[:300]}. {kept}."


def _token_numbers(used: int | None, limit: int | None) -> str:
    """ " (used / limit tokens)" when both are figures a person can make sense of: no
    zero or negative budget, and a need above what fits (else only the limit)."""
    if limit is None or limit <= 0:
        return ""
    if used is not None and used > limit:
        return f" ({used:,} / {limit:,} tokens)"
    return f" ({limit:,} tokens)"


def describe_context_error(exc: ContextError) -> str:
    """The context engine could not make a request fit, or the model's window is too small.

    Each text advises only what can help: /compact and /new when the history is what
    does not fit, shorter parts when the newest message alone does not, the operator
    when even the system prompt and tools do not."""
    numbers = _token_numbers(exc.used, exc.limit)
    if isinstance(exc, WindowTooSmallError):
        return (
            f"The configured model's context window is too small to run{numbers}. The operator "
            "should pick a larger model or fix [context.models] in the config."
        )
    cause = getattr(exc, "cause", CAUSE_HISTORY)
    if cause == CAUSE_MESSAGE:
        return (
            f"This message does not fit the model's context window{numbers}, even with "
            "the rest of the conversation left out. Your message is saved in the "
            "conversation, but I cannot answer it as it is: please send it in shorter parts."
        )
    if cause == CAUSE_SYSTEM:
        return (
            f"The model's context window is too small even for my instructions and tools"
            f"{numbers}, so I cannot answer. Your message is saved in the conversation. The "
            "operator should pick a model with a larger window (or offer fewer tools)."
        )
    return (
        f"This message does not fit the model's context window{numbers}: {exc.message}. "
        "Your message is saved in the conversation. Send /compact to summarise the session, "
        "or /new to start a fresh one (the current one is archived, not deleted)."
    )
