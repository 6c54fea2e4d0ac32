"""What only the PostgreSQL transcripts have: rows, a pool, other writers. The
behaviour both backends share is tested in tests/core/test_transcript_store.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from parley.core.errors import TranscriptError
from parley.core.messages import Message
from parley.gateway.errors import StateError
from parley.gateway.storage.errors import storage_failure
from parley.gateway.storage.postgres.database import PgDatabase
from parley.gateway.storage.postgres.transcripts import PgTranscriptStore, TranscriptConflictError

SID = "0123456789abcdef0123456789abcdef"
KEY = "agent:main:telegram:direct:42"


@pytest.fixture
def db(pg_url: str) -> Iterator[PgDatabase]:
    database = PgDatabase(pg_url)
    asyncio.run(database.open())
    try:
        yield database
    finally:
        asyncio.run(database.close())


@pytest.fixture
def store(db: PgDatabase) -> PgTranscriptStore:
    return PgTranscriptStore(db)


def _rows(db: PgDatabase) -> list[dict[str, Any]]:
    return db.call(
        lambda c: c.execute(
            "SELECT seq, kind, kept_seq FROM transcript_lines WHERE session_id = %s ORDER BY seq",
            (SID,),
        ).fetchall()
    )


def test_each_entry_is_a_row_numbered_as_its_line(db: PgDatabase, store: PgTranscriptStore) -> None:
    with store.create(SID, KEY) as t:
        first = t.append_message(Message.user("a"))
        t.append_message(Message.assistant("b"))
        t.append_compaction(
            "s", first_kept_entry_id=first.id, tokens_before=9, tokens_after=3, trigger="t"
        )
    rows = _rows(db)
    assert [(r["seq"], r["kind"], r["kept_seq"]) for r in rows] == [
        (2, "message", None),
        (3, "message", None),
        (4, "compaction", 2),
    ]
    count = db.call(
        lambda c: c.execute("SELECT line_count FROM transcripts WHERE session_id = %s", (SID,))
    ).fetchone()
    assert count["line_count"] == 4


def test_a_second_writer_fails_clearly_and_changes_nothing(
    db: PgDatabase, store: PgTranscriptStore
) -> None:
    store.create(SID, KEY).close()
    first = store.open(SID)
    second = store.open(SID)
    mine = first.append_message(Message.user("mine"))
    with pytest.raises(TranscriptConflictError, match="another writer") as raised:
        second.append_message(Message.user("theirs"))
    assert isinstance(raised.value, TranscriptError)
    # The loser's view is as it was; the table holds the winner's line only.
    assert second.entry_count == 0 and list(second.live_entries()) == []
    assert len(_rows(db)) == 1
    # The winner goes on; the loser keeps failing rather than forking the transcript.
    first.append_message(Message.assistant("ok"))
    with pytest.raises(TranscriptConflictError):
        second.append_custom("x", {})
    with store.open(SID) as fresh:
        assert [e.parent_id for e in fresh.entries()] == [None, mine.id]
        assert fresh.entry_count == 2


def test_reopen_after_a_pool_restart_sees_every_committed_entry(pg_url: str) -> None:
    db = PgDatabase(pg_url)
    asyncio.run(db.open())
    store = PgTranscriptStore(db)
    t = store.create(SID, KEY)
    written = [t.append_message(Message.user(f"m{i}")) for i in range(5)]
    written.append(
        t.append_compaction(
            "s", first_kept_entry_id=written[3].id, tokens_before=9, tokens_after=3, trigger="t"
        )
    )
    written.append(t.append_custom("delivery", {"ok": True}))
    live = list(t.live_entries())
    asyncio.run(db.close())  # no close() of the transcript: as if the process died

    with pytest.raises(TranscriptError):  # the pool is gone: a clear error, not a hang
        t.append_custom("lost", {})

    db = PgDatabase(pg_url)
    asyncio.run(db.open())
    try:
        with PgTranscriptStore(db).open(SID) as again:
            assert list(again.entries()) == written
            assert list(again.live_entries()) == live == written[3:]
            assert again.entry_count == 7 and again.load_report.clean
    finally:
        asyncio.run(db.close())


def test_a_database_failure_is_a_transcript_error_told_as_storage(pg_url: str) -> None:
    db = PgDatabase(pg_url)
    asyncio.run(db.open())
    t = PgTranscriptStore(db).create(SID, KEY)
    t.append_custom("kept", {})
    asyncio.run(db.close())
    with pytest.raises(TranscriptError, match="cannot append") as raised:
        t.append_message(Message.user("lost"))
    assert isinstance(raised.value.__cause__, StateError)
    assert storage_failure(raised.value) is not None
    assert t.entry_count == 1 and len(t.live_entries()) == 1  # nothing half-applied


def test_many_appends_then_open(store: PgTranscriptStore) -> None:
    with store.create(SID, KEY) as t:
        entries = [t.append_custom("n", {"i": i}) for i in range(2000)]
        t.append_compaction(
            "s", first_kept_entry_id=entries[-10].id, tokens_before=9, tokens_after=3, trigger="t"
        )
        for i in range(5):
            t.append_custom("after", {"i": i})
    with store.open(SID, read_only=True) as again:
        assert again.entry_count == 2006
        live = again.live_entries()
        assert len(live) == 16 and live[0] == entries[-10]
        # Opening read the live window only, not the 2,000 rows before it.
        assert again.load_report.lines_parsed == 16
        page = list(again.numbered_entries(1995, 7))
        assert [n for n, _ in page] == list(range(1995, 2002))
        assert [e for _, e in page[:5]] == entries[1995:]
        assert sum(1 for _ in again.entries()) == 2006  # pages through several batches


def test_a_corrupt_row_takes_its_line_but_is_skipped(
    db: PgDatabase, store: PgTranscriptStore
) -> None:
    """A row that does not parse (a hand-edited or imported table) is handled as a
    corrupt line in a file is: reported, skipped, numbering kept."""
    with store.create(SID, KEY) as t:
        a = t.append_custom("a", {})
        t.append_custom("b", {})
        c = t.append_custom("c", {})
    db.call(
        lambda conn: conn.execute(
            "UPDATE transcript_lines SET line = '{not json' WHERE session_id = %s AND seq = 3",
            (SID,),
        )
    )
    with store.open(SID) as again:
        assert again.load_report.corrupt_lines == (3,)
        assert list(again.live_entries()) == [a, c]
        assert list(again.numbered_entries()) == [(0, a), (2, c)]
        assert again.entry_count == 3


def test_a_compaction_whose_kept_row_is_gone_starts_the_window_at_itself(
    db: PgDatabase, store: PgTranscriptStore
) -> None:
    with store.create(SID, KEY) as t:
        kept = t.append_custom("a", {})
        compaction = t.append_compaction(
            "s", first_kept_entry_id=kept.id, tokens_before=9, tokens_after=3, trigger="t"
        )
    db.call(lambda conn: conn.execute("UPDATE transcript_lines SET kept_seq = NULL"))
    with store.open(SID) as again:
        assert again.load_report.missing_first_kept_id == kept.id
        assert list(again.live_entries()) == [compaction]


async def test_no_queries_on_the_event_loop(pg_url: str) -> None:
    async with PgDatabase(pg_url) as db:
        store = PgTranscriptStore(db)
        t = await asyncio.to_thread(store.create, SID, KEY)
        with pytest.raises(RuntimeError, match="event loop"):
            t.append_custom("blocking", {})
        with pytest.raises(RuntimeError, match="event loop"):
            store.exists(SID)
        # Answers from memory are fine anywhere.
        assert t.entry_count == 0 and list(t.live_entries()) == []
        await asyncio.to_thread(t.append_custom, "fine", {})
        assert await asyncio.to_thread(store.exists, SID)


def test_the_schema_refuses_a_line_without_its_transcript(db: PgDatabase) -> None:
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        db.call(
            lambda c: c.execute(
                "INSERT INTO transcript_lines (session_id, seq, kind, line)"
                " VALUES ('nope', 2, 'custom', '{}')"
            )
        )
