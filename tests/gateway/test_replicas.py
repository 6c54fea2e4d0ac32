"""Two gateway replicas on one real PostgreSQL: one session's messages received by
both, answered once each and in order; a replica that dies mid-turn, finished by the
other. Each replica is a whole Gateway (real lanes, session locks, inbox, registry
and transcripts in PostgreSQL) with a recording channel and a scripted provider."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from parley.gateway.admin.schemas import SessionListQuery, TranscriptQuery
from parley.gateway.admin.service import AdminService
from parley.gateway.app import Gateway
from parley.gateway.config import LoadedConfig, load_config
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider

SESSION_KEY = "agent:main:test:direct:alice"


@dataclass
class Replica:
    gateway: Gateway
    channel: RecordingChannel
    provider: ScriptedProvider
    gate: asyncio.Event

    async def receive(self, text: str) -> None:
        # The message id is the text: ids are unique across replicas, as a platform's are.
        await self.gateway.handle_inbound(self.channel.inbound(text, message_id=text))


def replica_config(home: Path, pg_url: str, mode: str, **extra: str) -> LoadedConfig:
    return load_config(
        env={
            **extra,
            "PARLEY_LANES__MODE": mode,
            "PARLEY_HOME": str(home),
            "PARLEY_SESSION__TIMEZONE": "UTC",
            "PARLEY_HTTP__ENABLED": "false",
            "PARLEY_MEMORY__ENABLED": "false",
            "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
            "PARLEY_STORAGE__BACKEND": "postgres",
            "PARLEY_STORAGE__URL": pg_url,
        }
    )


@asynccontextmanager
async def replica(
    home: Path, pg_url: str, mode: str = "collect", **extra: str
) -> AsyncIterator[Replica]:
    gate = asyncio.Event()
    provider = ScriptedProvider(gate=gate)
    channel = RecordingChannel()
    config = replica_config(home, pg_url, mode, **extra)
    gateway = Gateway(config, channels=[channel], provider=provider)
    async with gateway:
        yield Replica(gateway, channel, provider, gate)


async def kill(victim: Replica) -> None:
    """As close to SIGKILL as one process allows: its turns stop where they are, and
    its session-lock connection goes (PostgreSQL drops the locks and forgets the pid)."""
    gateway = victim.gateway
    assert gateway.replicas is not None and gateway.state.locks is not None
    await gateway.replicas.stop()
    await gateway.lanes.stop(drain=False, timeout=0)
    await gateway.state.locks.close()


async def wait_until(predicate: Callable[[], object], what: str, limit_s: float = 20.0) -> None:
    """Poll a condition another process (PostgreSQL, the other replica) makes true."""
    deadline = time.monotonic() + limit_s
    while not await _value(predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _value(result: object) -> object:
    return await result if asyncio.iscoroutine(result) else result


async def delivered(replica: Replica, count: int) -> bool:
    counts = await replica.gateway.inbox.counts()
    return counts == {"delivered": count}


async def user_turns(replica: Replica) -> list[list[int]]:
    """The inbox ids of each user entry of the session's transcript, in order."""
    gateway = replica.gateway
    record = await gateway.registry.get_active(SESSION_KEY)
    assert record is not None

    def read() -> list[list[int]]:
        with gateway.state.transcripts.open(record.session_id, read_only=True) as transcript:
            return [
                list(e.payload["meta"]["inbox_ids"])
                for e in transcript.entries()
                if e.type == "message" and e.message.role == "user"
            ]

    return await asyncio.to_thread(read)


