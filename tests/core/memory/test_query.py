from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.memory.query import (
    MAX_QUERY_TERMS,
    NON_FINITE_RANK_SCORE,
    bm25_to_score,
    build_cjk_query,
    build_fts_query,
    cjk_bigrams,
    cjk_index_text,
    extract_keywords,
    is_cjk,
    lexical_overlap,
    quote_fts,
    tokenize,
)

# The lead's index: chunk text in a porter table, CJK terms in a plain unicode61 table.
PORTER_TABLE = (
    "CREATE VIRTUAL TABLE chunks_fts USING fts5("
    "text, id UNINDEXED, tokenize='porter unicode61 remove_diacritics 2')"
)
CJK_TABLE = "CREATE VIRTUAL TABLE chunks_cjk USING fts5(text, id UNINDEXED, tokenize='unicode61')"

ENGLISH_CHUNKS = [
    "Caroline went to the LGBTQ support group on 7 May 2023 and felt accepted.",
    "Melanie painted a sunrise over the lake last year.",
    "Caroline researched adoption agencies because she wants to build a family.",
    "The support ticket 1187 about the database migration was closed.",
    "Melanie took her kids camping in the mountains.",
]

# Ten notes, one topic each: the right note must be found through its keywords alone.
CHINESE_CHUNKS = [
    "我养了一只橘猫，它的名字叫芒果。",
    "下周三上午十点要和设计团队开会讨论新版首页。",
    "我对花生过敏，吃了会起疹子。",
    "去年夏天我们全家去了云南旅游。",
    "我的护照放在抽屉里的蓝色文件夹中。",
    "妈妈的生日是十月十二日，她喜欢兰花。",
    "数据库迁移计划推迟到下个月。",
    "我最近在学习弹吉他，每天练习半小时。",
    "公司的年终奖会在一月底发放。",
    "周末打算和朋友去爬山，然后吃火锅。",
]

JAPANESE_CHUNKS = [
    "来週の金曜日に歯医者の予約がある。",
    "新しいプロジェクトの締め切りは三月末です。",
    "猫のミケは魚が大好きです。",
    "東京の天気は明日雨になるらしい。",
]


def _connect() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute(PORTER_TABLE)
    db.execute(CJK_TABLE)
    return db


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    connection = _connect()
    yield connection
    connection.close()


def _index(db: sqlite3.Connection, chunks: list[str]) -> None:
    for i, text in enumerate(chunks):
        db.execute("INSERT INTO chunks_fts (text, id) VALUES (?, ?)", (text, i))
        db.execute("INSERT INTO chunks_cjk (text, id) VALUES (?, ?)", (cjk_index_text(text), i))


def _search(db: sqlite3.Connection, table: str, match: str) -> list[tuple[int, float]]:
    """(chunk id, bm25 rank), best first, the way the lead's search reads FTS5."""
    rows = db.execute(
        f"SELECT id, bm25({table}) FROM {table} WHERE {table} MATCH ? ORDER BY bm25({table})",
        (match,),
    ).fetchall()
    return [(int(chunk_id), rank) for chunk_id, rank in rows]


# --- tokens ---------------------------------------------------------------------------------


def test_tokenize_lowercases_words_and_splits_cjk_runs_out_of_words() -> None:
    assert tokenize("Hello, World! foo_bar 2023") == ["hello", "world", "foo_bar", "2023"]
    assert tokenize("用API做了什么") == ["用", "api", "做了什么"]
    assert tokenize("API를 썼다") == ["api", "를", "썼다"]
    assert tokenize("Café naïve") == ["café", "naïve"]


def test_tokenize_splits_where_fts5_does() -> None:
    # Apostrophes and hyphens are separators for unicode61 too.
    assert tokenize("Caroline's well-known") == ["caroline", "s", "well", "known"]


def test_is_cjk() -> None:
    assert is_cjk("猫") and is_cjk("カメラ") and is_cjk("회의") and is_cjk("ひらがな")
    assert not is_cjk("cat") and not is_cjk("2023") and not is_cjk("")


def test_cjk_bigrams_per_run() -> None:
    assert cjk_bigrams("会议室") == ["会议", "议室"]
    # A one-character run yields the character; punctuation and Latin end a run.
    assert cjk_bigrams("猫。API 会议") == ["猫", "会议"]
    assert cjk_bigrams("no cjk here") == []


def test_cjk_index_text_holds_characters_and_bigrams() -> None:
    assert cjk_index_text("一只猫") == "一 只 猫 一只 只猫"
    assert cjk_index_text("plain English") == ""


