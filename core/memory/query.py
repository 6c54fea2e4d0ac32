"""The keyword side of memory search: tokens, keywords, FTS5 queries, BM25 scores, overlap.

Pure functions, no I/O. They serve two FTS5 tables in ``memory.db``:

* ``chunks_fts`` (tokenizer ``porter unicode61 remove_diacritics 2``) holds the chunk text.
  :func:`tokenize` splits words where unicode61 does (it, too, breaks at apostrophes and at
  combining marks), so a quoted query term becomes the same FTS token(s) as in the text, and
  porter stems both sides ("researched" finds "research").
* ``chunks_cjk`` (tokenizer ``unicode61``) holds :func:`cjk_index_text` of the chunk. Chinese and
  Japanese are written without spaces, so for unicode61 a whole sentence is one token and no
  keyword inside it could ever match. The segmenter-free fix is to index every character and
  every overlapping pair of characters of each CJK run: a query word of two or more characters
  is found through its bigrams, a one-character word ("猫", cat) through its unigram. Unigrams
  are indexed as well as bigrams because a one-character word at the end of a run ("一只猫")
  is the first character of no bigram. Hangul goes the same way: it does use spaces, but
  particles stick to the word ("회의에서"), and bigrams see through them.

CJK never goes into ``chunks_fts`` queries (:func:`build_fts_query` leaves it out): there it
could only match a whole identical run. Callers search both tables and merge.

Query side. The strict query (``mode="and"``) is OpenClaw's: every word, quoted, AND-ed. The
relaxed one (``mode="or"``) OR-s the keywords of :func:`extract_keywords`: stop words (EN, ES,
PT, DE, FR, ZH, JA, KO; see ``stopwords.py``) and one-character words are dropped; two-character
words are kept because the two-letter function words are all stop words, so what is left is
mostly acronyms that matter ("ai", "ml", "uk"); numbers of two digits or more are kept because
years and ids are exactly what people ask memory about ("2023", "1187"). In a CJK run, stop
words cut the run into segments (longest match first), Korean words lose their trailing
particle, and hiragana between kanji or katakana is dropped as grammar; each segment then
yields its bigrams, or itself when it is one character.

Quoting makes any input safe for ``MATCH``: terms hold only word characters, each is wrapped
in double quotes (inner quotes doubled), so FTS5 operators in the input (``NEAR(``, ``*``,
``-``, ``:``, ``^``, parentheses, ``AND``) are plain text. Terms without a letter or digit
("_") are left out: unicode61 reads them as an empty phrase, which makes an AND match nothing.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Iterable
from typing import Literal

from parley.core.memory.stopwords import (
    CJK_STOP_WORD_MAX_LEN,
    CJK_STOP_WORDS,
    KO_TRAILING_PARTICLES,
    STOP_WORDS_KO,
    WORD_STOP_WORDS,
)

FtsMode = Literal["and", "or"]

# One MATCH expression holds at most this many terms: a pasted page of text must not become a
# query of thousands of terms (nor, for callers that search keyword by keyword, thousands of
# queries). The first terms are kept.
MAX_QUERY_TERMS = 64

# OpenClaw's score for a rank that is not a finite number: 1 / (1 + 999).
NON_FINITE_RANK_SCORE = 0.001

# Scripts written without spaces between words (Hangul included, see the module docstring).
# Punctuation inside the kana blocks ("・", "゠") and the combining voiced marks are left out:
# unicode61 treats them as separators, and a bigram holding one would not be indexed as such.
_HAN = "\u3005-\u3007\u303b\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U000323af"
_HIRAGANA = "\u3041-\u3096\u309d-\u309f"
_KATAKANA = "\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HANGUL = "\u1100-\u11ff\u3131-\u318e\ua960-\ua97c\uac00-\ud7a3\ud7b0-\ud7fb"
_CJK = _HAN + _HIRAGANA + _KATAKANA + _HANGUL

# A token is a CJK run or a run of other word characters: "用API做" -> "用", "API", "做".
_TOKEN_RE = re.compile(rf"[{_CJK}]+|[^\W{_CJK}]+")
_WORD_RE = re.compile(rf"[^\W{_CJK}]+")
_CJK_RUN_RE = re.compile(rf"[{_CJK}]+")
_CJK_START_RE = re.compile(rf"[{_CJK}]")
_SCRIPT_RE = re.compile(
    rf"(?P<han>[{_HAN}]+)|(?P<hiragana>[{_HIRAGANA}]+)"
    rf"|(?P<katakana>[{_KATAKANA}]+)|(?P<hangul>[{_HANGUL}]+)"
)
_HAS_ALNUM_RE = re.compile(r"[^\W_]")


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens of ``text``, each CJK run a token of its own."""
    # Lowercased after matching: "İ".lower() grows a combining mark, which would split a word.
    return [token.lower() for token in _TOKEN_RE.findall(text)]