@pytest.mark.parametrize("mode", ["collect", "queue"])
async def test_messages_alternating_between_replicas_are_answered_once_in_order(
    tmp_path: Path, pg_url: str, mode: str
) -> None:
    texts = [f"m{i}" for i in range(8)]
    a_home, b_home = tmp_path / "a", tmp_path / "b"
    async with replica(a_home, pg_url, mode) as a, replica(b_home, pg_url, mode) as b:
        for i, text in enumerate(texts):
            await (a if i % 2 == 0 else b).receive(text)
        # One turn runs (held at its provider); the other replica's lane waits for
        # the session lock instead of starting a second turn beside it.
        await wait_until(lambda: a.provider.requests or b.provider.requests, "a first turn")
        assert len(a.provider.requests) + len(b.provider.requests) == 1
        a.gate.set()
        b.gate.set()
        await wait_until(lambda: delivered(a, len(texts)), "every message delivered")
        await a.gateway.wait_idle()
        await b.gateway.wait_idle()

        turns = await user_turns(a)
        flat = [i for turn in turns for i in turn]
        assert flat == sorted(flat) and len(set(flat)) == len(texts)  # once each, in order
        sent = a.channel.sent + b.channel.sent
        # One reply per turn and one turn per provider call: nothing ran twice.
        assert len(sent) == len(turns)
        assert len(a.provider.requests) + len(b.provider.requests) == len(turns)
        # Each reply answers its turn's last message; replies went out in turn order.
        by_id = {m.reply_to_message_id for m in sent}
        assert by_id == {texts[flat.index(turn[-1])] for turn in turns}
        if mode == "queue":  # one turn per message, even when the lock holder drains
            assert turns == [[i] for i in flat]
        else:  # the lock holder answered what the other replica received, folded
            assert len(turns) < len(texts)


async def test_a_replica_killed_mid_turn_leaves_the_queue_to_the_other(
    tmp_path: Path, pg_url: str
) -> None:
    async with replica(tmp_path / "a", pg_url) as a, replica(tmp_path / "b", pg_url) as b:
        b.gate.set()
        await a.receive("first")
        # a wrote the user message and is waiting for its model when it dies.
        await wait_until(lambda: a.provider.requests, "a's turn to start")
        assert await user_turns(a) == [[1]]
        await kill(a)

        await b.receive("second")
        await wait_until(lambda: delivered(b, 2), "both messages delivered")
        await b.gateway.wait_idle()
        assert [m.text for m in b.channel.sent] == ["echo: first", "echo: second"]
        assert [m.reply_to_message_id for m in b.channel.sent] == ["first", "second"]
        assert a.channel.sent == []
        # The dead replica's user message is resumed, not written a second time.
        assert await user_turns(b) == [[1], [2]]


async def test_a_dead_replicas_message_is_adopted_without_a_new_one(
    tmp_path: Path, pg_url: str
) -> None:
    async with replica(tmp_path / "a", pg_url) as a, replica(tmp_path / "b", pg_url) as b:
        assert b.gateway.replicas is not None
        b.gateway.replicas.scan_seconds = 0.05
        b.gate.set()
        await a.receive("orphan")
        await wait_until(lambda: a.provider.requests, "a's turn to start")
        await kill(a)
        # Nobody writes in this chat again: b's scan finds the item of a dead replica.
        await wait_until(lambda: delivered(b, 1), "the orphan delivered")
        await b.gateway.wait_idle()
        assert [m.text for m in b.channel.sent] == ["echo: orphan"]
        assert await user_turns(b) == [[1]]