# --- keywords -------------------------------------------------------------------------------


def test_keywords_of_an_english_question() -> None:
    question = "When did Caroline go to the LGBTQ support group?"
    assert extract_keywords(question) == ["caroline", "lgbtq", "support", "group"]


def test_keywords_keep_numbers_of_two_digits_and_two_letter_words() -> None:
    keywords = extract_keywords("What did Melanie paint in 2023 about AI, ticket 1187 or 7?")
    assert keywords == ["melanie", "paint", "2023", "ai", "ticket", "1187"]


def test_keywords_dedupe_in_order() -> None:
    assert extract_keywords("Python python PYTHON tests, python") == ["python", "tests"]


def test_keywords_drop_tokens_without_letters_or_digits() -> None:
    assert extract_keywords("_ __ x y") == []


def test_keywords_drop_stop_words_of_other_languages() -> None:
    assert extract_keywords("¿Qué comió María en Madrid?") == ["comió", "maría", "madrid"]
    assert extract_keywords("Wann war Thomas in Berlin?") == ["war", "thomas", "berlin"]
    assert extract_keywords("Quand est-ce que Jean est allé à Paris ?") == [
        "jean",
        "allé",
        "paris",
    ]
    assert extract_keywords("Quando o João foi para Lisboa?") == ["joão", "lisboa"]


def test_chinese_keywords_are_bigrams_between_stop_words() -> None:
    assert extract_keywords("我的猫叫什么名字？") == ["猫", "名字"]
    assert extract_keywords("我们之前讨论的那个方案") == ["讨论", "方案"]
    assert extract_keywords("数据库迁移") == ["数据", "据库", "库迁", "迁移"]


def test_japanese_keywords_drop_particles_and_kana_grammar() -> None:
    keywords = extract_keywords("歯医者の予約はいつですか？")
    assert keywords == ["歯医", "医者", "予約"]
    assert "プロ" in extract_keywords("プロジェクトの締め切りはいつ？")
    # Hiragana between kanji is grammar ("んだ"), even when it is no stop word.
    assert extract_keywords("昨日読んだ本の題名") == ["読", "本", "題名"]
    # An all-hiragana query keeps its words, minus stop words.
    assert extract_keywords("すしはどこ") == ["すし"]


def test_korean_keywords_strip_particles() -> None:
    keywords = extract_keywords("회의에서 결정한 내용은 뭐야?")
    assert keywords[0] == "회의"
    assert "내용" in keywords
    assert not any(k.endswith(("에서", "은")) for k in keywords)
    # A one-syllable stem is not stripped: "논의" is a word, not "논" + "의".
    assert extract_keywords("논의") == ["논의"]
    assert extract_keywords("우리가 그것을") == []


# --- FTS queries ----------------------------------------------------------------------------


def test_and_query_quotes_every_word() -> None:
    assert build_fts_query("Caroline's LGBTQ group", mode="and") == (
        '"caroline" AND "s" AND "lgbtq" AND "group"'
    )


def test_or_query_quotes_keywords() -> None:
    query = build_fts_query("When did Caroline go to the LGBTQ support group?", mode="or")
    assert query == '"caroline" OR "lgbtq" OR "support" OR "group"'


def test_queries_leave_cjk_to_the_cjk_table() -> None:
    assert build_fts_query("我的猫", mode="and") is None
    assert build_fts_query("API 的文档", mode="or") == '"api"'
    assert build_cjk_query("API 的文档") == '"文档"'
    assert build_cjk_query("plain English") is None


def test_queries_are_none_without_words() -> None:
    for mode in ("and", "or"):
        assert build_fts_query("", mode=mode) is None
        assert build_fts_query(" ?!* ( ) _ ", mode=mode) is None


def test_stop_word_only_query_still_searches_its_words() -> None:
    assert build_fts_query("Go?", mode="or") == '"go"'
    assert build_cjk_query("什么是这个") is not None


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="mode"):
        build_fts_query("x", mode="near")  # type: ignore[arg-type]


def test_queries_are_capped() -> None:
    words = " ".join(f"w{i}" for i in range(MAX_QUERY_TERMS * 2))
    query = build_fts_query(words, mode="and")
    assert query is not None and query.count(" AND ") == MAX_QUERY_TERMS - 1


def test_quote_fts_doubles_quotes() -> None:
    assert quote_fts('say "hi"') == '"say ""hi"""'
    assert quote_fts("a\x00b") == '"ab"'  # FTS5 would read the NUL as the end of the query


