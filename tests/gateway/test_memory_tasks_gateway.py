"""Task records in the running gateway: a turn that used tools leaves one in its
conversation's scope (searchable), a turn without tools leaves none, a failing record
never costs the person their answer, and ``/memory stats`` counts the conversation's
own. Real state.db, transcripts, lanes and memory.db; a scripted provider."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from parley.core.memory.tasks import TaskRecord
from parley.gateway.app import Gateway
from parley.gateway.audiences import scope_for_key
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import (
    Clock,
    final,
    memory_config,
    say,
    tool_call,
    use_hashing_embedder,
)

ALICE_KEY = "agent:main:test:direct:alice"
Stack = tuple[Gateway, RecordingChannel, ScriptedProvider]


@pytest.fixture
async def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    use_hashing_embedder(monkeypatch)
    (tmp_path / "workspace").mkdir()
    channel = RecordingChannel()
    provider = ScriptedProvider()
    clock = Clock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    gateway = Gateway(memory_config(tmp_path), channels=[channel], provider=provider, clock=clock)
    async with gateway:
        yield gateway, channel, provider


async def records(gateway: Gateway) -> list[TaskRecord]:
    assert gateway.memory is not None
    return gateway.memory.task_log.records()


async def test_a_tool_turn_leaves_a_searchable_record_in_its_scope(stack: Stack) -> None:
    gateway, channel, provider = stack
    assert gateway.memory is not None
    await say(gateway, channel, "hello there", sender="alice")
    assert await records(gateway) == []  # no tools, no record

    provider.push(tool_call("c1", "memory_search", query="zeppelin"), final("Nothing yet."))
    await say(gateway, channel, "find my zeppelin notes", sender="alice")
    (record,) = await records(gateway)
    alice = scope_for_key(ALICE_KEY)
    assert (record.request, record.tools, record.outcome, record.scope) == (
        "find my zeppelin notes", {"memory_search": 1}, "ok", alice,
    )  # fmt: skip
    assert record.started_at == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

    await gateway.memory.sync()
    found = await gateway.memory.search("zeppelin notes", scopes=[alice])
    assert any(
        h.source == "tasks" and "Task: find my zeppelin notes" in h.snippet for h in found.hits
    )


async def test_memory_stats_counts_the_conversations_own_records(stack: Stack) -> None:
    gateway, channel, provider = stack
    provider.push(tool_call("c1", "no_such_tool"), final("That did not work."))
    await say(gateway, channel, "do the impossible", sender="alice")
    (record,) = await records(gateway)
    assert record.outcome == "error" and record.errors  # the only tool result failed

    mine = await say(gateway, channel, "/memory stats", sender="alice")
    assert mine.splitlines()[0] == "Tasks: 1 (0 ok, 0 partial, 1 error)"
    assert "Most frequent errors:" in mine
    theirs = await say(gateway, channel, "/memory stats", sender="bob")
    assert theirs.startswith("No task records yet")
    assert len(provider.requests) == 2  # /memory stats never asks the model


async def test_a_failing_record_never_fails_the_turn(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channel, provider = stack
    assert gateway.memory is not None

    async def broken(record: TaskRecord) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(gateway.memory, "record_task", broken)
    provider.push(tool_call("c1", "memory_search", query="zeppelin"), final("Here you go."))
    assert await say(gateway, channel, "find my zeppelin notes", sender="alice") == "Here you go."
