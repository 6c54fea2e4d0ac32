"""``ResilientEmbedder``: batching, retries, timeouts, lockout and fallback around embedders.

One call (``embed``, ``embed_queries``, ``embed_passages``):

1. The texts are split into batches of at most ``max_batch`` texts (the embedder's own)
   and ``max_batch_chars`` characters (~8,000 tokens at four characters a token; a
   longer text goes alone). Batches run one after another and are concatenated in order.
2. Each batch attempt is bounded by a timeout (queries and passage batches apart; in-process
   models get far longer, since a cold load and a slow CPU are normal there). A query
   call as a whole (attempts, retries and their waits) is also bounded by
   ``query_budget_seconds`` for remote embedders: a search is waiting, and keyword
   results now beat vector results minutes later.
3. Retryable errors are retried ``retry.retries`` times with jittered exponential backoff;
   a server's ``Retry-After`` is waited out exactly, unless it is longer than
   ``retry.max_retry_after_seconds`` (then the call fails at once rather than stall).
4. A call that still fails counts against the primary; ``failure_limit`` failed calls in
   a row lock it out for ``lockout_seconds``. A success resets the count, and so does
   the end of a lockout (the primary then gets a fresh run of attempts).
5. A failed call, and every call during a lockout, goes to the fallback when there is
   one; without one the error is raised (during a lockout ``EmbedderUnavailableError``,
   without calling the primary).

Vectors from different models must never be compared. The fallback may be another model
with another width, and this class does not hide that: ``embed`` returns an
``EmbedResult`` naming the embedder that answered, so the memory index can store and
search each vector under that embedder's (provider, model, provider_key). ``last_used``
says the same for the most recent call only (concurrent calls race on it), and
``active`` is the one the next call will try first. Within one call all batches come
from the same embedder: a fallback redoes the whole call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from parley.core.errors import EmbedderError, EmbedderUnavailableError
from parley.core.memory.embedders.base import (
    NONE_PROVIDER,
    Embedder,
    empty_matrix,
    log,
    text_list,
)

Kind = Literal["query", "passage"]
Sleep = Callable[[float], Awaitable[None]]

DEFAULT_FAILURE_LIMIT = 2
DEFAULT_LOCKOUT_SECONDS = 300.0
DEFAULT_MAX_BATCH_CHARS = 32_000
IN_PROCESS_PROVIDERS = frozenset({"local", "e5"})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    retries: int = 3  # after the first attempt
    base_delay_seconds: float = 0.5
    max_delay_seconds: float = 8.0
    max_retry_after_seconds: float = 60.0

    def backoff(self, retry: int, rand: float) -> float:
        """The wait before retry number ``retry`` (1-based), ``rand`` in [0, 1).

        Jitter keeps it within [half, all] of the exponential step, so clients that
        failed together do not return together, yet it never collapses to zero.
        """
        step = min(self.max_delay_seconds, self.base_delay_seconds * 2 ** (retry - 1))
        return step * (0.5 + 0.5 * rand)


@dataclass(frozen=True, slots=True)
class CallTimeouts:
    query_seconds: float  # one batch of queries (a search is waiting)
    batch_seconds: float  # one batch of passages (indexing)


REMOTE_TIMEOUTS = CallTimeouts(query_seconds=60.0, batch_seconds=120.0)
LOCAL_TIMEOUTS = CallTimeouts(query_seconds=300.0, batch_seconds=600.0)
# One whole query call to a remote embedder. Without it a hung server held a search for
# four attempts of 60 s (plus backoff) before it fell back to keywords.
DEFAULT_QUERY_BUDGET_SECONDS = 15.0


def default_timeouts(embedder: Embedder) -> CallTimeouts:
    return LOCAL_TIMEOUTS if embedder.provider in IN_PROCESS_PROVIDERS else REMOTE_TIMEOUTS


def default_query_budget(embedder: Embedder) -> float | None:
    """In-process models get none: their first query may load the model (slow, not hung)."""
    return None if embedder.provider in IN_PROCESS_PROVIDERS else DEFAULT_QUERY_BUDGET_SECONDS


def split_batches(texts: Sequence[str], max_batch: int, max_chars: int) -> list[list[str]]:
    """Consecutive runs of ``texts``, each within both caps (a single long text stands alone)."""
    batches: list[list[str]] = []
    current: list[str] = []
    chars = 0
    for text in texts:
        if current and (len(current) >= max_batch or chars + len(text) > max_chars):
            batches.append(current)
            current, chars = [], 0
        current.append(text)
        chars += len(text)
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True, slots=True)
class EmbedResult:
    vectors: np.ndarray  # (n, embedder.dimensions) float32, unit rows
    embedder: Embedder  # the one that answered: key stored vectors by its identity
    fell_back: bool


@dataclass(frozen=True, slots=True)
class FallbackInfo:
    from_provider: str
    reason: str


@dataclass(frozen=True, slots=True)
class EmbedderStatus:
    provider: str  # the embedder the next call tries first
    model: str
    dimensions: int
    requested_provider: str  # as configured ("auto" included)
    failures: int  # consecutive failed calls of the primary
    failure_limit: int
    locked_until: float | None  # on the wrapper's clock (time.monotonic by default)
    lockout_remaining_seconds: float
    last_error: str | None
    last_used: str | None  # provider of the last successful call
    fallback: FallbackInfo | None  # why another embedder than the first choice is in use

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.fallback is not None:
            data["fallback"] = {"from": self.fallback.from_provider, "reason": self.fallback.reason}
        return data


class ResilientEmbedder:
    """An ``Embedder`` that retries, times out, locks out a failing primary and falls back."""

    def __init__(
        self,
        primary: Embedder,
        fallback: Embedder | None = None,
        *,
        requested_provider: str | None = None,
        skipped: Sequence[tuple[str, str]] = (),
        failure_limit: int = DEFAULT_FAILURE_LIMIT,
        lockout_seconds: float = DEFAULT_LOCKOUT_SECONDS,
        retry: RetryPolicy | None = None,
        max_batch_chars: int = DEFAULT_MAX_BATCH_CHARS,
        timeouts: CallTimeouts | None = None,
        fallback_timeouts: CallTimeouts | None = None,
        query_budget_seconds: float | Literal["default"] | None = "default",
        sleep: Sleep = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.requested_provider = requested_provider or primary.provider
        # (provider, reason) for each provider "auto" passed over before choosing the primary.
        self.skipped = tuple(skipped)
        self.failure_limit = failure_limit
        self.lockout_seconds = lockout_seconds
        self.retry = retry or RetryPolicy()
        self.max_batch_chars = max_batch_chars
        self.timeouts = timeouts or default_timeouts(primary)
        self.fallback_timeouts = fallback_timeouts or (
            default_timeouts(fallback) if fallback is not None else REMOTE_TIMEOUTS
        )
        # Per embedder: "default" picks by kind (none for in-process models).
        self._query_budget = query_budget_seconds
        self._sleep = sleep
        self._rand = rand
        self._clock = clock
        self.last_used: Embedder | None = None
        self._failures = 0
        self._locked_until: float | None = None
        self._last_error: str | None = None
        self._fallback_reason: str | None = None

    # -- the Embedder interface (describing the embedder the next call tries first) --------

    @property
    def active(self) -> Embedder:
        if self.fallback is not None and self._lockout_remaining() > 0:
            return self.fallback
        return self.primary

    @property
    def provider(self) -> str:
        return self.active.provider

    @property
    def model(self) -> str:
        return self.active.model

    @property
    def dimensions(self) -> int:
        return self.active.dimensions

    @property
    def provider_key(self) -> str:
        return self.active.provider_key

    @property
    def max_batch(self) -> int:
        return self.active.max_batch

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return (await self.embed(texts, kind="query")).vectors

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return (await self.embed(texts, kind="passage")).vectors

    async def close(self) -> None:
        try:
            await self.primary.close()
        finally:
            if self.fallback is not None:
                await self.fallback.close()

    # -- calls ------------------------------------------------------------------------------

    async def embed(self, texts: Sequence[str], *, kind: Kind) -> EmbedResult:
        """Vectors for ``texts`` and the embedder that made them (see the module docstring)."""
        items = text_list(texts)
        if self.primary.provider == NONE_PROVIDER:
            # Keyword-only by choice: nothing failed, so nothing is counted or retried.
            reason = getattr(self.primary, "reason", "memory search is keyword-only")
            raise EmbedderUnavailableError(reason, provider=NONE_PROVIDER)
        fallback = self.fallback
        remaining = self._lockout_remaining()
        if remaining > 0:
            reason = (
                f"{self.primary.provider} is locked out for another {remaining:.0f} s after "
                f"{self._failures} failed calls; last error: {self._last_error}"
            )
            if fallback is None:
                raise EmbedderUnavailableError(reason, provider=self.primary.provider)
        else:
            try:
                vectors = await self._run(self.primary, items, kind)
            except EmbedderError as exc:
                self._record_failure(exc)
                if fallback is None:
                    raise
                reason = f"{self.primary.provider} failed: {exc.message}"
            else:
                self._failures = 0
                self.last_used = self.primary
                self._fallback_reason = None
                return EmbedResult(vectors, self.primary, fell_back=False)
        log.info("embedding with the fallback %s: %s", fallback.provider, reason)
        try:
            vectors = await self._run(fallback, items, kind)
        except EmbedderError as exc:
            self._last_error = f"{fallback.provider}: {exc.message}"
            raise
        self.last_used = fallback
        self._fallback_reason = reason
        return EmbedResult(vectors, fallback, fell_back=True)

    def query_budget(self, embedder: Embedder) -> float | None:
        if self._query_budget == "default":
            return default_query_budget(embedder)
        return self._query_budget

    async def _run(self, embedder: Embedder, items: list[str], kind: Kind) -> np.ndarray:
        budget = self.query_budget(embedder) if kind == "query" else None
        if budget is None or not items:
            return await self._run_batches(embedder, items, kind)
        try:
            async with asyncio.timeout(budget):
                return await self._run_batches(embedder, items, kind)
        except TimeoutError as exc:
            raise EmbedderError(
                f"{embedder.provider} gave no answer within the {budget:g} s a search waits",
                provider=embedder.provider,
                retryable=True,
            ) from exc

    async def _run_batches(self, embedder: Embedder, items: list[str], kind: Kind) -> np.ndarray:
        if not items:
            return empty_matrix(embedder.dimensions)
        method = embedder.embed_queries if kind == "query" else embedder.embed_passages
        timeouts = self.timeouts if embedder is self.primary else self.fallback_timeouts
        limit = timeouts.query_seconds if kind == "query" else timeouts.batch_seconds
        parts: list[np.ndarray] = []
        for batch in split_batches(items, max(1, embedder.max_batch), self.max_batch_chars):
            vectors = await self._with_retries(embedder, method, batch, limit)
            if vectors.ndim != 2 or vectors.shape[0] != len(batch):
                raise EmbedderError(
                    f"{embedder.provider} returned shape {vectors.shape} for {len(batch)} texts",
                    provider=embedder.provider,
                )
            if parts and vectors.shape[1] != parts[0].shape[1]:
                raise EmbedderError(
                    f"{embedder.provider} changed width mid-call "
                    f"({parts[0].shape[1]} then {vectors.shape[1]})",
                    provider=embedder.provider,
                )
            parts.append(vectors)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    async def _with_retries(
        self,
        embedder: Embedder,
        method: Callable[[Sequence[str]], Awaitable[np.ndarray]],
        batch: list[str],
        limit: float,
    ) -> np.ndarray:
        retry = 0
        while True:
            try:
                async with asyncio.timeout(limit):
                    return await method(batch)
            except TimeoutError as exc:
                error = EmbedderError(
                    f"{embedder.provider} gave no answer within {limit:g} s",
                    provider=embedder.provider,
                    retryable=True,
                )
                error.__cause__ = exc
            except EmbedderError as exc:
                error = exc
            if not error.retryable or retry >= self.retry.retries:
                raise error
            retry += 1
            retry_after = getattr(error, "retry_after", None)
            if retry_after is None:
                delay = self.retry.backoff(retry, self._rand())
            elif retry_after <= self.retry.max_retry_after_seconds:
                delay = retry_after
            else:
                log.warning(
                    "%s asked to retry after %.1f s (over the %.1f s cap); giving up",
                    embedder.provider,
                    retry_after,
                    self.retry.max_retry_after_seconds,
                )
                raise error
            log.info(
                "%s embedding failed (%s); retry %d of %d in %.2f s",
                embedder.provider,
                error.message,
                retry,
                self.retry.retries,
                delay,
            )
            await self._sleep(delay)

    # -- failure accounting -------------------------------------------------------------------

    def _record_failure(self, error: EmbedderError) -> None:
        self._failures += 1
        self._last_error = f"{self.primary.provider}: {error.message}"
        if self._failures >= self.failure_limit:
            self._locked_until = self._clock() + self.lockout_seconds
            log.warning(
                "embedder %s failed %d calls in a row; locked out for %.0f s (%s)",
                self.primary.provider,
                self._failures,
                self.lockout_seconds,
                "using the fallback" if self.fallback else "no fallback: keyword search only",
            )

    def _lockout_remaining(self) -> float:
        """Seconds the primary stays locked out; ends (and resets the count) when due."""
        if self._locked_until is None:
            return 0.0
        remaining = self._locked_until - self._clock()
        if remaining > 0:
            return remaining
        self._locked_until = None
        self._failures = 0
        log.info("embedder %s lockout is over; trying it again", self.primary.provider)
        return 0.0

    def status(self) -> EmbedderStatus:
        remaining = self._lockout_remaining()
        active = self.active
        fallback: FallbackInfo | None = None
        if remaining > 0 and self.fallback is not None:
            fallback = FallbackInfo(
                self.primary.provider,
                f"locked out after {self._failures} failed calls: {self._last_error}",
            )
        elif self.last_used is not None and self.last_used is self.fallback:
            fallback = FallbackInfo(self.primary.provider, self._fallback_reason or "")
        elif self.skipped:
            reasons = "; ".join(f"{provider}: {reason}" for provider, reason in self.skipped)
            fallback = FallbackInfo(self.skipped[0][0], reasons)
        return EmbedderStatus(
            provider=active.provider,
            model=active.model,
            dimensions=active.dimensions,
            requested_provider=self.requested_provider,
            failures=self._failures,
            failure_limit=self.failure_limit,
            locked_until=self._locked_until,
            lockout_remaining_seconds=remaining,
            last_error=self._last_error,
            last_used=None if self.last_used is None else self.last_used.provider,
            fallback=fallback,
        )
