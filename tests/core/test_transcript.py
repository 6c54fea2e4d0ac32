"""Transcripts: round trips, torn-tail repair, corrupt lines, tail-only loading."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from parley.core.errors import TranscriptError
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from parley.core.transcript import Entry, Transcript
from parley.core.transcript import entries as entries_module
from parley.core.transcript import file as transcript_module


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def _fill(t: Transcript) -> list[Entry]:
    """A little of everything, non-ASCII included (so byte cuts split characters)."""
    return [
        t.append_message(Message.user("héllo ✓"), meta={"inbox_id": 7}),
        t.append_message(
            Message("assistant", (TextBlock("looking"), ToolUseBlock("t1", "search", {"q": "x"}))),
            usage=Usage(10, 5, 3, 2),
        ),
        t.append_message(Message("tool_result", (ToolResultBlock("t1", "found ✓"),))),
        t.append_custom("delivery", {"ok": True, "message_ids": ["a", "b"]}),
        t.append_message(Message.assistant("done — ünïcode"), meta={"delivery": {"ok": True}}),
    ]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "sess.jsonl"


def test_round_trip(path: Path) -> None:
    with Transcript.create(path, "sess", "telegram:dm:42", {"channel": "telegram"}) as t:
        written = _fill(t)
        assert list(t.live_entries()) == written
        assert t.entry_count == 5
        assert t.last_entry == written[-1]

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = _lines(path)
    header = json.loads(lines[0])
    assert header["type"] == "session" and header["version"] == 1
    assert (header["id"], header["key"], header["meta"]) == (
        "sess",
        "telegram:dm:42",
        {"channel": "telegram"},
    )
    assert header["created"].endswith("Z")
    first = json.loads(lines[1])
    assert list(first)[:4] == ["id", "parent_id", "ts", "type"]
    assert len(first["id"]) == 16 and int(first["id"], 16) >= 0
    assert first["meta"] == {"inbox_id": 7}
    assert json.loads(lines[2])["usage"] == {
        "input": 10,
        "output": 5,
        "cache_read": 3,
        "cache_write": 2,
    }

    with Transcript.open(path) as again:
        assert again.header.key == "telegram:dm:42"
        assert list(again.live_entries()) == written
        assert list(again.entries()) == written
        assert again.entry_count == 5
        assert again.load_report.clean
        assert [e.parent_id for e in written] == [None] + [e.id for e in written[:-1]]
        assert written[1].message.tool_uses[0].input == {"q": "x"}
        assert written[1].usage == Usage(10, 5, 3, 2)
        assert written[3].payload["data"]["message_ids"] == ["a", "b"]
        assert again.live_entries()[0].to_json() == lines[1].decode()
        with pytest.raises(TranscriptError):
            _ = written[3].message
        nxt = again.append_message(Message.user("more"))
        assert nxt.parent_id == written[-1].id


def test_create_refuses_to_overwrite(path: Path) -> None:
    Transcript.create(path, "a", "k").close()
    before = path.read_bytes()
    with pytest.raises(TranscriptError, match="already exists"):
        Transcript.create(path, "b", "k")
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no scratch left


def test_create_never_leaves_a_transcript_without_its_header(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill after the file appeared but before its header was written used to leave
    an empty transcript that failed its session for good (the crash soak hit it). The
    transcript now appears with its header or not at all: while the header is being
    written, nothing is at the transcript's name yet."""
    seen_during_write: list[bool] = []
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        seen_during_write.append(path.exists())
        return real_write(fd, data)

    monkeypatch.setattr("parley.core.transcript.file.os.write", write)
    Transcript.create(path, "a", "k").close()
    monkeypatch.undo()
    assert seen_during_write and not any(seen_during_write)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    with Transcript.open(path) as reopened:
        assert reopened.entry_count == 0


def test_open_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TranscriptError, match="not found"):
        Transcript.open(tmp_path / "nope.jsonl")


