"""The transcript stores, one suite over both backends: the runtime above them must
not be able to tell which it holds."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from parley.core.errors import TranscriptError
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from parley.core.transcript import Entry
from parley.core.transcript import base as transcript_module
from parley.core.transcript_store import (
    FileTranscriptStore,
    SessionTranscript,
    TranscriptStore,
    export_transcript,
    write_jsonl,
)
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.transcripts import PgTranscriptStore

SID = "0123456789abcdef0123456789abcdef"
KEY = "agent:main:telegram:direct:42"
META = {"agent": "main", "memory_scope": "peer:telegram:42"}


def _file_store(tmp_path: Path) -> FileTranscriptStore:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    return FileTranscriptStore(sessions)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PgTranscriptStore]:
    # The stores are synchronous (the runtime calls them from worker threads), so the
    # tests are too; the pool's own open and close need a loop of their own.
    db = PgDatabase(pg_url)
    asyncio.run(db.open())
    try:
        yield PgTranscriptStore(db)
    finally:
        asyncio.run(db.close())


@pytest.fixture(params=["file", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TranscriptStore:
    if request.param == "file":
        return _file_store(tmp_path)
    return request.getfixturevalue("pg_store")


def _fill(t: SessionTranscript) -> list[Entry]:
    """A little of everything, non-ASCII and a lone surrogate included (the line is
    then written with \\u escapes, ASCII only)."""
    return [
        t.append_message(Message.user("héllo ✓"), meta={"inbox_ids": [7]}),
        t.append_message(
            Message("assistant", (TextBlock("looking"), ToolUseBlock("t1", "search", {"q": "x"}))),
            usage=Usage(10, 5, 3, 2),
        ),
        t.append_message(Message("tool_result", (ToolResultBlock("t1", "found ✓\x00"),))),
        t.append_custom("delivery", {"ok": True, "inbox_ids": [7]}),
        t.append_message(Message.assistant("done — ünïcode \ud800")),
    ]


def _compact(t: SessionTranscript, keep: Entry | None, trigger: str = "threshold") -> Entry:
    return t.append_compaction(
        f"summary ({trigger})",
        first_kept_entry_id=keep.id if keep is not None else None,
        tokens_before=1000,
        tokens_after=200,
        trigger=trigger,
        details={"n": 1},
    )


# -- the suite over both backends ---------------------------------------------------------


def test_create_append_reopen(store: TranscriptStore) -> None:
    assert not store.exists(SID) and store.info(SID) is None
    with store.create(SID, KEY, META) as t:
        written = _fill(t)
        assert list(t.live_entries()) == written
        assert t.entry_count == 5 and t.last_entry == written[-1]
        assert [e.parent_id for e in written[1:]] == [e.id for e in written[:-1]]
        cycle = t.cycle_bytes
        header = t.header
    assert cycle > 0 and t.closed
    assert store.exists(SID)
    assert [i.session_id for i in store.list_transcripts()] == [SID]

    with store.open(SID) as again:
        assert again.header == header
        assert (header.id, header.key, header.meta) == (SID, KEY, META)
        assert again.load_report.clean
        assert list(again.live_entries()) == written
        assert list(again.entries()) == written
        assert again.entry_count == 5 and again.last_entry == written[-1]
        assert again.cycle_bytes == cycle
        assert again.live_entries()[4].message.text == "done — ünïcode \ud800"
        # Appends go on from where the first writer stopped.
        more = again.append_custom("note", {"x": 1})
        assert more.parent_id == written[-1].id and again.entry_count == 6


def test_create_refuses_an_existing_transcript_and_open_a_missing_one(
    store: TranscriptStore,
) -> None:
    store.create(SID, KEY).close()
    with pytest.raises(TranscriptError, match="already exists"):
        store.create(SID, KEY)
    with pytest.raises(TranscriptError, match="not found"):
        store.open("f" * 32)
    with pytest.raises(TranscriptError, match="not a session id"):
        store.open("../state")


def test_info_stamp_changes_with_every_append(store: TranscriptStore) -> None:
    with store.create(SID, KEY) as t:
        before = store.info(SID)
        t.append_custom("note", {})
        after = store.info(SID)
    assert before is not None and after is not None
    assert before.stamp != after.stamp
    assert after == store.list_transcripts()[0]


def test_live_view_runs_from_the_latest_compaction(store: TranscriptStore) -> None:
    with store.create(SID, KEY) as t:
        written = _fill(t)
        compaction = _compact(t, keep=written[2])
        assert list(t.live_entries()) == [*written[2:], compaction]
        assert t.cycle_bytes == 0
        tail = t.append_message(Message.user("after"))
        after_bytes = t.cycle_bytes
        assert after_bytes == len(tail.to_json().encode()) + 1
        with pytest.raises(TranscriptError, match="not a live entry"):
            _compact(t, keep=written[0])  # compacted away: refused, nothing written
        assert t.entry_count == 7
    with store.open(SID) as t:
        assert list(t.live_entries()) == [*written[2:], compaction, tail]
        assert t.cycle_bytes == after_bytes
        assert t.entry_count == 7
        # A compaction that keeps nothing: the window is the compaction alone.
        bare = _compact(t, keep=None, trigger="manual")
        assert list(t.live_entries()) == [bare]
    with store.open(SID, read_only=True) as t:
        assert list(t.live_entries()) == [bare]
        assert t.load_report.lines_parsed == 1  # nothing before the compaction is read
        assert len(list(t.entries())) == 8


def test_paging_counts_entry_lines(store: TranscriptStore) -> None:
    with store.create(SID, KEY) as t:
        written = [t.append_custom("n", {"i": i}) for i in range(7)]
        assert list(t.numbered_entries(2, 3)) == [(2, written[2]), (3, written[3]), (4, written[4])]
        assert list(t.entries(5)) == written[5:]
        assert list(t.entries(5, 10)) == written[5:]
        assert list(t.entries(3, 0)) == []
        assert list(t.entries(99)) == []
        with pytest.raises(ValueError):
            list(t.entries(-1))
        with pytest.raises(ValueError):
            list(t.entries(0, -1))


def test_read_only_refuses_appends_and_changes_nothing(store: TranscriptStore) -> None:
    with store.create(SID, KEY) as t:
        written = _fill(t)
    before = store.info(SID)
    with store.open(SID, read_only=True) as t:
        with pytest.raises(TranscriptError, match="read-only"):
            t.append_message(Message.user("no"))
        with pytest.raises(TranscriptError, match="read-only"):
            t.append_custom("x", {})
        assert list(t.entries()) == written and t.entry_count == 5
    assert store.info(SID) == before


def test_a_closed_transcript_refuses_reads(store: TranscriptStore) -> None:
    t = store.create(SID, KEY)
    t.append_custom("x", {})
    t.close()
    t.close()  # twice is fine
    assert t.closed
    with pytest.raises(TranscriptError, match="closed"):
        list(t.entries())
    with pytest.raises(TranscriptError, match="closed"):
        t.append_custom("y", {})


def test_export_writes_the_jsonl_file(store: TranscriptStore, tmp_path: Path) -> None:
    with store.create(SID, KEY, META) as t:
        written = _fill(t)
        _compact(t, keep=written[3])
        live = list(t.live_entries())
        streamed = b"".join(line + b"\n" for line in t.raw_lines())
    target = tmp_path / "export.jsonl"
    size = export_transcript(store, SID, target)
    data = target.read_bytes()
    assert size == len(data) and data == streamed
    assert target.stat().st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 1 + 6 + 1
    assert json.loads(lines[0]) == {
        "type": "session",
        "version": 1,
        "id": SID,
        "key": KEY,
        "created": json.loads(lines[0])["created"],
        "meta": META,
    }
    assert [Entry.from_json(line) for line in lines[1:-1]] == [*written, live[-1]]

    # The export is a transcript file like any other: the file backend opens it.
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    (copy_dir / f"{SID}.jsonl").write_bytes(data)
    with FileTranscriptStore(copy_dir).open(SID, read_only=True) as copy:
        assert list(copy.live_entries()) == live and copy.load_report.clean


# -- the two backends side by side --------------------------------------------------------


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Entry ids and times that repeat, so two backends' lines can be compared; call
    the result to start the ids over."""

    def restart() -> None:
        counter = itertools.count()
        monkeypatch.setattr(transcript_module, "new_entry_id", lambda: f"{next(counter):016x}")

    restart()
    monkeypatch.setattr(transcript_module, "_now_iso", lambda: "2026-01-02T03:04:05.678Z")
    return restart


