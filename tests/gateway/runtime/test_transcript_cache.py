"""The gateway's transcript cache: files open up to ``max_open``, then warm windows."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from parley.core.errors import TranscriptError
from parley.core.messages import Message
from parley.core.transcript import Transcript
from parley.core.transcript_store import FileTranscriptStore
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.storage.sessions import SessionRecord


def record(session_id: str) -> SessionRecord:
    now = datetime.now(UTC)
    return SessionRecord(
        session_id=session_id,
        key=f"agent:main:test:direct:{session_id}",
        agent_id="main",
        channel="test",
        account="default",
        chat_type="direct",
        peer=session_id,
        parent_key=None,
        display_name=None,
        created_at=now,
        updated_at=now,
        status="active",
        archived_reason=None,
        archived_at=None,
        model=None,
    )


def sessions(tmp_path: Path, count: int) -> FileTranscriptStore:
    store = FileTranscriptStore(tmp_path)
    for i in range(count):
        transcript = store.create(f"s{i}", f"agent:main:test:direct:s{i}")
        transcript.append_message(Message.user(f"hello from s{i}"))
        transcript.close()
    return store


async def test_past_max_open_a_session_comes_back_warm_without_reading_its_file(
    tmp_path: Path,
) -> None:
    cache = TranscriptCache(sessions(tmp_path, 3), max_open=1, shared=False, warm_bytes=1 << 20)
    first = await cache.get(record("s0"))
    window = first.live_entries()
    await cache.get(record("s1"))
    await cache.get(record("s2"))
    assert first.closed  # its file was let go
    again = await cache.get(record("s0"))
    assert again is first and not again.closed
    assert again.live_entries() is window
    again.append_message(Message.assistant("hi s0"))
    cache.close_all()
    reread = Transcript.open(tmp_path / "s0.jsonl")
    assert [e.message.text for e in reread.live_entries()] == ["hello from s0", "hi s0"]
    reread.close()


async def test_a_warm_session_changed_on_disk_is_read_afresh(tmp_path: Path) -> None:
    cache = TranscriptCache(sessions(tmp_path, 2), max_open=1, shared=False, warm_bytes=1 << 20)
    first = await cache.get(record("s0"))
    await cache.get(record("s1"))
    other = Transcript.open(tmp_path / "s0.jsonl")
    other.append_message(Message.assistant("written elsewhere"))
    other.close()
    again = await cache.get(record("s0"))
    assert again is not first and first.closed
    assert again.live_entries()[-1].message.text == "written elsewhere"
    cache.close_all()


async def test_warm_windows_stay_within_their_byte_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sessions(tmp_path, 4)
    probe = Transcript.open(tmp_path / "s0.jsonl")
    one = probe.live_bytes  # the same for each: one message of the same length
    probe.close()
    # Room for two warm windows. Warm long enough, the least recently used goes.
    monkeypatch.setattr("parley.gateway.runtime.transcripts.WARM_MIN_SECONDS", 0.0)
    cache = TranscriptCache(store, max_open=1, shared=False, warm_bytes=2 * one)
    opened = [await cache.get(record(f"s{i}")) for i in range(4)]
    assert cache._warm_total == 2 * one and opened[0].closed
    assert [await cache.get(record(f"s{i}")) is opened[i] for i in (2, 1)] == [True, True]
    assert await cache.get(record("s0")) is not opened[0]
    cache.close_all()
    assert all(t.closed for t in opened)


async def test_sessions_taking_turns_beyond_the_budget_still_mostly_resume(
    tmp_path: Path,
) -> None:
    # Twenty sessions in rounds, room for ten warm windows: evicting the least recently
    # used would miss every time (it is always the next asked for). Recently warm, the
    # newest goes instead, so the ten that fit resume round after round.
    store = sessions(tmp_path, 20)
    probe = Transcript.open(tmp_path / "s0.jsonl")
    one = probe.live_bytes
    probe.close()
    cache = TranscriptCache(store, max_open=1, shared=False, warm_bytes=10 * one)
    current = {f"s{i}": await cache.get(record(f"s{i}")) for i in range(20)}
    resumed = 0
    for _ in range(5):
        for i in range(20):
            got = await cache.get(record(f"s{i}"))
            resumed += got is current[f"s{i}"]
            current[f"s{i}"] = got
    cache.close_all()
    assert cache._warm_total == 0
    assert resumed >= 45  # ten of every twenty turns (the first round fills the tier)


async def test_no_warm_budget_closes_what_it_evicts(tmp_path: Path) -> None:
    cache = TranscriptCache(sessions(tmp_path, 2), max_open=1, shared=False)
    first = await cache.get(record("s0"))
    await cache.get(record("s1"))
    assert await cache.get(record("s0")) is not first
    cache.close_all()


async def test_a_warm_window_only_ever_comes_back_to_its_own_session(tmp_path: Path) -> None:
    """The canary: every session's words are its own; through opens, suspends, resumes
    and evictions, a session is never handed another session's window."""
    store = sessions(tmp_path, 12)
    probe = Transcript.open(tmp_path / "s0.jsonl")
    one = probe.live_bytes
    probe.close()
    cache = TranscriptCache(store, max_open=2, shared=False, warm_bytes=5 * one)
    for round_ in range(4):
        for i in list(range(12)) if round_ % 2 == 0 else [11 - k for k in range(12)]:
            transcript = await cache.get(record(f"s{i}"))
            assert transcript.header.id == f"s{i}"
            texts = [e.message.text for e in transcript.live_entries()]
            assert texts == [f"hello from s{i}"]  # its own words, and no one else's
    cache.close_all()


