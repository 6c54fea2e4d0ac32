"""MemoryIndex end to end: a real memory.db in tmp_path, real sqlite-vec, real transcripts,
the real e5 model for a few tests and a deterministic fake embedder where a test needs
control (failures, a model or width change, a sync held in the middle and cancelled)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import parley.core.memory.index.watch as watch_module
from parley.core.errors import MemoryIndexError
from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.driver import open_connection
from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder, build_embedder
from parley.core.memory.index import (
    SHADOW_SUFFIX,
    UNSCOPED,
    MemoryIndex,
    SearchResult,
    SyncReport,
    default_scope_resolver,
)
from parley.core.memory.memory_config import ChunkingSettings, SyncSettings
from parley.core.memory.redact import REDACTED
from parley.core.memory.sources import AGENT_SCOPE, SourceFile
from tests.core.memory.helpers import (
    HeldSync,
    KeepOpen,
    Layout,
    assert_consistent,
    bump_mtime,
    make_layout,
    open_index,
    quiet_settings,
    read_db,
)
from tests.fakes.embedder import HashingEmbedder, resilient

ALICE_SCOPES = ["agent", "person:alice"]
ALICE_VIEWER = Viewer(Audience.person("alice"), frozenset({"alice"}))
MEMORY_MD = "# Memory\n\nThe user's favourite tea is oolong, brewed at 90 degrees.\n"
NOTES = {
    "memory/2026-01-05.md": "Deployed the kubernetes cluster upgrade on Monday.\n",
    "memory/projects/parley.md": "# Parley\n\nThe gateway answers on Telegram and Discord.\n",
    "memory/people.md": "Dana from finance approves the quarterly budget.\n",
}
# Alice and Bob share words on purpose: a keyword that crosses scopes must still not leak.
ALICE = [
    ("user", "My cat is called Zanzibar and she eats tuna every morning."),
    ("assistant", "Zanzibar is a lovely name for a cat who likes tuna."),
]
BOB = [
    ("user", "My cat is called Mittens and she eats salmon; my bank PIN hint is lighthouse."),
    ("assistant", "Mittens and salmon, noted. I will remember the lighthouse hint."),
    ("user", "Also my sister Priya lives in Lisbon and my cat hates the vet."),
]


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return make_layout(tmp_path)


@pytest.fixture
def corpus(layout: Layout) -> Layout:
    """Memory files plus Alice's and Bob's direct-chat transcripts."""
    layout.write("MEMORY.md", MEMORY_MD)
    for path, text in NOTES.items():
        layout.write(path, text)
    layout.transcript("s-alice", ALICE, scope="person:alice")
    layout.transcript("s-bob", BOB, scope="person:bob")
    return layout


@pytest.fixture
def fake() -> HashingEmbedder:
    return HashingEmbedder()


@pytest.fixture(scope="module")
def e5_model() -> Iterator[ResilientEmbedder]:
    """The real e5 model, loaded once for the module (indexes get a wrapper that keeps it)."""
    embedder = build_embedder(EmbedderSettings(provider="e5"))
    yield embedder
    asyncio.run(embedder.close())


@pytest.fixture
def e5(e5_model: ResilientEmbedder) -> ResilientEmbedder:
    return resilient(KeepOpen(e5_model.primary))


def paths_of(result: SearchResult) -> list[str]:
    return [hit.path for hit in result.hits]


def shadow_of(layout: Layout) -> Path:
    return layout.db.with_name(layout.db.name + SHADOW_SUFFIX)


ALL_FILES = 1 + len(NOTES) + 2  # MEMORY.md, the notes, two transcripts


# -- first sync and incremental sync ----------------------------------------------------------


async def test_first_sync_indexes_memory_files_and_transcripts(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        report = await index.sync()
        status = await index.status()

    assert report.errors == []
    assert report.files_seen == report.files_indexed == ALL_FILES
    assert report.files_unchanged == 0
    assert not report.reindexed
    assert report.embedded == report.chunks_written == status.counts.chunks
    by_source = {s.source: (s.files, s.chunks) for s in status.counts.by_source}
    assert by_source["memory"][0] == 1 + len(NOTES)
    assert by_source["sessions"][0] == 2
    facts = assert_consistent(corpus.db)
    assert set(facts.files) == {
        "MEMORY.md",
        *NOTES,
        "sessions/s-alice.jsonl",
        "sessions/s-bob.jsonl",
    }
    scopes = {facts.chunk_scopes[i] for i in facts.chunk_ids}
    assert scopes == {"agent", "person:alice", "person:bob"}


async def test_unchanged_files_are_skipped(corpus: Layout, fake: HashingEmbedder) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        embedded = fake.passages_embedded

        again = await index.sync()

    assert (again.files_unchanged, again.files_indexed, again.files_deleted) == (ALL_FILES, 0, 0)
    assert again.embedded == 0
    assert fake.passages_embedded == embedded


async def test_a_changed_file_is_rechunked(corpus: Layout, fake: HashingEmbedder) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        path = corpus.write("memory/people.md", "Dana moved to legal.\n\nOmar runs finance now.\n")
        bump_mtime(path)

        report = await index.sync()
        found = await index.search("who runs finance", scopes=ALICE_SCOPES)

    assert (report.files_indexed, report.files_unchanged) == (1, ALL_FILES - 1)
    assert report.embedded == report.chunks_written == 1
    texts = read_db(corpus.db).texts
    assert "Dana moved to legal.\n\nOmar runs finance now." in texts
    assert not any("quarterly budget" in t for t in texts)
    assert found.hits[0].path == "memory/people.md"
    assert_consistent(corpus.db)


async def test_a_deleted_file_is_removed(corpus: Layout, fake: HashingEmbedder) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        (corpus.workspace / "memory" / "people.md").unlink()
        (corpus.sessions / "s-bob.jsonl").unlink()

        report = await index.sync()
        found = await index.search("quarterly budget finance", scopes=ALICE_SCOPES)

    assert report.files_deleted == 2
    assert "memory/people.md" not in paths_of(found)
    facts = assert_consistent(corpus.db)
    assert "memory/people.md" not in facts.files
    assert "sessions/s-bob.jsonl" not in facts.files
    assert not any("lighthouse" in t for t in facts.texts)


async def test_a_touched_file_with_the_same_content_is_not_reembedded(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        before = read_db(corpus.db)
        embedded = fake.passages_embedded
        for path in ("MEMORY.md", "memory/people.md"):
            bump_mtime(corpus.workspace / path)

        report = await index.sync()
        third = await index.sync()

    assert report.files_unchanged == ALL_FILES
    assert (report.files_indexed, report.embedded) == (0, 0)
    assert fake.passages_embedded == embedded
    assert read_db(corpus.db).chunk_ids == before.chunk_ids  # the rows were kept, not rewritten
    assert third.files_unchanged == ALL_FILES  # the new mtime was remembered


async def test_an_edit_reuses_the_cached_vectors_of_unchanged_chunks(
    layout: Layout, fake: HashingEmbedder
) -> None:
    sections = [f"## Topic {i}\n\n" + f"Fact number {i} about topic {i}. " * 40 for i in range(4)]
    path = layout.write("memory/long.md", "\n\n".join(sections) + "\n")
    settings = quiet_settings(chunking=ChunkingSettings(file_tokens=200, file_overlap_tokens=0))
    async with open_index(layout, settings, resilient(fake)) as index:
        first = await index.sync()
        sections[3] = "## Topic 3\n\nThis last section was rewritten entirely.\n"
        path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
        bump_mtime(path)

        second = await index.sync()

    assert first.chunks_written >= 4
    assert second.files_indexed == 1
    assert second.cache_hits >= 3
    assert second.embedded < second.chunks_written
    assert_consistent(layout.db)


async def test_an_appended_transcript_chunks_and_embeds_only_the_new_chunks(
    layout: Layout, fake: HashingEmbedder
) -> None:
    turns = [
        ("user" if i % 2 == 0 else "assistant", f"Message {i} about gardening.") for i in range(12)
    ]
    layout.transcript("s-1", turns, scope="person:alice")
    settings = quiet_settings(chunking=ChunkingSettings(transcript_tokens=40))
    async with open_index(layout, settings, resilient(fake)) as index:
        first = await index.sync()
        layout.append("s-1", [("user", "A brand new question about tomatoes.")])

        second = await index.sync()
        found = await index.search("tomatoes", scopes=ALICE_SCOPES)

    assert first.chunks_written >= 3
    assert second.files_indexed == second.files_resumed == 1
    # Resumed at the open chunk: the closed ones were neither re-chunked nor rewritten.
    assert 1 <= second.chunks_written <= 2
    assert second.embedded <= 2
    assert "tomatoes" in found.hits[0].snippet
    assert_consistent(layout.db)


async def test_a_source_left_out_of_the_settings_is_dropped(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
    async with open_index(corpus, quiet_settings(sources=("memory",)), resilient(fake)) as index:
        report = await index.sync()

    assert report.files_deleted == 2
    assert not any(p.startswith("sessions/") for p in assert_consistent(corpus.db).files)


# -- scopes -----------------------------------------------------------------------------------


def _queries() -> list[str]:
    """Every word of Bob's transcript, pairs of them, and questions about him."""
    words = sorted({w.strip(".,;").lower() for _, text in BOB for w in text.split()})
    pairs = [" ".join(p) for p in itertools.islice(itertools.combinations(words, 2), 0, 400, 7)]
    questions = [
        "what is the bank PIN hint",
        "where does Priya live",
        "which cat eats salmon",
        "Mittens",
        "lighthouse",
        "Lisbon sister",
        "my cat hates the vet",
    ]
    return words + pairs + questions


