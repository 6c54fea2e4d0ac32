"""The admin API of a gateway whose state, transcripts and memory are in PostgreSQL:
archived transcripts come from the transcript table (there are no files to read), and
memory search finds what was said. ``vector_index = "exact"``: this machine's pgvector
cannot compute distances (see tests/gateway/test_memory_pg_gateway.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from parley.core.transcript_store import TranscriptStore
from parley.gateway.admin.service import AdminService
from tests.gateway.admin.conftest import FACT, AdminWorld, admin_world, tool_call
from tests.gateway.memory_helpers import use_hashing_embedder


@pytest.fixture
async def pg_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> AsyncIterator[AdminWorld]:
    use_hashing_embedder(monkeypatch)
    async with admin_world(
        tmp_path / "home",
        seed_one_turn,
        PARLEY_STORAGE__BACKEND="postgres",
        PARLEY_STORAGE__URL=pg_url,
        PARLEY_STORAGE__VECTOR_INDEX="exact",
    ) as world:
        yield world


async def seed_one_turn(world: AdminWorld) -> str:
    """One turn with a tool call, then a compaction entry; returns the session id."""
    gateway, channel = world.gateway, world.channel
    world.provider.push(tool_call("list_files", path="."))
    await gateway.handle_inbound(channel.inbound(FACT, sender="alice"))
    await channel.wait_sent(1)
    await gateway.wait_idle()
    record = (await gateway.registry.list(query="alice", status="active")).sessions[0]
    transcript = await gateway.transcript(record)
    first = next(iter(await asyncio.to_thread(lambda: list(transcript.entries()))))
    entry = await asyncio.to_thread(
        transcript.append_compaction,
        "The user asked which files exist; the agent listed them.",
        first_kept_entry_id=first.id,
        tokens_before=1200,
        tokens_after=400,
        trigger="manual",
        details={"ledger": {"identifiers": ["notes.md"]}},
    )
    await gateway.registry.record_entries(record.session_id, transcript.entry_count, entry.id)
    return record.session_id


@pytest.fixture
async def pg_client(pg_world: AdminWorld) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        base_url=pg_world.base_url, headers=pg_world.headers
    ) as session:
        yield session


async def _all_pages(client: aiohttp.ClientSession, session_id: str) -> tuple[int, list[dict]]:
    base = f"/api/sessions/{session_id}/transcript"
    items: list[dict] = []
    cursor = None
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        async with client.get(base, params=params) as response:
            assert response.status == 200, await response.text()
            page = await response.json()
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return page["total"], items


async def test_an_archived_transcript_is_read_from_postgres(
    pg_world: AdminWorld, pg_client: aiohttp.ClientSession
) -> None:
    world = pg_world
    async with pg_client.post(f"/api/sessions/{world.session_id}/reset") as response:
        assert response.status == 200
    # No file anywhere: the sessions directory holds nothing of this session.
    assert not list(world.home.glob(f"**/{world.session_id}.jsonl"))

    total, items = await _all_pages(pg_client, world.session_id)

    store = world.gateway.state.transcripts
    expected = await asyncio.to_thread(_numbered, store, world.session_id)
    assert [(item["index"], item["id"]) for item in items] == expected
    assert total == len(expected)
    kinds = [item["type"] for item in items]
    assert "compaction" in kinds and kinds[-1] == "custom"
    assert items[-1]["custom_type"] == "reset"
    texts = [
        b.get("text", "") for i in items if i["type"] == "message" for b in i["message"]["content"]
    ]
    assert any(FACT in text for text in texts)
    async with pg_client.get(f"/api/sessions/{world.session_id}/compactions") as response:
        (compaction,) = (await response.json())["items"]
    assert compaction["ledger"] == {"identifiers": ["notes.md"]}


async def test_a_changed_archived_transcript_is_opened_afresh(pg_world: AdminWorld) -> None:
    world = pg_world
    gateway = world.gateway
    record = await gateway.registry.get(world.session_id)
    assert record is not None
    await gateway.archive_session(record, "test")
    archived = await gateway.registry.get(world.session_id)
    assert archived is not None and archived.status == "archived"
    service = AdminService(gateway)
    try:
        first = await service._open(archived)
        assert await service._open(archived) is first  # unchanged: kept open
        store = gateway.state.transcripts

        def append() -> None:
            with store.open(world.session_id) as writer:
                writer.append_custom("note", {"late": True})

        await asyncio.to_thread(append)
        again = await service._open(archived)
        assert again is not first and first.closed
        assert again.last_entry is not None and again.last_entry.payload["custom_type"] == "note"
    finally:
        await service.close()
    assert again.closed


async def test_memory_search_finds_what_was_said(
    pg_world: AdminWorld, pg_client: aiohttp.ClientSession
) -> None:
    async with pg_client.get("/api/memory/search", params={"q": "spare key teapot"}) as response:
        found = await response.json()
    async with pg_client.get("/api/memory/status") as response:
        status = await response.json()
    assert status["enabled"] is True and status["chunks"] > 0
    assert "memory index 'main'" in status["db_path"]
    hit = next(h for h in found["items"] if "teapot" in h["snippet"])
    assert hit["path"] == f"sessions/{pg_world.session_id}.jsonl"
    assert found["mode"] == "hybrid"


def _numbered(store: TranscriptStore, session_id: str) -> list[tuple[int, str]]:
    with store.open(session_id, read_only=True) as transcript:
        return [(i, entry.id) for i, entry in transcript.numbered_entries()]