def _same_appends(store: TranscriptStore) -> SessionTranscript:
    t = store.create(SID, KEY, META)
    written = _fill(t)
    _compact(t, keep=written[1])
    t.append_message(Message.user("and then"))
    return t


def test_both_backends_export_the_same_bytes(
    fixed_ids: Callable[[], None], tmp_path: Path, pg_store: PgTranscriptStore
) -> None:
    files = _file_store(tmp_path)
    with _same_appends(files) as on_disk:
        file_view = (list(on_disk.live_entries()), on_disk.cycle_bytes, on_disk.entry_count)
    fixed_ids()
    with _same_appends(pg_store) as in_table:
        pg_view = (list(in_table.live_entries()), in_table.cycle_bytes, in_table.entry_count)
    assert pg_view == file_view

    exported_file = tmp_path / "file.jsonl"
    exported_pg = tmp_path / "pg.jsonl"
    export_transcript(files, SID, exported_file)
    export_transcript(pg_store, SID, exported_pg)
    assert exported_pg.read_bytes() == exported_file.read_bytes()
    # ... and the file backend's export is the file itself.
    original = (tmp_path / "sessions" / f"{SID}.jsonl").read_bytes()
    assert exported_file.read_bytes() == original
    # cycle_bytes counts exactly the file's bytes after the compaction line.
    after = original.split(b"\n")[-2]
    assert file_view[1] == len(after) + 1

    with files.open(SID) as a, pg_store.open(SID) as b:
        assert list(a.numbered_entries()) == list(b.numbered_entries())
        assert (a.header, list(a.live_entries()), a.cycle_bytes) == (
            b.header,
            list(b.live_entries()),
            b.cycle_bytes,
        )


def test_write_jsonl_streams_an_open_writer(store: TranscriptStore, tmp_path: Path) -> None:
    """What a compaction checkpoint writes: the transcript as it is now, while open."""
    with store.create(SID, KEY) as t:
        _fill(t)
        out = io.BytesIO()
        assert write_jsonl(t, out) == len(out.getvalue())
        t.append_custom("later", {})
    export_transcript(store, SID, tmp_path / "all.jsonl")
    everything = (tmp_path / "all.jsonl").read_bytes()
    assert everything.startswith(out.getvalue())
    assert everything.count(b"\n") == out.getvalue().count(b"\n") + 1 == 7
