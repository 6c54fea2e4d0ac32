"""Automatic recall in the running gateway: what the model is sent, the conversation's
scope, the index's debounce left alone, and what /context and the admin API report.
Real state.db, transcripts, lanes, memory.db and admin server; scripted provider,
recording channel, deterministic embedder."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from parley.core.memory.recall import RECALL_META_KEY, is_recall_block
from parley.core.messages import TextBlock
from parley.gateway.app import Gateway
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import memory_config, say, spy_on_sync, use_hashing_embedder

ROUTER_NOTE = "# 2026-02-20\n\n- The wifi router lives behind the bookshelf in the study.\n"
NOTE_PATH = "memory/2026-02-20.md"
QUESTION = "do you remember where the wifi router is?"
ALICE_KEY = "agent:main:test:direct:alice"

Stack = tuple[Gateway, RecordingChannel, ScriptedProvider]


async def open_stack(
    home: Path, monkeypatch: pytest.MonkeyPatch, **env: str
) -> AsyncIterator[Stack]:
    use_hashing_embedder(monkeypatch)
    workspace = home / "workspace"
    (workspace / "memory").mkdir(parents=True)
    (workspace / NOTE_PATH).write_text(ROUTER_NOTE, encoding="utf-8")
    channel, provider = RecordingChannel(), ScriptedProvider()
    gateway = Gateway(memory_config(home, **env), channels=[channel], provider=provider)
    async with gateway:
        assert gateway.memory is not None
        await gateway.memory.sync()
        yield gateway, channel, provider


@pytest.fixture
async def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    async for opened in open_stack(tmp_path, monkeypatch):
        yield opened


def recall_blocks(provider: ScriptedProvider) -> list[TextBlock]:
    last = provider.requests[-1].messages[-1]
    return [b for b in last.content if isinstance(b, TextBlock) and is_recall_block(b)]


async def test_a_question_about_the_past_gets_cited_memory(stack: Stack) -> None:
    gateway, channel, provider = stack
    reply = await say(gateway, channel, QUESTION, sender="alice")
    assert reply == f"echo: {QUESTION}"
    (block,) = recall_blocks(provider)
    assert f"[{NOTE_PATH}#L" in block.text and "bookshelf" in block.text
    assert "bookshelf" not in provider.requests[-1].system
    # Small talk does not trigger "auto" recall.
    await say(gateway, channel, "tell me a joke", sender="alice")
    assert recall_blocks(provider) == []


async def test_recall_searches_only_this_conversations_scope(stack: Stack) -> None:
    gateway, channel, provider = stack
    await say(gateway, channel, "my alarm code is zebra-4471", sender="bob")
    # A new session: the code is no longer in Bob's live context, only in memory.
    await say(gateway, channel, "/new", sender="bob")
    assert gateway.memory is not None
    await gateway.memory.sync()  # Bob's old transcript is indexed, in Bob's scope
    await say(gateway, channel, "what did I say the alarm code zebra was?", sender="bob")
    assert any("zebra-4471" in b.text for b in recall_blocks(provider))
    await say(gateway, channel, "what did I say the alarm code zebra was?", sender="alice")
    assert not any("zebra-4471" in b.text for b in recall_blocks(provider))


async def test_recall_does_not_hold_back_for_a_sync(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channel, provider = stack
    assert gateway.memory is not None
    spy = spy_on_sync(gateway.memory, monkeypatch)
    await say(gateway, channel, QUESTION, sender="alice")
    await say(gateway, channel, "and what did I say before that?", sender="alice")
    assert len(provider.requests) == 2
    # Each turn's transcript sync waits for the debounce; recall did not force one.
    assert spy.reasons == []


async def test_recall_off_injects_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async for gateway, channel, provider in open_stack(
        tmp_path, monkeypatch, PARLEY_MEMORY__RECALL="off"
    ):
        await say(gateway, channel, QUESTION, sender="alice")
        assert recall_blocks(provider) == []


async def test_context_and_admin_api_show_the_last_recall(stack: Stack) -> None:
    gateway, channel, _ = stack
    await say(gateway, channel, QUESTION, sender="alice")
    record = await gateway.registry.get_active(ALICE_KEY)
    assert record is not None
    transcript = await gateway.transcript(record)
    user = next(e for e in transcript.entries() if e.type == "message")
    stored = user.meta[RECALL_META_KEY]
    citation = stored["hits"][0]["citation"]
    assert citation.startswith(f"{NOTE_PATH}#L")

    listing = await say(gateway, channel, "/context", sender="alice")
    assert "Recalled memory (last turn, auto, past)" in listing
    assert f"  {citation} (~{stored['hits'][0]['tokens']:,} tok)" in listing
    as_json = json.loads(await say(gateway, channel, "/context json", sender="alice"))
    assert as_json["recall"]["hits"][0]["citation"] == citation
    assert as_json["recall"]["tokens"] == stored["tokens"]

    assert gateway.http is not None
    headers = {"Authorization": f"Bearer {gateway.http.token.value}"}
    url = gateway.http.url("").rstrip("/") + f"/api/sessions/{record.session_id}/context"
    async with aiohttp.ClientSession(headers=headers) as client, client.get(url) as response:
        assert response.status == 200
        body = await response.json()
    assert body["recall"]["mode"] == "auto"
    assert [h["citation"] for h in body["recall"]["hits"]] == [
        h["citation"] for h in stored["hits"]
    ]
    assert body["recall"]["tokens"] == stored["tokens"]
    assert body["report"]["recall"] == body["recall"]

    # A turn without recall: /context no longer reports one.
    await say(gateway, channel, "tell me a joke", sender="alice")
    assert "Recalled memory" not in await say(gateway, channel, "/context", sender="alice")
