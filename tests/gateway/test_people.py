"""`parley people erase|list` (the gateway/people package) on SQLite and PostgreSQL: after a person
talked (in a direct chat and a group), had notes flushed and remembered, used tools,
was paired, had a session compacted and reset, erasing them removes all of it, and a
search in the operator's view finds none of it; another person's data and the group's
transcript stay. Plus the inbox's and registry's deletions on both backends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from parley.channels.base import ChatPolicy
from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.notes import NoteStore
from parley.core.memory.rows import SearchHit, Tombstone
from parley.core.memory.tasks import TaskRecord, scope_file_name
from parley.core.transcript_store import write_jsonl_file
from parley.gateway.app import Gateway
from parley.gateway.cli.main import build_parser
from parley.gateway.cli.people import people_command
from parley.gateway.config import LoadedConfig
from parley.gateway.memory import LEGACY_SHARED_TASKS_DIR, build_memory_index, notes_dir, tasks_dir
from parley.gateway.people import PersonError, erase_person, list_people, resolve_person
from parley.gateway.people import inventory as people_inventory
from parley.gateway.storage.sessions import SessionOrigin
from parley.gateway.storage.stores import StateStores
from tests.fakes.embedder import HashingEmbedder, resilient
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import Clock, final, memory_config, say, tool_call
from tests.gateway.state_backends import StateBackend, state, state_location  # noqa: F401

ALICE = "test:alice"
BOB = "test:bob"
ALICE_KEY = "agent:main:test:direct:alice"
BOB_KEY = "agent:main:test:direct:bob"
GROUP_KEY = "agent:main:test:group:g1"
# Canaries: words nothing else in the home holds, one per place a person's data goes.
SAID = "zanzibarquokka"
GROUP_SAID = "marzipanheron"
REMEMBERED = "tangerinewalrus"
FLUSHED = "obsidianpelican"
TOOLED = "quasarlemming"
LEGACY = "vermilionokapi"
RESET = "cobaltnarwhal"
FORGOTTEN = "ochrecapybara"
BOB_SAID = "saffronibex"
ALICE_CANARIES = (SAID, REMEMBERED, FLUSHED, TOOLED, LEGACY, RESET, FORGOTTEN)


@pytest.fixture(autouse=True)
def small_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 dimensions: this machine's pgvector dies on 16 or more (test_memory_pg_gateway).
    monkeypatch.setattr(
        "parley.gateway.memory.build_embedder",
        lambda settings: resilient(HashingEmbedder(dimensions=8)),
    )


@pytest.fixture(params=["sqlite", "postgres"])
def loaded(request: pytest.FixtureRequest, tmp_path: Path) -> LoadedConfig:
    if request.param == "postgres":
        return memory_config(
            tmp_path,
            PARLEY_STORAGE__BACKEND="postgres",
            PARLEY_STORAGE__URL=request.getfixturevalue("pg_url"),
            PARLEY_STORAGE__VECTOR_INDEX="exact",
        )
    return memory_config(tmp_path)


def gateway_for(loaded: LoadedConfig) -> tuple[Gateway, RecordingChannel, ScriptedProvider]:
    channel = RecordingChannel()
    provider = ScriptedProvider()
    clock = Clock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    return Gateway(loaded, channels=[channel], provider=provider, clock=clock), channel, provider


def code_in(text: str) -> str:
    line = next(ln for ln in text.splitlines() if "parley pairing approve" in ln)
    return line.rsplit(" ", 1)[-1]


async def pair(gateway: Gateway, channel: RecordingChannel, sender: str) -> None:
    reply = await say(gateway, channel, "hello, may I?", sender=sender)
    await gateway.pairing.approve(code_in(reply))


async def live(loaded: LoadedConfig) -> dict[str, Any]:
    """Everything the home holds now, as comparable values (files and rows)."""
    async with StateStores(loaded) as stores:
        page = await stores.registry.list(limit=500)
        rows = {
            "sessions": sorted((r.session_id, r.key, r.status) for r in page.sessions),
            "inbox": await stores.inbox.counts(),
            "pairing": sorted(
                (r.channel, r.sender_id, r.status) for r in await stores.pairing.list()
            ),
            "transcripts": sorted(
                i.session_id for i in await asyncio.to_thread(stores.transcripts.list_transcripts)
            ),
        }
    files = {
        str(p.relative_to(loaded.home)): p.read_bytes()
        for p in loaded.home.rglob("*")
        if p.is_file() and "memory.db" not in p.name and "state.db" not in p.name
    }
    return {**rows, "files": files}


async def operator_search(loaded: LoadedConfig, query: str) -> list[SearchHit]:
    index = build_memory_index(loaded)
    await index.open()
    try:
        await index.sync()
        scopes = await index.visible_scopes(Viewer.for_operator())
        return (await index.search(query, scopes=list(scopes), min_score=0.0)).hits
    finally:
        await index.close()


async def tombstones(loaded: LoadedConfig, add: Sequence[Tombstone] = ()) -> list[Tombstone]:
    """The index's forgetting tombstones (after adding ``add``)."""
    index = build_memory_index(loaded)
    await index.open()
    try:

        def run() -> list[Tombstone]:
            store = index.backend.open_live(vector=False)
            try:
                if add:
                    store.add_tombstones(add)
                return store.tombstones(None)
            finally:
                store.close()

        return await asyncio.to_thread(run)
    finally:
        await index.close()


