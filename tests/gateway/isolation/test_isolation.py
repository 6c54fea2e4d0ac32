"""Issue 19's isolation suite: no one's words reach another person, through the real
gateway, on SQLite and on PostgreSQL.

Each seed builds a scenario (``world.Generator``): five ids of four people (two of
Alice's ids linked), three groups with overlapping members and a thread, and some
eighty steps: secrets said, ``/remember``-ed and remembered by the model; attacks
(``memory_search`` for another audience's canary words, ``memory_get`` of its notes by
their path and disguised paths, ``read_file``/``list_files`` at the private notes from
inside and outside the workspace); ``/memory search|status|stats``, ``/context``,
``/status``; ``/forget`` of another audience's note by its words or its citation;
``/compact``, ``/new`` and ``/reset``; syncs; turns with tools (task records); one
person erased (``gateway.people.erase_person``, the gateway stopped and started again).
One compaction strategy per seed, the memory flush on, recall on every turn or when
asked. The model repeats every canary it is shown, in replies, summaries and flush
notes. Every request body, tool result, reply and command answer is checked against the
audience rule (``world`` states it on its own), and at the end so are the stored notes,
task records, transcripts and checkpoints on disk, and the workspace.

``test_the_suite_catches_a_broken_audience_rule`` keeps the suite honest (a rule that
lets everyone read everything must be caught); ``ISOLATION_PRE_AUDIENCE=1`` runs only
what existed before audiences (see ``world``), to show it bites on the code before
issue 19.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder
from parley.gateway.app import Gateway
from parley.gateway.runtime.group_context import GroupContextBuffer
from tests.fakes.embedder import HashingEmbedder, resilient
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.isolation.world import (
    CHANNELS,
    MODEL,
    PRE_AUDIENCE,
    EchoModel,
    Settings,
    World,
    load,
    request_parts,
    run_world,
)
from tests.gateway.memory_helpers import say

STRATEGIES = ("summary", "selective", "hierarchical", "sliding-window")
STEPS = 70
# One compaction strategy per seed; direct chats per channel or per person; recall on
# every turn or when the message asks for it.
SCENARIOS = [
    Settings(seed, STRATEGIES[seed % 4], dm_scope, recall, STEPS)
    for seed, dm_scope, recall in (
        (1901, "per-channel-peer", "always"),
        (1902, "per-peer", "auto"),
        (1903, "per-channel-peer", "auto"),
        (1904, "per-peer", "always"),
    )
]
# pgvector on this machine dies computing distances of 16 or more dimensions
# (tests/gateway/test_memory_pg_gateway.py): 8 there, the default elsewhere.
PG_DIMENSIONS = 8


def hashing_embedder(monkeypatch: pytest.MonkeyPatch, dimensions: int | None = None) -> None:
    def build(settings: EmbedderSettings) -> ResilientEmbedder:
        if dimensions is None:
            return resilient(HashingEmbedder())
        return resilient(HashingEmbedder(dimensions=dimensions))

    monkeypatch.setattr("parley.gateway.memory.build_embedder", build)


def assert_isolated(world: World, elapsed: float) -> None:
    checker, tally, settings = world.checker, world.tally, world.settings
    print(  # seen with -s: what a run covered
        f"\nisolation seed={settings.seed} strategy={settings.strategy} "
        f"dm_scope={settings.dm_scope} recall={settings.recall} "
        f"canaries={len(world.scenario.canaries)} {tally.line()} "
        f"model calls={dict(world.model.kinds)} in {elapsed:.1f}s"
    )
    assert not checker.violations, checker.report()
    # Not vacuous: the secrets travelled where they may, and the attacks were made.
    assert tally.attacks >= 5, tally.line()
    assert tally.own_hits > 0, f"no conversation ever found its own secret: {tally.line()}"
    assert world.model.kinds["flush"] > 0 and tally.flush_notes > 0, tally.line()
    assert tally.compactions > 0, tally.line()
    # The others fold without a model; hierarchical asks one only for a task still open
    # at the cut, which a window-sized keep share (core/context/budget.py) rarely leaves.
    if settings.strategy == "summary":
        assert world.model.kinds["summary"] > 0, dict(world.model.kinds)
    assert tally.memory_answers > 0 and tally.tool_results > 0, tally.line()
    assert tally.task_records > 0, tally.line()
    if not PRE_AUDIENCE:
        assert tally.documents > 0 and tally.pictures > 0, tally.line()
    if not PRE_AUDIENCE:  # group context: overheard, then shown in its own group only
        assert tally.chatter > 0 and tally.overheard > 0, tally.line()
    if settings.erase and not PRE_AUDIENCE:  # erasure ran, not skipped
        assert tally.erasures >= 1, tally.line()


@pytest.mark.parametrize("settings", SCENARIOS, ids=lambda s: f"{s.seed}-{s.strategy}")
async def test_isolation_sqlite(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashing_embedder(monkeypatch)
    started = time.perf_counter()
    world = await run_world(tmp_path, settings)
    assert_isolated(world, time.perf_counter() - started)


@pytest.mark.parametrize("settings", SCENARIOS, ids=lambda s: f"{s.seed}-{s.strategy}")
async def test_isolation_postgres(
    settings: Settings, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashing_embedder(monkeypatch, PG_DIMENSIONS)
    started = time.perf_counter()
    world = await run_world(
        tmp_path,
        settings,
        PARLEY_STORAGE__BACKEND="postgres",
        PARLEY_STORAGE__URL=pg_url,
        PARLEY_STORAGE__VECTOR_INDEX="exact",
    )
    assert_isolated(world, time.perf_counter() - started)


@pytest.mark.skipif(PRE_AUDIENCE, reason="the audience rule is what the proof run lacks")
async def test_the_suite_catches_a_broken_audience_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every conversation reading as the operator (everything): the suite must say so, in
    tool results, recalled memory and /memory answers alike."""
    from parley.core.memory.audience import Viewer

    hashing_embedder(monkeypatch)
    monkeypatch.setattr(
        "parley.gateway.runtime.context.viewer_for", lambda *_: Viewer.for_operator()
    )
    settings = Settings(1906, "summary", "per-channel-peer", "always", 40, erase=False)
    world = await run_world(tmp_path, settings)
    places = {v.where for v in world.checker.violations}
    assert any("tool result memory_search" in p for p in places), places
    assert any(p.startswith("/memory answer (search") for p in places), places
    assert any("recalled memory" in p for p in places), places


