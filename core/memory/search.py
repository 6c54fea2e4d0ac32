"""Hybrid memory search over one store: keyword + vector, merged, then ranked.

Pipeline (runs on the store's thread; the query vector is computed before):

1. Keyword side: FTS5 BM25 over ``chunks_fts`` with the query's keywords OR-ed (stop
   words dropped: BM25 then ranks chunks by how many rare keywords they hold), plus
   ``chunks_cjk`` for Chinese/Japanese/Korean. When that finds nothing, a relaxed query
   (every word, and prefixes of the keywords) runs instead. The text score is half the
   share of query keywords the chunk holds, half BM25 relative to the best hit.
2. Vector side: sqlite-vec KNN within the scopes; keyword hits the KNN did not return get
   their exact cosine too, so a chunk is never scored 0 on a side just for ranking low.
3. Merge: ``score = wv·vector + wt·text`` (weights normalised), the vector similarity
   rescaled from the embedder's floor (e5 puts unrelated text near 0.7 cosine).
4. Optional temporal decay, sort, optional MMR, the ``min_score`` filter on the
   undecayed relevance (decay reorders, it never hides an old memory; OpenClaw's
   relaxed re-filter of keyword hits when nothing passes), and transcript
   chunks that mostly repeat turns already returned are dropped (they overlap).
5. Snippets ≤ ``snippet_chars``: the chunk when it fits, else its best window of lines.

The store is any ``SearchStore`` (SQLite's FTS5 and sqlite-vec, or PostgreSQL's
full-text search and pgvector, which reproduce them); the hits are ``rows.SearchHit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from parley.core.memory.decay import chunk_age_days, decay_multiplier
from parley.core.memory.memory_config import SearchSettings
from parley.core.memory.mmr import mmr_rerank
from parley.core.memory.query import (
    build_cjk_query,
    build_fts_query,
    extract_keywords,
    lexical_overlap,
    quote_fts,
    tokenize,
)
from parley.core.memory.rows import ChunkRow, SearchHit
from parley.core.memory.store_protocol import SearchStore

# A transcript result whose turns were at least this much returned already is dropped.
_OVERLAP_DROP = 0.5
# The most candidates either side may bring, whatever the settings say.
_MAX_CANDIDATES = 200
# The keyword score: this share is keyword overlap, the rest BM25 relative to the best.
TEXT_OVERLAP_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class SearchParams:
    max_results: int
    min_score: float
    vector_weight: float
    text_weight: float
    candidates: int
    snippet_chars: int
    mmr: bool
    mmr_lambda: float
    temporal_decay: bool
    half_life_days: float
    similarity_floor: float = 0.0

    @classmethod
    def from_settings(
        cls,
        settings: SearchSettings,
        *,
        max_results: int | None = None,
        min_score: float | None = None,
        similarity_floor: float = 0.0,
    ) -> SearchParams:
        count = max_results if max_results is not None else settings.max_results
        total = settings.vector_weight + settings.text_weight
        return cls(
            max_results=count,
            min_score=settings.min_score if min_score is None else min_score,
            vector_weight=settings.vector_weight / total,
            text_weight=settings.text_weight / total,
            candidates=min(_MAX_CANDIDATES, count * settings.candidate_multiplier),
            snippet_chars=settings.snippet_chars,
            mmr=settings.mmr,
            mmr_lambda=settings.mmr_lambda,
            temporal_decay=settings.temporal_decay,
            half_life_days=settings.half_life_days,
            similarity_floor=similarity_floor,
        )


@dataclass(slots=True)
class _Candidate:
    row: ChunkRow
    vector: float | None = None
    text: float | None = None
    relevance: float = 0.0  # what min_score is compared with
    score: float = 0.0  # what ranks: relevance, decayed by age when decay is on


@dataclass(slots=True)
class SearchTrace:
    """What happened, for status and debugging (``/memory search`` shows it)."""

    keyword_hits: int = 0
    vector_hits: int = 0
    relaxed: bool = False
    mode: str = "hybrid"  # hybrid | keyword | vector
    notes: list[str] = field(default_factory=list)


def _keyword_side(
    store: SearchStore, query: str, scopes: Sequence[str], limit: int, trace: SearchTrace
) -> dict[int, float]:
    """chunk id → BM25 relevance relative to the best hit (1.0 for the best).

    Relative, because FTS5's BM25 is near 0 everywhere in a small index (few documents
    make every term look common): an absolute mapping would score a new user's only
    matching memory as irrelevant.
    """
    ranks: dict[int, float] = {}

    def run(table: str, match: str | None) -> None:
        if not match:
            return
        hits = store.keyword_hits(table, match, scopes, limit)
        best = max((-rank for _, rank in hits), default=0.0)
        for chunk_id, rank in hits:
            relative = (-rank / best) if best > 0 else 1.0
            ranks[chunk_id] = max(ranks.get(chunk_id, 0.0), relative)

    run("chunks_fts", build_fts_query(query, mode="or"))
    run("chunks_cjk", build_cjk_query(query))
    if not ranks:
        words = [w for w in tokenize(query) if w.isascii()]
        prefixes = [quote_fts(w) + "*" for w in extract_keywords(query) if len(w) >= 4]
        terms = list(dict.fromkeys([quote_fts(w) for w in words] + prefixes))
        if terms:
            trace.relaxed = True
            run("chunks_fts", " OR ".join(terms))
    trace.keyword_hits = len(ranks)
    return ranks


def _rescale(similarity: float, floor: float) -> float:
    if floor <= 0:
        return max(0.0, similarity)
    return max(0.0, (similarity - floor) / (1.0 - floor))


def run_search(
    store: SearchStore,
    query: str,
    query_vector: np.ndarray | None,
    scopes: Sequence[str],
    params: SearchParams,
    *,
    now: datetime,
    file_mtimes: dict[str, float] | None = None,
) -> tuple[list[SearchHit], SearchTrace]:
    trace = SearchTrace()
    if not scopes or not query.strip():
        return [], trace
    keyword = _keyword_side(store, query, scopes, params.candidates, trace)
    vector: dict[int, float] = {}
    if query_vector is not None and store.vector_dims == len(query_vector):
        for chunk_id, distance in store.vector_hits(query_vector, scopes, params.candidates):
            vector[chunk_id] = 1.0 - distance
        missing = [i for i in keyword if i not in vector]
        for chunk_id, stored in store.vectors_for(missing).items():
            vector[chunk_id] = float(np.dot(stored, query_vector))
        trace.vector_hits = len(vector)
    else:
        trace.mode = "keyword"
    if not keyword and vector:
        trace.mode = "vector" if trace.mode == "hybrid" else trace.mode
    rows = store.chunks_by_id(list({*keyword, *vector}))
    vw, tw = (params.vector_weight, params.text_weight) if vector else (0.0, 1.0)
    keywords = extract_keywords(query)
    candidates: list[_Candidate] = []
    for chunk_id, row in rows.items():
        text_score = None
        if chunk_id in keyword:
            # Half how much of the query the chunk holds (absolute), half BM25 (relative).
            overlap = lexical_overlap(keywords, row.text) if keywords else 1.0
            text_score = TEXT_OVERLAP_SHARE * overlap + (1 - TEXT_OVERLAP_SHARE) * keyword[chunk_id]
        cand = _Candidate(row, vector.get(chunk_id), text_score)
        vec = _rescale(cand.vector, params.similarity_floor) if cand.vector is not None else 0.0
        cand.relevance = cand.score = vw * vec + tw * (cand.text or 0.0)
        if params.temporal_decay:
            age = chunk_age_days(
                path=row.path,
                source=row.source,
                chunk_ts=row.ts,
                file_mtime=(file_mtimes or {}).get(row.path),
                now=now,
            )
            if age is not None:
                cand.score *= decay_multiplier(age, params.half_life_days)
        candidates.append(cand)
    candidates.sort(key=lambda c: (-c.score, c.row.id))
    if params.mmr:
        candidates = mmr_rerank(
            candidates, score=lambda c: c.score, text=lambda c: c.row.text, lam=params.mmr_lambda
        )
    # Filtered on relevance, not on the decayed score: decay orders old memories after
    # new ones but never hides them (a year-old fact would otherwise fall below any floor).
    passing = [c for c in candidates if c.relevance >= params.min_score]
    if not passing and keyword:
        relaxed = min(params.min_score, tw)
        passing = [c for c in candidates if c.text is not None and c.relevance >= relaxed]
    hits: list[SearchHit] = []
    covered: set[str] = set()
    for cand in passing:
        row = cand.row
        if row.entry_ids:
            seen = sum(1 for e in row.entry_ids if e in covered)
            if seen and seen >= _OVERLAP_DROP * len(row.entry_ids):
                continue
            covered.update(row.entry_ids)
        snippet, start, end = make_snippet(row, keywords, params.snippet_chars)
        hits.append(
            SearchHit(
                path=row.path,
                start_line=start,
                end_line=end,
                score=cand.score,
                snippet=snippet,
                source=row.source,
                scope=row.scope,
                entry_ids=row.entry_ids,
                ts=row.ts,
                vector_score=cand.vector,
                text_score=cand.text,
            )
        )
        if len(hits) >= params.max_results:
            break
    return hits, trace


def make_snippet(row: ChunkRow, keywords: Sequence[str], limit: int) -> tuple[str, int, int]:
    """The chunk's text when it fits ``limit``, else its best-matching window of lines.

    Returns (snippet, start_line, end_line). For memory files the line numbers narrow to
    the window; transcript chunk lines are turns, not file lines, so they keep the chunk's.
    """
    text = row.text
    if len(text) <= limit:
        return text, row.start_line, row.end_line
    lines = text.split("\n")
    scores = [lexical_overlap(keywords, line) if keywords else 0.0 for line in lines]
    best = max(range(len(lines)), key=lambda i: (scores[i], -i))
    start = end = best
    size = len(lines[best])
    # Grow the window around the best line, toward the better-scoring neighbour.
    while True:
        up = start - 1 if start > 0 else None
        down = end + 1 if end < len(lines) - 1 else None
        options = [i for i in (up, down) if i is not None and size + 1 + len(lines[i]) <= limit]
        if not options:
            break
        pick = max(options, key=lambda i: (scores[i], -abs(i - best), i == down))
        size += 1 + len(lines[pick])
        start, end = min(start, pick), max(end, pick)
    snippet = "\n".join(lines[start : end + 1])
    if len(snippet) > limit:  # one line longer than the limit on its own
        snippet = snippet[: limit - 1].rstrip() + "…"
    if row.entry_ids:
        return snippet, row.start_line, row.end_line
    return snippet, row.start_line + start, row.start_line + end