async def test_an_adopted_orphan_is_answered_before_the_later_message_queued_ahead_of_it(
    tmp_path: Path, pg_url: str
) -> None:
    # The orphan scan puts a dead replica's message at the back of this replica's lane,
    # behind a later message of the same chat that waits there for a run slot: the
    # lane's run for the later one must answer the orphan first, not leave it behind.
    async with (
        replica(tmp_path / "a", pg_url, "queue") as a,
        replica(tmp_path / "b", pg_url, "queue", PARLEY_LANES__MAX_CONCURRENT_RUNS="1") as b,
    ):
        assert b.gateway.replicas is not None
        await b.gateway.replicas.stop()  # no scan of its own: adopted below, at a set moment
        await a.receive("m0")
        await wait_until(lambda: a.provider.requests, "a's turn to start")
        await kill(a)
        # b's only run slot is taken by bob's turn (held at its model), so alice's next
        # message waits in b's lane while the scan adopts her first one behind it.
        await b.gateway.handle_inbound(b.channel.inbound("bob0", sender="bob", message_id="bob0"))
        await wait_until(lambda: b.provider.requests, "bob's turn to start")
        await b.receive("m1")
        assert await b.gateway.replicas.adopt_orphans() == 1
        b.gate.set()
        await wait_until(lambda: delivered(b, 3), "every message delivered")
        await b.gateway.wait_idle()
        alice = [m.reply_to_message_id for m in b.channel.sent if m.reply_to_message_id != "bob0"]
        assert alice == ["m0", "m1"]
        assert await user_turns(b) == [[1], [3]]


async def test_a_lane_waiting_for_its_session_lock_holds_no_run_slot(
    tmp_path: Path, pg_url: str
) -> None:
    """Waiting for another replica to let go of a session is not model work: with one
    run slot, this replica answers another chat meanwhile. (Held while waiting, a slot
    could close a cycle: this replica's lane waits for a lock whose holder, on the other
    replica, waits for a slot held there by a lane waiting for a lock held here.)"""
    async with (
        replica(tmp_path / "a", pg_url) as a,
        replica(tmp_path / "b", pg_url, PARLEY_LANES__MAX_CONCURRENT_RUNS="1") as b,
    ):
        b.gate.set()
        await a.receive("m0")  # a holds alice's session, its turn held at the model
        await wait_until(lambda: a.provider.requests, "a's turn to start")
        await b.receive("m1")  # b's lane for alice waits for the lock
        await b.gateway.handle_inbound(b.channel.inbound("bob0", sender="bob", message_id="bob0"))
        await wait_until(
            lambda: any(m.reply_to_message_id == "bob0" for m in b.channel.sent),
            "bob answered while alice's lane waits for her session",
        )
        a.gate.set()
        await wait_until(
            lambda: len([m for m in a.channel.sent + b.channel.sent if m.chat_id == "alice"]) == 2,
            "alice's two replies",
        )
        await a.gateway.wait_idle()
        await b.gateway.wait_idle()
        alice = [
            m.reply_to_message_id for m in a.channel.sent + b.channel.sent if m.chat_id == "alice"
        ]
        assert sorted(alice) == ["m0", "m1"]


async def test_one_replica_answers_back_to_back_messages_as_sqlite_does(
    tmp_path: Path, pg_url: str
) -> None:
    # The second message is recorded before the first run takes the lock: that run
    # must not take it too (it waits in this replica's lane, as with SQLite).
    async with replica(tmp_path / "a", pg_url) as a:
        a.gate.set()
        await a.receive("one")
        await a.receive("two")
        sent = await a.channel.wait_sent(2)
        await a.gateway.wait_idle()
        assert [m.text for m in sent] == ["echo: one", "echo: two"]
        assert await user_turns(a) == [[1], [2]]


async def test_any_replicas_admin_api_shows_every_session_as_it_is_now(
    tmp_path: Path, pg_url: str
) -> None:
    async with replica(tmp_path / "a", pg_url) as a, replica(tmp_path / "b", pg_url) as b:
        a.gate.set()
        b.gate.set()
        admin = AdminService(a.gateway)
        await b.receive("hello from b")
        await b.channel.wait_sent(1)
        page = await admin.sessions(SessionListQuery())
        [summary] = page.items
        first = await admin.transcript(summary.id, TranscriptQuery())
        # b runs a second turn: a, which has the transcript cached now, shows it too.
        await b.receive("again")
        await b.channel.wait_sent(2)
        await b.gateway.wait_idle()
        second = await admin.transcript(summary.id, TranscriptQuery())
        assert second.total > first.total
        assert a.channel.sent == []
        await admin.close()