def holds(hits: list[SearchHit], word: str) -> bool:
    return any(word in hit.snippet for hit in hits)


async def seed(loaded: LoadedConfig) -> dict[str, str]:
    """Alice and Bob talk (Alice in a group too), are paired, use tools, remember; a
    flush and a compaction checkpoint of Alice's; her first session is reset; legacy
    leftovers of hers in the workspace. Returns session ids by name."""
    gateway, channel, provider = gateway_for(loaded)
    async with gateway:
        assert gateway.memory is not None
        channel.chat_policy = ChatPolicy(dm_policy="pairing")
        await pair(gateway, channel, "alice")
        await pair(gateway, channel, "bob")
        await say(gateway, channel, f"My secret word is {RESET}.", sender="alice")
        first = await gateway.registry.get_active(ALICE_KEY)
        assert first is not None
        await say(gateway, channel, f"/new Call me by my codename {SAID}.", sender="alice")
        await say(
            gateway, channel, f"/remember my lucky animal is the {REMEMBERED}", sender="alice"
        )
        provider.push(tool_call("c1", "memory_search", query="anything"), final("Nothing."))
        await say(gateway, channel, f"look up the {TOOLED} report", sender="alice")
        await say(gateway, channel, f"I am Bob and I like {BOB_SAID}.", sender="bob")
        provider.push(tool_call("c2", "memory_search", query="bob"), final("Nothing."))
        await say(gateway, channel, f"find my {BOB_SAID} notes", sender="bob")
        await say(gateway, channel, f"/remember Bob's plant is a {BOB_SAID}", sender="bob")
        await say(
            gateway, channel, f"In the group I say {GROUP_SAID}.", sender="alice",
            chat_type="group", chat_id="g1",
        )  # fmt: skip
        alice = await gateway.registry.get_active(ALICE_KEY)
        bob = await gateway.registry.get_active(BOB_KEY)
        group = await gateway.registry.get_active(GROUP_KEY)
        assert alice is not None and bob is not None and group is not None
        assert first.session_id != alice.session_id
        # What a flush of Alice's session writes (core/context/flush.py), and a checkpoint of it
        # as a compaction makes them (core/context/compaction/compactor.py).
        await asyncio.to_thread(
            gateway.memory.notes.append_flush,
            Audience.person(ALICE),
            datetime(2026, 3, 1, 12, 5),
            f"- Alice's favourite gem is {FLUSHED}.",
        )

        def checkpoint() -> None:
            target = (
                loaded.checkpoints_dir / alice.session_id / "20260301T120500000000Z-manual.jsonl"
            )
            target.parent.mkdir(parents=True)
            with gateway.state.transcripts.open(alice.session_id, read_only=True) as t:
                write_jsonl_file(t, target)

        await asyncio.to_thread(checkpoint)
    # From before audiences, not migrated yet: a flush block in the workspace and a
    # task log where PostgreSQL replicas kept them.
    memory = loaded.workspace / "memory"
    memory.mkdir(exist_ok=True)
    (memory / "2026-02-28.md").write_text(
        "# Operator notes\n\nThe boiler is serviced in April.\n"
        f"\n## 18:00 — saved before compaction ({ALICE_KEY})\n\n- Alice likes {LEGACY}.\n",
        encoding="utf-8",
    )
    legacy = loaded.workspace / LEGACY_SHARED_TASKS_DIR / "host-8080"
    legacy.mkdir(parents=True)
    record = TaskRecord(
        f"sort the {LEGACY} photos", {"shell": 1}, "ok", (), datetime(2026, 2, 28, tzinfo=UTC),
        1.0, scope="dm:test:direct:alice",
    )  # fmt: skip
    (legacy / scope_file_name(record.scope)).write_text(
        json.dumps(record.to_dict()) + "\n", encoding="utf-8"
    )
    return {
        "alice_first": first.session_id,
        "alice": alice.session_id,
        "bob": bob.session_id,
        "group": group.session_id,
    }


