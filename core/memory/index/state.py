"""What the parts of one ``MemoryIndex`` share: what is known about its live index.

``IndexState`` holds the flags that sync, rebuild, search, status and the triggers read
and write; they are touched on the event loop only (never on the worker threads), so
no lock guards them. ``wanted_meta`` says which ``IndexMeta`` the settings and the
embedder call for (a live index built with another one is rebuilt), ``made_by`` whether
vectors came from the model the index was built with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.core.memory.embedders import Embedder
from parley.core.memory.rows import IndexMeta

TOKENIZER = "cl100k_base"


@dataclass(slots=True)
class IndexState:
    live_meta: IndexMeta | None = None  # what the live rows were built with (None: unknown)
    dirty: bool = True  # nothing is known to be in sync until the first sync
    synced_once: bool = False
    empty: bool = True  # no file indexed yet: a search waits for the first sync
    reindexing: bool = False  # a rebuild is filling the shadow; the live index answers
    syncing: bool = False  # a sync is running (it cleared ``dirty`` when it started)
    closed: bool = False
    known_scopes: tuple[str, ...] | None = None  # cleared by every sync


def wanted_meta(chunking: dict[str, Any], embedder: Embedder | None) -> IndexMeta:
    """The meta an index with these chunking settings wants: ``embedder``'s model when
    vectors are on (``embedder`` given), keyword-only otherwise."""
    if embedder is None:
        return IndexMeta("none", "", "", 0, chunking, TOKENIZER)
    return IndexMeta(
        embedder.provider, embedder.model, embedder.provider_key, embedder.dimensions,
        chunking, TOKENIZER,
    )  # fmt: skip


def made_by(embedder: Embedder, meta: IndexMeta) -> bool:
    """Did the model the index was built with make these vectors (not a fallback)?"""
    return (embedder.provider, embedder.model, embedder.provider_key) == (
        meta.embedder,
        meta.model,
        meta.provider_key,
    )