class CountingStore(FileTranscriptStore):
    """The file store, counting the transcripts it opens from their files."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.opened: list[str] = []

    def open(self, session_id: str, *, read_only: bool = False) -> Transcript:
        self.opened.append(session_id)
        return super().open(session_id, read_only=read_only)


def counting_sessions(tmp_path: Path, count: int) -> CountingStore:
    sessions(tmp_path, count)
    return CountingStore(tmp_path)


@pytest.mark.parametrize("warm_bytes", [0, 1 << 20], ids=["read-again", "warm"])
async def test_a_prefetched_session_is_open_when_its_run_asks(
    tmp_path: Path, warm_bytes: int
) -> None:
    store = counting_sessions(tmp_path, 2)
    cache = TranscriptCache(store, max_open=1, shared=False, warm_bytes=warm_bytes)
    first = await cache.get(record("s0"))
    await cache.get(record("s1"))  # s0 let go of: warm, or closed
    assert first.closed
    opened = list(store.opened)

    await cache.prefetch(record("s0").key)
    prefetched = await cache.cached(record("s0"))
    assert prefetched is not None and not prefetched.closed
    assert (prefetched is first) == bool(warm_bytes)  # resumed, or read from its file
    assert await cache.get(record("s0")) is prefetched
    assert len(store.opened) == len(opened) + (0 if warm_bytes else 1)  # read once at most
    assert [e.message.text for e in prefetched.live_entries()] == ["hello from s0"]
    cache.close_all()


async def test_a_run_asking_while_its_prefetch_reads_shares_that_read(tmp_path: Path) -> None:
    store = counting_sessions(tmp_path, 2)
    cache = TranscriptCache(store, max_open=1, shared=False)
    await cache.get(record("s0"))
    await cache.get(record("s1"))
    before = len(store.opened)
    prefetch = asyncio.create_task(cache.prefetch(record("s0").key))
    await asyncio.sleep(0)  # the prefetch's read is under way
    assert "s0" in cache._opening
    transcript = await cache.get(record("s0"))
    await prefetch
    assert len(store.opened) == before + 1  # one read, not two objects on one file
    assert await cache.cached(record("s0")) is transcript
    cache.close_all()


async def test_prefetch_reads_only_what_a_run_would_and_never_creates(tmp_path: Path) -> None:
    store = counting_sessions(tmp_path, 2)
    cache = TranscriptCache(store, max_open=4, shared=False)
    created: list[str] = []

    async def create_missing(rec: SessionRecord) -> Transcript:
        created.append(rec.session_id)
        return await asyncio.to_thread(store.create, rec.session_id, rec.key)

    cache.create_missing = create_missing  # type: ignore[assignment]
    await cache.prefetch(record("s0").key)  # a key no run has used: nothing to read
    assert store.opened == []

    gone = record("s1")
    await cache.get(gone)
    cache.forget("s1")  # archived: its key has no session to read ahead of
    await cache.prefetch(gone.key)
    assert store.opened == ["s1"]

    # The registry row exists but its transcript does not: the prefetch fails, and the
    # run's own open creates it.
    missing = record("s9")
    await cache.get(record("s0"))
    cache._remember(missing.key, "s9")
    with pytest.raises(TranscriptError):
        await cache.prefetch(missing.key)
    assert created == []
    transcript = await cache.get(missing)
    assert created == ["s9"] and transcript.header.id == "s9"

    shared = TranscriptCache(store, max_open=4, shared=True)
    await shared.get(record("s0"))
    shared.forget("s0")
    shared._remember(record("s0").key, "s0")
    opened = len(store.opened)
    await shared.prefetch(record("s0").key)  # several replicas: a run reads for itself
    assert len(store.opened) == opened
    cache.close_all()
    shared.close_all()


async def test_a_transcript_in_use_is_never_let_go_of(tmp_path: Path) -> None:
    cache = TranscriptCache(sessions(tmp_path, 3), max_open=1, shared=False, warm_bytes=0)
    running = {record("s0").key}
    cache.in_use = running.__contains__
    held = await cache.get(record("s0"))  # a run holds it from here to its delivery
    await cache.get(record("s1"))
    await cache.get(record("s2"))  # past max_open: s1 goes, s0 stays
    assert not held.closed
    held.append_message(Message.assistant("the run's reply"))  # a closed one would refuse
    running.clear()  # the run is over: s0 can go now
    await cache.get(record("s1"))
    assert held.closed
    cache.close_all()
    reread = Transcript.open(tmp_path / "s0.jsonl")
    assert [e.message.text for e in reread.live_entries()][-1] == "the run's reply"
    reread.close()


class GatedStore(CountingStore):
    """Opens wait for ``release`` (set from the test), and keep what they opened."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()
        self.transcripts: list[Transcript] = []
        self.fail_next: Exception | None = None

    def open(self, session_id: str, *, read_only: bool = False) -> Transcript:
        assert self.release.wait(WAIT)
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            raise failure
        transcript = super().open(session_id, read_only=read_only)
        self.transcripts.append(transcript)
        return transcript


