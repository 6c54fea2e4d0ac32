"""Storage faults through a running gateway: a full disk (ENOSPC) and a read-only state
directory, injected at the write seams (``os.write`` for transcripts, the state.db
connection, the memory index's writer connection).

For every fault: the user hears a clear message and the log says what failed; the
process keeps serving what it can (commands that only read, other sessions whose files
still take writes, memory search); nothing on disk is corrupt (transcripts load clean,
state.db and memory.db pass their integrity checks); and once space returns the next
message is answered and recorded, while the message that hit the fault was either
answered or is recorded in the inbox as failed, with the reason.

The last section takes the embedder down and watches ``/memory search`` and
``GET /api/memory/search`` fall back to keywords and say so (the index-level embedder
faults are in ``tests/core/memory/test_embedder_faults.py``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from parley.channels.base import InboundNotStored
from parley.core.memory.sources import AGENT_SCOPE
from parley.core.transcript import Transcript
from parley.gateway.app import Gateway
from parley.gateway.audiences import scope_for_key
from parley.gateway.config import load_config
from parley.gateway.runtime.user_errors import NOT_RECORDED_TEXT, STORAGE_ERROR_TEXT
from parley.gateway.storage.sqlite.database import Database
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import QUIET_MEMORY, use_hashing_embedder

ALICE = "agent:main:test:direct:alice"
BOB = "agent:main:test:direct:bob"
DISK_FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
READ_ONLY = OSError(errno.EROFS, os.strerror(errno.EROFS))
SQLITE_FULL = "database or disk is full"
SQLITE_READ_ONLY = "attempt to write a readonly database"
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")


@dataclass
class Faults:
    """What fails now. ``transcript`` picks the transcript files that refuse writes."""

    transcript_error: OSError | None = None
    short_write: bool = False  # the disk takes half of each write, then is full
    transcript: Callable[[str], bool] = lambda path: True
    state: str | None = None  # an SQLite error message for state.db writes
    memory: str | None = None  # the same for memory.db writes
    hits: dict[str, int] = field(default_factory=dict)

    def hit(self, seam: str) -> None:
        self.hits[seam] = self.hits.get(seam, 0) + 1

    def clear(self) -> None:
        self.transcript_error = None
        self.short_write = False
        self.state = self.memory = None


class FaultyConnection:
    """A DB-API connection whose writes fail with ``error()`` while it returns one."""

    def __init__(self, conn: Any, error: Callable[[], BaseException | None]) -> None:
        self._conn = conn
        self._error = error

    def _check(self, sql: str) -> None:
        words = sql.lstrip().upper()
        if words.startswith(_WRITES) or words.startswith("BEGIN IMMEDIATE"):
            exc = self._error()
            if exc is not None:
                raise exc

    def execute(self, sql: str, *args: Any) -> Any:
        self._check(sql)
        return self._conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        self._check(sql)
        return self._conn.executemany(sql, *args)

    def executescript(self, sql: str) -> Any:
        self._check(sql)
        return self._conn.executescript(sql)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def install(gateway: Gateway, faults: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the fault seams in place on a started gateway."""
    sessions = str(gateway.loaded.sessions_dir)
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        if faults.transcript_error is not None or faults.short_write:
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if path.startswith(sessions) and faults.transcript(path):
                faults.hit("transcript")
                if faults.transcript_error is not None:
                    raise faults.transcript_error
                return real_write(fd, bytes(data)[: max(1, len(data) // 2)])
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)

    def state_error() -> BaseException | None:
        if faults.state is None:
            return None
        faults.hit("state")
        return sqlite3.OperationalError(faults.state)

    db = gateway.state.sqlite
    assert db is not None
    db._conn = FaultyConnection(db.conn, state_error)  # type: ignore[assignment]

    memory = gateway.memory
    if memory is not None:
        store = memory._wstore
        assert store is not None
        module = store.info.module

        def memory_error() -> BaseException | None:
            if faults.memory is None:
                return None
            faults.hit("memory")
            return module.OperationalError(faults.memory)

        store._conn = FaultyConnection(store._conn, memory_error)


@dataclass
class World:
    gateway: Gateway
    channel: RecordingChannel
    provider: ScriptedProvider
    faults: Faults
    home: Path
    opened: list[Transcript] = field(default_factory=list)

    def close(self) -> None:
        for transcript in self.opened:
            transcript.close()

    async def say(self, text: str, sender: str = "alice", **kw: Any) -> str:
        before = len(self.channel.sent)
        await self.gateway.handle_inbound(self.channel.inbound(text, sender=sender, **kw))
        await self.gateway.wait_idle()
        sent = await self.channel.wait_sent(before + 1)
        assert len(sent) == before + 1, [m.text for m in sent[before:]]
        return sent[before].text

    async def transcript_of(self, key: str) -> Transcript:
        record = await self.gateway.registry.get_active(key)
        assert record is not None
        path = self.gateway.loaded.sessions_dir / f"{record.session_id}.jsonl"
        self.opened.append(Transcript.open(path, read_only=True))
        return self.opened[-1]

    @property
    def sqlite(self) -> Database:
        db = self.gateway.state.sqlite
        assert db is not None
        return db

    async def inbox(self) -> list[tuple[str, str, str | None]]:
        """(text, status, error) of every inbox item, in arrival order."""

        def rows() -> list[tuple[str, str, str | None]]:
            cur = self.sqlite.conn.execute("SELECT payload, status, error FROM inbox ORDER BY id")
            return [(json.loads(p)["text"], s, e) for p, s, e in cur.fetchall()]

        return await self.sqlite.run(rows)

    async def assert_intact(self) -> None:
        """Every transcript loads clean; state.db and memory.db pass integrity checks."""
        for path in sorted(self.gateway.loaded.sessions_dir.glob("*.jsonl")):
            with Transcript.open(path, read_only=True) as transcript:
                assert transcript.load_report.clean, (path, transcript.load_report)
                list(transcript.entries())
        assert await self.sqlite.run(self.sqlite.integrity_check) == []
        if self.gateway.memory is not None:
            assert await self.gateway.memory.integrity_check() == []


def make_config(home: Path, *, memory: bool, http: bool = False) -> Any:
    env = {
        "PARLEY_HOME": str(home),
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_HTTP__ENABLED": "true" if http else "false",
        "PARLEY_HTTP__PORT": "0",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
        "PARLEY_MEMORY__ENABLED": "true" if memory else "false",
        **QUIET_MEMORY,
    }
    return load_config(env=env)


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    use_hashing_embedder(monkeypatch)
    channel = RecordingChannel()
    provider = ScriptedProvider()
    gateway = Gateway(make_config(tmp_path, memory=True), channels=[channel], provider=provider)
    faults = Faults()
    async with gateway:
        install(gateway, faults, monkeypatch)
        world = World(gateway, channel, provider, faults, tmp_path)
        yield world
        world.close()


# -- transcripts -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "words"),
    [(DISK_FULL, "No space left"), (READ_ONLY, "Read-only file system"), (None, "short write")],
    ids=["enospc", "erofs", "short-write"],
)
async def test_a_transcript_append_that_fails(
    world: World, error: OSError | None, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert await world.say("first") == "echo: first"
    if error is None:
        world.faults.short_write = True  # the disk took half the line
    else:
        world.faults.transcript_error = error
    with caplog.at_level(logging.WARNING, logger="parley"):
        reply = await world.say("lost in the void")
        # Reads go on: /status answers from state.db.
        assert ALICE in await world.say("/status")

    assert reply == STORAGE_ERROR_TEXT
    assert "storage failure answering" in caplog.text and words in caplog.text
    assert "Traceback" not in caplog.text  # a known fault, not a crash
    items = await world.inbox()
    assert items[1][:2] == ("lost in the void", "failed")
    assert items[1][2] is not None and items[1][2].startswith("storage:")
    assert words in items[1][2]
    await world.assert_intact()  # the failed append left nothing behind

    world.faults.clear()
    assert await world.say("second") == "echo: second"
    transcript = await world.transcript_of(ALICE)
    users = [e.message.text for e in transcript.entries() if e.type == "message"]
    assert users[0].startswith("first") and users[2].startswith("second")
    assert not any("lost in the void" in text for text in users)  # never half-written
    assert all(status in ("delivered", "failed") for _, status, _ in await world.inbox())
    record = await world.gateway.registry.get_active(ALICE)
    assert record is not None and record.entry_count == transcript.entry_count
    assert record.last_entry_id == transcript.last_entry.id
    await world.assert_intact()


async def test_one_full_transcript_does_not_stop_other_sessions(world: World) -> None:
    await world.say("hi", sender="alice")
    alice = (await world.transcript_of(ALICE)).path.name
    world.faults.transcript = lambda path: alice in path  # its scratch file too
    world.faults.transcript_error = DISK_FULL

    assert await world.say("are you there?", sender="alice") == STORAGE_ERROR_TEXT
    assert await world.say("hello from bob", sender="bob") == "echo: hello from bob"
    assert await world.say("still me", sender="bob") == "echo: still me"

    world.faults.clear()
    assert await world.say("back again", sender="alice") == "echo: back again"
    await world.assert_intact()


async def test_a_new_sessions_transcript_that_cannot_be_created(world: World) -> None:
    world.faults.transcript_error = DISK_FULL
    assert await world.say("my first words", sender="bob") == STORAGE_ERROR_TEXT
    assert world.faults.hits["transcript"] >= 1
    await world.assert_intact()

    world.faults.clear()
    # The registry row was written before the file failed: the next message adopts it.
    assert await world.say("second try", sender="bob") == "echo: second try"
    page = await world.gateway.registry.list(query="bob")
    assert len(page.sessions) == 1
    transcript = await world.transcript_of(BOB)
    assert transcript.load_report.clean and transcript.entry_count == 3
    await world.assert_intact()


# -- state.db ----------------------------------------------------------------------------


@pytest.mark.parametrize("error", [SQLITE_FULL, SQLITE_READ_ONLY], ids=["full", "read-only"])
async def test_state_db_refusing_writes_refuses_new_messages_clearly(
    world: World, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    await world.say("before")
    world.faults.state = error
    message = world.channel.inbound("while full", message_id="m-full")
    for _ in range(2):  # the platform delivers it again: the sender is told once
        with (
            caplog.at_level(logging.ERROR, logger="parley"),
            pytest.raises(InboundNotStored) as raised,
        ):
            await world.gateway.handle_inbound(message)
    # Not durable, so not accepted: the adapter is told (the web chat shows an error,
    # Telegram retries the update) and so is the sender.
    assert str(raised.value) == f"the message was not recorded: state.db: {error}"
    assert "cannot record test message m-full in the inbox" in caplog.text
    assert [m.text for m in world.channel.sent] == ["echo: before", NOT_RECORDED_TEXT]
    assert world.channel.sent[-1].reply_to_message_id == "m-full"
    # Reads go on: the registry and the inbox still answer.
    record = await world.gateway.registry.get_active(ALICE)
    assert record is not None and record.turn_count == 1
    assert [t for t, _, _ in await world.inbox()] == ["before"]

    world.faults.clear()
    await world.assert_intact()
    # The platform delivers the same message again: answered, once.
    before = len(world.channel.sent)
    await world.gateway.handle_inbound(message)
    await world.gateway.handle_inbound(message)
    await world.gateway.wait_idle()
    assert [m.text for m in world.channel.sent[before:]] == ["echo: while full"]
    assert [s for _, s, _ in await world.inbox()] == ["delivered", "delivered"]


async def test_state_db_filling_up_mid_turn_still_answers_once_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills after the message was recorded: the reply (in the transcript) is
    still sent, nothing raises a second message, and the restart that finds the inbox
    item open sees the delivery in the transcript and does not send it again."""
    use_hashing_embedder(monkeypatch)
    faults = Faults()
    channel = RecordingChannel()
    provider = ScriptedProvider()

    def fill_the_disk(request: Any) -> None:
        faults.state = SQLITE_FULL  # from the provider call on, state.db refuses writes
        return None

    loaded = make_config(tmp_path, memory=False)
    async with Gateway(loaded, channels=[channel], provider=provider) as gateway:
        install(gateway, faults, monkeypatch)
        world = World(gateway, channel, provider, faults, tmp_path)
        await world.say("before")
        provider.responder = fill_the_disk
        with caplog.at_level(logging.ERROR, logger="parley"):
            assert await world.say("while filling") == "echo: while filling"
        assert (
            "could not record the turn in the registry: state.db: database or disk is full"
            in caplog.text
        )
        assert "could not store the reply in the inbox" in caplog.text
        provider.responder = None
        faults.clear()
        assert [s for _, s, _ in await world.inbox()] == ["delivered", "received"]
        assert await world.say("after") == "echo: after"
        await world.assert_intact()
        transcript = await world.transcript_of(ALICE)
        record = await gateway.registry.get_active(ALICE)
        assert record is not None and record.entry_count == transcript.entry_count
        world.close()

    channel2 = RecordingChannel()
    async with Gateway(loaded, channels=[channel2], provider=ScriptedProvider()) as gateway:
        await gateway.wait_idle()
        world = World(gateway, channel2, provider, Faults(), tmp_path)
        assert channel2.sent == []  # the open item's reply went out before: not again
        assert [s for _, s, _ in await world.inbox()] == ["delivered"] * 3
        # Every message the transcript says went out is on record in the inbox, that
        # one included (from the transcript): no later look at the chat
        # (gateway.runtime.send_recovery) may take it for another reply's.
        transcript = await world.transcript_of(ALICE)
        out = [
            str(platform_id)
            for entry in transcript.entries()
            if entry.type == "custom" and entry.payload.get("custom_type") == "delivery"
            for platform_id in entry.payload["data"]["platform_message_ids"]
        ]
        assert len(out) == 3
        for platform_id in out:
            assert await gateway.inbox.is_recorded(channel.name, "default", platform_id)
        world.close()
        await world.assert_intact()


# -- memory.db ---------------------------------------------------------------------------


@pytest.mark.parametrize("error", [SQLITE_FULL, SQLITE_READ_ONLY], ids=["full", "read-only"])
async def test_memory_index_refusing_writes(
    world: World, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    memory = world.gateway.memory
    assert memory is not None
    scopes = [scope_for_key(ALICE), AGENT_SCOPE]
    await world.say("The spare key is under the red doormat.")
    await memory.sync(reason="test")
    world.faults.memory = error
    assert await world.say("The boat is called Marigold.") == (
        "echo: The boat is called Marigold."
    )  # a chat never waits for (or fails with) memory
    with caplog.at_level(logging.WARNING, logger="parley"):
        report = await memory.sync(reason="test")
    assert world.faults.hits["memory"] >= 1
    assert any(error in e for e in report.errors), report.errors
    assert "memory sync (test): sessions/" in caplog.text and error in caplog.text
    # Search keeps answering from what is indexed: reads need no space.
    found = await world.say("/memory search doormat")
    assert "doormat" in found
    result = await memory.search("doormat", scopes=scopes)
    assert result.hits and result.hits[0].path.startswith("sessions/")
    assert await memory.integrity_check() == []

    world.faults.clear()
    # Still dirty after the failed sync: the next search catches up first.
    result = await memory.search("Marigold", scopes=scopes)
    assert result.synced_first and any("Marigold" in h.snippet for h in result.hits)
    assert "Marigold" in await world.say("/memory search Marigold boat")
    await world.assert_intact()


# -- the embedder down, seen from the gateway --------------------------------------------


async def test_an_embedder_down_turns_memory_search_keyword_only_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/memory search in a chat and GET /api/memory/search both answer by keyword while
    the embedder is down, say so, and are hybrid again once it is back."""
    made = use_hashing_embedder(monkeypatch)
    loaded = make_config(tmp_path, memory=True, http=True)
    channel = RecordingChannel()
    async with Gateway(loaded, channels=[channel], provider=ScriptedProvider()) as gateway:
        assert gateway.http is not None
        world = World(gateway, channel, ScriptedProvider(), Faults(), tmp_path)
        base = gateway.http.url("").rstrip("/")
        headers = {"Authorization": f"Bearer {gateway.http.token.value}"}

        async def api_search(query: str) -> dict[str, Any]:
            async with (
                aiohttp.ClientSession(headers=headers) as client,
                client.get(f"{base}/api/memory/search", params={"q": query}) as response,
            ):
                assert response.status == 200
                return await response.json()

        await world.say("The spare key is in the blue teapot.")
        healthy = await world.say("/memory search teapot")
        assert "hybrid" in healthy and "keyword-only" not in healthy

        (embedder,) = made
        embedder.fail = "embedding server down"
        chat = await world.say("/memory search teapot")
        body = await api_search("blue teapot")
        assert "teapot" in chat and "(keyword-only: embedder failed" in chat
        assert "embedding server down" in chat
        assert body["mode"] == "keyword" and body["items"]
        assert any("embedding server down" in note for note in body["notes"])

        embedder.fail = None
        assert "keyword-only" not in await world.say("/memory search teapot")
        body = await api_search("blue teapot")
        assert body["mode"] == "hybrid" and body["notes"] == [] and body["items"]


async def test_the_disk_filling_between_the_question_and_the_answer(world: World) -> None:
    """The user's message made it to the transcript, the reply did not: the user hears
    why, the transcript holds the question whole and no half answer, and the next turn
    sees the unanswered question in its history."""

    def fill_the_disk(request: Any) -> None:
        world.faults.transcript_error = DISK_FULL
        return None

    world.provider.responder = fill_the_disk
    assert await world.say("what is the capital of Peru?") == STORAGE_ERROR_TEXT
    world.provider.responder = None
    world.faults.clear()
    await world.assert_intact()
    transcript = await world.transcript_of(ALICE)
    roles = [e.message.role for e in transcript.entries() if e.type == "message"]
    assert roles == ["user"]

    assert await world.say("hello?") == "echo: hello?"
    texts = [b.text for m in world.provider.requests[-1].messages for b in m.content]
    assert any("capital of Peru" in text for text in texts)
    items = await world.inbox()
    assert [(t, s) for t, s, _ in items] == [
        ("what is the capital of Peru?", "failed"),
        ("hello?", "delivered"),
    ]
    await world.assert_intact()
