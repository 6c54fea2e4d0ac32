from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.core.memory.mmr import DEFAULT_MMR_LAMBDA, jaccard, mmr_rerank, similarity_tokens


@dataclass(frozen=True)
class Hit:
    name: str
    score: float
    text: str


def rerank(hits: list[Hit], **kwargs: object) -> list[str]:
    ranked = mmr_rerank(hits, score=lambda h: h.score, text=lambda h: h.text, **kwargs)  # type: ignore[arg-type]
    return [hit.name for hit in ranked]


# Two near-duplicates on top, then a different memory, then a weak one.
DUPLICATES = [
    Hit("a", 1.0, "Caroline went to the LGBTQ support group on Friday"),
    Hit("a2", 0.95, "Caroline went to the LGBTQ support group on Friday evening"),
    Hit("b", 0.9, "Melanie painted a sunrise over the lake"),
    Hit("c", 0.1, "the weather was mild"),
]


def test_default_lambda_demotes_a_near_duplicate() -> None:
    assert DEFAULT_MMR_LAMBDA == 0.7
    assert rerank(DUPLICATES) == ["a", "b", "a2", "c"]


def test_lambda_one_is_pure_relevance() -> None:
    assert rerank(DUPLICATES, lam=1.0) == ["a", "a2", "b", "c"]
    shuffled = [DUPLICATES[2], DUPLICATES[3], DUPLICATES[0], DUPLICATES[1]]
    assert rerank(shuffled, lam=1.0) == ["a", "a2", "b", "c"]


def test_lambda_zero_is_maximum_diversity() -> None:
    hits = [
        Hit("x", 1.0, "alpha beta gamma"),
        Hit("x2", 0.99, "alpha beta gamma"),
        Hit("x3", 0.98, "alpha beta delta"),
        Hit("y", 0.01, "omega"),
    ]
    # First the best; then whatever is least like what was picked, however weak.
    assert rerank(hits, lam=0.0) == ["x", "y", "x3", "x2"]


def test_lambda_is_clamped() -> None:
    assert rerank(DUPLICATES, lam=7.0) == rerank(DUPLICATES, lam=1.0)
    assert rerank(DUPLICATES, lam=-3.0) == rerank(DUPLICATES, lam=0.0)
    assert rerank(DUPLICATES, lam=math.inf) == rerank(DUPLICATES, lam=1.0)
    assert rerank(DUPLICATES, lam=math.nan) == rerank(DUPLICATES, lam=DEFAULT_MMR_LAMBDA)


def test_ties_go_to_the_original_score_then_the_original_order() -> None:
    # Nothing alike: every MMR score after the first pick is lam * relevance at lam = 0 -> 0.
    hits = [Hit("low", 0.2, "one"), Hit("high", 0.9, "two"), Hit("mid", 0.5, "three")]
    assert rerank(hits, lam=0.0) == ["high", "mid", "low"]
    same = [Hit(name, 0.5, "same text") for name in ("p", "q", "r")]
    assert rerank(same) == ["p", "q", "r"]
    assert rerank(same, lam=0.0) == ["p", "q", "r"]


def test_identical_scores_are_all_fully_relevant() -> None:
    hits = [
        Hit("a", 3.0, "red apple pie"),
        Hit("b", 3.0, "red apple pie recipe"),
        Hit("c", 3.0, "blue whale"),
    ]
    # All relevances are 1, so diversity alone decides after the first pick.
    assert rerank(hits) == ["a", "c", "b"]


def test_equal_finite_scores_stay_above_minus_infinity() -> None:
    # Equal scores normalise to 1, not 0: a duplicate at full relevance (0.7 - 0.3 = 0.4)
    # still beats an item with no relevance at all (0).
    hits = [Hit("a", 0.5, "x y"), Hit("b", 0.5, "x y"), Hit("none", -math.inf, "z")]
    assert rerank(hits) == ["a", "b", "none"]


