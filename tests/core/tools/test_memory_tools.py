"""memory_search, memory_get and remember as the model meets them: registered in a real
ToolRegistry and run through ``ToolRegistry.run`` (so every refusal comes back as an
error result), over a real index of a seeded workspace with the deterministic embedder.
Every call carries the turn's scopes and viewer in ``ToolContext.extra``, as the runner
passes them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.audience import AGENT, Audience, Viewer
from parley.core.memory.index import MemoryIndex
from parley.core.memory.sources import AGENT_SCOPE
from parley.core.messages import ToolResultBlock, ToolUseBlock
from parley.core.prompt import MEMORY_GET_TOOL, MEMORY_SEARCH_TOOL
from parley.core.tools.memory import REMEMBER_TOOL, SCOPES_KEY, VIEWER_KEY, memory_tools
from parley.core.tools.tool_registry import ToolContext, ToolRegistry
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
ALICE_SCOPES = (AGENT_SCOPE, "person:alice")
BOB_SCOPES = (AGENT_SCOPE, "person:bob")
ALICE_VIEWER = Viewer(Audience.person("alice"), frozenset({"alice"}))
BOB_VIEWER = Viewer(Audience.person("bob"), frozenset({"bob"}))
RESULT_FIELDS = {"path", "start_line", "end_line", "score", "snippet", "source", "citation"}


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = make_layout(tmp_path)
    layout.write("MEMORY.md", MEMORY_MD)
    layout.write("memory/2026-01-05.md", NOTE)
    layout.write("AGENTS.md", "# Agents\nThe operator's pager number is 555-0199.\n")
    layout.transcript("s-alice", ALICE, scope="person:alice")
    layout.transcript("s-bob", BOB, scope="person:bob")
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


def context(
    layout: Layout,
    scopes: tuple[str, ...] | None = ALICE_SCOPES,
    viewer: Viewer | None = ALICE_VIEWER,
) -> ToolContext:
    """What the runner hands a turn's tools: its scopes and its viewer (None: left out)."""
    extra: dict[str, Any] = {}
    if scopes is not None:
        extra[SCOPES_KEY] = scopes
    if viewer is not None:
        extra[VIEWER_KEY] = viewer
    return ToolContext(workspace=layout.workspace, session_key="s", extra=extra)


def refused(path: str) -> str:
    """memory_get's one refusal, for anything it will not read."""
    return (
        f"{path!r} is not a memory file you can read (MEMORY.md, memory/**/*.md, "
        "an extra path, or a notes/ path a search of this conversation cited)"
    )


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


def test_the_three_tools_are_offered_with_their_schemas(registry: ToolRegistry) -> None:
    specs = {spec.name: spec for spec in registry.specs()}
    assert set(specs) == {MEMORY_SEARCH_TOOL, MEMORY_GET_TOOL, REMEMBER_TOOL}
    assert specs[MEMORY_SEARCH_TOOL].input_schema["required"] == ["query"]
    assert specs[MEMORY_GET_TOOL].input_schema["required"] == ["path"]
    remember = specs[REMEMBER_TOOL].input_schema
    assert remember["required"] == ["text"]
    # Where a note goes is code's decision: the model cannot name an audience or a file.
    assert set(remember["properties"]) == {"text"}
    assert remember["additionalProperties"] is False


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
    result = await call(registry, ctx, MEMORY_SEARCH_TOOL, query="tea", scope="person:bob")
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
    assert result.content == refused(path)


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


async def test_get_needs_a_viewer(registry: ToolRegistry, layout: Layout) -> None:
    result = await call(registry, context(layout, viewer=None), MEMORY_GET_TOOL, path="MEMORY.md")
    assert result.is_error
    assert result.content == "memory is not available in this conversation"


# -- remember and the notes ---------------------------------------------------------------


