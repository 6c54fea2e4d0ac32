"""Forgetting: the policies (age, importance, capacity) as planned, and as applied by
MemoryIndex on memory.db and on PostgreSQL: user files are never touched, evictions
stick across syncs and rebuilds, a dry run changes nothing, the schedule holds."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.backend import SqliteBackend
from parley.core.memory.forgetting import (
    LAST_RUN_KEY,
    chunk_importance,
    format_forgetting_report,
    format_tombstones,
    plan_forgetting,
    policy_for,
)
from parley.core.memory.index import MemoryIndex
from parley.core.memory.memory_config import ChunkingSettings, ForgettingSettings, ScopeForgetting
from parley.core.memory.rows import ForgettableChunk
from parley.core.memory.store_protocol import StoreBackend
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
from tests.core.memory.helpers import Layout, make_layout, quiet_settings

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=90)
RECENT = NOW - timedelta(days=2)
DECISION = "We decided to run the ledger service on PostgreSQL from now on"
CHATTER = "ok thanks"
OFF = ForgettingSettings(max_chunks_per_scope=None, schedule_hours=0)


def fchunk(
    chunk_id: int,
    text: str,
    *,
    when: datetime = RECENT,
    scope: str = "person:alice",
    source: str = "sessions",
    path: str | None = None,
) -> ForgettableChunk:
    return ForgettableChunk(
        chunk_id, path or f"sessions/s{chunk_id}.jsonl", source, scope, 2, 3,
        f"hash-{chunk_id}", text, when.isoformat(), when.timestamp(),
    )  # fmt: skip


def evicted(chunks: list[ForgettableChunk], settings: ForgettingSettings) -> list[tuple[int, str]]:
    return [(e.chunk.id, e.policy) for e in plan_forgetting(chunks, settings, NOW)]


# -- the plan ------------------------------------------------------------------------------


def test_scope_overrides_take_only_the_keys_they_set() -> None:
    settings = ForgettingSettings(
        max_age_days=30,
        min_importance=0.2,
        max_chunks_per_scope=100,
        scopes={
            "conversation:*": ScopeForgetting(max_chunks_per_scope=10),
            "conversation:team*": ScopeForgetting(max_age_days=None),
            "person:vip": ScopeForgetting(max_age_days=365, min_importance=None),
        },
    )
    base = policy_for(settings, "person:alice")
    assert (base.max_age_days, base.min_importance, base.max_chunks) == (30, 0.2, 100)
    group = policy_for(settings, "conversation:book-club")
    assert (group.max_age_days, group.min_importance, group.max_chunks) == (30, 0.2, 10)
    # The longer pattern wins, and its explicit None turns age off; the rest inherit.
    team = policy_for(settings, "conversation:team-a")
    assert (team.max_age_days, team.min_importance, team.max_chunks) == (None, 0.2, 100)
    vip = policy_for(settings, "person:vip")
    assert (vip.max_age_days, vip.min_importance, vip.max_chunks) == (365, None, 100)


def test_age_evicts_old_derived_chunks_only() -> None:
    chunks = [
        fchunk(1, DECISION, when=OLD),
        fchunk(2, DECISION, when=RECENT),
        fchunk(3, "Task: deploy\nOutcome: ok", when=OLD, source="tasks", path="tasks/a.jsonl"),
        # Old user files: never, however old (dated notes and evergreen files alike).
        fchunk(4, DECISION, when=OLD, source="memory", path="memory/2025-01-01.md"),
        fchunk(5, DECISION, when=OLD, source="memory", path="MEMORY.md"),
    ]
    assert evicted(chunks, OFF.model_copy(update={"max_age_days": 30})) == [
        (1, "age"),
        (3, "age"),
    ]


def test_age_falls_back_to_the_file_mtime() -> None:
    undated = ForgettableChunk(
        7, "sessions/s7.jsonl", "sessions", "person:alice", 1, 1, "h", DECISION, None,
        OLD.timestamp(),
    )  # fmt: skip
    assert evicted([undated], OFF.model_copy(update={"max_age_days": 30})) == [(7, "age")]


def test_importance_scores_lines_without_their_speaker_prefix() -> None:
    assert chunk_importance(f"[2026-03-01 10:00] User: {CHATTER}\nAssistant: ok") < 0.2
    assert chunk_importance(f"[2026-03-01 10:00] User: {DECISION}") >= 0.9
    # A label never hides an error.
    assert chunk_importance("Error: disk full on /var") >= 0.9
    chunks = [
        fchunk(1, f"[2026-03-01 10:00] User: {CHATTER}\nAssistant: ok"),
        fchunk(2, f"[2026-03-01 10:00] User: {DECISION}"),
    ]
    assert evicted(chunks, OFF.model_copy(update={"min_importance": 0.3})) == [(1, "importance")]


def test_capacity_evicts_least_important_then_oldest() -> None:
    chunks = [
        fchunk(1, DECISION, when=OLD),
        fchunk(2, CHATTER, when=RECENT),
        fchunk(3, CHATTER, when=OLD),
        fchunk(4, "The spare key is under the third flowerpot", when=RECENT),
        fchunk(5, CHATTER, when=OLD, scope="person:bob"),  # another scope: its own budget
    ]
    capped = OFF.model_copy(update={"max_chunks_per_scope": 3})
    assert evicted(chunks, capped) == [(3, "capacity")]
    capped = OFF.model_copy(update={"max_chunks_per_scope": 1})
    assert evicted(chunks, capped) == [(3, "capacity"), (2, "capacity"), (4, "capacity")]


def test_turned_off_plans_nothing() -> None:
    settings = ForgettingSettings(enabled=False, max_age_days=1, max_chunks_per_scope=1)
    assert evicted([fchunk(1, CHATTER, when=OLD), fchunk(2, CHATTER)], settings) == []


# -- applied by MemoryIndex, on both stores ------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBackend]:
    if request.param == "sqlite":
        yield SqliteBackend(tmp_path / "state" / "memory.db")
        return
    async with PgDatabase(request.getfixturevalue("pg_url")) as db:
        yield PgMemoryBackend(db, "agent-1", vector_index="exact")


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def make_index(
    layout: Layout, backend: StoreBackend, forgetting: ForgettingSettings, clock: Callable[[], Any]
) -> MemoryIndex:
    return MemoryIndex(
        quiet_settings(
            forgetting=forgetting,
            # One exchange per chunk: the policies weigh each on its own.
            chunking=ChunkingSettings(transcript_tokens=32, transcript_overlap_turns=0),
        ),
        db_path=layout.db,
        workspace=layout.workspace,
        sessions_dir=layout.sessions,
        embedder=None,
        now=clock,
        backend=backend,
    )


def write_memory(layout: Layout) -> None:
    for relative in ("MEMORY.md", "memory/2025-01-01.md", "memory/people.md"):
        path = layout.write(relative, f"# Notes\n\nThe walrus in {relative} is the user's.\n")
        os.utime(path, (OLD.timestamp(), OLD.timestamp()))


async def texts(index: MemoryIndex, query: str) -> list[str]:
    result = await index.search(query, scopes=["agent", "person:alice"], min_score=0)
    return sorted(f"{h.path}" for h in result.hits)


async def test_age_spares_user_files_and_the_eviction_sticks(
    tmp_path: Path, backend: StoreBackend, caplog: pytest.LogCaptureFixture
) -> None:
    layout = make_layout(tmp_path)
    write_memory(layout)
    layout.transcript(
        "old", [("user", "The walrus escaped from the old zoo")], scope="person:alice", ts=OLD
    )
    layout.transcript(
        "new", [("user", "The walrus sings at the new zoo")], scope="person:alice", ts=RECENT
    )
    index = make_index(layout, backend, OFF.model_copy(update={"max_age_days": 30}), Clock(NOW))
    await index.open()
    try:
        assert not (await index.sync(reason="test")).errors
        every = ["MEMORY.md", "memory/2025-01-01.md", "memory/people.md"]
        assert await texts(index, "walrus") == sorted(
            [*every, "sessions/new.jsonl", "sessions/old.jsonl"]
        )

        dry = await index.forget(dry_run=True)
        assert [(e.policy, e.chunk.path) for e in dry.evictions] == [("age", "sessions/old.jsonl")]
        assert dry.evicted == 0 and "would evict 1 chunk(s)" in format_forgetting_report(dry)
        # The dry run changed nothing.
        assert len(await texts(index, "walrus")) == 5
        assert await index.forgotten() == []

        with caplog.at_level(logging.INFO, logger="parley.core.memory"):
            report = await index.forget()
        assert report.evicted == 1 and report.counts() == {("age", "person:alice"): 1}
        assert "memory forgot sessions/old.jsonl#L2-L2 (scope person:alice, age)" in caplog.text
        assert await texts(index, "walrus") == sorted([*every, "sessions/new.jsonl"])
        (tombstone,) = await index.forgotten()
        assert (tombstone.path, tombstone.scope) == ("sessions/old.jsonl", "person:alice")
        assert tombstone.reason.startswith("age: 90 days old")
        assert "walrus escaped" in tombstone.preview
        assert "sessions/old.jsonl#L2" in format_tombstones([tombstone])
        status = (await index.status()).to_dict()
        assert status["forgetting"] == {
            "enabled": True,
            "last_run": NOW.isoformat(),
            "forgotten": 1,
        }

        # The transcript grows: it is re-chunked whole, the evicted chunk stays out.
        layout.append("old", [("assistant", "A keeper found the walrus by the penguins")])
        report_sync = await index.sync(reason="test")
        assert report_sync.files_indexed == 1
        result = await index.search("walrus", scopes=["person:alice"], min_score=0)
        assert sorted(h.snippet.split("] ", 1)[-1] for h in result.hits) == [
            "Assistant: A keeper found the walrus by the penguins",
            "User: The walrus sings at the new zoo",
        ]
        # A full rebuild (new store or shadow) keeps what was forgotten forgotten.
        assert (await index.sync(reason="test", force=True)).reindexed
        after = await index.search("escaped zoo", scopes=["person:alice"], min_score=0)
        assert all("escaped" not in h.snippet for h in after.hits)
        assert len(await index.forgotten()) == 1
        assert (await index.status()).forgetting_last_run == NOW.isoformat()
    finally:
        await index.close()


async def test_importance_and_capacity_through_the_index(
    tmp_path: Path, backend: StoreBackend
) -> None:
    layout = make_layout(tmp_path)
    write_memory(layout)
    layout.transcript("a", [("user", CHATTER)], scope="person:alice", ts=OLD)
    layout.transcript("b", [("user", DECISION)], scope="person:alice", ts=OLD)
    layout.transcript(
        "c", [("user", "The walrus sings at the zoo")], scope="person:alice", ts=RECENT
    )
    layout.transcript("d", [("user", "The walrus hums at the zoo")], scope="person:alice", ts=OLD)
    forgetting = OFF.model_copy(update={"min_importance": 0.3, "max_chunks_per_scope": 2})
    index = make_index(layout, backend, forgetting, Clock(NOW))
    await index.open()
    try:
        await index.sync(reason="test")
        report = await index.forget()
        assert [(e.policy, e.chunk.path) for e in report.evictions] == [
            ("importance", "sessions/a.jsonl"),
            # b (a decision) and c (as important as d, but newer) stay.
            ("capacity", "sessions/d.jsonl"),
        ]
        status = await index.status()
        by_source = {s.source: s.chunks for s in status.counts.by_source}
        assert by_source == {"memory": 3, "sessions": 2}
    finally:
        await index.close()


async def test_the_schedule_runs_after_a_sync_once_due(
    tmp_path: Path, backend: StoreBackend
) -> None:
    layout = make_layout(tmp_path)
    layout.transcript("a", [("user", "The walrus escaped")], scope="person:alice", ts=OLD)
    clock = Clock(NOW)
    forgetting = OFF.model_copy(update={"max_age_days": 30, "schedule_hours": 24})
    index = make_index(layout, backend, forgetting, clock)
    await index.open()
    try:
        assert (await index.sync(reason="test")).forgotten == 1
        assert await index._w(index._store().state, LAST_RUN_KEY) == NOW.isoformat()
        layout.transcript("b", [("user", "The heron escaped")], scope="person:alice", ts=OLD)
        clock.now = NOW + timedelta(hours=23)
        assert (await index.sync(reason="test")).forgotten == 0  # not due yet
        clock.now = NOW + timedelta(hours=25)
        report = await index.sync(reason="test")
        assert report.files_indexed == 0 and report.forgotten == 1
        assert [t.path for t in await index.forgotten()] == [
            "sessions/b.jsonl",
            "sessions/a.jsonl",
        ]
    finally:
        await index.close()
