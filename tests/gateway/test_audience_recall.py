"""The owner's side of audiences: what is private still comes back to its owner.

A person's fact is recalled after /new, and on another channel once their ids are
linked; a group recalls its own facts after /new; nobody else is shown them. Real
state.db, transcripts, lanes and memory.db; scripted provider, recording channels,
deterministic embedder, recall on every turn."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from parley.core.memory.recall import is_recall_block
from parley.core.messages import TextBlock
from parley.gateway.app import Gateway
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import memory_config, say, use_hashing_embedder

LINKS = '{ alice = ["test:alice", "other:alice2"] }'
LOCKER = "My locker code is quokka-5521, please keep it in mind."
PICNIC = "Team note: the picnic is at the heron pond, bring the quokka-blanket."

World = tuple[Gateway, dict[str, RecordingChannel], ScriptedProvider]


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    use_hashing_embedder(monkeypatch)
    channels = {name: RecordingChannel(name) for name in ("test", "other")}
    provider = ScriptedProvider()
    loaded = memory_config(
        tmp_path, PARLEY_MEMORY__RECALL="always", PARLEY_SESSION__IDENTITY_LINKS=LINKS
    )
    async with Gateway(loaded, channels=list(channels.values()), provider=provider) as gateway:
        yield gateway, channels, provider


def recalled(provider: ScriptedProvider) -> str:
    """The recall block of the newest request ("" when there is none)."""
    last = provider.requests[-1].messages[-1]
    return "".join(b.text for b in last.content if isinstance(b, TextBlock) and is_recall_block(b))


async def sync(gateway: Gateway) -> None:
    assert gateway.memory is not None
    report = await gateway.memory.sync()
    assert report.errors == []


async def test_a_persons_fact_comes_back_after_new_and_on_a_linked_channel(
    world: World,
) -> None:
    gateway, channels, provider = world
    await say(gateway, channels["test"], LOCKER, sender="alice")
    await say(gateway, channels["test"], "/new", sender="alice")
    await sync(gateway)
    await say(gateway, channels["test"], "what is my locker code quokka?", sender="alice")
    assert "quokka-5521" in recalled(provider)
    # The same person on another channel, joined by the identity links.
    await say(gateway, channels["other"], "what is my locker code quokka?", sender="alice2")
    assert "quokka-5521" in recalled(provider)
    # Someone else, on either channel, and a group Alice is in: never.
    await say(gateway, channels["test"], "what is my locker code quokka?", sender="bob")
    assert "quokka-5521" not in recalled(provider)
    await say(gateway, channels["other"], "what is the locker code quokka?", sender="alice")
    assert "quokka-5521" not in recalled(provider)  # "alice" on other is not alice2
    group = {"chat_type": "group", "chat_id": "g1"}
    await say(gateway, channels["test"], "what is the locker code quokka?", sender="alice", **group)
    assert "quokka-5521" not in recalled(provider)


async def test_a_group_recalls_its_own_facts_and_no_other_conversation_does(
    world: World,
) -> None:
    gateway, channels, provider = world
    g1 = {"chat_type": "group", "chat_id": "g1"}
    await say(gateway, channels["test"], PICNIC, sender="bob", **g1)
    await say(gateway, channels["test"], "/new", sender="bob", **g1)
    await sync(gateway)
    await say(gateway, channels["test"], "where is the quokka picnic?", sender="carol", **g1)
    assert "heron pond" in recalled(provider)
    g2 = {"chat_type": "group", "chat_id": "g2"}
    await say(gateway, channels["test"], "where is the quokka picnic?", sender="bob", **g2)
    assert "heron pond" not in recalled(provider)
    await say(gateway, channels["test"], "where is the quokka picnic?", sender="bob")
    assert "heron pond" not in recalled(provider)  # Bob's own direct chat: not the group's


async def test_remember_and_forget_reach_only_the_own_audience(world: World) -> None:
    gateway, channels, provider = world
    answer = await say(gateway, channels["test"], "/remember my bike lock is 8817", sender="bob")
    assert answer.startswith("Remembered in your memory (notes/person/test%3Abob/remembered.md#L1")
    await sync(gateway)
    await say(gateway, channels["test"], "what is my bike lock code?", sender="bob")
    assert "8817" in recalled(provider)
    await say(gateway, channels["test"], "what is the bike lock code?", sender="carol")
    assert "8817" not in recalled(provider)
    # Carol cannot forget Bob's note, by its words or by its citation.
    citation = "notes/person/test%3Abob/remembered.md#L1"
    for needle in ("bike lock", citation):
        answer = await say(gateway, channels["test"], f"/forget {needle}", sender="carol")
        assert answer == "Nothing in your memory matches that."
    answer = await say(gateway, channels["test"], "/forget bike lock", sender="bob")
    assert answer.startswith("Forgot 1 line(s) from your memory")
    await sync(gateway)
    await say(gateway, channels["test"], "what is my bike lock code?", sender="bob")
    assert "8817" not in recalled(provider)


async def test_an_index_that_cannot_list_its_scopes_costs_the_turn_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channels, provider = world
    await say(gateway, channels["test"], LOCKER, sender="alice")
    await say(gateway, channels["test"], "/new", sender="alice")
    await sync(gateway)

    async def broken(viewer: object) -> tuple[str, ...]:
        raise sqlite3.OperationalError("disk I/O error")

    assert gateway.memory is not None
    monkeypatch.setattr(gateway.memory, "visible_scopes", broken)
    reply = await say(gateway, channels["test"], "what is my locker code quokka?", sender="alice")
    assert reply == "echo: what is my locker code quokka?"
    # Its own audience is still searched: Alice's own transcript comes back.
    assert "quokka-5521" in recalled(provider)
