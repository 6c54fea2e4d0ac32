"""The keyword side of memory search: FTS5's query syntax and ranking, reproduced.

SQLite ranks with ``bm25()`` over ``porter unicode61 remove_diacritics 2``; here ``tsv``
is the text (diacritics folded in Python, stemmed by snowball without a stop list:
``parley_english``) and the score is the same Okapi BM25 (k1 1.2, b 0.75, FTS5's idf
clamp), with each term's frequency read from ``ts_rank_cd`` (unit weights, no
normalisation: one per occurrence) and document frequencies counted over the whole
index, as FTS5 counts over its table. ``core.memory.search`` then scales ranks
relative to the best hit exactly as for SQLite.

CJK: as in SQLite, unicode61 cannot split Chinese or Japanese, so chunks carry their
unigrams and bigrams (``NewChunk.cjk_text``) in a second tsvector, ``cjk_tsv``
(``simple``), searched and ranked the same way. pg_trgm is not used for ranking:
trigrams cannot find the one- and two-character words CJK queries are made of.
"""

from __future__ import annotations

import re
import unicodedata

FTS_TABLE = "chunks_fts"
CJK_TABLE = "chunks_cjk"
# The text search configuration of each keyword "table" (the names that
# core.memory.search passes).
KEYWORD_CONFIGS = {FTS_TABLE: "parley_english", CJK_TABLE: "simple"}
KEYWORD_COLUMNS = {FTS_TABLE: ("tsv", "doc_len"), CJK_TABLE: ("cjk_tsv", "cjk_len")}
# FTS5's bm25() constants.
BM25_K1 = 1.2
BM25_B = 0.75
# FTS5 MATCH terms as query.py writes them: "quoted" (inner quotes doubled), maybe *.
_TERM = re.compile(r'"((?:[^"]|"")*)"(\*?)')


def fold(text: str) -> str:
    """``text`` without diacritics, as unicode61's ``remove_diacritics 2`` indexes it."""
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not _mark(c)))


def _mark(char: str) -> bool:
    return unicodedata.category(char) == "Mn"


def match_terms(match: str) -> list[tuple[str, bool]]:
    """(term, is prefix) of an FTS5 MATCH expression made of quoted terms and OR."""
    return [(m.group(1).replace('""', '"'), bool(m.group(2))) for m in _TERM.finditer(match)]


def tsquery_term(term: str, prefix: bool) -> str:
    """``term`` as one ``to_tsquery`` operand: a quoted phrase, ``:*`` for a prefix."""
    quoted = "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"
    return quoted + (":*" if prefix else "")


# FTS5's bm25(): sum over the query's terms of
#   idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avglen)),
# idf = ln((N - n + 0.5) / (n + 0.5)) clamped to 1e-6, N and avglen over the whole index
# (as FTS5 counts its whole table), n the chunks holding the term. Negated, as bm25().
KEYWORD_SQL = """
WITH terms AS (
    SELECT t.ord, to_tsquery(%(cfg)s::regconfig, t.q) AS query
    FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS t(q, ord)
), stats AS (
    SELECT count(*)::float8 AS n, coalesce(avg(c.{length}), 0)::float8 AS avglen
    FROM memory_chunks c WHERE c.index_id = %(ix)s AND {indexed}
), weights AS (
    SELECT t.ord, t.query,
        greatest(ln((s.n - d.df + 0.5) / (d.df + 0.5)), 1e-6) AS idf
    FROM terms t CROSS JOIN stats s
    CROSS JOIN LATERAL (
        SELECT count(*)::float8 AS df FROM memory_chunks c
        WHERE c.index_id = %(ix)s AND c.{column} @@ t.query
    ) AS d
    WHERE numnode(t.query) > 0
), hits AS (
    SELECT c.id, c.{column} AS v, c.{length}::float8 AS len FROM memory_chunks c
    WHERE c.index_id = %(ix)s AND c.scope = ANY(%(scopes)s)
        AND c.{column} @@ to_tsquery(%(cfg)s::regconfig, %(any)s)
)
SELECT h.id, -sum(
    w.idf * f.tf * (%(k1)s + 1)
    / (f.tf + %(k1)s * (1 - %(b)s + %(b)s * h.len / greatest(s.avglen, 1e-9)))
) AS rank
FROM hits h CROSS JOIN stats s CROSS JOIN weights w
CROSS JOIN LATERAL (
    SELECT ts_rank_cd('{{1,1,1,1}}'::float4[], h.v, w.query, 0)::float8 AS tf
) AS f
GROUP BY h.id ORDER BY rank, h.id LIMIT %(limit)s
"""