async def test_remember_stores_in_the_viewers_own_audience(
    registry: ToolRegistry, layout: Layout, index: MemoryIndex
) -> None:
    result = await call(
        registry, context(layout), REMEMBER_TOOL, text="  Alice's  boat is the Kittiwake. "
    )
    assert not result.is_error, result.content
    citation = "notes/person/alice/remembered.md#L1"
    assert result.content == f"remembered ({citation})"
    stored = index.notes.folder(Audience.person("alice")) / "remembered.md"
    [line] = stored.read_text(encoding="utf-8").splitlines()
    assert line.startswith("- Alice's boat is the Kittiwake. (")
    # Private notes, outside the workspace (no file tool reaches them), nobody else's.
    assert not stored.is_relative_to(layout.workspace)
    assert [n.path for n in index.notes.files()] == ["notes/person/alice/remembered.md"]

    # Alice's search finds it (the note made the index dirty: the search syncs first),
    # and memory_get reads the line it cites.
    found = await search(registry, context(layout), "what is the boat called", min_score=0)
    hit = next(r for r in found["results"] if "Kittiwake" in r["snippet"])
    assert hit["path"] == "notes/person/alice/remembered.md" and hit["source"] == "notes"
    read = await call(registry, context(layout), MEMORY_GET_TOOL, path=hit["path"])
    assert not read.is_error and "Kittiwake" in read.content


async def test_another_audiences_note_is_unreachable(
    registry: ToolRegistry, layout: Layout
) -> None:
    await call(registry, context(layout), REMEMBER_TOOL, text="Alice's safe word is heliotrope.")
    bob = context(layout, BOB_SCOPES, BOB_VIEWER)
    for min_score in (None, 0):
        extra = {} if min_score is None else {"min_score": min_score}
        found = await call(registry, bob, MEMORY_SEARCH_TOOL, query="safe word heliotrope", **extra)
        assert not found.is_error and "heliotrope" not in found.content
        assert "notes/person/alice" not in found.content
    # memory_get of Alice's note from Bob's chat: the refusal a missing note gets, word
    # for word, so the answer does not even say the note exists.
    existing = "notes/person/alice/remembered.md"
    missing = "notes/person/alice/2001-01-01.md"
    denied = await call(registry, bob, MEMORY_GET_TOOL, path=existing)
    absent = await call(registry, bob, MEMORY_GET_TOOL, path=missing)
    assert denied.is_error and absent.is_error
    assert denied.content == refused(existing)
    assert absent.content == refused(missing)
    assert "heliotrope" not in denied.content
    # The words are there, for the person they belong to: the audience, not the query,
    # kept them from Bob.
    alice = await search(registry, context(layout), "safe word heliotrope")
    assert any("heliotrope" in r["snippet"] for r in alice["results"])


async def test_remember_in_a_group_goes_to_the_group(
    registry: ToolRegistry, layout: Layout, index: MemoryIndex
) -> None:
    group = Audience.conversation("telegram:-100")
    ctx = context(layout, (AGENT_SCOPE, group.scope), Viewer(group))
    result = await call(registry, ctx, REMEMBER_TOOL, text="The team offsite is in Porto.")
    assert result.content == "remembered (notes/conversation/telegram%3A-100/remembered.md#L1)"
    assert (index.notes.folder(group) / "remembered.md").is_file()
    # Alice's direct chat does not see what the group keeps.
    read = await call(
        registry,
        context(layout),
        MEMORY_GET_TOOL,
        path="notes/conversation/telegram%3A-100/remembered.md",
    )
    assert read.is_error and "Porto" not in read.content


@pytest.mark.parametrize(
    ("viewer", "message"),
    [
        (None, "memory is not available in this conversation"),
        (
            Viewer(AGENT),
            "could not remember it: nothing the bot writes on its own is agent-wide",
        ),
        (
            Viewer.for_operator(),
            "could not remember it: nothing the bot writes on its own is agent-wide",
        ),
    ],
    ids=["no-viewer", "agent", "operator"],
)
async def test_remember_is_refused_without_an_audience(
    registry: ToolRegistry, layout: Layout, index: MemoryIndex, viewer: Viewer | None, message: str
) -> None:
    ctx = context(layout, viewer=viewer)
    result = await call(registry, ctx, REMEMBER_TOOL, text="Remember this for everyone.")
    assert result.is_error and result.content == message
    assert index.notes.files() == []
    assert not index.notes.root.exists()


async def test_remember_refuses_blank_text(
    registry: ToolRegistry, layout: Layout, index: MemoryIndex
) -> None:
    result = await call(registry, context(layout), REMEMBER_TOOL, text="   ")
    assert result.is_error and result.content == "text is empty"
    result = await call(registry, context(layout), REMEMBER_TOOL, text="x", where="agent")
    assert result.is_error and "unknown argument 'where'" in result.content
    assert index.notes.files() == []
