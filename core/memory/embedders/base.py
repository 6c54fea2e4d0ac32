"""The embedder seam: the interface every provider implements, and what they share.

Every provider returns float32 matrices of shape ``(len(texts), dimensions)`` whose
rows are L2-normalised, so a dot product is a cosine similarity whichever model
produced the vectors. Rows are normalised here even when a model claims to do it
itself: a server that forgets, or a quantised model that drifts, would otherwise skew
scores silently.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from parley.core.errors import EmbedderError, EmbedderUnavailableError

log = logging.getLogger("parley.core.memory.embedders")

NONE_PROVIDER = "none"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 rows; one instance per model and endpoint."""

    provider: str  # "local" | "e5" | "openai" | "none"
    model: str
    dimensions: int  # 0 for "none"; for "openai" 0 until the first answer says
    # A short hash of whatever changes the vectors beyond the model name (for openai the
    # endpoint and requested dimensions); "" when nothing does. Index rows keyed by
    # (provider, model, provider_key) are only comparable when all three match.
    provider_key: str
    max_batch: int  # texts per call

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    async def close(self) -> None: ...


class EmbedderHTTPError(EmbedderError):
    """An embedding server answered with an HTTP error status.

    ``retry_after`` is how long the server asked us to wait (seconds), when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        retryable: bool = False,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, provider=provider, retryable=retryable)
        self.status = status
        self.retry_after = retry_after


def text_list(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list; a lone string is refused (it would be embedded letter by letter)."""
    if isinstance(texts, str):
        raise TypeError("embed a list of texts, not a single string")
    return list(texts)


def empty_matrix(dimensions: int) -> np.ndarray:
    return np.zeros((0, dimensions), dtype=np.float32)


def normalize_rows(vectors: Any, *, rows: int, dimensions: int | None, provider: str) -> np.ndarray:
    """Check the shape and values of a model's output and return unit-length float32 rows.

    ``dimensions`` None (or 0) accepts any width. Every problem is a non-retryable
    ``EmbedderError``: asking the same model again would give the same answer.
    """
    try:
        array = np.asarray(vectors, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise EmbedderError(
            f"{provider} returned vectors that are not numbers: {exc}", provider=provider
        ) from exc
    if array.ndim != 2 or array.shape[0] != rows:
        raise EmbedderError(
            f"{provider} returned an array of shape {array.shape} for {rows} texts",
            provider=provider,
        )
    if dimensions and array.shape[1] != dimensions:
        raise EmbedderError(
            f"{provider} returned {array.shape[1]}-dimensional vectors, expected {dimensions}",
            provider=provider,
        )
    if not np.isfinite(array).all():
        raise EmbedderError(
            f"{provider} returned non-finite numbers (NaN or inf)", provider=provider
        )
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if (norms == 0).any():
        raise EmbedderError(
            f"{provider} returned an all-zero vector, which has no direction", provider=provider
        )
    return (array / norms).astype(np.float32)


def provider_key_for(*parts: object) -> str:
    """A stable 12-hex-digit hash of ``parts``; "" when there are none."""
    if not parts:
        return ""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    return digest[:12]


class NoneEmbedder:
    """FTS-only memory: no vectors. Every embed call raises ``EmbedderUnavailableError``."""

    provider = NONE_PROVIDER
    model = ""
    dimensions = 0
    provider_key = ""
    max_batch = 1

    def __init__(self, reason: str = "memory search is keyword-only (embedder 'none')") -> None:
        self.reason = reason

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        raise EmbedderUnavailableError(self.reason, provider=NONE_PROVIDER)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        raise EmbedderUnavailableError(self.reason, provider=NONE_PROVIDER)

    async def close(self) -> None:
        return None
