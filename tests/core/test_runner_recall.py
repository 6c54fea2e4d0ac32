"""The runner's automatic recall: where the block goes (the user message, never the system
prompt), what the transcript records, and that a failing index costs only the recall."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from parley.core.agent_config import AgentConfig
from parley.core.context.config import ContextConfig
from parley.core.errors import MemoryIndexError
from parley.core.memory.index import MemoryIndex
from parley.core.memory.recall import (
    RECALL_META_KEY,
    Recaller,
    RecallSearch,
    index_search,
    is_recall_block,
)
from parley.core.memory.rows import SearchHit
from parley.core.messages import Message, TextBlock, ToolUseBlock, Usage
from parley.core.prompt import SystemPromptBuilder, is_turn_context
from parley.core.providers.base import STOP_END, STOP_TOOL_USE, ProviderResponse
from parley.core.providers.provider_config import RetryConfig
from parley.core.runner import Runner, TurnRequest
from parley.core.tokens import default_counter
from parley.core.tools.builtin import default_registry
from parley.core.transcript import Transcript
from tests.core.memory.helpers import Layout, make_layout, open_index, quiet_settings
from tests.fakes.embedder import HashingEmbedder, resilient
from tests.fakes.scripted_provider import ScriptedProvider

SCOPES = ("agent", "person:alice")
CONTEXT = "<turn-context>time: now</turn-context>"


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = make_layout(tmp_path / "mem")
    layout.write("MEMORY.md", "# People\n\nThe user's sister Ana lives in Porto and sings.\n")
    layout.write("memory/2026-01-05.md", "# Trip\n\nBooked the night train to Vienna.\n")
    return layout


@pytest.fixture
async def index(layout: Layout) -> AsyncIterator[MemoryIndex]:
    async with open_index(layout, quiet_settings(), resilient(HashingEmbedder())) as index:
        await index.sync()  # recall searches what is indexed; it never waits for a sync
        yield index


def make_runner(
    workspace: Path, provider: ScriptedProvider, recaller: Recaller | None = None
) -> Runner:
    tools = default_registry(10_000)
    return Runner(
        provider=provider,
        tools=tools,
        prompt=SystemPromptBuilder(workspace, agent_name="T", tools=tools.specs()),
        agent=AgentConfig(),
        retry=RetryConfig(max_attempts=1),
        workspace=workspace,
        recaller=recaller,
    )


def recaller_for(search: RecallSearch, mode: str = "auto") -> Recaller:
    return Recaller(search, counter=default_counter(), mode=mode)  # type: ignore[arg-type]


def turn(text: str, **kwargs: object) -> TurnRequest:
    return TurnRequest("k", text, context_text=CONTEXT, memory_scopes=SCOPES, **kwargs)  # type: ignore[arg-type]


class Recording:
    def __init__(self, inner: RecallSearch) -> None:
        self.inner = inner
        self.queries: list[str] = []

    async def __call__(self, query: str, *, scopes: Sequence[str]) -> Sequence[SearchHit]:
        self.queries.append(query)
        return await self.inner(query, scopes=scopes)


async def test_recall_rides_in_the_user_message_and_the_system_prompt_is_unchanged(
    tmp_path: Path, index: MemoryIndex
) -> None:
    question = "where does my sister Ana live?"
    systems = []
    for name, recaller in (("off", None), ("on", recaller_for(index_search(index)))):
        provider = ScriptedProvider()
        with Transcript.create(tmp_path / f"{name}.jsonl", name, "k") as transcript:
            result = await make_runner(tmp_path, provider, recaller).run_turn(
                transcript, turn(question)
            )
        systems.append(provider.requests[0].system)
        sent = provider.requests[0].messages[-1]
        if recaller is None:
            assert result.recall is None
            assert not any(is_recall_block(b) for b in sent.content)
        else:
            assert result.recall is not None and result.recall.hits
            # Recalled notes first, then the user's words, then the turn context.
            recall_block, words, context = sent.content
            assert is_recall_block(recall_block) and "MEMORY.md#L" in recall_block.text
            assert "Porto" in recall_block.text
            assert words == TextBlock(question)
            assert is_turn_context(context)
            # The scripted fake echoes the user's words, not the recalled notes.
            assert result.reply == f"echo: {question}"
    assert systems[0] == systems[1]
    assert "Porto" not in systems[1]


async def test_the_transcript_records_what_was_injected(tmp_path: Path, index: MemoryIndex) -> None:
    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        result = await make_runner(
            tmp_path, ScriptedProvider(), recaller_for(index_search(index))
        ).run_turn(transcript, turn("what did I book for Vienna?", meta={"inbox_ids": [7]}))
        user = next(e for e in transcript.entries() if e.type == "message")
    assert result.recall is not None
    record = user.meta[RECALL_META_KEY]
    assert user.meta["inbox_ids"] == [7]  # the gateway's own meta is kept beside it
    assert record == result.recall.to_meta()
    assert record["mode"] == "auto" and record["reason"] == "past_question"
    assert record["hits"][0]["citation"] == result.recall.hits[0].citation
    assert record["tokens"] == default_counter().text(user.message.content[0].text)


async def test_the_next_turn_skips_what_the_last_one_recalled(
    tmp_path: Path, index: MemoryIndex
) -> None:
    runner = make_runner(tmp_path, ScriptedProvider(), recaller_for(index_search(index), "always"))
    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        first = await runner.run_turn(transcript, turn("sister Ana Porto"))
        second = await runner.run_turn(transcript, turn("sister Ana Porto"))
    assert first.recall is not None and first.recall.hits
    assert second.recall is not None
    cited = {h.citation for h in first.recall.hits}
    assert not cited & {h.citation for h in second.recall.hits}
    assert second.recall.skipped_present >= len(cited)


async def test_a_short_follow_up_searches_with_the_previous_message(
    tmp_path: Path, index: MemoryIndex
) -> None:
    search = Recording(index_search(index))
    runner = make_runner(tmp_path, ScriptedProvider(), recaller_for(search, "always"))
    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        await runner.run_turn(transcript, turn("tell me about my sister"))
        await runner.run_turn(transcript, turn("and where?"))
    assert search.queries == ["tell me about my sister", "and where?\ntell me about my sister"]


async def test_a_failing_index_costs_the_recall_not_the_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(query: str, *, scopes: Sequence[str]) -> Sequence[SearchHit]:
        raise MemoryIndexError("the memory index is not open")

    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        result = await make_runner(tmp_path, ScriptedProvider(), recaller_for(broken)).run_turn(
            transcript, turn("do you remember my sister?")
        )
        user = next(e for e in transcript.entries() if e.type == "message")
    assert result.reply == "echo: do you remember my sister?"
    assert result.recall is None
    assert RECALL_META_KEY not in user.meta
    assert "recall skipped" in caplog.text and "MemoryIndexError" in caplog.text


async def test_no_recall_when_not_triggered_or_resumed(tmp_path: Path, index: MemoryIndex) -> None:
    search = Recording(index_search(index))
    runner = make_runner(tmp_path, ScriptedProvider(), recaller_for(search))
    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        plain = await runner.run_turn(transcript, turn("tell me a joke"))
        transcript.append_message(Message.user("remember Ana?"))  # written before a crash
        resumed = await runner.run_turn(transcript, turn("remember Ana?", resume=True))
    assert plain.recall is None and resumed.recall is None
    assert search.queries == []


async def test_the_engine_may_idle_while_tools_run(tmp_path: Path) -> None:
    provider = ScriptedProvider()
    provider.push(
        ProviderResponse((ToolUseBlock("t1", "current_time", {}),), STOP_TOOL_USE, Usage(1, 1)),
        ProviderResponse((TextBlock("done"),), STOP_END, Usage(1, 1)),
    )
    runner = make_runner(tmp_path, provider)
    idled: list[str] = []

    async def idle(session_key: str) -> None:
        idled.append(session_key)

    runner.engine.idle = idle  # type: ignore[attr-defined]
    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        result = await runner.run_turn(transcript, turn("what time is it"))
    assert result.reply == "done"
    assert idled == ["k"]


async def test_memory_the_system_prompt_already_holds_is_not_recalled(
    layout: Layout, index: MemoryIndex
) -> None:
    # The runner's workspace is the indexed one: MEMORY.md is in the system prompt.
    runner = make_runner(
        layout.workspace, ScriptedProvider(), recaller_for(index_search(index), "always")
    )
    with Transcript.create(layout.workspace / "t.jsonl", "t", "k") as transcript:
        result = await runner.run_turn(transcript, turn("sister Ana Porto, night train Vienna"))
    assert result.recall is not None
    paths = [h.path for h in result.recall.hits]
    assert "memory/2026-01-05.md" in paths
    assert "MEMORY.md" not in paths
    assert result.recall.skipped_present >= 1


@pytest.mark.parametrize(("window", "cap"), [(2_048, 153), (200_000, 1_500)])
async def test_the_recall_block_is_capped_to_the_windows_share(
    tmp_path: Path, window: int, cap: int
) -> None:
    """1,500 tokens of notes would be most of a 2,048-token window."""
    notes = [
        SearchHit(
            f"memory/day{n}.md", 1, 9, 1.0 - n / 10, "Ana sings in Porto. " * 60, "memory", "agent"
        )
        for n in range(6)
    ]

    async def search(query: str, *, scopes: Sequence[str]) -> Sequence[SearchHit]:
        return notes

    provider = ScriptedProvider()
    runner = make_runner(tmp_path, provider, recaller_for(search, mode="always"))
    runner.engine.config = ContextConfig.model_validate(
        {"models": {provider.model: {"context_tokens": window}}}
    )
    with Transcript.create(tmp_path / "t.jsonl", "t", "k") as transcript:
        result = await runner.run_turn(transcript, turn("where does Ana sing?"))
    assert result.recall is not None and result.recall.hits
    assert cap - 30 <= result.recall.tokens <= cap
