"""Replicas on one PostgreSQL keep a chat's replies in order when things go slow or
wrong (gateway/runtime/replicas.py, dispatch.py, delivery.py,
storage/postgres/session_locks.py):

- a reply another replica could not send (a timeout under load) is sent before the
  next message's reply, not left behind it for that replica's redelivery;
- a replica whose session-lock connection went away mid-turn (a network cut, a
  server's ``idle_session_timeout``) no longer holds the session: another replica
  may answer it meanwhile, so the first one must not send its reply as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from parley.channels.base import DeliveryError
from parley.gateway.storage.inbox import InboxItem
from tests.gateway.test_replicas import Replica, delivered, replica, user_turns, wait_until

DOWN = DeliveryError("network: timed out", retryable=True)


@pytest.fixture(autouse=True)
def quick_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("parley.gateway.runtime.delivery.DELIVERY_BACKOFF_SECONDS", (0.0, 0.0))


async def kept(replica: Replica, text: str) -> bool:
    items = await replica.gateway.inbox.open_items()
    return any(i.message.text == text and i.status == "replied" and i.error for i in items)


async def test_another_replicas_failed_send_goes_out_before_the_next_reply(
    tmp_path: Path, pg_url: str
) -> None:
    async with (
        replica(tmp_path / "a", pg_url, "queue") as a,
        replica(tmp_path / "b", pg_url, "queue") as b,
    ):
        a.gate.set()
        b.gate.set()
        a.channel.fail_next.extend([DOWN] * 3)  # a cannot reach the platform for m0
        await a.receive("m0")
        await wait_until(lambda: kept(a, "m0"), "m0's reply kept by a")
        await a.gateway.wait_idle()
        # b answers the chat's next message: m0's reply goes first (before: b sent m1's
        # at once and left m0 to a's redelivery, 30 s later).
        await b.receive("m1")
        await wait_until(lambda: delivered(b, 2), "both delivered")
        await b.gateway.wait_idle()
        assert [m.reply_to_message_id for m in b.channel.sent] == ["m0", "m1"]
        assert a.channel.sent == []
        assert await a.gateway.redeliver_now() == 0  # nothing left to send twice
        assert await user_turns(b) == [[1], [2]]


async def test_a_reply_waits_while_another_replicas_failed_send_still_fails(
    tmp_path: Path, pg_url: str
) -> None:
    async with (
        replica(tmp_path / "a", pg_url, "queue") as a,
        replica(tmp_path / "b", pg_url, "queue") as b,
    ):
        a.gate.set()
        b.gate.set()
        a.channel.fail_next.extend([DOWN] * 3)
        await a.receive("m0")
        await wait_until(lambda: kept(a, "m0"), "m0's reply kept by a")
        await a.gateway.wait_idle()
        b.channel.fail_next.extend([DOWN] * 3)  # b's try of m0 fails too
        await b.receive("m1")
        await wait_until(lambda: kept(b, "m1"), "m1's reply kept behind m0")
        await b.gateway.wait_idle()
        assert a.channel.sent == [] and b.channel.sent == []
        # Each replica's redelivery resends its own; in whatever order they come, the
        # chat gets m0 then m1.
        assert await b.gateway.redeliver_now() == 1
        await b.gateway.wait_idle()
        assert await a.gateway.redeliver_now() == 0  # b sent a's too, first
        sent = a.channel.sent + b.channel.sent
        assert [m.reply_to_message_id for m in sent] == ["m0", "m1"]
        assert await delivered(a, 2)


async def test_a_replica_that_lost_its_lock_mid_turn_does_not_send_too(
    tmp_path: Path, pg_url: str
) -> None:
    async with (
        replica(tmp_path / "a", pg_url, "queue") as a,
        replica(tmp_path / "b", pg_url, "queue") as b,
    ):
        b.gate.set()
        await a.receive("m0")
        await wait_until(lambda: a.provider.requests, "a's turn on m0 to start")
        locks = a.gateway.state.locks
        assert locks is not None
        # a's lock connection goes (as a network cut or the server's idle timeout
        # would end it) while a's model is still thinking: PostgreSQL drops the lock.
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (locks.pid,))
        # b takes the session, resumes m0 (its user message is in the transcript) and
        # answers m1 after it.
        await b.receive("m1")
        await wait_until(lambda: len(b.channel.sent) == 2, "b's two replies")
        # a's model answers now: a must not send m0's reply a second time, after m1's.
        a.gate.set()
        await a.gateway.wait_idle()
        await b.gateway.wait_idle()
        assert [m.reply_to_message_id for m in b.channel.sent] == ["m0", "m1"]
        assert a.channel.sent == []
        assert await delivered(b, 2)
        # a goes on with a new lock connection and answers the chat's next message.
        await a.receive("m2")
        await wait_until(lambda: delivered(a, 3), "m2 delivered")
        await a.gateway.wait_idle()
        assert [m.reply_to_message_id for m in a.channel.sent] == ["m2"]


async def test_a_run_whose_read_of_the_session_failed_is_tried_again(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading the session's open items under its lock failed (the pool timed out under
    # load): the message stays open, and the next scan queues it again (before, it was
    # left for a restart, or for the chat's next message to pull it in).
    async with replica(tmp_path / "a", pg_url, "queue") as a:
        coordinator = a.gateway.replicas
        assert coordinator is not None
        await coordinator.stop()  # the scan runs below, at a set moment
        a.gate.set()
        read = coordinator.inbox.open_for_session
        failures = [psycopg.OperationalError("couldn't get a connection after 30.00 sec")]

        async def flaky(key: str, also: Sequence[int] = ()) -> list[InboxItem]:
            if failures:
                raise failures.pop()
            return await read(key, also)

        monkeypatch.setattr(coordinator.inbox, "open_for_session", flaky)
        await a.receive("m0")
        await a.gateway.wait_idle()
        assert a.channel.sent == [] and not failures
        assert await coordinator.adopt_orphans() == 1
        await wait_until(lambda: delivered(a, 1), "m0 delivered")
        await a.gateway.wait_idle()
        assert [m.reply_to_message_id for m in a.channel.sent] == ["m0"]