def test_and_query_is_strict_and_or_query_is_relaxed(db: sqlite3.Connection) -> None:
    _index(db, ENGLISH_CHUNKS)
    strict = build_fts_query("Caroline support group", mode="and")
    relaxed = build_fts_query("Caroline support group", mode="or")
    assert strict is not None and relaxed is not None
    assert [chunk for chunk, _ in _search(db, "chunks_fts", strict)] == [0]
    assert {chunk for chunk, _ in _search(db, "chunks_fts", relaxed)} == {0, 2, 3}


def test_or_query_finds_stemmed_words_and_numbers(db: sqlite3.Connection) -> None:
    _index(db, ENGLISH_CHUNKS)
    query = build_fts_query("What did Caroline research?", mode="or")
    assert query is not None
    assert _search(db, "chunks_fts", query)[0][0] == 2
    query = build_fts_query("What happened with ticket 1187?", mode="or")
    assert query is not None
    assert [chunk for chunk, _ in _search(db, "chunks_fts", query)] == [3]


HOSTILE = [
    '"',
    '""',
    "*",
    "NEAR(",
    "NEAR(a b, 2)",
    "-foo",
    "text:foo",
    "^start",
    "(unbalanced",
    "unbalanced)",
    "a AND",
    "OR",
    "NOT x",
    "a + b",
    "{text}: x",
    "'; DROP TABLE chunks_fts; --",
    "\x00",
]

_query_text = st.one_of(
    st.text(),
    st.lists(st.sampled_from([*HOSTILE, "foo", "猫", "会议", "caroline", " "])).map("".join),
)


@pytest.fixture(scope="module")
def fuzz_db() -> Iterator[sqlite3.Connection]:
    connection = _connect()
    _index(connection, ENGLISH_CHUNKS + CHINESE_CHUNKS + JAPANESE_CHUNKS)
    yield connection
    connection.close()


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_input_is_safe(fuzz_db: sqlite3.Connection, text: str) -> None:
    # Unquoted, each of these is an FTS5 syntax error (or worse).
    for mode in ("and", "or"):
        query = build_fts_query(f"caroline {text} group", mode=mode)
        assert query is not None
        _search(fuzz_db, "chunks_fts", query)


@settings(max_examples=200, deadline=None)
@given(_query_text)
def test_any_quoted_text_is_a_valid_match(fuzz_db: sqlite3.Connection, text: str) -> None:
    _search(fuzz_db, "chunks_fts", quote_fts(text))
    _search(fuzz_db, "chunks_fts", " OR ".join(map(quote_fts, [text, text[::-1]])))


@settings(max_examples=300, deadline=None)
@given(_query_text)
def test_match_never_raises(fuzz_db: sqlite3.Connection, text: str) -> None:
    for mode in ("and", "or"):
        query = build_fts_query(text, mode=mode)
        if query is not None:
            _search(fuzz_db, "chunks_fts", query)
    query = build_cjk_query(text)
    if query is not None:
        _search(fuzz_db, "chunks_cjk", query)


# --- CJK search -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("我的猫叫什么名字？", 0),
        ("猫", 0),  # a one-character word at the end of a run
        ("我对什么过敏？", 2),
        ("我们去年去哪里旅游了？", 3),
        ("护照放在哪里了", 4),
        ("妈妈喜欢什么花？", 5),
        ("数据库迁移什么时候做？", 6),
        ("我每天练习多久？", 7),
        ("年终奖什么时候发？", 8),
        ("周末和朋友吃什么", 9),
    ],
)
def test_chinese_question_finds_its_note(
    db: sqlite3.Connection, question: str, expected: int
) -> None:
    _index(db, CHINESE_CHUNKS)
    query = build_cjk_query(question)
    assert query is not None
    hits = _search(db, "chunks_cjk", query)
    assert hits and hits[0][0] == expected, (query, hits)


def test_chinese_is_not_findable_in_the_porter_table(db: sqlite3.Connection) -> None:
    # Why the CJK table exists: unicode61 reads a whole sentence as one token.
    _index(db, CHINESE_CHUNKS)
    assert _search(db, "chunks_fts", quote_fts("橘猫")) == []
    assert [chunk for chunk, _ in _search(db, "chunks_cjk", quote_fts("橘猫"))] == [0]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("歯医者の予約はいつですか？", 0),
        ("プロジェクトの締め切りは？", 1),
        ("ミケの好きなものは？", 2),
        ("東京の天気はどう？", 3),
    ],
)
def test_japanese_question_finds_its_note(
    db: sqlite3.Connection, question: str, expected: int
) -> None:
    _index(db, JAPANESE_CHUNKS)
    query = build_cjk_query(question)
    assert query is not None
    hits = _search(db, "chunks_cjk", query)
    assert hits and hits[0][0] == expected, (query, hits)