LAMP = "CANARY-ALICE-hjkmnpqrstvw"
DOOR = "CANARY-ALICE-wvtsrqpnmkjh"


@pytest.mark.skipif(PRE_AUDIENCE, reason="identity links share memory only since audiences")
async def test_a_stranger_whose_id_is_a_linked_name_reads_nothing_of_that_person(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashing_embedder(monkeypatch)
    loaded = load(tmp_path, Settings(1906, "summary", "per-channel-peer", "always", 0))
    channels = {name: RecordingChannel(name) for name in (*CHANNELS, "third")}
    provider = ScriptedProvider(MODEL)
    provider.responder = EchoModel()
    gateway = Gateway(loaded, channels=list(channels.values()), provider=provider)
    async with gateway:
        assert gateway.memory is not None
        await say(gateway, channels["test"], f"Please keep this safe: {LAMP} is the lamp code.",
                  sender="alice")  # fmt: skip
        await say(gateway, channels["other"], f"/remember {DOOR} is the door code.",
                  sender="alice2")  # fmt: skip
        await gateway.memory.sync()
        before = len(provider.requests)
        # Someone else: on a third platform, not linked, whose id happens to be "alice".
        seen = [
            await say(gateway, channels["third"], "Which codes do you know?", sender="alice"),
            await say(gateway, channels["third"], "/memory search lamp door code", sender="alice"),
        ]
        seen += [text for r in provider.requests[before:] for _, text in request_parts(r)]
    leaked = sorted({c for c in (LAMP, DOOR) for text in seen if c in text})
    assert not leaked, f"the stranger third:alice was shown {leaked}"


def test_the_pre_audience_flag_is_off_in_the_suite() -> None:
    """The flag is for the proof run on the code before audiences, never for `make test`."""
    assert not PRE_AUDIENCE


@pytest.mark.skipif(PRE_AUDIENCE, reason="group context came with issue 23")
async def test_the_suite_catches_group_context_that_crosses_conversations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One buffer for every conversation: what was said in one group without
    addressing the agent reaches a turn of another, and the suite must say so."""
    hashing_embedder(monkeypatch)
    keep, peek, drop = GroupContextBuffer.keep, GroupContextBuffer.peek, GroupContextBuffer.drop
    shared = "every conversation"
    monkeypatch.setattr(GroupContextBuffer, "keep", lambda s, _, m, n: keep(s, shared, m, n))
    monkeypatch.setattr(GroupContextBuffer, "peek", lambda s, _: peek(s, shared))
    monkeypatch.setattr(GroupContextBuffer, "drop", lambda s, _, t: drop(s, shared, t))
    settings = Settings(1905, "summary", "per-channel-peer", "auto", 40, erase=False)
    world = await run_world(tmp_path, settings)
    places = {v.where for v in world.checker.violations}
    assert any(p.endswith("group context") for p in places), places
