"""Maximal Marginal Relevance: re-rank search results so near-duplicates do not crowd the top.

Items are picked one at a time, each maximising ``lam * relevance - (1 - lam) * max_sim``, where
relevance is the item's score min-max normalised to [0, 1] and ``max_sim`` is its highest
Jaccard similarity to an item already picked (Carbonell & Goldstein, 1998; OpenClaw's defaults).
``lam = 1`` is the plain relevance order, ``lam = 0`` the most diverse order.

Similarity is Jaccard over token sets: the lowercase words of :func:`query.tokenize` plus the
characters and adjacent-character bigrams of CJK runs. OpenClaw takes ``[a-z0-9_]+`` for the
words, which is the same on ASCII text but leaves Cyrillic, Greek or accented text without
tokens; ours keeps them. Two texts without any token are not called similar (OpenClaw calls
them identical): having no tokens is no evidence of redundancy.

Cost: each item's token set is built once; each pick compares the newly picked item with the
remaining ones only (the running maximum similarity is kept per item), so re-ranking ``n`` items
costs ``O(n * k)`` Jaccard comparisons.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from parley.core.memory.query import cjk_terms, is_cjk, tokenize

T = TypeVar("T")

DEFAULT_MMR_LAMBDA = 0.7


def similarity_tokens(text: str) -> frozenset[str]:
    """The token set that :func:`mmr_rerank` compares with Jaccard."""
    tokens: set[str] = set()
    for token in tokenize(text):
        if is_cjk(token):
            tokens.update(cjk_terms(token))
        else:
            tokens.add(token)
    return frozenset(tokens)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b|; 0 when either set is empty."""
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


def _clamp_lambda(lam: float) -> float:
    if math.isnan(lam):
        return DEFAULT_MMR_LAMBDA
    return min(1.0, max(0.0, lam))


def _relevances(scores: Sequence[float]) -> list[float]:
    """Scores min-max normalised to [0, 1] (all equal -> all 1); +inf is 1, -inf is 0."""
    finite = [s for s in scores if math.isfinite(s)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    # Halved (exactly) so that a spread such as 1e308 - -1e308 cannot overflow to inf.
    spread = high / 2 - low / 2
    relevances: list[float] = []
    for s in scores:
        if not math.isfinite(s):
            relevances.append(1.0 if s > 0 else 0.0)
        elif spread > 0:
            relevances.append((s / 2 - low / 2) / spread)
        else:
            relevances.append(1.0)
    return relevances


def mmr_rerank(
    items: Sequence[T],
    *,
    score: Callable[[T], float],
    text: Callable[[T], str],
    lam: float = DEFAULT_MMR_LAMBDA,
    k: int | None = None,
) -> list[T]:
    """The first ``k`` items (all when None) in MMR order.

    ``lam`` is clamped to [0, 1] (NaN means the default). Ties go to the higher original
    score, then to the earlier item. A NaN score ranks as -inf. ``score`` and ``text`` are
    called once per item.
    """
    count = len(items) if k is None else max(0, min(k, len(items)))
    if count == 0:
        return []
    lam = _clamp_lambda(lam)
    # NaN would make every comparison false and the order arbitrary.
    scores = [-math.inf if math.isnan(s := float(score(item))) else s for item in items]
    if lam == 1.0:
        order = sorted(range(len(items)), key=lambda i: (-scores[i], i))
        return [items[i] for i in order[:count]]

    relevance = _relevances(scores)
    tokens = [similarity_tokens(text(item)) for item in items]
    max_sim = [0.0] * len(items)
    remaining = list(range(len(items)))
    picked: list[int] = []
    while len(picked) < count:
        best = max(
            remaining,
            key=lambda i: (lam * relevance[i] - (1 - lam) * max_sim[i], scores[i], -i),
        )
        picked.append(best)
        remaining.remove(best)
        if len(picked) < count:
            for i in remaining:
                max_sim[i] = max(max_sim[i], jaccard(tokens[i], tokens[best]))
    return [items[i] for i in picked]