def test_unserialisable_payload_is_rejected_before_writing(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        kept = t.append_message(Message.user("one"))
        size = path.stat().st_size
        with pytest.raises(TranscriptError):
            t.append_custom("bad", {"x": object()})
        with pytest.raises(TranscriptError):
            t.append_custom("nan", {"x": float("nan")})
        with pytest.raises(TranscriptError):
            t.append_message(Message("assistant", (ToolUseBlock("t", "n", {"s": {1, 2}}),)))
        assert path.stat().st_size == size
        assert list(t.live_entries()) == [kept]
        # Platform text can carry a lone surrogate: stored escaped, read back intact.
        odd = t.append_message(Message.user("bad \ud800 surrogate"))
        assert odd.parent_id == kept.id
    with Transcript.open(path) as t:
        assert t.live_entries()[-1].message.text == "bad \ud800 surrogate"
        assert t.load_report.clean


def test_in_memory_entries_match_what_a_reopen_reads(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        entry = t.append_custom("c", {"ids": (1, 2), 3: "int key"})
        assert entry.payload["data"] == {"ids": [1, 2], "3": "int key"}
    with Transcript.open(path) as t:
        assert list(t.live_entries()) == [entry]


def test_truncated_at_every_byte_of_the_last_entry(tmp_path: Path) -> None:
    source = tmp_path / "source.jsonl"
    with Transcript.create(source, "s", "k") as t:
        written = _fill(t)
    data = source.read_bytes()
    last_start = data.rindex(b"\n", 0, len(data) - 1) + 1
    for cut in range(last_start, len(data)):
        path = tmp_path / f"cut-{cut}.jsonl"
        path.write_bytes(data[:cut])
        with Transcript.open(path) as t:
            report = t.load_report
            complete = cut == len(data) - 1  # everything but the newline made it
            survivors = written if complete else written[:-1]
            assert list(t.live_entries()) == survivors, cut
            assert report.torn_tail_bytes == cut - last_start
            expected = "none" if cut == last_start else "completed" if complete else "truncated"
            assert report.torn_tail_action == expected
            assert t.entry_count == len(survivors)
            assert path.read_bytes() == (data if complete else data[:last_start])
            added = t.append_message(Message.user("after the crash"))
            assert added.parent_id == survivors[-1].id
        with Transcript.open(path) as again:
            assert list(again.live_entries()) == [*survivors, added]
            assert again.load_report.clean


def test_torn_tail_of_a_huge_line_across_many_blocks(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        kept = t.append_message(Message.user("short"))
        t.append_message(Message.assistant("x" * 300_000))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with Transcript.open(path, block_size=4096) as t:
        assert list(t.live_entries()) == [kept]
        assert t.load_report.torn_tail_bytes > 290_000


def test_corrupt_middle_lines_are_skipped_and_reported(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        written = _fill(t)
    lines = _lines(path)
    lines[2] = b'{"id": "broken'  # line 3
    lines[3] = b"[1, 2]"  # line 4: JSON, but not an entry
    lines.insert(4, b"")  # line 5: blank
    path.write_bytes(b"\n".join(lines) + b"\n")
    with Transcript.open(path) as t:
        assert t.load_report.corrupt_lines == (3, 4, 5)
        assert not t.load_report.clean
        assert list(t.live_entries()) == [written[0], written[3], written[4]]
        assert t.entry_count == 6  # every line after the header, the corrupt ones included
        assert t.append_custom("x", {}).parent_id == written[-1].id
        page = list(t.entries(offset=1, limit=3))  # slots 1-3 are corrupt lines
        assert page == []
        assert list(t.entries(offset=4)) == [written[3], written[4], t.last_entry]


@pytest.mark.parametrize(
    "bad",
    [
        b'{"no": "envelope"}',  # JSON, so the window still parses in one go
        b'{"a": 1}, {"b": 2}',  # two values on one line: counted, not taken as two
        b"\xff\xfe not utf-8",
    ],
)
def test_a_bad_line_among_good_ones_costs_only_its_own_slot(path: Path, bad: bytes) -> None:
    with Transcript.create(path, "s", "k") as t:
        written = _fill(t)
    lines = _lines(path)
    lines[3] = bad  # line 4 of the file: the third entry
    path.write_bytes(b"\n".join(lines) + b"\n")
    with Transcript.open(path) as t:
        assert t.load_report.corrupt_lines == (4,)
        assert list(t.live_entries()) == [written[0], written[1], written[3], written[4]]


def test_a_window_parsed_in_chunks_is_the_same_window(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Transcript.create(path, "s", "k") as t:
        written = _fill(t)
    lines = _lines(path)
    lines[4] = b"not json"  # line 5: in the second chunk of two lines
    path.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(entries_module, "PARSE_CHUNK_LINES", 2)
    with Transcript.open(path) as t:
        assert t.load_report.corrupt_lines == (5,)
        assert list(t.live_entries()) == [written[0], written[1], written[2], written[4]]


def test_a_window_shares_its_key_strings(path: Path) -> None:
    """Parsed in one go, the entries of a window share the decoder's key strings
    rather than each holding its own copies (the memory a warm window takes)."""
    with Transcript.create(path, "s", "k") as t:
        for i in range(3):
            t.append_message(Message.user(f"m{i}"), meta={"inbox_ids": [i]})
    with Transcript.open(path) as t:
        first, second, third = (e.payload for e in t.live_entries())
    keys = [next(k for k in p if k == "meta") for p in (first, second, third)]
    assert keys[0] is keys[1] is keys[2]


def test_corrupt_last_complete_line_does_not_break_the_chain(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        written = _fill(t)
    with path.open("ab") as f:
        f.write(b"garbage\n")
    with Transcript.open(path) as t:
        assert t.load_report.corrupt_lines == (7,)
        assert t.last_entry == written[-1]
        assert t.append_custom("x", {}).parent_id == written[-1].id


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b'{"type":"session","vers', "torn"),
        (b"not json at all\n", "unreadable"),
        (b'{"type":"session","version":99,"id":"s","key":"k","created":"x"}\n', "version"),
        (b'{"type":"message","id":"x"}\n{"id":"a"}\n', "not a transcript header"),
    ],
)
def test_unreadable_header_is_an_error(path: Path, content: bytes, message: str) -> None:
    path.write_bytes(content)
    with pytest.raises(TranscriptError, match=message):
        Transcript.open(path)


def test_header_missing_only_its_newline_is_completed(path: Path) -> None:
    Transcript.create(path, "s", "k").close()
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    with Transcript.open(path) as t:
        assert t.load_report.torn_tail_action == "completed"
        assert t.header.id == "s"
        assert t.entry_count == 0
        first = t.append_message(Message.user("hi"))
    with Transcript.open(path) as t:
        assert list(t.live_entries()) == [first]


def test_read_only_open_leaves_a_torn_file_alone(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        written = _fill(t)
    torn = path.read_bytes()[:-5]
    path.write_bytes(torn)
    with Transcript.open(path, read_only=True) as t:
        assert t.load_report.torn_tail_action == "ignored"
        assert list(t.live_entries()) == written[:-1]
        assert list(t.entries()) == written[:-1]
        with pytest.raises(TranscriptError, match="read-only"):
            t.append_message(Message.user("no"))
    assert path.read_bytes() == torn


def _long_file(path: Path, before: int) -> tuple[list[Entry], Entry]:
    """``before`` messages, a compaction keeping the last 3 of them, then 2 more."""
    with Transcript.create(path, "s", "k") as t:
        for i in range(before):
            t.append_message(Message.user(f"message {i}") if i % 2 else Message.assistant("ok"))
        kept = list(t.live_entries()[-3:])
        compaction = t.append_compaction(
            "what happened",
            first_kept_entry_id=kept[0].id,
            tokens_before=5000,
            tokens_after=300,
            trigger="auto-threshold",
            details={"ledger": ["x"]},
        )
        after = [t.append_message(Message.user("after")), t.append_custom("note", {})]
        live = [*kept, compaction, *after]
        assert list(t.live_entries()) == live
    return live, compaction


def test_opening_a_long_file_reads_only_the_tail(path: Path) -> None:
    live, compaction = _long_file(path, 10_000)
    size = path.stat().st_size
    with Transcript.open(path) as t:
        assert list(t.live_entries()) == live
        report = t.load_report
        assert report.lines_parsed <= 10
        assert report.bytes_read < 3 * transcript_module.DEFAULT_READ_BLOCK < size // 4
        assert report.clean
        assert t.entry_count == 10_000 + 3  # counted lazily from raw newlines
        assert t.live_entries()[3].payload["details"] == {"ledger": ["x"]}
        assert sum(1 for _ in t.entries()) == 10_003
        assert [e.id for e in t.entries(offset=9_999, limit=2)] == [live[2].id, compaction.id]


def test_tiny_blocks_find_the_same_window(path: Path) -> None:
    live, _ = _long_file(path, 50)
    with Transcript.open(path, block_size=7) as t:
        assert list(t.live_entries()) == live
        assert t.entry_count == 53


def test_compaction_keeping_nothing_starts_the_window_at_itself(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        _fill(t)
        compaction = t.append_compaction(
            "all of it", first_kept_entry_id=None, tokens_before=9, tokens_after=1, trigger="manual"
        )
        after = t.append_message(Message.user("next"))
        assert list(t.live_entries()) == [compaction, after]
    with Transcript.open(path) as t:
        assert list(t.live_entries()) == [compaction, after]
        assert t.load_report.lines_parsed <= 3


def test_latest_of_several_compactions_wins(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        first = _fill(t)
        t.append_compaction(
            "one", first_kept_entry_id=first[-1].id, tokens_before=1, tokens_after=1, trigger="m"
        )
        more = _fill(t)
        second = t.append_compaction(
            "two", first_kept_entry_id=more[2].id, tokens_before=1, tokens_after=1, trigger="m"
        )
        live = list(t.live_entries())
        assert live == [*more[2:], second]
    with Transcript.open(path) as t:
        assert list(t.live_entries()) == live


def test_compaction_must_keep_a_live_entry(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        old = _fill(t)[0]
        t.append_compaction(
            "s", first_kept_entry_id=old.id, tokens_before=1, tokens_after=1, trigger="m"
        )
        t.append_compaction(
            "s", first_kept_entry_id=None, tokens_before=1, tokens_after=1, trigger="m"
        )
        size = path.stat().st_size
        with pytest.raises(TranscriptError, match="not a live entry"):
            t.append_compaction(
                "s", first_kept_entry_id=old.id, tokens_before=1, tokens_after=1, trigger="m"
            )
        assert path.stat().st_size == size


def test_missing_first_kept_entry_falls_back_to_the_compaction(path: Path) -> None:
    live, compaction = _long_file(path, 20)
    lines = _lines(path)
    kept_line = next(i for i, line in enumerate(lines) if live[0].id.encode() in line)
    lines[kept_line] = b"corrupted beyond repair"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with Transcript.open(path) as t:
        assert t.load_report.missing_first_kept_id == live[0].id
        assert list(t.live_entries()) == live[3:]
        assert t.live_entries()[0] == compaction
        assert t.entry_count == 23


def test_appends_after_open_never_reread_the_file(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _long_file(path, 30)
    t = Transcript.open(path)

    def no_reads(*args: object) -> bytes:
        raise AssertionError("the transcript re-read its file")

    monkeypatch.setattr(os, "pread", no_reads)
    monkeypatch.setattr(os, "read", no_reads)
    views = [t.live_entries()]
    added = [t.append_message(Message.user(f"turn {i}")) for i in range(5)]
    views.append(t.live_entries())
    compaction = t.append_compaction(
        "later", first_kept_entry_id=added[3].id, tokens_before=1, tokens_after=1, trigger="m"
    )
    tail = t.append_message(Message.assistant("fine"))
    assert list(t.live_entries()) == [added[3], added[4], compaction, tail]
    assert list(views[1][-5:]) == added and len(views[0]) == len(views[1]) - 5
    monkeypatch.undo()
    t.close()
    with Transcript.open(path) as again:
        assert list(again.live_entries()) == [added[3], added[4], compaction, tail]
        assert again.entry_count == 33 + 7


def test_short_write_is_rolled_back(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A full disk accepts part of a write: that part must not stay behind.
    with Transcript.create(path, "s", "k") as t:
        first = t.append_message(Message.user("one"))
        size = path.stat().st_size
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[: len(data) // 2]))
        with pytest.raises(TranscriptError, match="short write"):
            t.append_message(Message.user("two"))
        monkeypatch.undo()
        assert path.stat().st_size == size
        assert t.last_entry == first
        second = t.append_message(Message.user("three"))
        assert second.parent_id == first.id
    with Transcript.open(path) as t:
        assert list(t.live_entries()) == [first, second]
        assert t.load_report.clean


def test_fsync_flag_syncs_every_append(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with Transcript.create(path, "s", "k", fsync=True) as t:
        created = len(synced)
        t.append_message(Message.user("a"))
        t.append_custom("b", {})
        assert len(synced) == created + 2
    with Transcript.open(path) as t:
        t.append_message(Message.user("c"))
    assert len(synced) == created + 2


def test_unknown_entry_types_are_kept(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        first = t.append_message(Message.user("a"))
    with path.open("ab") as f:
        f.write(b'{"id":"ffff","parent_id":null,"ts":"2026-01-01T00:00:00.000Z","type":"label"}\n')
    with Transcript.open(path) as t:
        assert [e.type for e in t.live_entries()] == ["message", "label"]
        assert t.live_entries()[0] == first
        assert t.append_custom("x", {}).parent_id == "ffff"


def test_closed_transcript_refuses_work(path: Path) -> None:
    t = Transcript.create(path, "s", "k")
    t.close()
    t.close()  # idempotent
    assert t.closed
    with pytest.raises(TranscriptError, match="closed"):
        t.append_message(Message.user("x"))
    with pytest.raises(TranscriptError, match="closed"):
        list(t.entries())


def test_a_window_parses_in_chunks_as_it_does_line_by_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunked parse (msgspec) and the line-by-line one (json) read a window the same,
    including the lines msgspec refuses: a lone surrogate's escape, which the writer
    produces on purpose, a NaN or a number out of range a hand edit left, a stray byte,
    nesting too deep for either parser, a corrupt line and two values on one."""
    good = Entry(
        "e1",
        None,
        "2026-01-01T00:00:00.000Z",
        "message",
        {"message": {"role": "user", "content": "hi ✓"}},
    )
    deep = b"[" * 5000 + b"]" * 5000  # deeper than either parser goes
    lines = [
        good.to_json().encode(),
        entries_module.encode_record(
            {**good.to_dict(), "id": "e2", "message": {"role": "user", "content": "odd \ud800"}}
        ),
        b'{"id":"e3","parent_id":null,"ts":"t","type":"custom","custom_type":"x","data":NaN}',
        b'{"id":"e8","parent_id":null,"ts":"t","type":"custom","custom_type":"x","data":1e999}',
        b'{"id":"e9","parent_id":null,"ts":"t","type":"custom","custom_type":"\xff"}',
        b'{"id":"e10","parent_id":null,"ts":"t","type":"custom","d":' + deep + b"}",
        b'{"id":"e4","parent_id":null,"ts":"t","type":"mess',
        b'{"id":"e5","parent_id":null,"ts":"t","type":"custom"},{"id":"e6"}',
        good.to_json().replace('"e1"', '"e7"').encode(),
    ]
    one_by_one = [entries_module.parse_entry_or_none(line) for line in lines]

    for chunk_lines in (2, 3, len(lines)):
        monkeypatch.setattr(entries_module, "PARSE_CHUNK_LINES", chunk_lines)
        chunked = entries_module.parse_entries_or_none(lines)
        assert chunked == one_by_one
    assert [e.id if e else None for e in one_by_one] == [
        "e1",
        "e2",
        "e3",
        "e8",
        None,
        None,
        None,
        None,
        "e7",
    ]
    assert one_by_one[1] is not None and one_by_one[1].message.text == "odd \ud800"
    # Clean lines take the fast path and read back equal; in a chunk the fast parser
    # refuses, only the lines it refuses go to json, each on its own: one odd line does
    # not keep the rest of its chunk from the fast read.
    assert entries_module.parse_entries_or_none(lines[:1] + lines[-1:]) == [
        one_by_one[0],
        one_by_one[-1],
    ]
    parsed_whole: list[int] = []
    real_loads = entries_module.json.loads

    def counting_loads(data: bytes) -> object:
        parsed_whole.append(len(data))
        return real_loads(data)

    monkeypatch.setattr(entries_module.json, "loads", counting_loads)
    monkeypatch.setattr(entries_module, "PARSE_CHUNK_LINES", 3)
    three = entries_module.parse_entries_or_none(lines[:3])
    assert parsed_whole == [len(lines[1]), len(lines[2])]  # not the clean first line
    assert three == one_by_one[:3]


def test_appended_since_answers_from_what_this_object_appended(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        appended = [t.append_message(Message.user(f"m{i}")) for i in range(3)]
        assert t.entry_count == 3
        assert t.appended_since(0) == (3, appended)
        since_one = t.appended_since(1)
        assert since_one is not None
        assert all(a is b for a, b in zip(since_one[1], appended[1:], strict=True))
        assert t.appended_since(3) == (3, [])
        assert t.appended_since(4) is None  # lines it does not have
        for i in range(transcript_module.APPENDS_KEPT):
            t.append_message(Message.user(f"more {i}"))
        assert t.appended_since(0) is None  # older than the appends it keeps
    with Transcript.open(path) as again:
        newest = again.append_message(Message.assistant("after a reopen"))
        assert again.entry_count == 4 + transcript_module.APPENDS_KEPT
        assert again.appended_since(3 + transcript_module.APPENDS_KEPT) == (
            4 + transcript_module.APPENDS_KEPT,
            [newest],
        )
        assert again.appended_since(2) is None  # read at open, not appended by this object


def test_appended_since_never_waits_for_a_writer(path: Path) -> None:
    with Transcript.create(path, "s", "k") as t:
        t.append_message(Message.user("hi"))
        assert t.entry_count == 1
        held, done = threading.Event(), threading.Event()

        def writer() -> None:  # a worker thread in the middle of an append (and fsync)
            with t._lock:
                held.set()
                done.wait(5)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            assert held.wait(5)
            assert t.appended_since(0) is None  # the caller reads on a thread instead
        finally:
            done.set()
            thread.join()
        assert t.appended_since(0) is not None
