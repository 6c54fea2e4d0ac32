"""Pages of a transcript file: the sparse line index (core/transcript/line_index.py)
gives the same pages as a scan from the start, and a late page reads little."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parley.core.messages import Message
from parley.core.transcript import Entry, Transcript, parse_entry_or_none
from parley.core.transcript import file as transcript_module
from parley.core.transcript.line_index import LineIndex, scan


def _reference(path: Path, size: int | None = None) -> list[tuple[int, Entry]]:
    """Every (line number, entry) of the file, read the obvious way."""
    data = path.read_bytes()
    if size is not None:
        data = data[:size]
    lines = data.split(b"\n")[1:-1]  # the header; what follows the last newline
    return [(i, e) for i, line in enumerate(lines) if (e := parse_entry_or_none(line)) is not None]


def _page(ref: list[tuple[int, Entry]], offset: int, limit: int | None) -> list[tuple[int, Entry]]:
    stop = None if limit is None else offset + limit
    return [(i, e) for i, e in ref if i >= offset and (stop is None or i < stop)]


# An entry, or a corrupt line (it still takes its slot), some longer than a read block.
_LINES = st.lists(
    st.one_of(
        st.text(max_size=40).map(lambda text: ("entry", text)),
        st.sampled_from([b"garbage", b"", b"[1, 2]", b'{"id": "torn']).map(lambda b: ("bad", b)),
        st.just(("long", "x" * 3000)),
    ),
    max_size=60,
)
_QUERIES = st.lists(
    st.tuples(st.integers(0, 70), st.one_of(st.none(), st.integers(0, 20))), max_size=12
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=_LINES,
    more=_LINES,
    queries=_QUERIES,
    stride=st.integers(1, 7),
    block=st.sampled_from([64, 1024, 1 << 20]),
    torn=st.sampled_from([None, "cut", "newline"]),
)
def test_pages_equal_a_scan_from_the_start(
    lines: list[tuple[str, str | bytes]],
    more: list[tuple[str, str | bytes]],
    queries: list[tuple[int, int | None]],
    stride: int,
    block: int,
    torn: str | None,
) -> None:
    with tempfile.TemporaryDirectory() as home, pytest.MonkeyPatch.context() as mp:
        mp.setattr(transcript_module, "INDEX_STRIDE", stride)
        mp.setattr(transcript_module, "DEFAULT_SCAN_BLOCK", block)
        mp.setattr(transcript_module, "PAGE_READ_BLOCK", block)
        path = Path(home) / "s.jsonl"
        Transcript.create(path, "s", "k").close()
        for _, value in lines:
            if isinstance(value, bytes):
                with path.open("ab") as raw:
                    raw.write(value + b"\n")
            else:
                with Transcript.open(path) as t:
                    t.append_message(Message.user(value))
        if torn == "cut":  # a kill mid-write: the torn line is cut off at the open
            with path.open("ab") as raw:
                raw.write(b'{"id": "half')
        elif torn == "newline" and path.read_bytes().endswith(b"}\n"):  # all but its newline
            path.write_bytes(path.read_bytes()[:-1])
        with Transcript.open(path) as t:
            ref = _reference(path)
            for offset, limit in queries:
                assert list(t.numbered_entries(offset, limit)) == _page(ref, offset, limit)
            for _, value in more:  # appends extend the index the pages use
                t.append_message(Message.user(str(value)))
            ref = _reference(path)
            assert t.entry_count == len(path.read_bytes().split(b"\n")) - 2
            for offset, limit in [*queries, (max(0, t.entry_count - 1), 5), (0, None)]:
                assert list(t.numbered_entries(offset, limit)) == _page(ref, offset, limit)
            for offset in range(t.entry_count + 1, -1, -1):  # every mark, once built
                assert list(t.numbered_entries(offset, 2)) == _page(ref, offset, 2)


def _many(path: Path, count: int) -> Transcript:
    t = Transcript.create(path, "s", "k")
    for i in range(count):
        t.append_message(Message.user(f"message {i} " + "lorem ipsum " * 10))
    return t


def test_a_late_page_reads_about_what_the_first_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    _many(path, 5_000).close()
    read: list[int] = []
    pread = transcript_module._pread

    def counting(fd: int, offset: int, size: int) -> bytes:
        read.append(size)
        return pread(fd, offset, size)

    monkeypatch.setattr(transcript_module, "_pread", counting)
    with Transcript.open(path, read_only=True) as t:
        ref = _reference(path)
        read.clear()
        assert list(t.numbered_entries(0, 100)) == ref[:100]
        first = sum(read)
        assert list(t.numbered_entries(4_900, 100)) == ref[4_900:]  # builds the index
        read.clear()
        assert list(t.numbered_entries(4_900, 100)) == ref[4_900:]
        assert list(t.numbered_entries(2_345, 100)) == ref[2_345:2_445]
        assert sum(read) <= 2 * first
        assert sum(read) < path.stat().st_size // 10


def test_appends_keep_the_index_current_without_a_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    with _many(path, 3_000) as t:
        list(t.numbered_entries(2_999, 1))  # the index now reaches the end
        scans: list[int] = []
        original = transcript_module.scan

        def counting_scan(*args: object, **kwargs: object) -> object:
            scans.append(1)
            return original(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(transcript_module, "scan", counting_scan)
        added = [t.append_message(Message.user(f"new {i}")) for i in range(300)]
        assert [e for _, e in t.numbered_entries(3_000)] == added
        assert [i for i, _ in t.numbered_entries(3_250, 10)] == list(range(3_250, 3_260))
        assert scans == []


def test_a_read_only_copy_pages_only_what_it_opened(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with _many(path, 500) as writer:
        size = path.stat().st_size
        with Transcript.open(path, read_only=True) as reader:
            for i in range(200):  # the owner goes on writing
                writer.append_message(Message.user(f"later {i}"))
            ref = _reference(path, size)
            assert list(reader.numbered_entries(450)) == ref[450:]
            assert list(reader.numbered_entries(600, 10)) == []
            assert reader.entry_count == 500


def test_pages_read_while_another_thread_appends_are_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transcript_module, "INDEX_STRIDE", 3)
    path = tmp_path / "s.jsonl"
    with _many(path, 200) as t:
        done = threading.Event()
        pages: list[tuple[int, list[tuple[int, Entry]]]] = []

        def append() -> None:
            for i in range(1_000):
                t.append_message(Message.user(f"concurrent {i}"))
            done.set()

        def read() -> None:
            offset = 0
            while not done.is_set() or offset < 1_200:
                pages.append((offset, list(t.numbered_entries(offset, 7))))
                offset = (offset + 37) % 1_250

        threads = [threading.Thread(target=append), threading.Thread(target=read)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ref = _reference(path)
        assert len(ref) == 1_200
        for offset, page in pages:
            # A page read mid-append may end early, never differ.
            assert page == _page(ref, offset, 7)[: len(page)]
            assert page or offset >= 200


def test_the_index_reads_a_line_longer_than_its_block() -> None:
    data = b"a\n" + b"b" * 500 + b"\nc\nd\n"

    def read(offset: int, size: int) -> bytes:
        return data[offset : offset + size]

    index = LineIndex(0, stride=2)
    found = scan(read, index.frontier, 2, len(data), until_line=3, block=16)
    index.extend(found)
    assert (index.lines, index.end) == (3, data.index(b"d"))
    assert index.seek(1) == (0, 0)
    assert index.seek(2) == (2, data.index(b"c"))
    stale = scan(read, (0, 0), 2, len(data), until_line=4, block=16)
    index.extend(stale)  # begun from a frontier the index has left: refused
    assert index.lines == 3
    # A region that does not end at a newline stops the scan instead of looping.
    assert scan(read, (0, 0), 2, len(data) - 1, until_line=9, block=16).lines == 3