WAIT = 5.0


async def opened_later(tmp_path: Path) -> tuple[GatedStore, TranscriptCache]:
    sessions(tmp_path, 2)
    store = GatedStore(tmp_path)
    cache = TranscriptCache(store, max_open=1, shared=False)
    store.release.set()
    await cache.get(record("s0"))
    await cache.get(record("s1"))  # s0 closed (no warm budget): a prefetch reads it
    store.release.clear()
    return store, cache


@pytest.mark.parametrize("let_go", ["forget", "close_all"])
async def test_a_prefetch_finishing_after_its_session_was_let_go_of_keeps_nothing(
    tmp_path: Path, let_go: str
) -> None:
    store, cache = await opened_later(tmp_path)
    prefetch = asyncio.create_task(cache.prefetch(record("s0").key))
    await asyncio.sleep(0)  # its open waits in a worker thread
    if let_go == "forget":
        cache.forget("s0")  # the session was reset: archived
    else:
        cache.close_all()  # the gateway stops
    store.release.set()
    with pytest.raises(TranscriptError, match="let go of while it opened"):
        await prefetch
    assert store.transcripts[-1].header.id == "s0" and store.transcripts[-1].closed
    assert await cache.cached(record("s0")) is None
    cache.close_all()


async def test_a_run_whose_prefetch_failed_opens_its_transcript_itself(tmp_path: Path) -> None:
    store, cache = await opened_later(tmp_path)
    store.fail_next = OSError("disk hiccup")
    prefetch = asyncio.create_task(cache.prefetch(record("s0").key))
    await asyncio.sleep(0)
    run = asyncio.create_task(cache.get(record("s0")))  # shares the prefetch's read
    await asyncio.sleep(0)
    store.release.set()
    with pytest.raises(OSError, match="disk hiccup"):
        await prefetch
    transcript = await run  # the failure was the prefetch's: the run read for itself
    assert transcript.header.id == "s0" and not transcript.closed
    assert [e.message.text for e in transcript.live_entries()] == ["hello from s0"]
    cache.close_all()


async def test_an_archived_session_never_becomes_its_keys_prefetch(tmp_path: Path) -> None:
    store = counting_sessions(tmp_path, 2)
    cache = TranscriptCache(store, max_open=1, shared=False)
    active = record("s0")
    archived = dataclasses.replace(record("s1"), key=active.key, status="archived")
    await cache.get(active)
    await cache.get(archived)  # a stored reply of the old session is sent; s0 let go of
    opened = len(store.opened)
    await cache.prefetch(active.key)
    assert store.opened[opened:] == ["s0"]  # the key's active session, not the archived one
    cache.close_all()