def test_negative_scores() -> None:
    hits = [Hit("worst", -5.0, "one"), Hit("best", -1.0, "two"), Hit("mid", -3.0, "three")]
    assert rerank(hits, lam=1.0) == ["best", "mid", "worst"]
    assert rerank(hits) == ["best", "mid", "worst"]


def test_non_finite_scores_do_not_break_the_order() -> None:
    hits = [Hit("nan", math.nan, "one"), Hit("inf", math.inf, "two"), Hit("ok", 0.5, "three")]
    assert rerank(hits, lam=1.0) == ["inf", "ok", "nan"]
    assert rerank(hits) == ["inf", "ok", "nan"]


def test_empty_input_and_k() -> None:
    assert rerank([]) == []
    assert rerank(DUPLICATES, k=2) == ["a", "b"]
    assert rerank(DUPLICATES, k=2, lam=1.0) == ["a", "a2"]
    assert rerank(DUPLICATES, k=99) == ["a", "b", "a2", "c"]
    assert rerank(DUPLICATES, k=0) == []
    assert rerank(DUPLICATES, k=-1) == []


def test_text_and_score_are_read_once_per_item() -> None:
    calls = {"text": 0, "score": 0}

    def text(hit: Hit) -> str:
        calls["text"] += 1
        return hit.text

    def score(hit: Hit) -> float:
        calls["score"] += 1
        return hit.score

    hits = [Hit(str(i), i / 40, f"memory number {i} about topic {i % 5}") for i in range(40)]
    assert len(mmr_rerank(hits, score=score, text=text)) == 40
    assert calls == {"text": 40, "score": 40}


def test_cjk_near_duplicates_are_demoted() -> None:
    hits = [
        Hit("cat", 1.0, "我养了一只橘猫，名字叫芒果。"),
        Hit("cat2", 0.95, "我养了一只橘猫，它叫芒果。"),
        Hit("trip", 0.9, "去年夏天我们去了云南旅游。"),
    ]
    assert rerank(hits, lam=0.5) == ["cat", "trip", "cat2"]
    assert rerank(hits, lam=1.0) == ["cat", "cat2", "trip"]


def test_similarity_tokens() -> None:
    assert similarity_tokens("Hello, hello WORLD_1") == {"hello", "world_1"}
    assert similarity_tokens("一只猫") == {"一", "只", "猫", "一只", "只猫"}
    # No bigram across a gap: "猫" and "狗" are not adjacent.
    assert "猫狗" not in similarity_tokens("猫 狗")
    # Words outside ASCII are tokens too (OpenClaw's [a-z0-9_]+ would see nothing here).
    assert similarity_tokens("Привет мир") == {"привет", "мир"}


def test_jaccard() -> None:
    a = frozenset({"x", "y"})
    assert jaccard(a, a) == 1.0
    assert jaccard(a, frozenset({"y", "z"})) == pytest.approx(1 / 3)
    assert jaccard(a, frozenset()) == 0.0
    assert jaccard(frozenset(), frozenset()) == 0.0


_hits = st.lists(
    st.builds(
        Hit,
        name=st.uuids().map(str),
        score=st.floats(allow_nan=True, allow_infinity=True),
        text=st.text(alphabet="abc 猫狗", max_size=12),
    ),
    max_size=12,
)


@given(_hits, st.floats(allow_nan=True), st.one_of(st.none(), st.integers(-2, 15)))
def test_result_is_a_prefix_sized_selection_of_the_items(
    hits: list[Hit], lam: float, k: int | None
) -> None:
    ranked = mmr_rerank(hits, score=lambda h: h.score, text=lambda h: h.text, lam=lam, k=k)
    expected = len(hits) if k is None else max(0, min(k, len(hits)))
    assert len(ranked) == expected
    assert len({id(hit) for hit in ranked}) == len(ranked)
    assert all(any(hit is item for item in hits) for hit in ranked)
    if ranked:
        # Whatever lam, the first pick is the most relevant item.
        best = max(hits, key=lambda h: -math.inf if math.isnan(h.score) else h.score)
        first = ranked[0].score
        assert first == best.score or (math.isnan(first) and math.isnan(best.score))
