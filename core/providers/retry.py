"""One bounded retry policy for every provider, and the error classification it rests on.

The SDKs' own retries are off (``max_retries=0``): their waits are uncapped when a
server sends a long ``retry-after``, and they cannot tell the caller that text
already streamed from a failed attempt is void. ``call_with_retry`` does both.

Streamed text and retries: ``on_text`` receives the deltas of every attempt as they
arrive, and the next attempt streams its reply from the start. So a retry after partial
output never silently doubles a reply:

- with an ``on_retry(attempt, error, delay)`` hook, the hook is called before every
  retry, and a caller that streams text **must discard what the failed attempt
  streamed** when it is called (it is told which attempt failed);
- without one, an attempt that already passed text to ``on_text`` is not retried: its
  error is raised, since nobody could take the shown text back.

Timeouts: streams are bounded by silence (the providers' connect and stall timeouts,
see ``core.providers.streaming``), so a long, healthy reply is never cut.
``policy.timeout_seconds``, when set, also caps each whole attempt (unset: no cap).

``classify_status_error`` lives here because it decides what is retryable: both
providers map their SDK errors through it, so a 429 or a mid-stream
``overloaded_error`` means the same thing whichever service sent it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from parley.core.errors import (
    AuthenticationError,
    ContextOverflowError,
    InvalidRequestError,
    OverloadedError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
)
from parley.core.providers.base import Provider, ProviderRequest, ProviderResponse, TextCallback
from parley.core.providers.overflow import match_overflow
from parley.core.providers.provider_config import RetryConfig
from parley.core.providers.streaming import within_deadline

log = logging.getLogger("parley.core.providers.retry")

RetryHook = Callable[[int, ProviderError, float], None]
Sleep = Callable[[float], Awaitable[None]]

_RATE_LIMIT_TYPES = frozenset({"rate_limit_error", "rate_limit_exceeded", "tokens", "requests"})
_OVERLOADED_TYPES = frozenset({"overloaded_error", "server_overloaded", "engine_overloaded"})
_AUTH_TYPES = frozenset({"authentication_error", "permission_error", "invalid_api_key"})
# A 429 that waiting does not cure: retrying would only delay telling the user.
_QUOTA_TYPES = frozenset({"insufficient_quota", "billing_error"})
_SERVER_TYPES = frozenset({"api_error", "server_error", "internal_server_error"})
_TIMEOUT_TYPES = frozenset({"timeout_error"})


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms`` first, then ``retry-after``
    (seconds or an HTTP date). ``None`` when absent or unreadable."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_status_error(
    *,
    provider: str,
    status: int | None,
    message: str,
    error_type: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    body: Mapping[str, Any] | None = None,
) -> ProviderError:
    """Map an HTTP error (or an error event inside a 200 stream) to a typed error.

    The body's error type wins over the status: a stream that fails after HTTP 200
    says what went wrong only in its type.
    """
    kind = (error_type or "").lower()
    retry_after = parse_retry_after(headers)

    overflow = match_overflow(message, status=status, error_type=kind, code=code, body=body)
    if overflow is not None:
        return ContextOverflowError(
            message,
            provider=provider,
            status=status,
            observed_tokens=overflow.observed_tokens,
            limit=overflow.limit,
        )
    if kind in _QUOTA_TYPES or code in _QUOTA_TYPES:
        return InvalidRequestError(message, provider=provider, status=status)
    if status == 429 or kind in _RATE_LIMIT_TYPES or code == "rate_limit_exceeded":
        return RateLimitError(message, provider=provider, status=status, retry_after=retry_after)
    if status in (503, 529) or kind in _OVERLOADED_TYPES:
        return OverloadedError(message, provider=provider, status=status, retry_after=retry_after)
    if status in (401, 403) or kind in _AUTH_TYPES:
        return AuthenticationError(message, provider=provider, status=status)
    if status == 408 or kind in _TIMEOUT_TYPES:
        return ProviderTimeoutError(message, provider=provider, status=status)
    if kind in _SERVER_TYPES or (status is not None and status >= 500):
        return ServerError(message, provider=provider, status=status, retry_after=retry_after)
    if status is not None and 400 <= status < 500:
        return InvalidRequestError(message, provider=provider, status=status)
    if kind == "invalid_request_error":
        return InvalidRequestError(message, provider=provider, status=status)
    # An unknown error inside a stream that had started well: most likely the service's
    # fault, and a retry is cheap next to dropping the turn.
    return ServerError(message, provider=provider, status=status, retry_after=retry_after)


class _Relay:
    """``on_text`` for one attempt, noting whether any text went through."""

    def __init__(self, on_text: TextCallback) -> None:
        self.on_text = on_text
        self.streamed = False

    async def __call__(self, text: str) -> None:
        if text:
            self.streamed = True
        await self.on_text(text)


def backoff_delay(attempt: int, policy: RetryConfig, rand: Callable[[], float]) -> float:
    """Exponential backoff for the wait after failed attempt ``attempt`` (1-based).

    Jitter keeps the delay in [half, all] of the exponential step, so many clients
    that failed together do not come back together, yet the wait never collapses to 0.
    """
    step = min(policy.max_delay_seconds, policy.base_delay_seconds * (2 ** (attempt - 1)))
    return step * (0.5 + 0.5 * rand())


async def call_with_retry(
    provider: Provider,
    request: ProviderRequest,
    policy: RetryConfig,
    on_text: TextCallback | None = None,
    *,
    sleep: Sleep = asyncio.sleep,
    on_retry: RetryHook | None = None,
    rand: Callable[[], float] = random.random,
) -> ProviderResponse:
    """Call ``provider.complete`` with bounded retries of retryable errors.

    At most ``policy.max_attempts`` attempts in all; each is capped by
    ``policy.timeout_seconds`` only when it is set (the provider bounds silence). A
    server's ``retry_after`` is honoured when it is at most
    ``policy.max_retry_after_seconds``; a longer one is not waited out: the error is
    raised at once so the user hears about it now. After the last attempt the last
    typed error is raised.

    ``on_retry`` is called before each retry; a caller that shows ``on_text``'s deltas
    must discard those of the failed attempt there. Without ``on_retry``, a failed
    attempt that had passed text to ``on_text`` is raised, not retried.
    """
    name = getattr(provider, "name", "")
    attempt = 0
    while True:
        attempt += 1
        relay = _Relay(on_text) if on_text is not None else None
        try:
            return await within_deadline(
                provider.complete(request, relay), policy.timeout_seconds, name
            )
        except ProviderError as exc:
            error = exc

        if not error.retryable or attempt >= policy.max_attempts:
            raise error
        if relay is not None and relay.streamed and on_retry is None:
            log.warning(
                "attempt %d failed after streaming part of its reply (%s: %s); not retried, "
                "since the caller cannot discard the text it was given",
                attempt,
                type(error).__name__,
                error.message,
            )
            raise error
        if error.retry_after is not None:
            if error.retry_after > policy.max_retry_after_seconds:
                log.warning(
                    "%s asked to retry after %.1f s (over the %.1f s cap); giving up",
                    error.provider or "provider",
                    error.retry_after,
                    policy.max_retry_after_seconds,
                )
                raise error
            delay = error.retry_after
        else:
            delay = backoff_delay(attempt, policy, rand)
        log.info(
            "attempt %d of %d failed (%s: %s); retrying in %.2f s",
            attempt,
            policy.max_attempts,
            type(error).__name__,
            error.message,
            delay,
        )
        if on_retry is not None:
            on_retry(attempt, error, delay)
        await sleep(delay)
