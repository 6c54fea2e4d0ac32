"""The gateway's transcript cache: files open up to ``max_open``, then warm windows."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

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