async def test_erase_removes_everything_of_a_person_and_nothing_else(
    loaded: LoadedConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = await seed(loaded)
    for word in (*ALICE_CANARIES, BOB_SAID, GROUP_SAID):
        if word != FORGOTTEN:
            assert holds(await operator_search(loaded, word), word), word
    # A chunk of hers that forgetting evicted: its tombstone keeps a preview of the text.
    evicted = Tombstone(
        f"sessions/{ids['alice_first']}.jsonl", "0" * 64, f"person:{ALICE}", "sessions",
        3, 4, "age", 1.0, f"user: my pet is an {FORGOTTEN}",
    )  # fmt: skip
    assert len(await tombstones(loaded, [evicted])) == 1

    # --dry-run lists and changes nothing.
    before = await live(loaded)
    preview = await erase_person(loaded, "test:Alice", dry_run=True)
    assert await live(loaded) == before
    assert preview.dry_run and preview.person == ALICE
    assert {s.session_id for s in preview.sessions} == {ids["alice_first"], ids["alice"]}
    assert sorted(s.status for s in preview.sessions) == ["active", "archived"]
    assert preview.registry_rows == 2 and len(preview.transcripts) == 2
    assert len(preview.checkpoints) == 1
    assert any(path.endswith("remembered.md") for path in preview.notes)
    assert any(path.endswith("2026-03-01.md") for path in preview.notes)
    assert len(preview.task_logs) == 2  # today's, and the workspace's legacy one
    assert preview.flush_blocks == ["memory/2026-02-28.md line 4 (18:00)"]
    # Every message she sent once let in (the group one too); the pairing approval.
    assert preview.inbox_rows == 5
    assert preview.pairing == ["test alice (approved)"]
    assert preview.index_chunks > 0 and preview.group_sessions == 1
    lines = preview.lines()
    assert lines[0] == "Would erase person test:alice (dry run: nothing was changed):"
    assert any("does not rewrite group history" in line for line in lines)

    report = await erase_person(loaded, ALICE)
    assert report.errors == [], report.errors
    assert not report.dry_run and report.registry_rows == 2 and report.inbox_rows == 5
    assert report.tombstones == 1 and await tombstones(loaded) == []

    after = await live(loaded)
    remaining = {sid for sid, _, _ in after["sessions"]}
    assert remaining == {ids["bob"], ids["group"]}
    assert set(after["transcripts"]) == {ids["bob"], ids["group"]}
    assert after["pairing"] == [("test", "bob", "approved")]
    assert not (loaded.checkpoints_dir / ids["alice"]).exists()
    notes = NoteStore(notes_dir(loaded))
    assert not notes.folder(Audience.person(ALICE)).exists()
    assert notes.folder(Audience.person(BOB)).is_dir()
    assert not any(
        path.name == scope_file_name(f"person:{ALICE}") for path in tasks_dir(loaded).rglob("*")
    )
    assert any(
        path.name == scope_file_name(f"person:{BOB}") for path in tasks_dir(loaded).rglob("*")
    )
    assert not list((loaded.workspace / LEGACY_SHARED_TASKS_DIR).rglob("*.jsonl"))
    workspace_note = (loaded.workspace / "memory" / "2026-02-28.md").read_text(encoding="utf-8")
    assert workspace_note == "# Operator notes\n\nThe boiler is serviced in April.\n"
    for text in after["files"].values():
        for word in ALICE_CANARIES:
            assert word.encode() not in text, word
    if loaded.config.storage.backend == "sqlite":
        # Not even in free pages or the FTS index's segments of the SQLite files.
        for path in loaded.home.rglob("*.db*"):
            data = path.read_bytes()
            for word in ALICE_CANARIES:
                assert word.encode() not in data, (path.name, word)

    # Nothing of hers in the operator's view; Bob's and the group's words are still there.
    for word in ALICE_CANARIES:
        assert not holds(await operator_search(loaded, word), word), word
    assert holds(await operator_search(loaded, BOB_SAID), BOB_SAID)
    assert holds(await operator_search(loaded, GROUP_SAID), GROUP_SAID)

    async with StateStores(loaded) as stores:
        assert await stores.inbox.items_from("test", "alice") == []
        assert len(await stores.inbox.items_from("test", "bob")) == 3

    # Erasing again finds nothing; the CLI prints what it did.
    args = build_parser().parse_args(["people", "erase", ALICE])
    assert await people_command(loaded, args) == 0
    out = capsys.readouterr().out
    assert out.startswith("Erased person test:alice:")
    assert "sessions        0 (0 active, 0 archived)" in out
    assert "Kept: 1 group session(s) on record." in out


async def test_a_running_gateway_is_refused_but_a_dry_run_is_not(loaded: LoadedConfig) -> None:
    gateway, _, _ = gateway_for(loaded)
    async with gateway:
        with pytest.raises(PersonError, match="stop"):
            await erase_person(loaded, ALICE)
        assert (await erase_person(loaded, ALICE, dry_run=True)).sessions == []
    assert (await erase_person(loaded, ALICE)).errors == []


@pytest.mark.parametrize("loaded", ["postgres"], indirect=True)  # where replicas are counted
async def test_a_replica_stopped_a_moment_ago_is_waited_for_not_refused(
    loaded: LoadedConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = people_inventory._pg_replicas
    asked: list[int] = []

    def lingering(conn: Any) -> int:
        # The first look still lists the stopped replica's backend, as PostgreSQL does
        # until that backend has seen its socket close and exited.
        asked.append(1)
        return 1 if len(asked) == 1 else real(conn)

    gateway, _, _ = gateway_for(loaded)
    async with gateway:  # a replica that ran (and migrated the database), now stopped
        pass
    monkeypatch.setattr(people_inventory, "_pg_replicas", lingering)
    assert (await erase_person(loaded, ALICE)).errors == []
    assert len(asked) >= 2


async def test_people_list_groups_linked_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = memory_config(
        tmp_path, PARLEY_SESSION__IDENTITY_LINKS='{alice = ["test:alice", "discord:99"]}'
    )
    gateway, channel, _ = gateway_for(loaded)
    async with gateway:
        await say(gateway, channel, "hello", sender="alice")
        await say(gateway, channel, "hello", sender="bob")
        assert gateway.memory is not None
        await gateway.memory.remember(Audience.person("discord:99"), "alice on discord")
    people = {p.person: p for p in await list_people(loaded)}
    assert set(people) == {"alice", "test:bob"}
    assert people["alice"].ids == {"test:alice", "discord:99"}
    assert (people["alice"].sessions, people["alice"].notes) == (1, 1)
    assert people["test:bob"].sessions == 1

    args = build_parser().parse_args(["people", "list"])
    assert await people_command(loaded, args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["PERSON", "IDS", "SESSIONS", "NOTES", "TASK", "LOGS", "PAIRING"]
    assert out[1].startswith("alice ") and "discord:99, test:alice" in out[1]

    # The name erases every linked id; one id erases only what was filed under it.
    alone = await erase_person(loaded, "discord:99", dry_run=True)
    assert alone.sessions == [] and len(alone.notes) == 1
    assert any("linked to 'alice'" in note for note in alone.notes_out)
    everyone = await erase_person(loaded, "alice", dry_run=True)
    assert len(everyone.sessions) == 1 and len(everyone.notes) == 1
    assert everyone.linked == ["test:alice", "discord:99"]


def test_person_forms() -> None:
    loaded = memory_config(
        Path("/nonexistent"), PARLEY_SESSION__IDENTITY_LINKS='{alice = ["telegram:123"]}'
    )
    assert resolve_person(loaded, "Telegram:123").id == "telegram:123"
    assert resolve_person(loaded, "person:telegram:123").id == "telegram:123"
    named = resolve_person(loaded, "Alice")
    assert named.canonical and named.linked == ("telegram:123",)
    assert named.owns("person:telegram:123") and named.owns("person:alice")
    # Scopes of an index from before audiences: a key made while linked holds the name.
    assert named.owns("dm:telegram:direct:123") and named.owns("dm:telegram:direct:alice")
    assert not named.owns("conversation:telegram:-100") and not named.owns("person:telegram:9")
    assert named.senders({"telegram:123", "telegram:alice"}) == {("telegram", "123")}
    one = resolve_person(loaded, "telegram:123")
    assert one.owns("person:telegram:123") and not one.owns("person:alice")
    with pytest.raises(PersonError):
        resolve_person(loaded, "  ")
    with pytest.raises(PersonError):
        resolve_person(loaded, "telegram:")


# -- the stores' deletions, on both backends ---------------------------------------------


def _origin(key: str) -> SessionOrigin:
    return SessionOrigin(key, "main", "test", "default", "direct", key.rsplit(":", 1)[-1])


async def test_inbox_items_from_a_sender_and_their_deletion(state: StateBackend) -> None:  # noqa: F811
    channel = RecordingChannel()
    other = RecordingChannel("discord")
    mine = [
        (await state.inbox.record(channel.inbound("hi", sender="Alice"))).item.id,
        (
            await state.inbox.record(
                channel.inbound("in a group", sender="alice", chat_type="group", chat_id="g1")
            )
        ).item.id,
    ]
    theirs = (await state.inbox.record(channel.inbound("hi", sender="bob"))).item.id
    elsewhere = (await state.inbox.record(other.inbound("hi", sender="alice"))).item.id
    await state.inbox.mark_replied(mine[:1], None, ["hello"])
    assert await state.inbox.items_from("test", "alice") == mine
    assert await state.inbox.items_from(None, "ALICE") == [*mine, elsewhere]
    assert await state.inbox.items_from("test", "nobody") == []
    assert await state.inbox.delete_items(mine) == 2
    assert await state.inbox.items_from("test", "alice") == []
    assert await state.inbox.get(theirs) is not None
    assert await state.inbox.get(elsewhere) is not None
    assert await state.inbox.delete_items([]) == 0
    assert await state.inbox.counts() == {"received": 2}


async def test_registry_rows_are_deleted_active_and_archived(state: StateBackend) -> None:  # noqa: F811
    old = await state.registry.create(_origin(ALICE_KEY))
    await state.registry.archive(old.session_id, "reset")
    new = await state.registry.create(_origin(ALICE_KEY))
    kept = await state.registry.create(_origin(BOB_KEY))
    assert await state.registry.delete([old.session_id, new.session_id, "f" * 32]) == 2
    assert await state.registry.get(old.session_id) is None
    assert await state.registry.get_active(ALICE_KEY) is None
    assert await state.registry.get(kept.session_id) is not None
    assert await state.registry.delete([]) == 0
