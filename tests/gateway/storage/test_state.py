"""State: state.db's migrations on a real SQLite file; the session registry, the durable
inbox and the DM pairing store on both backends (SQLite and a real PostgreSQL), from one
suite: every test that takes ``state`` runs once per backend."""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from parley.channels.base import Attachment, EarlierMessage, InboundMessage, SeenMark
from parley.core.messages import Usage
from parley.gateway.errors import PairingError, SchemaTooNewError
from parley.gateway.storage.inbox import (
    UNKNOWN_SEND_MARK,
    SentMessages,
    message_from_json,
    message_to_json,
    well_formed,
)
from parley.gateway.storage.pairing import (
    CODE_TTL,
    MAX_PENDING_PER_CHANNEL,
    RENOTIFY_AFTER,
    format_code,
)
from parley.gateway.storage.sessions import SessionOrigin
from parley.gateway.storage.sqlite.database import SCHEMA_VERSION, Database
from parley.gateway.storage.sqlite.session_registry import SqliteSessionRegistry
from tests.gateway.state_backends import StateBackend, state, state_location

__all__ = ["state", "state_location"]  # the shared fixtures

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


async def test_a_version_2_database_without_last_message_ids_opens(tmp_path: Path) -> None:
    """209179a's state.db says version 2 but predates last_message_ids (added to the
    released migration 2 later): opening it adds the column, and the registry works."""
    fixture = Path(__file__).parents[1] / "fixtures" / "state" / "state2-nolastids-209179a"
    path = tmp_path / "state.db"
    path.write_bytes((fixture / "state.db").read_bytes())
    columns = {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(sessions)")}
    assert "last_message_ids" not in columns
    async with Database(path) as db:
        registry = SqliteSessionRegistry(db)
        sessions = (await registry.list()).sessions
        assert sessions and all(s.last_message_ids == [] for s in sessions)
        assert await db.run(db.integrity_check) == []


async def test_registry_lifecycle(state: StateBackend) -> None:
    registry = state.registry
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


async def test_registry_list_filters_and_paginates(state: StateBackend) -> None:
    registry = state.registry
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


async def test_inbox_dedupes_and_tracks_state(state: StateBackend) -> None:
    inbox = state.inbox
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


async def test_inbox_keeps_a_message_group_context(state: StateBackend) -> None:
    # What others said before it (gateway.runtime.group_context) survives a restart
    # with the message, on either backend; a row from before has none.
    inbox = state.inbox
    earlier = (
        EarlierMessage("bob", "Bob", "lunch at noon? 😀", "2026-11-27T11:58:00+00:00"),
        EarlierMessage("carol", "Carol", "ok\nsure", "2026-11-27T11:59:00+00:00"),
    )
    with_context = dataclasses.replace(message("61", "bot?"), group_context=earlier)
    item = (await inbox.record(with_context)).item
    stored = await inbox.get(item.id)
    assert stored is not None and stored.message == with_context
    plain = (await inbox.record(message("62"))).item
    assert (await inbox.get(plain.id)).message.group_context == ()  # type: ignore[union-attr]


async def test_inbox_keeps_a_message_attachments(state: StateBackend) -> None:
    # The platform's references survive a restart with the message (the turn fetches
    # the files then), on either backend; no bytes are stored, and a row without any
    # (or from before attachments) reads back with none.
    inbox = state.inbox
    files = (
        Attachment("image", "AgACAgIAAxk", name="photo.jpg", mime_type="image/jpeg",
                   size=123_456, width=1280, height=960),
        Attachment("voice", "https://cdn.example/v.ogg", name="v\ud800.ogg", duration=3.5),
    )  # fmt: skip
    sent = dataclasses.replace(message("71", "look"), attachments=files)
    item = (await inbox.record(well_formed(sent))).item  # as the gateway records it
    stored = await inbox.get(item.id)
    assert stored is not None and stored.message.attachments[0] == files[0]
    assert stored.message.attachments[1].name == "v\ufffd.ogg"  # scrubbed, not refused
    assert [i.message.attachments for i in await inbox.open_items()][-1] == (
        stored.message.attachments
    )
    plain = (await inbox.record(message("72"))).item
    assert (await inbox.get(plain.id)).message.attachments == ()  # type: ignore[union-attr]


async def test_inbox_keeps_the_send_mark_the_fold_and_what_went_out(
    state: StateBackend,
) -> None:
    inbox = state.inbox
    one = (await inbox.record(message("51"))).item
    two = (await inbox.record(message("52"))).item
    await inbox.mark_replied([one.id, two.id], "sid", ["both"], send_mark="17")
    stored = await inbox.get(two.id)
    assert stored is not None
    assert stored.send_mark == "17" and stored.reply_for == (one.id, two.id)
    # A second store of the reply (a resend) keeps the first mark: that send came after it.
    await inbox.mark_replied([one.id, two.id], "sid", ["both"], send_mark="30")
    assert (await inbox.get(one.id)).send_mark == "17"  # type: ignore[union-attr]
    assert not await inbox.is_recorded("test", "default", "chat:18")
    # Replies stored and not yet recorded as sent, per channel account.
    assert [i.id for i in await inbox.open_replies("test", "default")] == [one.id, two.id]
    assert await inbox.open_replies("test", "second") == []
    sent = SentMessages("test", "default", ("chat:18", "chat:19"))
    await inbox.mark_delivered([one.id, two.id], sent)
    assert await inbox.is_recorded("test", "default", "chat:18")
    assert await inbox.is_recorded("test", "default", "chat:19")
    assert await inbox.open_replies("test", "default") == []
    assert not await inbox.is_recorded("test", "second", "chat:18")  # another account
    assert not await inbox.is_recorded("other", "default", "chat:18")
    # Nothing found above the mark before a resend: the resend's own mark replaces it.
    three = (await inbox.record(message("53"))).item
    await inbox.mark_replied([three.id], "sid", ["x"], send_mark="40")
    await inbox.renew_send_mark([three.id], "45")
    assert (await inbox.get(three.id)).send_mark == "45"  # type: ignore[union-attr]
    # Doubt: the mark is forgotten for good, and no renewal brings it back.
    await inbox.forget_send_marks([three.id])
    await inbox.mark_replied([three.id], "sid", ["x"], send_mark="41")
    await inbox.renew_send_mark([three.id], "50")
    assert (await inbox.get(three.id)).send_mark == UNKNOWN_SEND_MARK  # type: ignore[union-attr]
    # Erasing the items takes their sent records with them.
    assert await inbox.delete_items([one.id, two.id]) == 2
    assert not await inbox.is_recorded("test", "default", "chat:18")


async def test_inbox_records_a_streamed_replys_drafts_before_the_reply(
    state: StateBackend,
) -> None:
    inbox = state.inbox
    one = (await inbox.record(message("60"))).item
    two = (await inbox.record(message("61"))).item
    # Before the first draft message: the mark, with every item the reply answers.
    await inbox.note_preview([one.id, two.id], "30")
    stored = await inbox.get(one.id)
    assert stored is not None and stored.status == "received"
    assert (stored.send_mark, stored.reply_for) == ("30", (one.id, two.id))
    # Open while it is written: another reply recovered in the chat must not take
    # its draft messages for its own.
    assert [i.id for i in await inbox.open_replies("test", "default")] == [one.id, two.id]
    await inbox.note_preview([one.id, two.id], None, SentMessages("test", "default", ("c:31",)))
    await inbox.note_preview(
        [one.id, two.id], "35", SentMessages("test", "default", ("c:31", "c:32"))
    )
    assert (await inbox.get(two.id)).send_mark == "30"  # type: ignore[union-attr]  # kept
    assert sorted(await inbox.previews([one.id, two.id])) == ["c:31", "c:32"]
    assert await inbox.is_recorded("test", "default", "c:32")
    assert await inbox.previews([two.id]) == []  # recorded under the first item
    # The reply stored and delivered: the earlier mark stays, the drafts are its parts.
    await inbox.mark_replied([one.id, two.id], "sid", ["x"], send_mark="40")
    assert (await inbox.get(one.id)).send_mark == "30"  # type: ignore[union-attr]
    await inbox.mark_delivered([one.id, two.id], SentMessages("test", "default", ("c:31",)))
    assert await inbox.open_replies("test", "default") == []
    # A message never streamed is no open reply.
    await inbox.record(message("62"))
    assert await inbox.open_replies("test", "default") == []


async def test_inbox_survives_reopen(state: StateBackend) -> None:
    await state.inbox.record(message("1"))
    async with state.reopen() as reopened:
        items = await reopened.inbox.open_items()
        assert [i.message.message_id for i in items] == ["1"]


async def test_inbox_gives_the_newest_message_per_recent_conversation(
    state: StateBackend,
) -> None:
    inbox = state.inbox

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
    await state.execute(
        "UPDATE inbox SET received_at = ? WHERE platform_message_id = '10'", (long_ago,)
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


async def test_registry_records_compactions_deliveries_and_settings(state: StateBackend) -> None:
    registry = state.registry
    record = await registry.create(ORIGIN, model="m1", now=datetime(2026, 1, 1, tzinfo=UTC))
    await registry.record_turn(
        record.session_id,
        usage=Usage(10, 1),
        context_tokens=500,
        entry_count=2,
        last_entry_id="e2",
        model=None,
        compactions=1,
    )
    # /compact without a new size keeps the old one; with one, replaces it.
    await registry.record_compaction(
        record.session_id,
        compactions=1,
        usage=Usage(5, 2, 1, 1),
        context_tokens=None,
        entry_count=3,
        last_entry_id="e3",
    )
    got = await registry.get(record.session_id)
    assert got is not None
    assert (got.context_tokens, got.compaction_count, got.model) == (500, 2, "m1")
    assert got.usage == Usage(15, 3, 1, 1)
    await registry.record_compaction(
        record.session_id,
        compactions=1,
        usage=Usage(),
        context_tokens=120,
        entry_count=4,
        last_entry_id="e4",
    )
    await registry.record_delivery(
        record.session_id,
        {"chat_id": "alice", "thread_id": None},
        "timed out",
        entry_count=5,
        last_entry_id="e5",
        message_ids=["m1", "m2"],
    )
    await registry.update_settings(record.session_id, {"model": "m2", "think": True})
    got = await registry.get(record.session_id)
    assert got is not None
    assert (got.context_tokens, got.compaction_count) == (120, 3)
    assert got.last_route == {"chat_id": "alice", "thread_id": None}
    assert (got.delivery_error, got.last_message_ids) == ("timed out", ["m1", "m2"])
    assert (got.entry_count, got.last_entry_id) == (5, "e5")
    assert got.settings == {"model": "m2", "think": True}
    await registry.record_entries(record.session_id, 7, "e7")
    got = await registry.get(record.session_id)
    assert got is not None and (got.entry_count, got.last_entry_id) == (7, "e7")


async def test_registry_find_and_list_by_status_and_plain_text_query(
    state: StateBackend,
) -> None:
    registry = state.registry
    base = datetime(2026, 1, 1, tzinfo=UTC)
    old = await registry.create(ORIGIN, now=base)
    await registry.archive(old.session_id, "idle", now=base + timedelta(hours=1))
    assert await registry.get_active(ORIGIN.key) is None
    # No active session: the key finds the latest one; an id finds itself.
    assert (await registry.find(ORIGIN.key)).session_id == old.session_id
    assert (await registry.find(old.session_id)).session_id == old.session_id
    assert await registry.find("agent:main:nobody") is None
    new = await registry.create(ORIGIN, now=base + timedelta(hours=2))
    percent = SessionOrigin(
        "agent:main:test:group:50%_off", "main", "test", "default", "group", "g"
    )
    await registry.create(percent, now=base + timedelta(hours=3))
    archived = await registry.list(status="archived")
    assert [r.session_id for r in archived.sessions] == [old.session_id]
    active = await registry.list(status="active")
    assert [r.key for r in active.sessions] == [percent.key, new.key]
    # The query is plain text, not a pattern: "%" and "_" match only themselves.
    assert [r.key for r in (await registry.list(query="0%_O")).sessions] == [percent.key]
    assert (await registry.list(query="%")).sessions[0].key == percent.key
    assert len((await registry.list(query="%")).sessions) == 1


async def test_inbox_keeps_undelivered_replies_open_and_rejects(state: StateBackend) -> None:
    inbox = state.inbox
    first = (await inbox.record(message("1"))).item
    second = (await inbox.record(message("2"))).item
    await inbox.mark_replied([first.id, second.id], "sid", ["one", "two"])
    await inbox.note_undelivered([first.id, second.id], "network down")
    open_items = await inbox.open_items()
    assert [(i.id, i.status, i.error) for i in open_items] == [
        (first.id, "replied", "network down"),
        (second.id, "replied", "network down"),
    ]
    # The stored reply and session survive a status change that does not name them.
    assert [(i.session_id, i.reply) for i in open_items] == [("sid", ["one", "two"])] * 2
    assert await inbox.open_items(limit=1) == open_items[:1]
    await inbox.mark_rejected([second.id], "queue full")
    assert await inbox.counts() == {"replied": 1, "rejected": 1}
    assert await inbox.get(9_999) is None


async def test_inbox_stores_any_text_a_platform_sends(state: StateBackend) -> None:
    # A NUL, controls and non-BMP text in a message must not cost the message, nor
    # break the per-conversation scan over its neighbours.
    text = "nul \x00 bell \x07 😀 \u212a"
    recorded = await state.inbox.record(message("1", text))
    assert recorded.is_new and recorded.item.message.text == text
    got = await state.inbox.get(recorded.item.id)
    assert got is not None and got.message == message("1", text)
    marks = await state.inbox.newest_per_conversation("test", datetime.now(UTC) - timedelta(1))
    assert marks == [SeenMark("default", "alice", None, "1")]


# -- DM pairing ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def test_pairing_code_reminder_and_approval(state: StateBackend) -> None:
    clock = Clock()
    store = state.pairing(now=clock)
    first = await store.check("test", "default", "Bob", "Bob B")
    assert (first.allowed, first.notify, first.reason) == (False, True, "new code")
    assert first.request is not None and first.request.sender_id == "bob"
    code = first.request.code
    await store.mark_notified("test", "BOB")
    clock.now += timedelta(minutes=1)
    soon = await store.check("test", "default", "bob", "Bob B")
    assert (soon.notify, soon.reason, soon.request.code) == (False, "pending", code)
    clock.now += RENOTIFY_AFTER
    reminder = await store.check("test", "default", "bob", "Bob B")
    assert (reminder.notify, reminder.request.code) == (True, code)
    approved = await store.approve(format_code(code).lower())
    assert (approved.status, approved.decided_at) == ("approved", clock.now)
    assert (await store.check("test", "default", "bob", None)).allowed
    with pytest.raises(PairingError, match="already approved"):
        await store.approve(code)
    with pytest.raises(PairingError, match="no pairing request has the code ZZZZ-ZZZZ"):
        await store.deny("zzzz-zzzz")


async def test_pairing_expiry_renews_and_deny_silences(state: StateBackend) -> None:
    clock = Clock()
    store = state.pairing(now=clock)
    first = (await store.check("test", "default", "eve", None)).request
    assert first is not None
    clock.now += CODE_TTL + timedelta(seconds=1)
    with pytest.raises(PairingError, match="expired"):
        await store.approve(first.code)
    renewed = await store.check("test", "default", "eve", "Eve")
    assert renewed.reason == "new code" and renewed.request is not None
    assert renewed.request.code != first.code and renewed.request.notified_at is None
    assert renewed.request.expires_at == clock.now + CODE_TTL
    denied = await store.deny(renewed.request.code)
    assert denied.status == "denied"
    clock.now += CODE_TTL * 2
    later = await store.check("test", "default", "eve", "Eve")
    assert (later.allowed, later.notify, later.reason) == (False, False, "denied")
    # Revoking forgets the decision: the next message starts over with a new code.
    assert await store.revoke("test", "EVE") is True
    assert await store.revoke("test", "eve") is False
    assert (await store.check("test", "default", "eve", "Eve")).reason == "new code"


async def test_pairing_caps_open_codes_per_channel(state: StateBackend) -> None:
    clock = Clock()
    store = state.pairing(now=clock)
    for n in range(MAX_PENDING_PER_CHANNEL):
        assert (await store.check("test", "default", f"s{n}", None)).reason == "new code"
        clock.now += timedelta(seconds=1)
    full = await store.check("test", "default", "late", None)
    assert (full.allowed, full.request, full.reason) == (False, None, "too many pending codes")
    # Another channel has its own cap.
    assert (await store.check("other", "default", "late", None)).reason == "new code"
    pending = await store.list("pending")
    assert [r.sender_id for r in pending] == ["s0", "s1", "s2", "late"]
    assert [r.channel for r in await store.list()] == ["test"] * 3 + ["other"]
    assert await store.list("approved") == []
    # Expired codes do not count against the cap.
    clock.now += CODE_TTL
    assert (await store.check("test", "default", "late", None)).reason == "new code"


async def test_inbox_keeps_the_files_of_a_reply_and_of_the_group_context(
    state: StateBackend,
) -> None:
    # A reply's files and the group context's (the turn may fetch them after a restart)
    # survive with the message, on either backend; a line stored before lines had
    # files (four fields) reads back with none.
    inbox = state.inbox
    photo = Attachment("image", "AgAC-earlier", name="photo.jpg", width=800, height=600)
    replied = Attachment("document", "https://cdn.example/notes.txt", name="notes.txt")
    earlier = (
        EarlierMessage("bob", "Bob", "[photo]", "2026-11-27T11:58:00+00:00", (photo,)),
        EarlierMessage("carol", "Carol", "nice", "2026-11-27T11:59:00+00:00"),
    )
    sent = dataclasses.replace(
        message("81", "what is this?"), group_context=earlier, reply_attachments=(replied,)
    )
    item = (await inbox.record(well_formed(sent))).item
    stored = await inbox.get(item.id)
    assert stored is not None and stored.message == sent
    assert message_from_json(message_to_json(sent)) == sent
    old_row = message_to_json(message("82")).replace(
        '"group_context": []', '"group_context": [["bob", "Bob", "hi", "2026-11-27T12:00:00Z"]]'
    )
    [line] = message_from_json(old_row).group_context
    assert (line.text, line.attachments) == ("hi", ())
    lone = dataclasses.replace(sent, reply_attachments=(Attachment("image", "r\ud800"),))
    assert well_formed(lone).reply_attachments[0].ref == "r\ufffd"


def test_well_formed_replaces_what_no_store_can_hold() -> None:
    raw = dataclasses.replace(
        message("m\x001", "nul\x00 lone\ud800 pair 😀"), sender_name="Al\x00ice"
    )
    clean = well_formed(raw)
    assert clean.text == "nul\ufffd lone\ufffd pair 😀"
    assert (clean.sender_name, clean.message_id) == ("Al\ufffdice", "m\ufffd1")
    assert well_formed(message("ok")) == message("ok")
