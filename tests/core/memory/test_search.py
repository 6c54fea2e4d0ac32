"""Hybrid search through a real index: ranking, limits, snippets and citations, CJK keywords,
the relaxed fallback, min_score, overlapping transcript chunks, MMR and temporal decay.

Most tests search keyword-only (no embedder: BM25 scores are deterministic) or with the
fake embedder; one runs the real e5 model for a semantic match."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder, build_embedder
from parley.core.memory.memory_config import ChunkingSettings, SearchSettings
from parley.core.memory.rows import FileRow, NewChunk
from parley.core.memory.search import SearchParams, run_search
from parley.core.memory.store import MemoryStore
from tests.core.memory.helpers import (
    KeepOpen,
    Layout,
    make_layout,
    open_index,
    quiet_settings,
    read_db,
)
from tests.fakes.embedder import HashingEmbedder, resilient

SCOPES = ["agent", "person:alice"]
CITATION = re.compile(r"^(?P<path>.+)#L(?P<start>\d+)-L(?P<end>\d+)$")
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return make_layout(tmp_path)


@pytest.fixture(scope="module")
def e5_model() -> Iterator[ResilientEmbedder]:
    embedder = build_embedder(EmbedderSettings(provider="e5"))
    yield embedder
    asyncio.run(embedder.close())


def search_settings(**search: object) -> SearchSettings:
    return SearchSettings(**search)  # type: ignore[arg-type]


def file_lines(layout: Layout, path: str) -> list[str]:
    return (layout.workspace / path).read_text(encoding="utf-8").split("\n")


# -- ranking, limits, snippets, citations -----------------------------------------------------


@pytest.fixture
def garden(layout: Layout) -> Layout:
    """Twelve notes that all mention the garden, some far more than others."""
    for i in range(12):
        body = "\n".join(
            [f"# Garden note {i}", ""]
            + [f"Watered the tomatoes in the garden, bed {j}." for j in range(i % 4 + 1)]
            + [f"Unrelated line {k} about the weather and the neighbours." for k in range(i)]
        )
        layout.write(f"memory/garden-{i:02}.md", body + "\n")
    return layout


@pytest.mark.parametrize("embedded", [False, True], ids=["keyword", "hybrid"])
async def test_results_are_ranked_bounded_and_cited(garden: Layout, embedded: bool) -> None:
    settings = quiet_settings(search=search_settings(max_results=5, snippet_chars=120))
    embedder = resilient(HashingEmbedder()) if embedded else None
    async with open_index(garden, settings, embedder) as index:
        result = await index.search("tomatoes garden", scopes=SCOPES)
        more = await index.search("tomatoes garden", scopes=SCOPES, max_results=8)

    assert result.mode == ("hybrid" if embedded else "keyword")
    assert len(result.hits) == 5
    assert len(more.hits) == 8
    scores = [h.score for h in more.hits]
    assert scores == sorted(scores, reverse=True)
    assert [h.path for h in more.hits[:5]] == [h.path for h in result.hits]
    for hit in more.hits:
        assert len(hit.snippet) <= 120
        match = CITATION.match(hit.citation)
        assert match is not None
        assert (match["path"], int(match["start"]), int(match["end"])) == (
            hit.path,
            hit.start_line,
            hit.end_line,
        )
        assert hit.to_dict()["citation"] == hit.citation
        assert 1 <= hit.start_line <= hit.end_line
        assert hit.source == "memory"
        assert 0 < hit.score <= 1.0


async def test_markdown_citations_are_the_snippets_lines(layout: Layout) -> None:
    lines = [f"Line {i}: routine entry about the weekly grocery list." for i in range(1, 41)]
    lines[26] = "Line 27: the spare key is hidden under the blue flowerpot."
    lines[27] = "Line 28: the flowerpot sits left of the door."
    layout.write("memory/house.md", "\n".join(lines) + "\n")
    layout.write("MEMORY.md", "# Memory\n\nShort: the blue flowerpot was a gift.\n")
    settings = quiet_settings(search=search_settings(snippet_chars=150, min_score=0))
    async with open_index(layout, settings, None) as index:
        result = await index.search("spare key flowerpot", scopes=SCOPES)

    assert {h.path for h in result.hits} == {"memory/house.md", "MEMORY.md"}
    for hit in result.hits:
        cited = file_lines(layout, hit.path)[hit.start_line - 1 : hit.end_line]
        assert "\n".join(cited) == hit.snippet
        assert len(hit.snippet) <= 150
    house = next(h for h in result.hits if h.path == "memory/house.md")
    assert "spare key" in house.snippet  # the window is around the best line
    assert house.end_line - house.start_line < 39  # narrowed, not the whole chunk


async def test_a_single_overlong_line_is_cut_to_the_limit(layout: Layout) -> None:
    layout.write("memory/wall.md", "word " * 300 + "needle " + "word " * 300 + "\n")
    settings = quiet_settings(search=search_settings(snippet_chars=100))
    async with open_index(layout, settings, None) as index:
        result = await index.search("needle", scopes=SCOPES)

    assert result.hits
    for hit in result.hits:
        assert len(hit.snippet) <= 100


# -- CJK --------------------------------------------------------------------------------------

CHINESE_NOTES = (
    "# 生活笔记\n"
    "\n"
    "我的猫叫小白，它最喜欢吃鱼。\n"
    "下周三我们要去北京开会，记得订高铁票。\n"
    "项目预算是五十万元，由财务部审批。\n"
)
JAPANESE_NOTES = "昨日は東京で寿司を食べました。\n来月、京都の紅葉を見に行く予定です。\n"


@pytest.fixture
def multilingual(layout: Layout) -> Layout:
    layout.write("memory/zh.md", CHINESE_NOTES)
    layout.write("memory/ja.md", JAPANESE_NOTES)
    layout.write("memory/en.md", "The cat's vet visit is on Monday.\nBudget review in May.\n")
    layout.write("MEMORY.md", "# Memory\n\nThe user lives in Shanghai.\n")
    return layout


@pytest.mark.parametrize(
    ("query", "path", "expected"),
    [
        ("我的猫叫什么名字？", "memory/zh.md", "小白"),
        ("什么时候去北京开会", "memory/zh.md", "北京"),
        ("项目预算多少", "memory/zh.md", "五十万元"),
        ("寿司", "memory/ja.md", "寿司"),
        ("京都の紅葉", "memory/ja.md", "紅葉"),
    ],
)
async def test_chinese_and_japanese_are_found_by_keyword(
    multilingual: Layout, query: str, path: str, expected: str
) -> None:
    async with open_index(multilingual, quiet_settings(), None) as index:
        result = await index.search(query, scopes=SCOPES)

    assert result.mode == "keyword"
    assert result.trace.keyword_hits > 0
    assert result.hits[0].path == path
    assert expected in result.hits[0].snippet
    cited = file_lines(multilingual, path)[result.hits[0].start_line - 1 : result.hits[0].end_line]
    assert "\n".join(cited) == result.hits[0].snippet


async def test_chinese_memory_is_found_with_e5(
    multilingual: Layout, e5_model: ResilientEmbedder
) -> None:
    async with open_index(
        multilingual, quiet_settings(), resilient(KeepOpen(e5_model.primary))
    ) as index:
        result = await index.search("我的猫叫什么名字？", scopes=SCOPES)
        semantic = await index.search("which city is the user's home", scopes=SCOPES)

    assert result.mode == "hybrid"
    assert result.hits[0].path == "memory/zh.md"
    assert "小白" in result.hits[0].snippet
    assert result.hits[0].vector_score is not None
    assert semantic.hits[0].path == "MEMORY.md"  # no shared keyword: the vector found it


# -- the relaxed fallback and min_score --------------------------------------------------------


@pytest.fixture
def ops(layout: Layout) -> Layout:
    layout.write("memory/infra.md", "We run kubernetes on three nodes.\n")
    layout.write("memory/about.md", "What it is about: the quarterly planning.\n")
    layout.write("memory/misc.md", "Bought oat milk and bread.\n")
    return layout


async def test_a_prefix_finds_what_the_strict_query_misses(ops: Layout) -> None:
    async with open_index(ops, quiet_settings(), None) as index:
        result = await index.search("kube", scopes=SCOPES)

    assert result.trace.relaxed
    assert [h.path for h in result.hits][:1] == ["memory/infra.md"]


async def test_a_query_of_stop_words_still_finds_something(ops: Layout) -> None:
    async with open_index(ops, quiet_settings(), None) as index:
        result = await index.search("what is it about", scopes=SCOPES)

    assert result.hits
    assert result.hits[0].path == "memory/about.md"


async def test_a_query_that_matches_nothing_finds_nothing(ops: Layout) -> None:
    async with open_index(ops, quiet_settings(), None) as index:
        result = await index.search("xylophone zeppelin", scopes=SCOPES)

    assert result.hits == []
    assert result.trace.relaxed  # it tried


async def test_min_score_filters(garden: Layout) -> None:
    settings = quiet_settings(search=search_settings(max_results=50))
    async with open_index(garden, settings, resilient(HashingEmbedder())) as index:
        everything = await index.search("tomatoes garden weather", scopes=SCOPES, min_score=0)
        scores = sorted(h.score for h in everything.hits)
        threshold = scores[len(scores) // 2]
        filtered = await index.search("tomatoes garden weather", scopes=SCOPES, min_score=threshold)
        default = await index.search("tomatoes garden weather", scopes=SCOPES)

    assert 0 < len(filtered.hits) < len(everything.hits)
    assert all(h.score >= threshold for h in filtered.hits)
    kept = [h.path for h in everything.hits if h.score >= threshold]
    assert [h.path for h in filtered.hits] == kept
    assert all(h.score >= 0.2 for h in default.hits)  # SearchSettings.min_score


# -- transcripts ------------------------------------------------------------------------------


async def test_overlapping_transcript_chunks_are_returned_once(layout: Layout) -> None:
    turns = [
        ("user", "Morning! Any plans for the weekend trip?"),
        ("assistant", "We could visit the island of Zanzibar by ferry on Saturday."),
        ("user", "Sounds great, book the morning ferry please."),
        ("assistant", "Booked the morning ferry for two people."),
        ("user", "Thanks, and remind me to pack sunscreen."),
    ]
    layout.transcript("s-trip", turns, scope="person:alice")
    settings = quiet_settings(
        chunking=ChunkingSettings(transcript_tokens=40, transcript_overlap_turns=1)
    )
    async with open_index(layout, settings, None) as index:
        result = await index.search("Zanzibar ferry", scopes=SCOPES, min_score=0)

    holding = [t for t in read_db(layout.db).texts if "Zanzibar" in t]
    assert len(holding) == 2  # the turn sits in two overlapping chunks
    with_zanzibar = [h for h in result.hits if "Zanzibar" in h.snippet]
    assert len(with_zanzibar) == 1
    covered: set[str] = set()
    for hit in result.hits:
        assert hit.source == "sessions"
        assert hit.entry_ids
        assert sum(e in covered for e in hit.entry_ids) < len(hit.entry_ids) / 2
        covered.update(hit.entry_ids)


# -- MMR and temporal decay --------------------------------------------------------------------


@pytest.fixture
def upgrades(layout: Layout) -> Layout:
    checklist = (
        "Kubernetes cluster upgrade checklist: drain nodes, upgrade kubernetes cluster"
        " control plane"
    )
    layout.write("memory/a.md", checklist + ".\n")
    layout.write("memory/b.md", checklist + " first.\n")  # a near-duplicate of a.md
    layout.write(
        "memory/c.md",
        "Kubernetes cluster upgrade failed: the Helm release rolled back and paged oncall.\n",
    )
    layout.write("memory/d.md", "Kubernetes meetup on Friday.\n")
    return layout


@pytest.mark.parametrize("mmr", [False, True])
async def test_mmr_demotes_near_duplicates(upgrades: Layout, mmr: bool) -> None:
    settings = quiet_settings(search=search_settings(mmr=mmr, min_score=0))
    async with open_index(upgrades, settings, None) as index:
        result = await index.search("kubernetes cluster upgrade", scopes=SCOPES)

    order = [Path(h.path).stem for h in result.hits]
    assert order == (["a", "c", "b", "d"] if mmr else ["a", "b", "c", "d"])


STANDUP = "The team standup moved to 9:30 on Tuesdays.\n"


@pytest.fixture
def dated(layout: Layout) -> Layout:
    layout.write("memory/2024-01-10.md", STANDUP)
    layout.write("memory/2026-11-01.md", STANDUP)
    layout.write("memory/2026-11-19-retro.md", STANDUP)
    layout.write("memory/team.md", STANDUP)  # undated: evergreen
    layout.write("MEMORY.md", STANDUP)  # evergreen
    return layout


@pytest.mark.parametrize("decay", [False, True])
async def test_temporal_decay_ranks_newer_memories_first(dated: Layout, decay: bool) -> None:
    settings = quiet_settings(search=search_settings(temporal_decay=decay, min_score=0))
    async with open_index(dated, settings, None, now=lambda: NOW) as index:
        result = await index.search("standup Tuesdays", scopes=SCOPES)

    scores = {h.path: h.score for h in result.hits}
    assert len(scores) == 5
    if not decay:
        assert len({round(s, 9) for s in scores.values()}) == 1  # equal text, equal score
        return
    assert scores["MEMORY.md"] == pytest.approx(scores["memory/team.md"])
    assert scores["MEMORY.md"] > scores["memory/2026-11-19-retro.md"]
    assert scores["memory/2026-11-19-retro.md"] > scores["memory/2026-11-01.md"]
    assert scores["memory/2026-11-01.md"] > scores["memory/2024-01-10.md"]
    # 19 days at a 30-day half-life, relative to an evergreen file:
    ratio = scores["memory/2026-11-01.md"] / scores["MEMORY.md"]
    assert ratio == pytest.approx(0.5 ** ((19.5) / 30), rel=1e-3)
    assert [h.path for h in result.hits][-1] == "memory/2024-01-10.md"


async def test_temporal_decay_never_hides_an_old_memory(dated: Layout) -> None:
    # Default min_score: the 2024 note is almost three years old (decayed ~1e-10), but it
    # is as relevant as the others, so it is ranked last, not dropped.
    settings = quiet_settings(search=search_settings(temporal_decay=True))
    async with open_index(dated, settings, None, now=lambda: NOW) as index:
        result = await index.search("standup Tuesdays", scopes=SCOPES)

    paths = [h.path for h in result.hits]
    assert "memory/2024-01-10.md" in paths
    assert paths[-1] == "memory/2024-01-10.md"


# -- run_search on a bare store -----------------------------------------------------------------


def test_run_search_without_scopes_or_query_finds_nothing(tmp_path: Path) -> None:
    store = MemoryStore.open(tmp_path / "m.db", vector=False)
    try:
        store.replace_file(
            FileRow("MEMORY.md", "memory", "agent", "h", 1.0, 1),
            [NewChunk(1, 1, "findable text", "c")],
            None,
        )
        params = SearchParams.from_settings(SearchSettings())
        assert run_search(store, "findable", None, [], params, now=NOW)[0] == []
        assert run_search(store, "   ", None, ["agent"], params, now=NOW)[0] == []
        hits, trace = run_search(store, "findable", None, ["agent"], params, now=NOW)
    finally:
        store.close()

    assert [h.path for h in hits] == ["MEMORY.md"]
    assert trace.mode == "keyword"


def test_search_params_normalise_the_weights() -> None:
    params = SearchParams.from_settings(
        SearchSettings(vector_weight=0.6, text_weight=0.6, max_results=10), min_score=0.5
    )
    assert params.vector_weight == pytest.approx(0.5)
    assert params.text_weight == pytest.approx(0.5)
    assert params.min_score == 0.5
    assert params.candidates == 40
