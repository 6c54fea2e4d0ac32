"""Canaries across agents: one agent never reads another's memory or transcripts.

Two agents on one gateway (real state.db, transcripts, lanes, memory.db per agent,
notes, the deterministic embedder): ``main`` answers the ``test`` channel and ``work``
the ``other`` channel (a binding). Alice is one person on both (identity links), so the
audience rule alone would let each conversation read the other's memory: only the
agents keep them apart. Each agent is told canaries (in chat, by /remember, in its
workspace's MEMORY.md); every request, recall block, /memory answer, memory_search and
memory_get result and index row of the other agent is checked for them. The owning
agent does find its own, so the checks can fail.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.audience import Viewer
from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder
from parley.core.memory.recall import is_recall_block
from parley.core.messages import TextBlock, ToolResultBlock
from parley.core.providers.base import ProviderRequest
from parley.core.tools.memory import MEMORY_GET_TOOL, MEMORY_SEARCH_TOOL
from parley.gateway.app import Gateway
from tests.fakes.embedder import HashingEmbedder, resilient
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import (
    final,
    memory_config,
    say,
    tool_call,
    tool_results,
    use_hashing_embedder,
)

CONFIG = """
[session]
dm_scope = "per-peer"
[session.identity_links]
alice = ["test:alice", "other:alice"]

[[agents]]
id = "main"
name = "Parley"

[[agents]]
id = "work"
name = "Atlas"
model = "work-model"