def test_korean_word_with_particle_is_found(db: sqlite3.Connection) -> None:
    _index(db, ["어제 회의에서 예산을 정했다.", "고양이가 밥을 먹었다."])
    query = build_cjk_query("회의는 언제야?")
    assert query is not None
    assert [chunk for chunk, _ in _search(db, "chunks_cjk", query)] == [0]


# --- BM25 scores ----------------------------------------------------------------------------


def test_bm25_to_score_values() -> None:
    assert bm25_to_score(-1.0) == 0.5
    assert bm25_to_score(-3.0) == 0.75
    assert bm25_to_score(0.0) == 1.0
    assert bm25_to_score(1.0) == 0.5
    for rank in (math.nan, math.inf, -math.inf):
        assert bm25_to_score(rank) == NON_FINITE_RANK_SCORE


_ranks = st.floats(min_value=-1e9, max_value=-1e-9)


@given(_ranks, _ranks)
def test_bm25_to_score_is_monotonic_in_the_fts5_range(a: float, b: float) -> None:
    # FTS5's bm25() is always negative; more negative is a better match.
    better, worse = min(a, b), max(a, b)
    assert bm25_to_score(better) >= bm25_to_score(worse)
    assert 0.0 < bm25_to_score(better) <= 1.0


@given(st.floats(min_value=0, max_value=1e9), st.floats(min_value=0, max_value=1e9))
def test_bm25_to_score_is_monotonic_for_positive_ranks(a: float, b: float) -> None:
    assert bm25_to_score(min(a, b)) >= bm25_to_score(max(a, b))


def test_bm25_to_score_strictly_orders_realistic_ranks() -> None:
    ranks = [-12.5, -7.0, -3.2, -1.0, -0.4, -1e-6]
    scores = [bm25_to_score(rank) for rank in ranks]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)


def test_bm25_scores_keep_the_fts_order(db: sqlite3.Connection) -> None:
    _index(db, [*ENGLISH_CHUNKS, "Caroline, Caroline and Caroline again: support support."])
    query = build_fts_query("Caroline support group Melanie", mode="or")
    assert query is not None
    hits = _search(db, "chunks_fts", query)
    assert len(hits) >= 4
    assert all(rank < 0 for _, rank in hits)
    scores = [bm25_to_score(rank) for _, rank in hits]
    assert scores == sorted(scores, reverse=True)
    assert sorted(hits, key=lambda hit: -bm25_to_score(hit[1])) == hits


# --- lexical overlap ------------------------------------------------------------------------


def test_lexical_overlap_matches_stems() -> None:
    text = "Caroline researched adoption agencies last spring."
    assert lexical_overlap(["research", "agency"], text) == 1.0
    assert lexical_overlap(["caroline", "melanie"], text) == 0.5
    assert lexical_overlap(["melanie"], text) == 0.0


def test_lexical_overlap_counts_distinct_keywords() -> None:
    # "races" and "racing" are one keyword once stemmed.
    assert lexical_overlap(["races", "racing", "boat"], "She raced a boat.") == 1.0
    assert lexical_overlap(["note"], "not a single thing") == 0.0


def test_lexical_overlap_folds_diacritics_and_case() -> None:
    assert lexical_overlap(["cafe"], "Un CAFÉ noir") == 1.0
    assert lexical_overlap(["Café"], "cafe") == 1.0


def test_lexical_overlap_cjk() -> None:
    keywords = extract_keywords("妈妈喜欢什么花？")
    assert lexical_overlap(keywords, CHINESE_CHUNKS[5]) >= 0.75
    assert lexical_overlap(keywords, CHINESE_CHUNKS[0]) == 0.0
    # A bigram must sit inside one run, not across punctuation.
    assert lexical_overlap(["只猫"], "一只。猫") == 0.0


def test_lexical_overlap_without_keywords_is_zero() -> None:
    assert lexical_overlap([], "anything") == 0.0
    assert lexical_overlap([""], "anything") == 0.0


@given(st.lists(st.text(max_size=8), max_size=6), st.text(max_size=80))
def test_lexical_overlap_is_a_share(keywords: list[str], text: str) -> None:
    assert 0.0 <= lexical_overlap(keywords, text) <= 1.0
