"""A deterministic fake of the ``Embedder`` protocol, for memory tests that need control.

``HashingEmbedder`` hashes each word of a text into one of ``dimensions`` buckets (a
bag of words: texts sharing words point the same way), plus a constant component so no
text maps to the zero vector. Nothing is random and nothing is loaded. Tests flip
``fail`` to make it raise, or ``hold_after`` to hold a passage call until they release it
(or cancel the sync waiting on it).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

import numpy as np

from parley.core.errors import EmbedderError
from parley.core.memory.embedders import Embedder, ResilientEmbedder, RetryPolicy, normalize_rows
from parley.core.memory.query import tokenize

FAKE_PROVIDER = "fake"
DEFAULT_FAKE_DIMENSIONS = 64


def hashed_vector(text: str, dimensions: int) -> np.ndarray:
    vector = np.zeros(dimensions, dtype=np.float64)
    vector[0] = 0.5  # keeps the empty text off the zero vector
    for token in tokenize(text.lower()):
        digest = hashlib.blake2b(token.encode(), digest_size=4).digest()
        vector[1 + int.from_bytes(digest, "big") % (dimensions - 1)] += 1.0
    return vector


class HashingEmbedder:
    """Bag-of-words vectors; records every passage batch it embeds."""

    max_batch = 64

    def __init__(
        self,
        *,
        model: str = "hash-v1",
        dimensions: int = DEFAULT_FAKE_DIMENSIONS,
        provider: str = FAKE_PROVIDER,
    ) -> None:
        self.provider = provider
        self.model = model
        self.dimensions = dimensions
        self.provider_key = ""
        self.passage_calls: list[list[str]] = []
        self.query_calls: list[list[str]] = []
        self.fail: str | None = None  # raise EmbedderError with this message when set
        # After this many passage calls, the next ones wait for ``release`` (having set
        # ``held``): a test can then cancel a sync in the middle of its files.
        self.hold_after: int | None = None
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.closed = False

    @property
    def passages_embedded(self) -> int:
        return sum(len(call) for call in self.passage_calls)

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.query_calls.append(list(texts))
        return self._embed(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if self.hold_after is not None and len(self.passage_calls) >= self.hold_after:
            self.held.set()
            await self.release.wait()
        self.passage_calls.append(list(texts))
        return self._embed(texts)

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail is not None:
            raise EmbedderError(self.fail, provider=self.provider)
        rows = [hashed_vector(text, self.dimensions) for text in texts]
        return normalize_rows(
            np.array(rows).reshape(len(rows), self.dimensions),
            rows=len(rows),
            dimensions=self.dimensions,
            provider=self.provider,
        )

    async def close(self) -> None:
        self.closed = True


def resilient(primary: Embedder, fallback: Embedder | None = None) -> ResilientEmbedder:
    """``primary`` behind the real wrapper, without retries or lockout (tests decide)."""
    return ResilientEmbedder(
        primary, fallback, retry=RetryPolicy(retries=0), failure_limit=100, lockout_seconds=0
    )