[[bindings]]
agent = "work"
channel = "other"
"""
MAIN = ("CANARY-MAIN-CHAT", "CANARY-MAIN-NOTE", "CANARY-MAIN-FILE")
WORK = ("CANARY-WORK-CHAT", "CANARY-WORK-NOTE", "CANARY-WORK-FILE")
# Both agents' canaries sit next to the same words, so a search for them finds either.
TOPIC = "the quokka locker combination"

World = tuple[Gateway, RecordingChannel, RecordingChannel, ScriptedProvider]


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    use_hashing_embedder(monkeypatch)
    (tmp_path / "parley.toml").write_text(CONFIG, encoding="utf-8")
    _workspaces(tmp_path)
    test, other, provider = RecordingChannel("test"), RecordingChannel("other"), ScriptedProvider()
    gateway = Gateway(memory_config(tmp_path), channels=[test, other], provider=provider)
    async with gateway:
        yield gateway, test, other, provider


def _workspaces(home: Path) -> None:
    for workspace, canary in (
        (home / "workspace", MAIN[2]),
        (home / "agents" / "work" / "workspace", WORK[2]),
    ):
        workspace.mkdir(parents=True)
        (workspace / "MEMORY.md").write_text(f"# Facts\n\n- {TOPIC} is {canary}\n")


def _text(request: ProviderRequest) -> str:
    parts = [request.system]
    for message in request.messages:
        for block in message.content:
            parts.append(getattr(block, "text", "") or "")
            parts.append(str(getattr(block, "content", "") or ""))
    return "\n".join(parts)


def _index_rows(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        chunks = [r[0] for r in conn.execute("SELECT text FROM chunks")]
        files = [r[0] for r in conn.execute("SELECT path FROM files")]
    return "\n".join(chunks + files)


async def _tell(gateway: Gateway, channel: RecordingChannel, canaries: tuple[str, ...]) -> None:
    await say(gateway, channel, f"remember {TOPIC} is {canaries[0]}")
    await say(gateway, channel, f"/remember {TOPIC} is {canaries[1]}")
    await say(gateway, channel, "/new")  # the canary is in memory only from now on


async def test_no_canary_crosses_from_one_agent_to_the_other(world: World, tmp_path: Path) -> None:
    await _no_canary_crosses(*world)
    # Nor does either index hold a row of the other's: not stored, not only unread.
    main_rows = await asyncio.to_thread(_index_rows, tmp_path / "memory" / "main" / "memory.db")
    work_rows = await asyncio.to_thread(_index_rows, tmp_path / "memory" / "work" / "memory.db")
    assert MAIN[0] in main_rows and WORK[0] in work_rows
    assert not any(c in work_rows for c in MAIN)
    assert not any(c in main_rows for c in WORK)


async def test_no_canary_crosses_on_postgres(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    """The same on PostgreSQL: both indexes in one database (one per agent id), the
    transcripts in its table."""

    def build(settings: EmbedderSettings) -> ResilientEmbedder:
        # 8 dimensions, ranked in the client: see tests/gateway/test_memory_pg_gateway.py.
        return resilient(HashingEmbedder(dimensions=8))

    monkeypatch.setattr("parley.gateway.memory.build_embedder", build)
    (tmp_path / "parley.toml").write_text(CONFIG, encoding="utf-8")
    _workspaces(tmp_path)
    loaded = memory_config(
        tmp_path,
        PARLEY_STORAGE__BACKEND="postgres",
        PARLEY_STORAGE__URL=pg_url,
        PARLEY_STORAGE__VECTOR_INDEX="exact",
    )
    test, other, provider = RecordingChannel("test"), RecordingChannel("other"), ScriptedProvider()
    async with Gateway(loaded, channels=[test, other], provider=provider) as gateway:
        await _no_canary_crosses(gateway, test, other, provider)
    assert not (tmp_path / "memory" / "work" / "memory.db").exists()


async def _no_canary_crosses(
    gateway: Gateway, test: RecordingChannel, other: RecordingChannel, provider: ScriptedProvider
) -> None:
    main, work = gateway.rt.agents["main"], gateway.rt.agents["work"]
    assert main.memory is not None and work.memory is not None
    await _tell(gateway, test, MAIN)
    await _tell(gateway, other, WORK)
    await asyncio.gather(main.memory.sync(), work.memory.sync())
    asked = len(provider.requests)

    for channel, own, foreign in ((test, MAIN, WORK), (other, WORK, MAIN)):
        # Recall: the agent's own canaries come back, the other agent's never.
        await say(gateway, channel, f"what is {TOPIC}? do you remember?")
        recalled = [
            b.text
            for b in provider.requests[-1].messages[-1].content
            if isinstance(b, TextBlock) and is_recall_block(b)
        ]
        assert any(own[0] in t or own[1] in t for t in recalled), recalled
        assert not any(c in t for c in foreign for t in recalled)
        # /memory search, as the conversation sees it.
        found = await say(gateway, channel, "/memory search quokka locker combination")
        assert own[0] in found or own[1] in found or own[2] in found, found
        assert not any(c in found for c in foreign), found
        # The memory tools.
        provider.push(
            tool_call("s1", MEMORY_SEARCH_TOOL, query=f"{TOPIC} CANARY"),
            tool_call("g1", MEMORY_GET_TOOL, path="MEMORY.md"),
            final("done"),
        )
        await say(gateway, channel, "look it up")
        results: list[ToolResultBlock] = [
            *tool_results(provider.requests[-2]),
            *tool_results(provider.requests[-1]),
        ]
        shown = "\n".join(r.content for r in results)
        assert own[2] in shown, shown  # memory_get read its own workspace's MEMORY.md
        assert not any(c in shown for c in foreign), shown

    # Every request an agent made holds none of the other agent's canaries.
    for request in provider.requests:
        text = _text(request)
        foreign = MAIN if request.model == "work-model" else WORK
        assert not any(c in text for c in foreign), (request.model, text[-2000:])
    assert {r.model for r in provider.requests[asked:]} == {"scripted-model", "work-model"}

    # What each index holds at all (the operator's view, every audience).
    for parts, foreign in ((main, WORK), (work, MAIN)):
        assert parts.memory is not None
        scopes = await parts.memory.visible_scopes(Viewer.for_operator())
        for canary in foreign:
            result = await parts.memory.search(f"{TOPIC} {canary}", scopes=scopes, max_results=50)
            assert not any(canary in hit.snippet for hit in result.hits), (parts.id, canary)


async def test_each_agents_sessions_carry_its_id(world: World) -> None:
    gateway, test, other, _ = world
    await say(gateway, test, "hello")
    await say(gateway, other, "hello")
    status = await say(gateway, other, "/status")
    assert "Agent: Atlas (work)" in status and "Session: agent:work:direct:alice" in status
    main_status = await say(gateway, test, "/status")
    assert "Agent: Parley (main)" in main_status
    keys = {(r.agent_id, r.key) for r in (await gateway.registry.list()).sessions}
    assert keys == {("main", "agent:main:direct:alice"), ("work", "agent:work:direct:alice")}


def _files_text(root: Path) -> str:
    if not root.exists():
        return ""
    return "\n".join(
        p.read_text(encoding="utf-8", errors="replace") for p in root.rglob("*") if p.is_file()
    )


async def test_erasing_a_person_erases_them_from_every_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parley.gateway.people import erase_person, list_people

    use_hashing_embedder(monkeypatch)
    (tmp_path / "parley.toml").write_text(CONFIG, encoding="utf-8")
    test, other, provider = RecordingChannel("test"), RecordingChannel("other"), ScriptedProvider()
    loaded = memory_config(tmp_path)
    async with Gateway(loaded, channels=[test, other], provider=provider) as gateway:
        await _tell(gateway, test, MAIN)
        await _tell(gateway, other, WORK)
        for parts in gateway.rt.agents.values():
            assert parts.memory is not None
            await parts.memory.sync()
    memory = tmp_path / "memory"
    work_db = memory / "work" / "memory.db"
    assert WORK[0] in await asyncio.to_thread(_index_rows, work_db)
    assert WORK[1] in _files_text(memory / "work" / "notes")

    # `parley people list` counts both agents' notes of hers.
    (alice,) = [p for p in await list_people(loaded) if p.person == "alice"]
    assert alice.notes == 2

    report = await erase_person(loaded, "alice")
    assert any(n.startswith("work: ") for n in report.notes), report.notes
    for agent, canaries in (("main", MAIN), ("work", WORK)):
        rows = await asyncio.to_thread(_index_rows, memory / agent / "memory.db")
        notes = _files_text(memory / agent / "notes") + _files_text(memory / agent / "tasks")
        assert not any(c in rows or c in notes for c in canaries[:2]), agent
    assert not any(c in _files_text(tmp_path / "sessions") for c in MAIN[:2] + WORK[:2])


async def test_the_admin_api_searches_one_agents_memory_at_a_time(
    world: World, tmp_path: Path
) -> None:
    import aiohttp

    gateway, test, other, _ = world
    await _tell(gateway, test, MAIN)
    await _tell(gateway, other, WORK)
    http = gateway.http
    assert http is not None
    token = (tmp_path / "admin.token").read_text(encoding="utf-8").strip()
    found: dict[str, str] = {}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as client:
        for agent in ("main", "work", "ghost"):
            params = {"q": TOPIC, "agent": agent, "limit": "50"}
            async with client.get(http.url("/api/memory/search"), params=params) as r:
                found[agent] = f"{r.status} {await r.text()}"
        async with client.get(http.url("/api/memory/status"), params={"agent": "work"}) as r:
            assert r.status == 200 and (await r.json())["enabled"] is True
    assert found["main"].startswith("200") and found["work"].startswith("200")
    assert any(c in found["main"] for c in MAIN) and not any(c in found["main"] for c in WORK)
    assert any(c in found["work"] for c in WORK) and not any(c in found["work"] for c in MAIN)
    assert found["ghost"].startswith("404")


async def test_parley_migrate_moves_each_agents_memory_to_its_own_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    from parley.gateway.cli.migrate import migrate_command
    from parley.gateway.storage.postgres.database import PgDatabase
    from tests.gateway.cli.test_migrate import parse

    monkeypatch.setattr(
        "parley.gateway.memory.build_embedder",
        lambda settings: resilient(HashingEmbedder(dimensions=8)),
    )
    (tmp_path / "parley.toml").write_text(CONFIG, encoding="utf-8")
    loaded = memory_config(tmp_path)
    test, other, provider = RecordingChannel("test"), RecordingChannel("other"), ScriptedProvider()
    async with Gateway(loaded, channels=[test, other], provider=provider) as gateway:
        await _tell(gateway, test, MAIN)
        await _tell(gateway, other, WORK)
        for parts in gateway.rt.agents.values():
            assert parts.memory is not None
            await parts.memory.sync()
    args = parse("--from", "sqlite", "--to", "postgres", "--url", pg_url, "--vector-index", "exact")
    assert await migrate_command(loaded, args) == 0

    def rows(conn: Any, agent: str) -> str:
        found = conn.execute(
            "SELECT c.text AS text FROM memory_chunks c JOIN memory_indexes i "
            "ON c.index_id = i.id WHERE i.name = %s AND i.role = 'live'",
            (agent,),
        ).fetchall()
        return "\n".join(r["text"] for r in found)

    async with PgDatabase(pg_url, pool_size=2) as db:
        main_rows = await db.run(rows, "main")
        work_rows = await db.run(rows, "work")
    assert MAIN[0] in main_rows and WORK[0] in work_rows
    assert not any(c in main_rows for c in WORK) and not any(c in work_rows for c in MAIN)
