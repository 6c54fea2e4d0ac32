"""Long-term memory in the running gateway: scopes per conversation, the transcript header,
/memory, and the sync a turn triggers. Real state.db, transcripts, lanes and memory.db;
the provider is scripted and the channel records. The real e5 model where the test is
about what a person would see; the deterministic embedder where it is about plumbing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT
from parley.core.memory.audience import Audience, visible_scopes
from parley.core.memory.sources import AGENT_SCOPE
from parley.core.messages import TextBlock, Usage
from parley.core.prompt import MEMORY_GET_TOOL, MEMORY_SEARCH_TOOL
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse
from parley.core.tokens import default_counter
from parley.core.transcript import Transcript
from parley.gateway.app import Gateway
from parley.gateway.audiences import (
    UNSCOPED,
    PersonLinks,
    audience_for,
    scope_for_key,
    scope_resolver,
    viewer_for,
)
from parley.gateway.routing import SessionRoute
from parley.gateway.runtime.commands.texts import MEMORY_USAGE
from parley.gateway.session_config import SessionConfig
from parley.gateway.storage.sessions import SessionRecord
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider, echo_text
from tests.gateway.memory_helpers import (
    E5,
    Clock,
    final,
    memory_config,
    say,
    search_payload,
    spy_on_sync,
    tool_call,
    tool_results,
    use_hashing_embedder,
)

ALICE_KEY = "agent:main:test:direct:alice"
BOB_KEY = "agent:main:test:direct:bob"
ALICE_SCOPE = "person:test:alice"
GROUP_KEY = "agent:main:test:group:g1"
ALICE_FACT = "Remember this: my locker combination is 7491 and my ferret is named Pumpernickel."
BOB_FACT = "Please remember that I practise the bassoon every Thursday evening."
MEMORY_MD = "# Memory\n\n- The household wifi router lives behind the bookshelf in the study.\n"

Stack = tuple[Gateway, RecordingChannel, ScriptedProvider]


def open_stack(home: Path, **env: str) -> Stack:
    channel = RecordingChannel()
    provider = ScriptedProvider()
    clock = Clock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    gateway = Gateway(
        memory_config(home, **env), channels=[channel], provider=provider, clock=clock
    )
    return gateway, channel, provider


@pytest.fixture
async def hashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stack]:
    use_hashing_embedder(monkeypatch)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_text(MEMORY_MD, encoding="utf-8")
    gateway, channel, provider = open_stack(tmp_path)
    async with gateway:
        yield gateway, channel, provider


async def active(gateway: Gateway, key: str) -> SessionRecord:
    record = await gateway.registry.get_active(key)
    assert record is not None, key
    return record


def transcript_path(gateway: Gateway, record: SessionRecord) -> Path:
    return gateway.loaded.sessions_dir / f"{record.session_id}.jsonl"


# -- audiences, as pure functions --------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "scope"),
    [
        (ALICE_KEY, ALICE_SCOPE),
        (f"{ALICE_KEY}:thread:t1", ALICE_SCOPE),
        ("agent:main:test:acct:direct:alice", ALICE_SCOPE),  # accounts are one person
        ("agent:main:main", "person:~main"),
        ("agent:main:direct:bob", "person:bob"),
        ("agent:main:test:group:g1", "conversation:test:g1"),
        ("agent:main:test:group:g1:thread:t9", "conversation:test:g1"),  # a thread: its group
        ("key:s-1", UNSCOPED),
        ("", UNSCOPED),
    ],
)
def test_scope_for_key(key: str, scope: str) -> None:
    assert scope_for_key(key) == scope


def test_a_key_made_while_linked_is_that_persons_and_only_then() -> None:
    names = frozenset({"alice"})
    assert scope_for_key(ALICE_KEY, names) == "person:alice"
    assert scope_for_key(ALICE_KEY) == ALICE_SCOPE
    links = PersonLinks(SessionConfig(identity_links={"alice": ["test:a1"]}))
    # A raw id reading as the name is the person's only through a link.
    assert links("test:a1") == "alice" and links("alice") == "alice"
    assert links("third:alice") == "third:alice"


def test_a_direct_chat_reads_its_person_and_a_group_itself() -> None:
    config = SessionConfig()
    links = PersonLinks(config)
    alice = audience_for(
        SessionRoute(ALICE_KEY, None, "direct", "alice"),
        channel="test", sender_id="Alice", chat_id="Alice", config=config,
    )  # fmt: skip
    assert alice.scope == ALICE_SCOPE
    viewer = viewer_for(alice, config, links)
    assert visible_scopes(viewer, ["person:test:bob", "conversation:test:g1"]) == (
        AGENT_SCOPE,
        ALICE_SCOPE,
    )
    group = audience_for(
        SessionRoute(f"{GROUP_KEY}:thread:t1", GROUP_KEY, "thread", "g1"),
        channel="test", sender_id="alice", chat_id="g1", config=config,
    )  # fmt: skip
    assert group.scope == "conversation:test:g1"
    seen = visible_scopes(viewer_for(group, config, links), [ALICE_SCOPE, "conversation:test:g2"])
    assert seen == (AGENT_SCOPE, "conversation:test:g1")


def test_linked_ids_read_each_others_memory_and_unlinking_splits_them() -> None:
    linked = SessionConfig(identity_links={"alice": ["test:alice", "discord:99"]})
    viewer = viewer_for(Audience.person("test:alice"), linked, PersonLinks(linked))
    known = ["person:discord:99", "person:discord:100", "person:alice"]
    assert visible_scopes(viewer, known) == (
        AGENT_SCOPE, "person:alice", "person:discord:99", ALICE_SCOPE,
    )  # fmt: skip
    apart = SessionConfig()
    viewer = viewer_for(Audience.person("test:alice"), apart, PersonLinks(apart))
    assert visible_scopes(viewer, known) == (AGENT_SCOPE, ALICE_SCOPE)


def test_scope_resolver_prefers_the_recorded_audience() -> None:
    resolve = scope_resolver()
    assert resolve({"key": ALICE_KEY, "meta": {"memory_scope": "person:other"}}) == "person:other"
    # Written before audiences (a dm: scope, or agent-wide): derived from the key.
    assert resolve({"key": ALICE_KEY, "meta": {"memory_scope": "dm:test:direct:alice"}}) == (
        ALICE_SCOPE
    )
    assert resolve({"key": ALICE_KEY, "meta": {"memory_scope": "agent"}}) == ALICE_SCOPE
    assert resolve({"key": ALICE_KEY, "meta": {}}) == ALICE_SCOPE
    assert resolve({"key": ALICE_KEY}) == ALICE_SCOPE
    assert resolve({"key": "not a key"}) == UNSCOPED
    assert resolve({"meta": "junk"}) == UNSCOPED


# -- one person's memories never reach another -------------------------------------------


async def test_people_never_find_each_others_memories(tmp_path: Path) -> None:
    gateway, channel, provider = open_stack(tmp_path, **E5)
    async with gateway:
        assert gateway.memory is not None
        await say(gateway, channel, ALICE_FACT, sender="alice")
        await say(gateway, channel, BOB_FACT, sender="bob")
        report = await gateway.memory.sync()
        assert report.errors == [] and report.files_indexed >= 2
        status = await gateway.memory.status()
        assert status.provider == "e5" and status.vector_available

        # Bob's model searches for Alice's fact, by her very words.
        provider.push(
            tool_call(
                "s1", MEMORY_SEARCH_TOOL, query="Pumpernickel ferret locker combination 7491"
            ),
            final("I have nothing about that."),
        )
        assert await say(gateway, channel, "What is my ferret called?", sender="bob") == (
            "I have nothing about that."
        )
        [bob_result] = tool_results(provider.requests[-1])
        bob_payload = search_payload(bob_result)
        for word in ("Pumpernickel", "7491", "locker", "ferret is named"):
            assert word not in bob_result.content
        alice = await active(gateway, ALICE_KEY)
        alice_file = f"sessions/{alice.session_id}.jsonl"
        assert all(r["path"] != alice_file for r in bob_payload["results"])
        # What the model saw is what Bob's transcript holds.
        bob = await active(gateway, BOB_KEY)
        entries = list(Transcript.open(transcript_path(gateway, bob), read_only=True).entries())
        recorded = [
            e.message.content[0] for e in entries if e.type == "message"
            and e.message.role == "tool_result"
        ]  # fmt: skip
        assert [r.content for r in recorded] == [bob_result.content]

        # Alice's own model finds it.
        provider.push(
            tool_call(
                "s2", MEMORY_SEARCH_TOOL, query="Pumpernickel ferret locker combination 7491"
            ),
            final("Your ferret is Pumpernickel."),
        )
        await say(gateway, channel, "What is my ferret called?", sender="alice")
        [alice_result] = tool_results(provider.requests[-1])
        alice_payload = search_payload(alice_result)
        hits = [r for r in alice_payload["results"] if r["path"] == alice_file]
        assert hits and hits[0]["source"] == "sessions"
        assert "Pumpernickel" in hits[0]["snippet"] and "7491" in hits[0]["snippet"]
        assert "bassoon" not in alice_result.content
        assert alice_payload["provider"] == "e5" and alice_payload["mode"] == "hybrid"


async def test_memory_get_refuses_a_transcript_in_a_turn(hashing: Stack) -> None:
    gateway, channel, provider = hashing
    await say(gateway, channel, ALICE_FACT, sender="alice")
    alice = await active(gateway, ALICE_KEY)
    provider.push(
        tool_call("g1", MEMORY_GET_TOOL, path=f"sessions/{alice.session_id}.jsonl"),
        final("I cannot read that."),
    )
    await say(gateway, channel, "read my file", sender="bob")
    [result] = tool_results(provider.requests[-1])
    assert result.is_error and "is not a memory file" in result.content
    assert "Pumpernickel" not in result.content


async def test_tools_and_prompt_offer_memory(hashing: Stack) -> None:
    gateway, channel, provider = hashing
    await say(gateway, channel, "hello")
    names = {t.name for t in provider.requests[0].tools}
    assert {MEMORY_SEARCH_TOOL, MEMORY_GET_TOOL} <= names
    assert MEMORY_SEARCH_TOOL in provider.requests[0].system


# -- the transcript header -----------------------------------------------------------------


async def test_transcript_header_records_scope_and_agent_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_hashing_embedder(monkeypatch)
    gateway, channel, _ = open_stack(tmp_path, PARLEY_AGENT__NAME="Marlowe")
    async with gateway:
        await say(gateway, channel, "hi", sender="alice")
        await say(gateway, channel, "hi", sender="Carol", chat_type="group", chat_id="g1")
        alice = await active(gateway, ALICE_KEY)
        group = await active(gateway, "agent:main:test:group:g1")
        paths = transcript_path(gateway, alice), transcript_path(gateway, group)
    headers = [json.loads(p.read_text(encoding="utf-8").split("\n", 1)[0]) for p in paths]
    assert headers[0]["key"] == ALICE_KEY
    assert headers[0]["meta"]["memory_scope"] == ALICE_SCOPE
    assert headers[0]["meta"]["agent_name"] == "Marlowe"
    assert headers[1]["meta"]["memory_scope"] == "conversation:test:g1"
    assert headers[1]["meta"]["agent_name"] == "Marlowe"


# -- /memory ------------------------------------------------------------------------------


async def test_memory_status_answers_without_the_model(hashing: Stack) -> None:
    gateway, channel, provider = hashing
    assert gateway.memory is not None
    await gateway.memory.sync()
    text = await say(gateway, channel, "/memory status")
    lines = text.splitlines()
    assert lines[0].startswith("Provider: fake")
    assert any(line.startswith("Indexed: 1 files · 1 chunks") for line in lines), text
    assert "Vector: ready" in lines and "FTS: ready" in lines
    assert any(line.startswith("Dirty: no") for line in lines)
    assert await say(gateway, channel, "/memory") == text  # status is the default action
    assert provider.requests == []


async def test_memory_search_finds_a_memory_md_fact(hashing: Stack) -> None:
    gateway, channel, provider = hashing
    # The index has never synced: the first search waits for it.
    text = await say(gateway, channel, "/memory search where is the wifi router")
    head, *rest = text.splitlines()
    assert head.startswith('1 result(s) for "where is the wifi router"'), text
    assert rest[0].startswith("1. MEMORY.md#L1-L3 · ") and rest[0].endswith(" · memory")
    assert "behind the bookshelf in the study" in rest[1]
    nothing = await say(gateway, channel, "/memory search zzyzx")
    assert nothing == 'No memory matches "zzyzx".'
    assert provider.requests == []


async def test_memory_search_is_scoped_to_the_conversation(hashing: Stack) -> None:
    gateway, channel, _ = hashing
    assert gateway.memory is not None
    await say(gateway, channel, ALICE_FACT, sender="alice")
    await gateway.memory.sync()
    mine = await say(gateway, channel, "/memory search Pumpernickel", sender="alice")
    assert "Pumpernickel" in mine and "sessions/" in mine
    theirs = await say(gateway, channel, "/memory search Pumpernickel", sender="bob")
    _, *results = theirs.splitlines()
    assert all("sessions/" not in line and "Pumpernickel" not in line for line in results)
    assert "7491" not in theirs


@pytest.mark.parametrize("text", ["/memory frobnicate", "/memory search", "/memory search   "])
async def test_memory_with_a_bad_action_answers_the_usage(hashing: Stack, text: str) -> None:
    gateway, channel, provider = hashing
    assert await say(gateway, channel, text) == MEMORY_USAGE
    assert provider.requests == []


async def test_memory_turned_off(tmp_path: Path) -> None:
    gateway, channel, provider = open_stack(tmp_path, PARLEY_MEMORY__ENABLED="false")
    async with gateway:
        assert gateway.memory is None
        assert await say(gateway, channel, "hello") == "echo: hello"
        names = {t.name for t in provider.requests[0].tools}
        assert names and not names & {MEMORY_SEARCH_TOOL, MEMORY_GET_TOOL}
        assert MEMORY_SEARCH_TOOL not in provider.requests[0].system
        for command in ("/memory status", "/memory search anything"):
            assert await say(gateway, channel, command) == (
                "Long-term memory is turned off ([memory] enabled = false)."
            )
        assert len(provider.requests) == 1
    assert not (tmp_path / "memory").exists()


# -- a turn marks the index dirty and asks for a sync ------------------------------------


async def search_texts(gateway: Gateway, query: str, scopes: tuple[str, ...]) -> list[str]:
    assert gateway.memory is not None
    result = await gateway.memory.search(query, scopes=scopes)
    return [hit.snippet for hit in result.hits]


QUOKKA = "The quokka called Bartholomew lives on Rottnest island."
SCOPES = (AGENT_SCOPE, ALICE_SCOPE)
NO_CATCH_UP = {"PARLEY_MEMORY__SYNC__ON_SEARCH": "false"}


async def test_a_turn_requests_a_sync_at_once_without_debounce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_hashing_embedder(monkeypatch)
    gateway, channel, _ = open_stack(
        tmp_path, PARLEY_MEMORY__SYNC__TRANSCRIPT_DEBOUNCE_SECONDS="0", **NO_CATCH_UP
    )
    async with gateway:
        assert gateway.memory is not None
        spy = spy_on_sync(gateway.memory, monkeypatch)
        await gateway.memory.sync()
        assert await search_texts(gateway, "Bartholomew quokka", SCOPES) == []
        await say(gateway, channel, QUOKKA, sender="alice")
        assert spy.reasons == ["transcript"]
        [report] = await spy.wait_all()
        assert report.errors == [] and report.files_indexed == 1
        # Searches do not sync here: the words are in because the turn's sync ran.
        found = await search_texts(gateway, "Bartholomew quokka", SCOPES)
        assert any("Bartholomew" in s and "Rottnest" in s for s in found)


async def test_a_turn_marks_the_index_dirty_until_the_debounce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_hashing_embedder(monkeypatch)
    gateway, channel, _ = open_stack(
        tmp_path, PARLEY_MEMORY__SYNC__TRANSCRIPT_DEBOUNCE_SECONDS="600"
    )
    async with gateway:
        assert gateway.memory is not None
        await gateway.memory.sync()
        spy = spy_on_sync(gateway.memory, monkeypatch)
        await say(gateway, channel, QUOKKA, sender="alice")
        assert spy.reasons == []  # waiting out the debounce
        alice = await active(gateway, ALICE_KEY)
        status = await gateway.memory.status()
        assert status.dirty_files == [f"sessions/{alice.session_id}.jsonl"]
        # Marked dirty: a search catches up before it answers.
        found = await search_texts(gateway, "Bartholomew quokka", SCOPES)
        assert spy.reasons == ["search"]
        assert any("Bartholomew" in s for s in found)
        # Clean again: the next search does not sync.
        await search_texts(gateway, "Bartholomew", SCOPES)
        assert spy.reasons == ["search"]


async def test_enough_new_messages_skip_the_debounce(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_hashing_embedder(monkeypatch)
    gateway, channel, _ = open_stack(
        tmp_path,
        PARLEY_MEMORY__SYNC__TRANSCRIPT_DEBOUNCE_SECONDS="600",
        PARLEY_MEMORY__SYNC__TRANSCRIPT_DELTA_MESSAGES="2",
        **NO_CATCH_UP,
    )
    async with gateway:
        assert gateway.memory is not None
        spy = spy_on_sync(gateway.memory, monkeypatch)
        await say(gateway, channel, QUOKKA, sender="alice")  # user + assistant: 2 messages
        assert spy.reasons == ["transcript"]
        await spy.wait_all()
        assert any("Bartholomew" in s for s in await search_texts(gateway, "Bartholomew", SCOPES))


async def test_a_search_in_a_turn_catches_up_with_a_dirty_index(hashing: Stack) -> None:
    gateway, channel, provider = hashing
    # No explicit sync anywhere: the turn marks the index dirty (debounce pending), and
    # the next memory_search syncs before it answers.
    await say(gateway, channel, QUOKKA, sender="alice")
    provider.push(tool_call("s1", MEMORY_SEARCH_TOOL, query="Bartholomew"), final("found"))
    await say(gateway, channel, "who lives on Rottnest?", sender="alice")
    [result] = tool_results(provider.requests[-1])
    snippets = [r["snippet"] for r in search_payload(result)["results"]]
    assert any("Bartholomew" in s for s in snippets)


# -- a compaction asks for a sync at once --------------------------------------------------

SUMMARY = (
    "## Decisions\n- The garden plan was agreed.\n## Open TODOs\n- none\n"
    "## Constraints/Rules\n- none\n## Pending user asks\n- none\n## Exact identifiers\n- none"
)
COMPACT_ENV = {
    "PARLEY_CONTEXT__MODELS": '{ "scripted-model" = { context_tokens = 20000 } }',
    "PARLEY_CONTEXT__COMPACTION__ENABLED": "false",
    "PARLEY_CONTEXT__FLUSH__ENABLED": "false",
    "PARLEY_MEMORY__SYNC__TRANSCRIPT_DEBOUNCE_SECONDS": "600",
    "PARLEY_MEMORY__SYNC__TRANSCRIPT_DELTA_MESSAGES": "1000",
}


def summarising(request: ProviderRequest) -> ProviderResponse | None:
    """Fixed summaries; echoed turns that report their real prompt size (the engine's
    accounting decides whether a compaction pays)."""
    if request.system == SUMMARY_SYSTEM_PROMPT:
        return final(SUMMARY)
    text = echo_text(request)
    counter = default_counter()
    prompt = counter.request(request.system, request.messages, request.tools)
    return ProviderResponse((TextBlock(text),), STOP_END, Usage(prompt, counter.text(text)))


@pytest.mark.parametrize("after_compaction", [True, False])
async def test_a_compaction_requests_a_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_compaction: bool
) -> None:
    use_hashing_embedder(monkeypatch)
    gateway, channel, provider = open_stack(
        tmp_path,
        PARLEY_MEMORY__SYNC__AFTER_COMPACTION=str(after_compaction).lower(),
        **COMPACT_ENV,
    )
    provider.responder = summarising
    body = " ".join(["we talked about the garden and the plan for the spring planting"] * 16)
    async with gateway:
        assert gateway.memory is not None
        spy = spy_on_sync(gateway.memory, monkeypatch)
        for turn in range(12):
            await say(gateway, channel, f"Turn {turn}: {body}")
        assert spy.reasons == []  # the debounce holds every turn's sync back
        reply = await say(gateway, channel, "/compact")
        assert reply.startswith("Compacted ("), reply
        assert spy.reasons == (["transcript"] if after_compaction else [])
        await spy.wait_all()
