"""state.db: migrations, the session registry and the durable inbox on a real SQLite file."""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from channels.base import InboundMessage, SeenMark
from core.messages import Usage
from gateway.db import SCHEMA_VERSION, Database
from gateway.errors import SchemaTooNewError
from gateway.inbox import Inbox
from gateway.registry import SessionOrigin, SessionRegistry

ORIGIN = SessionOrigin("agent:main:test:direct:alice", "main", "test", "default", "direct", "alice")


def message(mid: str, text: str = "hi") -> InboundMessage:
    return InboundMessage(
        "test",
        "default",
        "direct",
        "alice",
        "alice",
        "Alice",
        text,
        mid,
        datetime(2026, 1, 1, tzinfo=UTC),
    )


async def test_schema_created_and_newer_schema_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with Database(path) as db:
        assert await db.run(db.integrity_check) == []
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNewError):
        await Database(path).open()


async def test_registry_lifecycle(tmp_path: Path) -> None:
    async with Database(tmp_path / "state.db") as db:
        registry = SessionRegistry(db)
        first = await registry.create(ORIGIN, settings={"model": "m1"})
        assert (await registry.get_active(ORIGIN.key)) == first
        # A second create for the same key returns the active one, never a duplicate.
        assert (await registry.create(ORIGIN)).session_id == first.session_id
        later = datetime.now(UTC) + timedelta(seconds=5)
        await registry.record_turn(
            first.session_id,
            usage=Usage(100, 20, 50, 10),
            context_tokens=180,
            entry_count=3,
            last_entry_id="abc",
            model="m",
            now=later,
        )
        await registry.record_turn(
            first.session_id,
            usage=Usage(1, 2, 3, 4),
            context_tokens=190,
            entry_count=5,
            last_entry_id="def",
            model=None,
            now=later - timedelta(hours=1),
        )
        got = await registry.get(first.session_id)
        assert got is not None
        assert got.usage == Usage(101, 22, 53, 14)
        assert (got.turn_count, got.entry_count, got.last_entry_id) == (2, 5, "def")
        assert got.updated_at == later  # updated_at never moves backwards
        await registry.archive(first.session_id, "daily")
        assert await registry.get_active(ORIGIN.key) is None
        second = await registry.create(ORIGIN)
        assert second.session_id != first.session_id
        assert (await registry.find(ORIGIN.key)).session_id == second.session_id
        archived = await registry.get(first.session_id)
        assert archived is not None and archived.status == "archived"
        assert archived.archived_reason == "daily"


async def test_registry_list_filters_and_paginates(tmp_path: Path) -> None:
    async with Database(tmp_path / "state.db") as db:
        registry = SessionRegistry(db)
        base = datetime(2026, 1, 1, tzinfo=UTC)
        for i in range(7):
            origin = SessionOrigin(
                f"agent:main:test:direct:user{i}",
                "main",
                "tg" if i % 2 else "test",
                "default",
                "direct",
                f"user{i}",
                display_name=f"User {i}",
            )
            await registry.create(origin, now=base + timedelta(minutes=i))
        seen: list[str] = []
        cursor = None
        while True:
            page = await registry.list(limit=3, cursor=cursor)
            seen += [r.key for r in page.sessions]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == [f"agent:main:test:direct:user{i}" for i in reversed(range(7))]
        tg = await registry.list(channel="tg")
        assert {r.peer for r in tg.sessions} == {"user1", "user3", "user5"}
        found = await registry.list(query="USER 4")
        assert [r.peer for r in found.sessions] == ["user4"]


async def test_inbox_dedupes_and_tracks_state(tmp_path: Path) -> None:
    async with Database(tmp_path / "state.db") as db:
        inbox = Inbox(db)
        first = await inbox.record(message("42", "hello"))
        again = await inbox.record(message("42", "hello"))
        assert first.is_new and not again.is_new
        assert again.item.id == first.item.id
        other = await inbox.record(message("43"))
        assert [i.id for i in await inbox.open_items()] == [first.item.id, other.item.id]
        await inbox.mark_replied([first.item.id], "sid", ["the reply"])
        item = await inbox.get(first.item.id)
        assert item is not None and item.status == "replied" and item.reply == ["the reply"]
        assert item.message == message("42", "hello")
        await inbox.mark_delivered([first.item.id])
        await inbox.mark_failed([other.item.id], "blocked")
        assert await inbox.open_items() == []
        assert await inbox.counts() == {"delivered": 1, "failed": 1}


async def test_inbox_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with Database(path) as db:
        await Inbox(db).record(message("1"))
    async with Database(path) as db:
        items = await Inbox(db).open_items()
        assert [i.message.message_id for i in items] == ["1"]


async def test_inbox_gives_the_newest_message_per_recent_conversation(tmp_path: Path) -> None:
    async with Database(tmp_path / "state.db") as db:
        inbox = Inbox(db)

        def at(mid: str, chat: str, **fields: object) -> InboundMessage:
            return dataclasses.replace(message(mid), channel="discord", chat_id=chat, **fields)

        for item in (
            at("10", "old-chat"),
            at("11", "c1"),
            at("12", "c1", thread_id="t1"),
            at("13", "c2", account="second"),
            at("14", "c1"),
            at("15", "c1", thread_id="t1"),
            message("16"),  # another channel
        ):
            await inbox.record(item)
        # old-chat was last active long ago (received_at is the arrival time).
        long_ago = (datetime.now(UTC) - timedelta(days=30)).isoformat()
        await db.run(
            lambda: db.conn.execute(
                "UPDATE inbox SET received_at = ? WHERE platform_message_id = '10'", (long_ago,)
            )
        )
        since = datetime.now(UTC) - timedelta(days=7)
        marks = await inbox.newest_per_conversation("discord", since)
        assert marks == [
            SeenMark("default", "c1", "t1", "15"),
            SeenMark("default", "c1", None, "14"),
            SeenMark("second", "c2", None, "13"),
        ]
        assert await inbox.newest_per_conversation("discord", since, limit=1) == marks[:1]
        assert await inbox.newest_per_conversation("discord", datetime.now(UTC)) == []