def is_cjk(token: str) -> bool:
    """True for a CJK token (a run, bigram or character), which belongs to ``chunks_cjk``."""
    return _CJK_START_RE.match(token) is not None


def _bigrams(run: str) -> list[str]:
    if len(run) < 2:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def cjk_bigrams(text: str) -> list[str]:
    """Overlapping character bigrams of every CJK run (a one-character run yields itself)."""
    return [gram for run in _CJK_RUN_RE.findall(text) for gram in _bigrams(run)]


def cjk_terms(text: str) -> list[str]:
    """Every character and every bigram of each CJK run of ``text``."""
    terms: list[str] = []
    for run in _CJK_RUN_RE.findall(text):
        terms.extend(run)
        if len(run) > 1:
            terms.extend(_bigrams(run))
    return terms


def cjk_index_text(text: str) -> str:
    """What ``chunks_cjk`` stores for a chunk: its CJK terms, space-joined ("" without CJK)."""
    return " ".join(cjk_terms(text))


def _stop_word_length(text: str, i: int) -> int:
    """The length of the longest stop word starting at ``text[i]``, 0 for none."""
    for size in range(min(CJK_STOP_WORD_MAX_LEN, len(text) - i), 0, -1):
        if text[i : i + size] in CJK_STOP_WORDS:
            return size
    return 0


def _split_at_stop_words(text: str) -> list[str]:
    """The pieces of a CJK segment left between its stop words."""
    pieces: list[str] = []
    start = i = 0
    while i < len(text):
        size = _stop_word_length(text, i)
        if not size:
            i += 1
            continue
        if start < i:
            pieces.append(text[start:i])
        i += size
        start = i
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _korean_stem(word: str) -> str | None:
    """``word`` without its trailing particle, or None for a stop word."""
    if word in STOP_WORDS_KO:
        return None
    for particle in KO_TRAILING_PARTICLES:
        # A one-syllable remainder is usually a word that merely ends like a particle
        # ("논의" is not "논" + "의").
        if word.endswith(particle) and len(word) - len(particle) >= 2:
            word = word[: -len(particle)]
            break
    return None if word in STOP_WORDS_KO else word


def _cjk_keywords(run: str) -> list[str]:
    parts = [(match.lastgroup, match.group()) for match in _SCRIPT_RE.finditer(run)]
    # In mixed Japanese the content words are kanji and katakana; hiragana is particles and
    # inflections. An all-hiragana run is kept (minus stop words): it may be all there is.
    mixed = any(script in ("han", "katakana") for script, _ in parts)
    keywords: list[str] = []
    for script, part in parts:
        if script == "hangul":
            stem = _korean_stem(part)
            segments = [stem] if stem else []
        elif script == "hiragana" and mixed:
            continue
        else:
            segments = _split_at_stop_words(part)
            if script != "han":  # a lone kana is a fragment; a lone hanzi/kanji is a word
                segments = [segment for segment in segments if len(segment) > 1]
        for segment in segments:
            keywords.extend(_bigrams(segment))
    return keywords


def _is_word_keyword(token: str) -> bool:
    # Also drops one-digit numbers; "2023" and "ai" stay.
    return len(token) >= 2 and token not in WORD_STOP_WORDS and bool(_HAS_ALNUM_RE.search(token))


def extract_keywords(query: str) -> list[str]:
    """The words of ``query`` worth searching for, in order, without duplicates.

    "When did Caroline go to the LGBTQ support group?" -> caroline, lgbtq, support, group.
    CJK text yields bigrams (and one-character words): "我的猫叫什么名字" -> 猫, 叫, 名字.
    """
    keywords: list[str] = []
    for token in tokenize(query):
        if is_cjk(token):
            keywords.extend(_cjk_keywords(token))
        elif _is_word_keyword(token):
            keywords.append(token)
    return list(dict.fromkeys(keywords))


def quote_fts(term: str) -> str:
    """``term`` as an FTS5 string: plain text whatever it holds."""
    # FTS5 reads a NUL as the end of the query ("unterminated string"), so it cannot be quoted.
    return '"' + term.replace("\x00", "").replace('"', '""') + '"'


def _join_terms(terms: Iterable[str], operator: str) -> str | None:
    unique = list(dict.fromkeys(terms))[:MAX_QUERY_TERMS]
    return f" {operator} ".join(map(quote_fts, unique)) if unique else None


def _plain_words(query: str) -> list[str]:
    return [t for t in tokenize(query) if not is_cjk(t) and _HAS_ALNUM_RE.search(t)]