async def test_a_peer_never_sees_another_peers_transcript(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        for query in _queries():
            for max_results in (3, 50):
                result = await index.search(
                    query, scopes=ALICE_SCOPES, max_results=max_results, min_score=0
                )
                assert all(h.scope in ALICE_SCOPES for h in result.hits), query
                assert "sessions/s-bob.jsonl" not in paths_of(result), query
                assert not any("Mittens" in h.snippet for h in result.hits), query
        own = await index.search("Mittens salmon lighthouse", scopes=["agent", "person:bob"])

    # The same words do find Bob's transcript in Bob's own scope: the filter, not the
    # query, kept it from Alice.
    assert own.hits[0].path == "sessions/s-bob.jsonl"


async def test_a_peer_never_sees_another_peers_transcript_e5(
    corpus: Layout, e5: ResilientEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(), e5) as index:
        await index.sync()
        for query in _queries()[::3]:
            result = await index.search(query, scopes=ALICE_SCOPES, max_results=50, min_score=0)
            assert result.mode in ("hybrid", "vector")  # vectors were used
            assert all(h.scope in ALICE_SCOPES for h in result.hits), query
        own = await index.search("where does my sister live?", scopes=["agent", "person:bob"])

    assert own.hits[0].path == "sessions/s-bob.jsonl"


async def test_transcript_scope_agent_no_longer_shares_transcripts(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    # The option still loads (older configs) but is not honoured: a direct chat's
    # transcripts belong to its person, never to everyone who talks to the agent.
    async with open_index(
        corpus, quiet_settings(transcript_scope="agent"), resilient(fake)
    ) as index:
        await index.sync()
        agent = await index.search("Mittens salmon", scopes=[AGENT_SCOPE], min_score=0)
        own = await index.search("Mittens salmon", scopes=[AGENT_SCOPE, "person:bob"])

    assert "sessions/s-bob.jsonl" not in paths_of(agent)
    assert all(h.scope == AGENT_SCOPE for h in agent.hits)
    assert own.hits[0].path == "sessions/s-bob.jsonl"
    assert own.hits[0].scope == "person:bob"
    facts = assert_consistent(corpus.db)
    assert set(facts.chunk_scopes.values()) == {AGENT_SCOPE, "person:alice", "person:bob"}


@pytest.mark.parametrize(
    "scope",
    [AGENT_SCOPE, "dm:alice", "group:team", "peer:alice", "person:", "person:Alice", ""],
)
def test_default_scope_resolver_files_what_names_no_audience_as_unscoped(scope: str) -> None:
    # Agent-wide (nothing the bot records is everyone's), legacy dm:/group: scopes and
    # ids that are not audience ids belong to nobody.
    assert default_scope_resolver({"meta": {"memory_scope": scope}}) == UNSCOPED


def test_default_scope_resolver_keeps_a_person_or_a_conversation() -> None:
    for scope in ("person:alice", "person:telegram:42", "conversation:telegram:-100"):
        assert default_scope_resolver({"meta": {"memory_scope": scope}}) == scope
    assert default_scope_resolver({"meta": {}}) == UNSCOPED
    assert default_scope_resolver({}) == UNSCOPED
    assert default_scope_resolver({"meta": "person:alice"}) == UNSCOPED
    assert default_scope_resolver({"meta": {"memory_scope": ["person:alice"]}}) == UNSCOPED


@pytest.mark.parametrize("recorded", [AGENT_SCOPE, "dm:alice"])
async def test_a_transcript_recording_agent_or_a_legacy_scope_is_unscoped(
    layout: Layout, fake: HashingEmbedder, recorded: str
) -> None:
    layout.transcript(
        "s-old", [("user", "The boathouse key is under the blue pot.")], scope=recorded
    )
    # Even with the old option set: it shares nothing any more.
    settings = quiet_settings(transcript_scope="agent")
    async with open_index(layout, settings, resilient(fake)) as index:
        await index.sync()
        agent = await index.search("boathouse key blue pot", scopes=[AGENT_SCOPE], min_score=0)
        alice = await index.search("boathouse key blue pot", scopes=ALICE_SCOPES, min_score=0)
        unscoped = await index.search("boathouse key blue pot", scopes=[UNSCOPED])

    assert agent.hits == [] and alice.hits == []
    assert [h.path for h in unscoped.hits] == ["sessions/s-old.jsonl"]
    assert {h.scope for h in unscoped.hits} == {UNSCOPED}
    assert set(assert_consistent(layout.db).chunk_scopes.values()) == {UNSCOPED}


async def test_a_transcript_without_a_scope_is_unscoped(
    layout: Layout, fake: HashingEmbedder
) -> None:
    layout.transcript("s-anon", [("user", "The launch code word is marmalade.")])
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        peer = await index.search("launch code marmalade", scopes=ALICE_SCOPES, min_score=0)
        unscoped = await index.search("launch code marmalade", scopes=["unscoped"])

    assert peer.hits == []
    assert [h.path for h in unscoped.hits] == ["sessions/s-anon.jsonl"]
    assert unscoped.hits[0].scope == "unscoped"


async def test_transcript_scope_agent_keeps_groups_apart(
    layout: Layout, fake: HashingEmbedder
) -> None:
    layout.transcript(
        "s-team", [("user", "Team secret: the offsite is in Porto.")], scope="conversation:team"
    )
    settings = quiet_settings(transcript_scope="agent")
    async with open_index(layout, settings, resilient(fake)) as index:
        await index.sync()
        agent = await index.search("offsite Porto", scopes=[AGENT_SCOPE], min_score=0)
        group = await index.search("offsite Porto", scopes=[AGENT_SCOPE, "conversation:team"])

    assert agent.hits == []
    assert [h.scope for h in group.hits] == ["conversation:team"]


async def test_a_custom_scope_resolver(layout: Layout, fake: HashingEmbedder) -> None:
    layout.transcript("s-group", [("user", "Group plans: picnic on Sunday.")], scope="x")
    index = MemoryIndex(
        quiet_settings(),
        db_path=layout.db,
        workspace=layout.workspace,
        sessions_dir=layout.sessions,
        embedder=resilient(fake),
        scope_for=lambda header: f"conversation:{header['id']}",
    )
    await index.start()
    try:
        result = await index.search("picnic", scopes=["conversation:s-group"])
    finally:
        await index.close()

    assert [h.scope for h in result.hits] == ["conversation:s-group"]


# -- triggers ---------------------------------------------------------------------------------


async def test_an_empty_index_syncs_before_answering(corpus: Layout, fake: HashingEmbedder) -> None:
    settings = quiet_settings(sync=SyncSettings(on_start=False, watch=False, search_wait_seconds=0))
    async with open_index(corpus, settings, resilient(fake)) as index:
        result = await index.search("oolong tea", scopes=ALICE_SCOPES)
        status = await index.status()

    assert result.synced_first
    assert result.hits[0].path == "MEMORY.md"
    assert status.last_sync is not None
    assert status.last_sync["reason"] == "search"
    assert status.counts.files == ALL_FILES


SyncRequests = list[tuple[str, asyncio.Task[SyncReport]]]


@pytest.fixture
def sync_requests(monkeypatch: pytest.MonkeyPatch) -> SyncRequests:
    """Every background sync an index starts (or joins), with its task to await."""
    requests: SyncRequests = []
    real = MemoryIndex.request_sync

    def spy(self: MemoryIndex, reason: str) -> asyncio.Task[SyncReport]:
        task = real(self, reason)
        requests.append((reason, task))
        return task

    monkeypatch.setattr(MemoryIndex, "request_sync", spy)
    return requests


async def test_a_search_on_a_dirty_index_syncs_first(
    corpus: Layout, fake: HashingEmbedder, sync_requests: SyncRequests
) -> None:
    settings = quiet_settings(
        sync=SyncSettings(on_start=False, watch=False, transcript_debounce_seconds=600)
    )
    async with open_index(corpus, settings, resilient(fake)) as index:
        await index.sync()
        clean = await index.search("oolong", scopes=ALICE_SCOPES)
        corpus.write("memory/2026-02-01.md", "The new office is on Rue Montorgueil.\n")
        assert "memory/2026-02-01.md" in (await index.status()).dirty_files
        corpus.append("s-alice", [("user", "Remind me: the vet appointment is on Thursday.")])
        index.notify_transcript(appended_bytes=100)
        assert sync_requests == []  # debounced: no sync yet, but the index is dirty

        result = await index.search("office Rue Montorgueil", scopes=ALICE_SCOPES)
        vet = await index.search("vet appointment Thursday", scopes=ALICE_SCOPES)

    assert not clean.synced_first
    assert [reason for reason, _ in sync_requests] == ["search"]
    assert result.synced_first
    assert result.hits[0].path == "memory/2026-02-01.md"
    assert not vet.synced_first
    assert vet.hits[0].path == "sessions/s-alice.jsonl"
    assert "Thursday" in vet.hits[0].snippet


async def test_on_start_syncs_in_the_background(
    corpus: Layout, fake: HashingEmbedder, sync_requests: SyncRequests
) -> None:
    settings = quiet_settings(sync=SyncSettings(on_start=True, watch=False))
    async with open_index(corpus, settings, resilient(fake)) as index:
        assert [reason for reason, _ in sync_requests] == ["start"]
        report = await sync_requests[0][1]
        status = await index.status()

    assert report.reason == "start"
    assert report.files_indexed == ALL_FILES
    assert status.counts.files == ALL_FILES
    assert not status.dirty_files


async def test_transcript_appends_past_the_threshold_sync_at_once(
    corpus: Layout, fake: HashingEmbedder, sync_requests: SyncRequests
) -> None:
    settings = quiet_settings(
        sync=SyncSettings(
            on_start=False,
            watch=False,
            transcript_debounce_seconds=600,
            transcript_delta_messages=2,
        )
    )
    async with open_index(corpus, settings, resilient(fake)) as index:
        await index.sync()
        corpus.append("s-alice", [("user", "Zanzibar caught a sparrow."), ("assistant", "Oh no.")])
        index.notify_transcript(appended_messages=1)
        assert sync_requests == []  # under the threshold: debounced
        index.notify_transcript(appended_messages=1)
        assert [reason for reason, _ in sync_requests] == ["transcript"]
        report = await sync_requests[0][1]
        result = await index.search("sparrow", scopes=ALICE_SCOPES)

    assert report.files_indexed == 1
    assert not result.synced_first  # the trigger did it, not the search
    assert "sparrow" in result.hits[0].snippet


async def test_a_zero_debounce_syncs_at_once(
    corpus: Layout, fake: HashingEmbedder, sync_requests: SyncRequests
) -> None:
    settings = quiet_settings(
        sync=SyncSettings(on_start=False, watch=False, transcript_debounce_seconds=0)
    )
    async with open_index(corpus, settings, resilient(fake)) as index:
        await index.sync()
        corpus.append("s-bob", [("user", "One more thing about Mittens.")])
        index.notify_transcript()
        assert [reason for reason, _ in sync_requests] == ["transcript"]
        report = await sync_requests[0][1]

    assert report.files_indexed == 1


@pytest.mark.parametrize("after_compaction", [True, False])
async def test_a_compaction_syncs_at_once(
    corpus: Layout, fake: HashingEmbedder, sync_requests: SyncRequests, after_compaction: bool
) -> None:
    settings = quiet_settings(
        sync=SyncSettings(
            on_start=False,
            watch=False,
            transcript_debounce_seconds=600,
            after_compaction=after_compaction,
        )
    )
    async with open_index(corpus, settings, resilient(fake)) as index:
        await index.sync()
        index.notify_compaction()
        reasons = [reason for reason, _ in sync_requests]
        for _, task in sync_requests:
            await task

    assert reasons == (["transcript"] if after_compaction else [])


async def test_the_watcher_syncs_a_changed_memory_file(
    corpus: Layout, fake: HashingEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driven by events, not by waiting: the test learns when the watcher has listed the
    files for its first snapshot, and catches the sync it asks for."""
    loop = asyncio.get_running_loop()
    listed = asyncio.Event()
    real = watch_module.memory_files

    def listing(*args: Any, **kwargs: Any) -> list[SourceFile]:
        found = real(*args, **kwargs)
        loop.call_soon_threadsafe(listed.set)  # called from a worker thread
        return found

    monkeypatch.setattr(watch_module, "memory_files", listing)
    settings = quiet_settings(
        sync=SyncSettings(
            on_start=False, watch=True, watch_poll_seconds=0.05, watch_debounce_seconds=0.05
        )
    )
    async with open_index(corpus, settings, resilient(fake)) as index:
        requested: asyncio.Future[asyncio.Task[SyncReport]] = loop.create_future()
        request_sync = index.request_sync

        def spy(reason: str) -> asyncio.Task[SyncReport]:
            task = request_sync(reason)
            if reason == "watch" and not requested.done():
                requested.set_result(task)
            return task

        monkeypatch.setattr(index, "request_sync", spy)
        async with asyncio.timeout(10):
            await listed.wait()  # the watcher's first snapshot: nothing else lists files yet
            # Written whole, then moved in: no poll can see it half written.
            staged = corpus.write("staged.txt", "Booked the ferry to Naxos.\n")
            staged.replace(corpus.workspace / "memory" / "2026-03-01.md")
            report = await (await requested)
        result = await index.search("ferry Naxos", scopes=ALICE_SCOPES)

    assert report.reason == "watch"
    assert report.files_indexed == ALL_FILES + 1  # the first sync of this index
    assert not result.synced_first
    assert result.hits[0].path == "memory/2026-03-01.md"


# -- reindex ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    ["model", "dimensions", "chunking"],
)
async def test_a_meta_change_reindexes_into_a_shadow_and_swaps(corpus: Layout, change: str) -> None:
    async with open_index(corpus, quiet_settings(), resilient(HashingEmbedder())) as index:
        await index.sync()
    inode = corpus.db.stat().st_ino
    embedder = HashingEmbedder(
        model="hash-v2" if change == "model" else "hash-v1",
        dimensions=32 if change == "dimensions" else 64,
    )
    settings = quiet_settings(
        chunking=ChunkingSettings(file_tokens=120 if change == "chunking" else 400)
    )

    async with open_index(corpus, settings, resilient(embedder)) as index:
        report = await index.sync()
        found = await index.search("oolong tea", scopes=ALICE_SCOPES)
        again = await index.sync()
        status = await index.status()

    assert report.reindexed
    assert report.files_indexed == ALL_FILES
    assert not again.reindexed
    assert again.files_unchanged == ALL_FILES
    assert found.mode == "hybrid"
    assert found.hits[0].path == "MEMORY.md"
    assert corpus.db.stat().st_ino != inode  # the rebuilt file took the old one's place
    assert not shadow_of(corpus).exists()
    assert not list(corpus.db.parent.glob("*" + SHADOW_SUFFIX + "*"))
    facts = assert_consistent(corpus.db)
    meta = json.loads(facts.meta or "{}")
    assert (meta["model"], meta["dimensions"]) == (embedder.model, embedder.dimensions)
    assert meta["chunking"]["file_tokens"] == settings.chunking.file_tokens
    assert (status.model, status.dimensions) == (embedder.model, embedder.dimensions)


async def test_force_reindexes_without_a_change(corpus: Layout, fake: HashingEmbedder) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        report = await index.sync(force=True)

    assert report.reindexed
    assert report.files_indexed == ALL_FILES
    # The rebuild reuses the live index's vectors of the same model: nothing re-embedded.
    assert report.cache_hits == ALL_FILES
    assert report.embedded == 0
    assert not shadow_of(corpus).exists()
    assert_consistent(corpus.db)


async def _cancel_when_held(index: MemoryIndex, embedder: HashingEmbedder) -> None:
    """Start a sync and cancel it once ``embedder`` holds a passage call (a rebuild
    embeds its shadow's chunks inside the sync)."""
    task = index.request_sync("start")
    await embedder.held.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _cancel_at_file(index: MemoryIndex, files_done: int) -> None:
    """Start a sync and cancel it as it is about to sync its file number ``files_done``
    (0-based): the files before it are written, the rest are not."""
    held = HeldSync(index, after=files_done)
    task = index.request_sync("start")
    await held.held.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_sync_killed_midway_leaves_a_consistent_index_that_resumes(
    corpus: Layout,
) -> None:
    first = HashingEmbedder()
    async with open_index(corpus, quiet_settings(), resilient(first)) as index:
        await _cancel_at_file(index, 2)  # MEMORY.md and one note get in; the third is held

    partial = assert_consistent(corpus.db, vectors=False)
    assert len(partial.files) == 2
    assert first.passages_embedded == 0  # vectors come after a sync, which never finished
    resumed = HashingEmbedder()
    async with open_index(corpus, quiet_settings(), resilient(resumed)) as index:
        report = await index.sync()
        found = await index.search("kubernetes upgrade", scopes=ALICE_SCOPES)

    assert not report.reindexed
    assert report.files_unchanged == 2
    assert report.files_indexed == ALL_FILES - 2
    facts = assert_consistent(corpus.db)
    assert resumed.passages_embedded == len(facts.chunk_ids)  # the two files' too
    assert len(resumed.passage_calls) == 1  # every file's chunks in one batch
    assert found.hits[0].path == "memory/2026-01-05.md"
    assert len(facts.files) == ALL_FILES


async def test_a_vector_pass_killed_midway_resumes_with_the_pending_chunks(
    corpus: Layout,
) -> None:
    first = HashingEmbedder()
    first.max_batch = 1  # one chunk per call: the pass can be stopped between chunks
    first.hold_after = 2
    async with open_index(corpus, quiet_settings(), resilient(first)) as index:
        index.request_sync("start")  # the text is written, then the vectors
        await asyncio.wait_for(first.held.wait(), 5)
        partial = read_db(corpus.db)
        keyword = await index.search("kubernetes upgrade", scopes=ALICE_SCOPES, catch_up=False)
    # closed while the third vector was being computed

    assert keyword.hits[0].path == "memory/2026-01-05.md"  # findable before its vector
    assert partial.vec_ids is not None and len(partial.vec_ids) == 2
    resumed = HashingEmbedder()
    async with open_index(corpus, quiet_settings(), resilient(resumed)) as index:
        report = await index.sync()

    facts = assert_consistent(corpus.db)
    assert report.files_unchanged == ALL_FILES and report.files_indexed == 0
    assert resumed.passages_embedded == len(facts.chunk_ids) - 2


async def test_a_cancelled_sync_leaves_the_index_dirty(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        corpus.write("memory/2026-04-01.md", "Flight to Oslo on April 3rd.\n")
        await _cancel_at_file(index, 0)

        result = await index.search("flight Oslo", scopes=ALICE_SCOPES)

    assert result.synced_first
    assert result.hits[0].path == "memory/2026-04-01.md"


async def test_a_killed_reindex_resumes_from_its_shadow(corpus: Layout) -> None:
    async with open_index(corpus, quiet_settings(), resilient(HashingEmbedder())) as index:
        await index.sync()
    killed = HashingEmbedder(model="hash-v2")
    killed.max_batch = 2
    killed.hold_after = 1  # the shadow's chunks are written; its second batch is held
    async with open_index(corpus, quiet_settings(), resilient(killed)) as index:
        await _cancel_when_held(index, killed)

    assert shadow_of(corpus).exists()
    live = assert_consistent(corpus.db)  # the old index is untouched
    assert json.loads(live.meta or "{}")["model"] == "hash-v1"
    assert len(live.files) == ALL_FILES
    shadow = assert_consistent(shadow_of(corpus), vectors=False)
    assert len(shadow.files) == ALL_FILES
    assert shadow.vec_ids is not None and len(shadow.vec_ids) == 2

    resumed = HashingEmbedder(model="hash-v2")
    async with open_index(corpus, quiet_settings(), resilient(resumed)) as index:
        report = await index.sync()

    assert report.reindexed
    assert report.files_unchanged == ALL_FILES
    assert report.files_indexed == 0
    assert resumed.passages_embedded == len(shadow.chunk_ids) - 2  # only what was pending
    assert not shadow_of(corpus).exists()
    facts = assert_consistent(corpus.db)
    assert json.loads(facts.meta or "{}")["model"] == "hash-v2"
    assert len(facts.files) == ALL_FILES


async def test_a_shadow_of_another_meta_is_thrown_away(corpus: Layout) -> None:
    async with open_index(corpus, quiet_settings(), resilient(HashingEmbedder())) as index:
        await index.sync()
    stale = HashingEmbedder(model="hash-v2")
    stale.hold_after = 0
    async with open_index(corpus, quiet_settings(), resilient(stale)) as index:
        await _cancel_when_held(index, stale)

    other = HashingEmbedder(model="hash-v3")
    async with open_index(corpus, quiet_settings(), resilient(other)) as index:
        report = await index.sync()

    assert report.reindexed
    assert report.files_indexed == ALL_FILES
    assert json.loads(assert_consistent(corpus.db).meta or "{}")["model"] == "hash-v3"


async def test_a_search_during_a_reindex_answers_from_the_old_index(corpus: Layout) -> None:
    async with open_index(corpus, quiet_settings(), resilient(HashingEmbedder())) as index:
        await index.sync()
    slow = HashingEmbedder(model="hash-v2")
    slow.hold_after = 0
    async with open_index(corpus, quiet_settings(), resilient(slow)) as index:
        task = index.request_sync("start")
        await slow.held.wait()
        try:
            result = await asyncio.wait_for(
                index.search("oolong tea", scopes=ALICE_SCOPES), timeout=1.0
            )
        finally:
            task.cancel()

    assert result.mode == "keyword"
    assert result.fallback is not None and "reindexing" in result.fallback
    assert result.hits[0].path == "MEMORY.md"


# -- embedder failures and FTS-only ------------------------------------------------------------


async def test_an_embedder_failure_indexes_keyword_only_then_fills_the_vectors(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    fake.fail = "fake is down"
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        failed = await index.sync()
        status = (await index.status()).to_dict()
        keyword = await index.search("oolong tea", scopes=ALICE_SCOPES)
        assert_consistent(corpus.db, vectors=False)

        fake.fail = None
        healed = await index.sync()
        healed_status = (await index.status()).to_dict()
        hybrid = await index.search("oolong tea", scopes=ALICE_SCOPES)

    assert failed.files_indexed == ALL_FILES
    assert failed.vectors_pending == ALL_FILES
    assert any("fake is down" in e for e in failed.errors)
    assert status["files_awaiting_vectors"] == ALL_FILES
    assert status["vectors"] == 0
    assert status["chunks"] > 0
    # One call for every file's chunks (batched across files), and it failed: the pass
    # stops there rather than ask a failing embedder again file after file.
    assert status["embedder"]["failures"] == 1
    assert "fake is down" in status["embedder"]["last_error"]
    assert keyword.mode == "keyword"
    assert keyword.fallback is not None and "fake is down" in keyword.fallback
    assert keyword.hits[0].path == "MEMORY.md"

    assert healed.files_unchanged == ALL_FILES  # no re-chunking: the vectors are filled in
    assert healed.files_indexed == 0
    assert healed.embedded == status["chunks"]
    assert healed_status["files_awaiting_vectors"] == 0
    assert healed_status["vectors"] == healed_status["chunks"]
    assert healed_status["embedder"]["failures"] == 0
    assert hybrid.mode == "hybrid"
    assert hybrid.fallback is None
    assert_consistent(corpus.db)


async def test_a_fallback_embedders_vectors_never_mix_with_the_primarys(corpus: Layout) -> None:
    primary = HashingEmbedder()
    primary.fail = "primary is down"
    fallback = HashingEmbedder(provider="fake-fallback", model="other", dimensions=32)
    embedder = ResilientEmbedder(primary, fallback, failure_limit=100, lockout_seconds=0)
    async with open_index(corpus, quiet_settings(), embedder) as index:
        report = await index.sync()
        status = (await index.status()).to_dict()
        result = await index.search("oolong tea", scopes=ALICE_SCOPES)

    assert report.vectors_pending == ALL_FILES
    assert status["files_awaiting_vectors"] == ALL_FILES
    assert status["fallback"] is not None
    assert "primary is down" in status["fallback"]
    assert status["provider"] == "fake"  # the index stays the primary's
    assert result.mode == "keyword"
    assert result.fallback is not None and "fake-fallback" in result.fallback
    assert result.hits[0].path == "MEMORY.md"
    assert read_db(corpus.db).vec_ids is None  # no 32-wide vectors in the 64-wide index


async def test_an_fts_only_driver_searches_by_keyword_and_says_why(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(driver="sqlite3"), resilient(fake)) as index:
        report = await index.sync()
        result = await index.search("kubernetes upgrade", scopes=ALICE_SCOPES)
        status = (await index.status()).to_dict()

    assert report.errors == []
    assert fake.passage_calls == []  # no vectors to store: nothing embedded
    assert result.mode == "keyword"
    assert result.fallback is not None and "cannot load extensions" in result.fallback
    assert result.hits[0].path == "memory/2026-01-05.md"
    assert status["driver"]["driver"] == "sqlite3"
    assert status["vector"]["available"] is False
    assert "cannot load extensions" in status["vector"]["error"]
    assert "cannot load extensions" in status["fallback"]
    assert status["fts"] == {"available": True}
    assert status["provider"] == "none"
    assert status["files"] == ALL_FILES
    assert_consistent(corpus.db, vectors=False)


async def test_no_embedder_is_keyword_only(corpus: Layout) -> None:
    async with open_index(corpus, quiet_settings(), None) as index:
        await index.sync()
        result = await index.search("Zanzibar tuna", scopes=ALICE_SCOPES)
        status = (await index.status()).to_dict()

    assert result.mode == "keyword"
    assert result.hits[0].path == "sessions/s-alice.jsonl"
    assert (
        status["fallback"]
        == "vector search unavailable: vector search is turned off (keyword-only)"
    )
    assert status["requested_provider"] == "none"
    assert status["embedder"] is None


# -- status -----------------------------------------------------------------------------------


async def test_status_e5_end_to_end(corpus: Layout, e5: ResilientEmbedder) -> None:
    async with open_index(corpus, quiet_settings(), e5) as index:
        await index.sync()
        result = await index.search("which hot drink does the user like?", scopes=ALICE_SCOPES)
        corpus.write("memory/new.md", "Not indexed yet.\n")
        status = (await index.status()).to_dict()

    assert result.mode == "hybrid"
    assert result.provider == "e5"
    assert result.hits[0].path == "MEMORY.md"
    assert status["provider"] == status["requested_provider"] == "e5"
    assert status["model"] == "multilingual-e5-small-q4"
    assert status["dimensions"] == 384
    assert status["vector"] == {"available": True, "error": None}
    assert status["fts"] == {"available": True}
    assert status["driver"]["driver"] == "pysqlite3"
    assert status["files"] == ALL_FILES
    assert status["vectors"] == status["chunks"] > 0
    assert {s["source"]: s["files"] for s in status["by_source"]} == {
        "memory": 1 + len(NOTES),
        "sessions": 2,
    }
    assert status["dirty"] is True
    assert status["dirty_files"] == ["memory/new.md"]
    assert status["cache"]["entries"] == status["chunks"]
    assert status["cache"]["max_entries"] == 100_000
    assert status["embedder"]["failures"] == 0
    assert status["fallback"] is None
    assert status["last_sync"]["files_indexed"] == ALL_FILES
    assert status["sources"] == ["memory", "sessions", "tasks", "notes"]
    json.dumps(status)  # status output is plain JSON


# -- memory_get -------------------------------------------------------------------------------


@pytest.fixture
def readable(layout: Layout, tmp_path: Path) -> Layout:
    layout.write("MEMORY.md", "".join(f"line {i}\n" for i in range(1, 11)))
    layout.write("AGENTS.md", "agent instructions\n")
    layout.write("memory/a.md", "alpha\nbeta\n")
    layout.transcript("s-1", [("user", "hello")], scope="person:alice")
    (tmp_path / "outside.md").write_text("outside note\n", encoding="utf-8")
    (layout.workspace / "memory" / "link.md").symlink_to(layout.workspace / "AGENTS.md")
    return layout


@pytest.mark.parametrize(
    "path",
    [
        "sessions/s-1.jsonl",
        "../etc/passwd",
        "/etc/passwd",
        "AGENTS.md",
        "memory/../AGENTS.md",
        "memory/link.md",
        "../outside.md",
    ],
)
async def test_read_refuses_what_is_not_a_memory_file(readable: Layout, path: str) -> None:
    async with open_index(readable, quiet_settings(), None) as index:
        with pytest.raises(MemoryIndexError, match="not a memory file"):
            await index.read(path, viewer=ALICE_VIEWER)


async def test_read_slices_lines(readable: Layout) -> None:
    async with open_index(readable, quiet_settings(), None) as index:
        whole = await index.read("MEMORY.md", viewer=ALICE_VIEWER)
        middle = await index.read("MEMORY.md", from_line=3, lines=2, viewer=ALICE_VIEWER)
        tail = await index.read("MEMORY.md", from_line=9, viewer=ALICE_VIEWER)
        past = await index.read("MEMORY.md", from_line=50, viewer=ALICE_VIEWER)
        note = await index.read("memory/a.md", lines=1, viewer=ALICE_VIEWER)

    assert whole == "".join(f"line {i}\n" for i in range(1, 11))
    assert middle == "line 3\nline 4\n"
    assert tail == "line 9\nline 10\n"
    assert past == ""
    assert note == "alpha\n"


async def test_read_an_extra_path(readable: Layout, tmp_path: Path) -> None:
    outside = tmp_path / "outside.md"
    settings = quiet_settings(extra_paths=(outside,))
    async with open_index(readable, settings, None) as index:
        assert await index.read(outside.as_posix(), viewer=ALICE_VIEWER) == "outside note\n"


@pytest.mark.parametrize("path", ["memory/2099-01-01.md", "extra/missing.md"])
async def test_read_a_missing_memory_file_is_empty(layout: Layout, path: str) -> None:
    settings = quiet_settings(extra_paths=(Path("extra/missing.md"),))
    async with open_index(layout, settings, None) as index:
        assert await index.read(path, viewer=ALICE_VIEWER) == ""


# -- private notes ----------------------------------------------------------------------------

BOB_VIEWER = Viewer(Audience.person("bob"), frozenset({"bob"}))
GROUP_VIEWER = Viewer(Audience.conversation("telegram:-100"))
ALICE_NOTE = "notes/person/alice/remembered.md"
WHEN_NOTED = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def _refusal(path: str) -> str:
    """The whole message memory_get refuses ``path`` with (the path is all that varies)."""
    return (
        f"{path!r} is not a memory file you can read (MEMORY.md, memory/**/*.md, "
        "an extra path, or a notes/ path a search of this conversation cited)"
    )


async def _refused(index: MemoryIndex, path: str, viewer: Viewer) -> str:
    with pytest.raises(MemoryIndexError) as caught:
        await index.read(path, viewer=viewer)
    return str(caught.value)


def _scopes_of(db: Path, path: str) -> set[str]:
    """The scopes memory.db files ``path``'s chunks under (its own connection)."""
    conn, _ = open_connection(db)
    try:
        rows = conn.execute("SELECT DISTINCT scope FROM chunks WHERE path = ?", (path,))
        return {str(scope) for (scope,) in rows}
    finally:
        conn.close()


async def test_a_persons_note_is_indexed_in_that_persons_scope_only(
    corpus: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(corpus, quiet_settings(), resilient(fake)) as index:
        # Private notes live beside memory.db, never in the workspace.
        assert index.notes.root == corpus.db.parent / "notes"
        citation = await index.remember(Audience.person("alice"), "My heron is named Osprey.")
        assert citation == f"{ALICE_NOTE}#L1"
        await index.sync()
        alice_scopes = await index.visible_scopes(ALICE_VIEWER)
        bob_scopes = await index.visible_scopes(BOB_VIEWER)
        group_scopes = await index.visible_scopes(GROUP_VIEWER)
        alice = await index.search("heron named Osprey", scopes=list(alice_scopes))
        others = [
            await index.search("heron named Osprey", scopes=list(scopes), min_score=0)
            for scopes in (bob_scopes, group_scopes)
        ]

    assert alice_scopes == ("agent", "person:alice")
    assert bob_scopes == ("agent", "person:bob")
    assert group_scopes == ("agent", "conversation:telegram:-100")
    assert ALICE_NOTE in assert_consistent(corpus.db).files
    assert _scopes_of(corpus.db, ALICE_NOTE) == {"person:alice"}
    hit = alice.hits[0]
    assert (hit.path, hit.source, hit.scope) == (ALICE_NOTE, "notes", "person:alice")
    assert "Osprey" in hit.snippet and hit.start_line == 1
    for result in others:
        assert ALICE_NOTE not in paths_of(result)
        assert not any("Osprey" in h.snippet for h in result.hits)
        assert all(h.scope != "person:alice" for h in result.hits)


async def test_a_linked_ids_note_is_found_by_the_person(
    layout: Layout, fake: HashingEmbedder
) -> None:
    links = {"telegram:42": "alice"}
    viewer = Viewer(
        Audience.person("discord:7"), frozenset({"alice"}), lambda i: links.get(i, i), linked=True
    )
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.remember(Audience.person("telegram:42"), "The spare key is in the shed.")
        await index.sync()
        scopes = await index.visible_scopes(viewer)
        found = await index.search("spare key shed", scopes=list(scopes))
        path = "notes/person/telegram%3A42/remembered.md"
        read = await index.read(path, viewer=viewer)
        refused = await _refused(index, path, BOB_VIEWER)

    assert scopes == ("agent", "person:discord:7", "person:telegram:42")
    assert [h.path for h in found.hits] == [path]
    assert "spare key" in read
    assert refused == _refusal(path)


async def test_memory_get_of_another_audiences_note_is_refused_like_a_missing_path(
    layout: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.remember(Audience.person("alice"), "The vault PIN hint is marigold.")
        own = await index.read(ALICE_NOTE, viewer=ALICE_VIEWER)
        operator = await index.read(ALICE_NOTE, viewer=Viewer.for_operator())
        missing_note = "notes/person/alice/2001-01-01.md"
        answers = {
            "bob, existing": await _refused(index, ALICE_NOTE, BOB_VIEWER),
            "bob, missing": await _refused(index, missing_note, BOB_VIEWER),
            "group, existing": await _refused(index, ALICE_NOTE, GROUP_VIEWER),
            "bob, not a note": await _refused(index, "notes/person/nobody.md", BOB_VIEWER),
        }
        # Within the own audience a missing note reads as empty, like a missing memory file.
        own_missing = await index.read(missing_note, viewer=ALICE_VIEWER)

    assert "marigold" in own and own == operator
    assert own_missing == ""
    assert answers["bob, existing"] == _refusal(ALICE_NOTE)
    assert answers["bob, missing"] == _refusal(missing_note)
    assert answers["group, existing"] == _refusal(ALICE_NOTE)
    assert answers["bob, not a note"] == _refusal("notes/person/nobody.md")
    # Nothing tells the existing note from the missing one but the path Bob asked for.
    assert answers["bob, existing"].replace(ALICE_NOTE, "?") == answers["bob, missing"].replace(
        missing_note, "?"
    )
    assert all("marigold" not in text for text in answers.values())


async def test_a_forgotten_note_leaves_the_index(layout: Layout, fake: HashingEmbedder) -> None:
    alice = Audience.person("alice")
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.remember(alice, "The dentist is on Thursday.")
        await index.remember(alice, "The plumber comes on Friday.")
        await index.sync()
        before = await index.search("dentist Thursday", scopes=["agent", "person:alice"])
        assert await index.forget_note(Audience.person("bob"), "dentist") == []
        [gone] = await index.forget_note(alice, "DENTIST")
        await index.sync()
        after = await index.search("dentist Thursday", scopes=["agent", "person:alice"])
        plumber = await index.search("plumber Friday", scopes=["agent", "person:alice"])

    assert any("dentist" in h.snippet for h in before.hits)
    assert gone.path == ALICE_NOTE and "dentist" in gone.lines[0]
    assert not any("dentist" in h.snippet for h in after.hits)
    assert [h.path for h in plumber.hits] == [ALICE_NOTE]


async def test_a_forgotten_note_is_gone_before_any_sync(
    layout: Layout, fake: HashingEmbedder
) -> None:
    alice = Audience.person("alice")
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.remember(alice, "The dentist is on Thursday.")
        await index.sync()
        await index.forget_note(alice, "dentist")
        # No sync between: a search that does not catch up (automatic recall's kind)
        # must not find the forgotten line.
        found = await index.search("dentist Thursday", scopes=["person:alice"], catch_up=False)
    assert not any("dentist" in h.snippet for h in found.hits)


async def test_status_lists_only_the_viewers_own_pending_notes(
    layout: Layout, fake: HashingEmbedder
) -> None:
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        index.notes.remember(Audience.person("alice"), WHEN_NOTED, "alice's")
        index.notes.remember(Audience.person("bob"), WHEN_NOTED, "bob's")
        alice = await index.status(ALICE_VIEWER)
        group = await index.status(GROUP_VIEWER)
        operator = await index.status()

    assert alice.to_dict()["dirty_files"] == [ALICE_NOTE]
    assert group.to_dict()["dirty_files"] == []
    assert operator.to_dict()["dirty_files"] == [ALICE_NOTE, "notes/person/bob/remembered.md"]


# -- redaction --------------------------------------------------------------------------------

API_KEY = "sk-ant-api03-" + "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz" * 2
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


async def test_secrets_in_transcripts_are_redacted_in_the_index(
    layout: Layout, fake: HashingEmbedder
) -> None:
    layout.transcript(
        "s-keys",
        [
            ("user", f"Here is the Anthropic key {API_KEY} for the staging bot."),
            ("assistant", "Thanks, I configured the staging bot."),
            ("user", f"And the GitHub token is {GITHUB_TOKEN}"),
        ],
        scope="person:alice",
    )
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        results = [
            await index.search(q, scopes=ALICE_SCOPES, min_score=0)
            for q in (API_KEY, GITHUB_TOKEN, "Anthropic key staging bot", "GitHub token")
        ]

    raw = re.compile(re.escape(API_KEY[:20]) + "|" + re.escape(GITHUB_TOKEN[:12]))
    for result in results:
        assert not any(raw.search(h.snippet) for h in result.hits)
    assert REDACTED in results[2].hits[0].snippet
    texts = read_db(layout.db).texts
    assert not any(raw.search(t) for t in texts)
    assert any(REDACTED in t for t in texts)
    assert not any(raw.search(c) for call in fake.passage_calls for c in call)


async def test_an_extra_path_into_the_private_notes_makes_nothing_agent_wide(
    layout: Layout, fake: HashingEmbedder
) -> None:
    alice = Audience.person("alice")
    settings = quiet_settings(extra_paths=(layout.db.parent / "notes",))
    async with open_index(layout, settings, resilient(fake)) as index:
        await index.remember(alice, "The safe combination is 3-14-15.")
        await index.sync()
        everyone = await index.search("safe combination", scopes=["agent"], min_score=0)
        note = index.notes.folder(alice) / "remembered.md"
        with pytest.raises(MemoryIndexError):
            await index.read(str(note), viewer=Viewer(Audience.person("bob")))
    assert not any("3-14-15" in h.snippet for h in everyone.hits)


async def test_a_sync_indexes_notes_before_transcripts(
    layout: Layout, fake: HashingEmbedder
) -> None:
    """A search waits for a sync only so long: what a person asked to keep goes in before
    the transcripts, which are many and long, so /remember then /memory search finds it."""
    layout.transcript("s-long", [("user", "We talked about the garden shed for hours.")])
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.remember(Audience.person("alice"), "My locker code is CANARY-7731.")
        await index.sync()
    embedded = [text for call in fake.passage_calls for text in call]
    note = next(i for i, t in enumerate(embedded) if "CANARY-7731" in t)
    transcript = next(i for i, t in enumerate(embedded) if "garden shed" in t)
    assert note < transcript


async def test_a_search_waits_for_the_sync_a_remember_started(
    layout: Layout, fake: HashingEmbedder
) -> None:
    """The sync a /remember asks for clears ``dirty`` as it starts; a search meanwhile
    must wait for it, not answer from the rows before the note (hand test: a fresh home's
    /memory search right after /remember found nothing)."""
    layout.write("MEMORY.md", "# Memory\n- The agent's own notes.\n")
    note_indexed_at_query: list[bool] = []
    embed_queries = fake.embed_queries

    async def spying(texts: Any) -> Any:
        note_indexed_at_query.append(any("CANARY-7731" in t for t in read_db(layout.db).texts))
        return await embed_queries(texts)

    fake.embed_queries = spying  # type: ignore[method-assign]
    async with open_index(layout, quiet_settings(), resilient(fake)) as index:
        await index.sync()
        held = HeldSync(index, after=1)  # MEMORY.md (unchanged), then the note: held
        await index.remember(Audience.person("alice"), "My locker code is CANARY-7731.")
        await asyncio.wait_for(held.held.wait(), 5)  # the note's sync is running
        # The search is scheduled before the sync can go on: it runs first, and must
        # wait for that sync rather than embed its query against the old rows.
        search = asyncio.create_task(index.search("locker code", scopes=["person:alice"]))
        held.release.set()
        found = await asyncio.wait_for(search, 5)
    assert note_indexed_at_query == [True]
    assert any("CANARY-7731" in hit.snippet for hit in found.hits)
