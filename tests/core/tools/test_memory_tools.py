"""memory_search and memory_get as the model meets them: registered in a real
ToolRegistry and run through ``ToolRegistry.run`` (so every refusal comes back as an
error result), over a real index of a seeded workspace with the deterministic embedder."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.memory.index import MemoryIndex
from core.memory.sources import AGENT_SCOPE
from core.messages import ToolResultBlock, ToolUseBlock
from core.prompt import MEMORY_GET_TOOL, MEMORY_SEARCH_TOOL
from core.tools.memory import SCOPES_KEY, memory_tools
from core.tools.registry import ToolContext, ToolRegistry
from tests.core.memory.helpers import Layout, make_layout, quiet_settings
from tests.fakes.embedder import HashingEmbedder, resilient

MEMORY_MD = (
    "# Memory\n"
    "\n"
    "- The user's favourite tea is oolong, brewed at 90 degrees.\n"
    "- The user's sister Priya lives in Lisbon.\n"
    "- Standup moved to 09:30 on Tuesdays.\n"
)
NOTE = "Deployed the kubernetes cluster upgrade on Monday; the tea kettle broke.\n"
ALICE = [
    ("user", "My parrot is called Zanzibar and he eats mango every morning."),
    ("assistant", "Zanzibar and mango, noted."),
]
BOB = [
    ("user", "My parrot is called Quetzal; my locker code hint is lighthouse."),
    ("assistant", "Quetzal and the lighthouse hint, noted."),
]
ALICE_SCOPES = (AGENT_SCOPE, "peer:alice")
BOB_SCOPES = (AGENT_SCOPE, "peer:bob")
RESULT_FIELDS = {"path", "start_line", "end_line", "score", "snippet", "source", "citation"}


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = make_layout(tmp_path)
    layout.write("MEMORY.md", MEMORY_MD)
    layout.write("memory/2026-01-05.md", NOTE)
    layout.write("AGENTS.md", "# Agents\nThe operator's pager number is 555-0199.\n")
    layout.transcript("s-alice", ALICE, scope="peer:alice")
    layout.transcript("s-bob", BOB, scope="peer:bob")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("outside secret\n", encoding="utf-8")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "allowed.md").write_text("extra line one\nextra line two\n", encoding="utf-8")
    (extra / "sibling.md").write_text("not configured\n", encoding="utf-8")
    (layout.workspace / "memory" / "link.md").symlink_to(outside / "secret.md")
    return layout


@pytest.fixture
async def index(layout: Layout, tmp_path: Path) -> AsyncIterator[MemoryIndex]:
    settings = quiet_settings(extra_paths=(tmp_path / "extra" / "allowed.md",))
    index = MemoryIndex(
        settings,
        db_path=layout.db,
        workspace=layout.workspace,
        sessions_dir=layout.sessions,
        embedder=resilient(HashingEmbedder()),
    )
    await index.start()
    report = await index.sync()
    assert report.errors == [] and report.files_indexed == 5
    try:
        yield index
    finally:
        await index.close()


@pytest.fixture
def registry(index: MemoryIndex) -> ToolRegistry:
    registry = ToolRegistry()
    for tool in memory_tools(index):
        registry.register(tool)
    return registry


def context(layout: Layout, scopes: tuple[str, ...] | None = ALICE_SCOPES) -> ToolContext:
    extra = {} if scopes is None else {SCOPES_KEY: scopes}
    return ToolContext(workspace=layout.workspace, session_key="s", extra=extra)


async def call(
    registry: ToolRegistry, ctx: ToolContext, name: str, **arguments: Any
) -> ToolResultBlock:
    result = await registry.run(ToolUseBlock("call-1", name, arguments), ctx)
    assert result.tool_use_id == "call-1"
    return result


async def search(
    registry: ToolRegistry, ctx: ToolContext, query: str, **arguments: Any
) -> dict[str, Any]:
    result = await call(registry, ctx, MEMORY_SEARCH_TOOL, query=query, **arguments)
    assert not result.is_error, result.content
    payload = json.loads(result.content)
    assert isinstance(payload, dict)
    return payload


def test_both_tools_are_offered_with_their_schemas(registry: ToolRegistry) -> None:
    specs = {spec.name: spec for spec in registry.specs()}
    assert set(specs) == {MEMORY_SEARCH_TOOL, MEMORY_GET_TOOL}
    assert specs[MEMORY_SEARCH_TOOL].input_schema["required"] == ["query"]
    assert specs[MEMORY_GET_TOOL].input_schema["required"] == ["path"]


# -- memory_search ------------------------------------------------------------------------


async def test_search_returns_cited_results_as_json(registry: ToolRegistry, layout: Layout) -> None:
    payload = await search(registry, context(layout), "oolong tea")
    results = payload["results"]
    assert results, payload
    for result in results:
        assert set(result) == RESULT_FIELDS
        assert (
            result["citation"] == f"{result['path']}#L{result['start_line']}-L{result['end_line']}"
        )
        assert 0 < result["score"] <= 1
        assert result["start_line"] <= result["end_line"]
    best = results[0]
    assert best["path"] == "MEMORY.md" and best["source"] == "memory"
    assert "oolong, brewed at 90 degrees" in best["snippet"]
    # The cited lines hold the snippet's fact.
    lines = MEMORY_MD.split("\n")[best["start_line"] - 1 : best["end_line"]]
    assert any("oolong" in line for line in lines)
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert payload["mode"] == "hybrid" and payload["provider"] == "fake"
    assert "note" not in payload


async def test_search_finds_the_conversations_own_transcript(
    registry: ToolRegistry, layout: Layout
) -> None:
    payload = await search(registry, context(layout), "what does Zanzibar eat")
    hit = next(r for r in payload["results"] if r["path"] == "sessions/s-alice.jsonl")
    assert hit["source"] == "sessions" and "mango" in hit["snippet"]


async def test_max_results_caps_the_list(registry: ToolRegistry, layout: Layout) -> None:
    query = "tea oolong kettle Priya Lisbon standup"
    everything = await search(registry, context(layout), query, min_score=0)
    assert len(everything["results"]) >= 2
    one = await search(registry, context(layout), query, min_score=0, max_results=1)
    assert len(one["results"]) == 1
    assert one["results"][0]["citation"] == everything["results"][0]["citation"]


async def test_min_score_filters_weak_results(registry: ToolRegistry, layout: Layout) -> None:
    query = "tea oolong kettle"
    loose = (await search(registry, context(layout), query, min_score=0))["results"]
    scores = [r["score"] for r in loose]
    assert len(scores) >= 2 and scores[0] > scores[-1]
    threshold = (scores[0] + scores[-1]) / 2
    strict = (await search(registry, context(layout), query, min_score=threshold))["results"]
    assert strict and len(strict) < len(loose)
    assert all(r["score"] >= threshold for r in strict)


async def test_min_score_one_leaves_nothing_when_no_keyword_matches(
    registry: ToolRegistry, layout: Layout
) -> None:
    # No keyword matches: only vector candidates, which score below 1.
    query = "qwxv zzyzx"
    loose = await search(registry, context(layout), query, min_score=0)
    assert loose["results"]
    strict = await search(registry, context(layout), query, min_score=1)
    assert strict["results"] == []
    assert "no memory matched" in strict["note"]


@pytest.mark.parametrize("scopes", [None, ()])
async def test_search_refuses_without_scopes(
    registry: ToolRegistry, layout: Layout, scopes: tuple[str, ...] | None
) -> None:
    result = await call(registry, context(layout, scopes), MEMORY_SEARCH_TOOL, query="oolong")
    assert result.is_error
    assert result.content == "memory search is not available in this conversation"


async def test_blank_query_is_refused(registry: ToolRegistry, layout: Layout) -> None:
    result = await call(registry, context(layout), MEMORY_SEARCH_TOOL, query="   ")
    assert result.is_error and result.content == "query is empty"


async def test_bad_arguments_come_back_as_errors(registry: ToolRegistry, layout: Layout) -> None:
    ctx = context(layout)
    result = await call(registry, ctx, MEMORY_SEARCH_TOOL, query="tea", max_results=0)
    assert result.is_error and "max_results" in result.content
    result = await call(registry, ctx, MEMORY_SEARCH_TOOL, query="tea", scope="peer:bob")
    assert result.is_error and "unknown argument 'scope'" in result.content


async def test_search_never_returns_another_scopes_transcript(
    registry: ToolRegistry, layout: Layout
) -> None:
    query = "Quetzal locker code hint lighthouse"
    for min_score in (None, 0):
        extra = {} if min_score is None else {"min_score": min_score}
        result = await call(registry, context(layout), MEMORY_SEARCH_TOOL, query=query, **extra)
        assert not result.is_error
        assert "lighthouse" not in result.content and "Quetzal" not in result.content
        paths = {r["path"] for r in json.loads(result.content)["results"]}
        assert "sessions/s-bob.jsonl" not in paths
    # The words are there, for the conversation they belong to.
    bob = await search(registry, context(layout, BOB_SCOPES), query)
    assert any("lighthouse" in r["snippet"] for r in bob["results"])
    assert all(r["path"] != "sessions/s-alice.jsonl" for r in bob["results"])


async def test_a_closed_index_is_reported_not_raised(
    registry: ToolRegistry, layout: Layout, index: MemoryIndex
) -> None:
    await index.close()
    result = await call(registry, context(layout), MEMORY_SEARCH_TOOL, query="oolong")
    assert result.is_error
    assert result.content.startswith("memory search is unavailable:")


# -- memory_get ---------------------------------------------------------------------------


async def test_get_reads_lines_of_memory_md(registry: ToolRegistry, layout: Layout) -> None:
    ctx = context(layout)
    whole = await call(registry, ctx, MEMORY_GET_TOOL, path="MEMORY.md")
    assert not whole.is_error and whole.content == MEMORY_MD
    part = await call(registry, ctx, MEMORY_GET_TOOL, path="MEMORY.md", lines=2, **{"from": 3})
    assert not part.is_error
    assert part.content == (
        "- The user's favourite tea is oolong, brewed at 90 degrees.\n"
        "- The user's sister Priya lives in Lisbon.\n"
    )
    tail = await call(registry, ctx, MEMORY_GET_TOOL, path="MEMORY.md", **{"from": 5})
    assert tail.content == "- Standup moved to 09:30 on Tuesdays.\n"


async def test_get_reads_notes_and_configured_extra_paths(
    registry: ToolRegistry, layout: Layout, tmp_path: Path
) -> None:
    ctx = context(layout)
    note = await call(registry, ctx, MEMORY_GET_TOOL, path="memory/2026-01-05.md")
    assert not note.is_error and note.content == NOTE
    extra = str(tmp_path / "extra" / "allowed.md")
    read = await call(registry, ctx, MEMORY_GET_TOOL, path=extra, lines=1, **{"from": 2})
    assert not read.is_error and read.content == "extra line two\n"


async def test_get_of_a_missing_memory_file_says_so(registry: ToolRegistry, layout: Layout) -> None:
    ctx = context(layout)
    missing = await call(registry, ctx, MEMORY_GET_TOOL, path="memory/2099-01-01.md")
    assert not missing.is_error
    assert missing.content == "(memory/2099-01-01.md is empty or has no such lines)"
    past_end = await call(registry, ctx, MEMORY_GET_TOOL, path="MEMORY.md", **{"from": 500})
    assert past_end.content == "(MEMORY.md is empty or has no such lines)"


@pytest.mark.parametrize(
    "path",
    [
        "AGENTS.md",
        "SOUL.md",
        "sessions/s-alice.jsonl",
        "sessions/x.jsonl",
        "../sessions/s-bob.jsonl",
        "../outside/secret.md",
        "memory/../AGENTS.md",
        "memory/../../outside/secret.md",
        "memory/link.md",  # a symlink out of the workspace
        "memory/notes.txt",
        "memory",
    ],
)
async def test_get_refuses_anything_but_memory_files(
    registry: ToolRegistry, layout: Layout, path: str
) -> None:
    result = await call(registry, context(layout), MEMORY_GET_TOOL, path=path)
    assert result.is_error
    assert result.content == (
        f"{path!r} is not a memory file (MEMORY.md, memory/**/*.md or an extra path)"
    )


async def test_get_refuses_absolute_paths_outside_the_extra_paths(
    registry: ToolRegistry, layout: Layout, tmp_path: Path
) -> None:
    ctx = context(layout)
    for path in (
        tmp_path / "outside" / "secret.md",
        tmp_path / "extra" / "sibling.md",  # next to a configured file, not configured
        tmp_path / "extra" / ".." / "outside" / "secret.md",
        layout.workspace / "AGENTS.md",
        Path("/etc/passwd"),
    ):
        result = await call(registry, ctx, MEMORY_GET_TOOL, path=str(path))
        assert result.is_error, path
        assert "is not a memory file" in result.content
        assert "secret" not in result.content.split("'")[-1]


async def test_get_never_returns_a_refused_files_text(
    registry: ToolRegistry, layout: Layout
) -> None:
    result = await call(registry, context(layout), MEMORY_GET_TOOL, path="AGENTS.md")
    assert result.is_error and "555-0199" not in result.content


async def test_get_checks_its_arguments(registry: ToolRegistry, layout: Layout) -> None:
    ctx = context(layout)
    result = await call(registry, ctx, MEMORY_GET_TOOL, path="MEMORY.md", **{"from": 0})
    assert result.is_error and "'from' must be at least 1" in result.content
    result = await call(registry, ctx, MEMORY_GET_TOOL, path="MEMORY.md", lines=5000)
    assert result.is_error and "'lines' must be at most 2000" in result.content


@pytest.mark.parametrize("extra", ["../shared/notes.md", "../shared"])
async def test_get_reads_what_search_cites_for_a_relative_extra_path(
    layout: Layout, tmp_path: Path, extra: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "notes.md").write_text("The boat is moored at pier seven.\n", encoding="utf-8")
    index = MemoryIndex(
        quiet_settings(extra_paths=(Path(extra),)),
        db_path=tmp_path / "other.db",
        workspace=layout.workspace,
        sessions_dir=layout.sessions,
        embedder=resilient(HashingEmbedder()),
    )
    await index.start()
    try:
        registry = ToolRegistry()
        for tool in memory_tools(index):
            registry.register(tool)
        found = await search(registry, context(layout), "where is the boat moored")
        [hit] = [r for r in found["results"] if "pier seven" in r["snippet"]]
        assert hit["path"] == str(shared / "notes.md")
        result = await call(registry, context(layout), MEMORY_GET_TOOL, path=hit["path"])
        assert not result.is_error, result.content
        assert result.content == "The boat is moored at pier seven.\n"
    finally:
        await index.close()
