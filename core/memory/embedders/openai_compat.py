"""Any OpenAI-compatible embeddings endpoint (OpenAI, Ollama, vLLM, LM Studio...).

``POST {base_url}/embeddings`` with ``{"model", "input": [...], "encoding_format": "float"}``
(plus ``dimensions`` when configured), through aiohttp directly: the openai SDK would
add its own retries and a second HTTP stack for one small call. ``base_url`` may be
given with or without its ``/v1`` (``http://localhost:11434`` and
``http://localhost:11434/v1`` both work), since the chat config and server docs differ.

Errors, typed for the retry wrapper (``ResilientEmbedder``):

- 429 (unless the quota is spent), 408, 5xx, refused/reset connections and timeouts:
  retryable; ``EmbedderHTTPError.retry_after`` carries the server's ``Retry-After``.
- 401/403: not retryable (a key does not fix itself). 400 and other 4xx: not retryable,
  with the server's own message.
- A body we cannot use (not JSON, no ``data``, the wrong number of vectors, unequal or
  unexpected widths, NaN or inf): not retryable, with what was wrong.

Vectors come back in input order whatever order the server lists them in (by ``index``).
The width is learned from the first answer when ``dimensions`` is not configured; after
that a different width is an error, since the index cannot mix them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import numpy as np

from parley.core.errors import EmbedderError
from parley.core.memory.embedders.base import (
    EmbedderHTTPError,
    empty_matrix,
    log,
    normalize_rows,
    provider_key_for,
    text_list,
)
from parley.core.providers.retry import parse_retry_after

OPENAI_PROVIDER = "openai"
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_OPENAI_EMBEDDING_MODEL = "text-embedding-3-small"
DEFAULT_OPENAI_TIMEOUT_SECONDS = 60.0
# The API takes 2,048 inputs a call; smaller calls keep one failure (and one retry) cheap.
DEFAULT_OPENAI_MAX_BATCH = 256
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})
_MESSAGE_CHARS = 300


def embeddings_url(base_url: str) -> str:
    """The endpoint for ``base_url``, which may or may not end in ``/v1``."""
    base = base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/embeddings"


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible server; queries and passages alike."""

    provider = OPENAI_PROVIDER

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_OPENAI_BASE_URL,
        api_key: str | None = None,
        model: str = DEFAULT_OPENAI_EMBEDDING_MODEL,
        dimensions: int | None = None,
        timeout_seconds: float = DEFAULT_OPENAI_TIMEOUT_SECONDS,
        max_batch: int = DEFAULT_OPENAI_MAX_BATCH,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.url = embeddings_url(base_url)
        self.model = model
        self.requested_dimensions = dimensions
        self.dimensions = dimensions or 0
        # Another server (or a shortened width) under the same model name gives other vectors.
        self.provider_key = provider_key_for(self.url, dimensions or "native")
        self.max_batch = max_batch
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session = session
        self._owns_session = session is None

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts)

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _embed(self, texts: Sequence[str]) -> np.ndarray:
        items = text_list(texts)
        if not items:
            return empty_matrix(self.dimensions)
        # The API refuses empty strings; one blank chunk should not fail its whole batch.
        payload: dict[str, Any] = {
            "model": self.model,
            "input": [text or " " for text in items],
            "encoding_format": "float",
        }
        if self.requested_dimensions:
            payload["dimensions"] = self.requested_dimensions
        body = await self._post(payload)
        vectors = self._parse(body, len(items))
        if not self.dimensions:
            self.dimensions = int(vectors.shape[1])
            log.info("%s at %s answers with %d dimensions", self.model, self.url, self.dimensions)
        return vectors

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Created on first use, so that it belongs to the running loop. trust_env: honour
            # HTTPS_PROXY / NO_PROXY as the SDK-based chat providers do.
            self._session = aiohttp.ClientSession(trust_env=True)
        return self._session

    async def _post(self, payload: Mapping[str, Any]) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            async with self._client().post(
                self.url, json=payload, headers=headers, timeout=self._timeout
            ) as response:
                raw = await response.read()
                if response.status >= 400:
                    raise self._status_error(response.status, response.headers, raw)
        except TimeoutError as exc:
            raise EmbedderError(
                f"{self.url} did not answer within {self._timeout.total:g} s",
                provider=self.provider,
                retryable=True,
            ) from exc
        except aiohttp.ClientError as exc:
            raise EmbedderError(
                f"cannot reach {self.url}: {type(exc).__name__}: {exc}",
                provider=self.provider,
                retryable=True,
            ) from exc
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise self._malformed(f"the body is not JSON ({_excerpt(raw)!r})") from exc

    def _status_error(
        self, status: int, headers: Mapping[str, str], raw: bytes
    ) -> EmbedderHTTPError:
        message, code = _server_error(raw)
        quota_spent = code in _QUOTA_CODES
        retryable = (status == 429 and not quota_spent) or status == 408 or status >= 500
        if status in (401, 403):
            what = "was refused the key" if status == 401 else "is not allowed"
            text = f"{self.url} {what} (HTTP {status}): {message}"
        else:
            text = f"{self.url} answered HTTP {status}: {message}"
        return EmbedderHTTPError(
            text,
            provider=self.provider,
            retryable=retryable,
            status=status,
            retry_after=parse_retry_after(headers) if retryable else None,
        )

    def _malformed(self, what: str) -> EmbedderError:
        return EmbedderError(
            f"malformed embeddings response from {self.url}: {what}", provider=self.provider
        )

    def _parse(self, body: Any, count: int) -> np.ndarray:
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise self._malformed("no 'data' list")
        if len(data) != count:
            raise self._malformed(f"{len(data)} embeddings for {count} inputs")
        rows: list[Any] = [None] * count
        for position, item in enumerate(data):
            if not isinstance(item, dict) or not isinstance(item.get("embedding"), list):
                raise self._malformed(f"data[{position}] has no 'embedding' list")
            index = item.get("index", position)
            valid = isinstance(index, int) and not isinstance(index, bool) and 0 <= index < count
            if not valid or rows[index] is not None:
                raise self._malformed(f"data[{position}] has a bad or repeated index {index!r}")
            rows[index] = item["embedding"]
        widths = sorted({len(row) for row in rows})
        if len(widths) != 1 or widths[0] == 0:
            raise self._malformed(f"vectors of unequal or zero length {widths}")
        try:
            return normalize_rows(
                rows, rows=count, dimensions=self.dimensions, provider=self.provider
            )
        except EmbedderError as exc:
            raise self._malformed(exc.message) from exc


def _server_error(raw: bytes) -> tuple[str, str | None]:
    """The message and code of an error body, in any of the shapes servers use."""
    try:
        body = json.loads(raw)
    except ValueError:
        return _excerpt(raw) or "(no body)", None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):  # OpenAI
            code = error.get("code")
            return error["message"], code if isinstance(code, str) else None
        if isinstance(error, str):  # Ollama
            return error, None
        for key in ("message", "detail"):  # vLLM; FastAPI-based servers
            if isinstance(body.get(key), str):
                return body[key], None
    return _excerpt(raw), None


def _excerpt(raw: bytes) -> str:
    return raw[:_MESSAGE_CHARS].decode(errors="replace").strip()