def build_fts_query(query: str, *, mode: FtsMode) -> str | None:
    """A ``MATCH`` expression for ``chunks_fts``, or None when there is nothing to search.

    ``"and"``: every word, quoted, AND-ed (the strict first try). ``"or"``: the keywords,
    quoted, OR-ed (the relaxed fallback). A query made of stop words only ("who is it?", but
    also "Go" the language) still OR-s its words: BM25 weighs common words down, and a weak
    hit beats none. CJK is left to :func:`build_cjk_query`.
    """
    if mode == "and":
        return _join_terms(_plain_words(query), "AND")
    if mode == "or":
        keywords = extract_keywords(query)
        if keywords:
            return _join_terms((k for k in keywords if not is_cjk(k)), "OR")
        return _join_terms(_plain_words(query), "OR")
    raise ValueError(f"unknown FTS query mode: {mode!r}")


def build_cjk_query(query: str) -> str | None:
    """A ``MATCH`` expression for ``chunks_cjk``: the CJK keywords OR-ed, or None."""
    keywords = extract_keywords(query)
    if keywords:
        return _join_terms((k for k in keywords if is_cjk(k)), "OR")
    # Stop words only ("什么是这个"): as in build_fts_query, search what there is.
    return _join_terms(cjk_bigrams(query), "OR")


def bm25_to_score(rank: float) -> float:
    """OpenClaw's mapping of an FTS5 ``bm25()`` rank to a score in (0, 1].

    FTS5 ranks are negative, more negative is better: rank -r maps to r / (1 + r), which grows
    with r, so sorting by score keeps the FTS order. Ranks >= 0 (not produced by ``bm25()``
    with its default weights) map to 1 / (1 + rank).
    """
    if not math.isfinite(rank):
        return NON_FINITE_RANK_SCORE
    if rank < 0:
        relevance = -rank
        return relevance / (1 + relevance)
    return 1 / (1 + rank)


def _fold(token: str) -> str:
    """``token`` without diacritics or width variants, as unicode61 ``remove_diacritics``."""
    if token.isascii():
        return token
    decomposed = unicodedata.normalize("NFKD", token)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _consonant(word: str, i: int) -> bool:
    if word[i] in "aeiou":
        return False
    if word[i] == "y":  # "y" is a vowel after a consonant ("try"), a consonant otherwise
        return i == 0 or not _consonant(word, i - 1)
    return True


def _measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in ``stem``."""
    count, after_vowel = 0, False
    for i in range(len(stem)):
        consonant = _consonant(stem, i)
        if consonant and after_vowel:
            count += 1
        after_vowel = not consonant
    return count


def _has_vowel(stem: str) -> bool:
    return any(not _consonant(stem, i) for i in range(len(stem)))


def _ends_cvc(stem: str) -> bool:
    n = len(stem)
    return (
        n >= 3
        and _consonant(stem, n - 3)
        and not _consonant(stem, n - 2)
        and _consonant(stem, n - 1)
        and stem[-1] not in "wxy"
    )


def _stem(word: str) -> str:
    """Step 1 of the Porter stemmer (plurals, -ed, -ing, final -y).

    It is the part of FTS5's porter that matters for matching memories ("researched",
    "researching" -> "research"; "agencies", "agency" -> "agenci"; "races", "racing" ->
    "race"), in a few lines rather than a dependency.
    """
    if len(word) <= 2 or not (word.isascii() and word.isalpha()):
        return word
    if word.endswith(("sses", "ies")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    else:
        for suffix in ("ed", "ing"):
            if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
                word = word[: -len(suffix)]
                if word.endswith(("at", "bl", "iz")):
                    word += "e"
                elif len(word) > 1 and word[-1] == word[-2] and _consonant(word, len(word) - 1):
                    if word[-1] not in "lsz":
                        word = word[:-1]
                elif _measure(word) == 1 and _ends_cvc(word):
                    word += "e"
                break
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    return word


@functools.lru_cache(maxsize=65_536)
def _word_form(word: str) -> str:
    """``word`` lowercased, folded and stemmed: the form two words are compared in."""
    # Cached: the same words come back in every candidate chunk of every search, and stemming
    # them one by one would cost more than the rest of the overlap.
    return _stem(_fold(word.lower()))


def lexical_overlap(query_keywords: Iterable[str], text: str) -> float:
    """The share of the distinct query keywords found in ``text``, in [0, 1].

    Words match on their stems, without diacritics; CJK keywords (as :func:`extract_keywords`
    makes them: bigrams and single characters) match as substrings of the text's CJK runs.
    """
    cjk_wanted: set[str] = set()
    words_wanted: set[str] = set()
    for keyword in query_keywords:
        if is_cjk(keyword):
            cjk_wanted.add(keyword)
        elif keyword:
            words_wanted.add(_word_form(keyword))
    wanted = len(cjk_wanted) + len(words_wanted)
    if not wanted:
        return 0.0
    runs = _CJK_RUN_RE.findall(text) if cjk_wanted else []
    found = sum(any(keyword in run for run in runs) for keyword in cjk_wanted)
    if words_wanted:
        stems = {_word_form(word) for word in _WORD_RE.findall(text)}
        found += len(words_wanted & stems)
    return found / wanted
