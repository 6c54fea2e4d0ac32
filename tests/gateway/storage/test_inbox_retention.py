"""Retention of the durable inbox on both backends (a real state.db and a real
PostgreSQL): only finished rows past the window and older than every open item go,
with their sent-message records; what dedupe, send recovery and catch-up read of the
rows that stay is unchanged, and a redelivered message inside the window is still
answered once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from parley.channels.base import InboundMessage
from parley.gateway.config import load_config
from parley.gateway.errors import ConfigFileError
from parley.gateway.retention_config import INBOX_DEDUPE_DAYS
from parley.gateway.storage.inbox import PruneResult, SentMessages
from tests.gateway.state_backends import StateBackend, state, state_location

__all__ = ["state", "state_location"]  # the shared fixtures

NOW = datetime.now(UTC)


def message(mid: str, chat: str = "alice") -> InboundMessage:
    return InboundMessage(
        "test", "default", "direct", chat, chat, chat.title(), f"words {mid}", mid, NOW
    )


async def _age(state: StateBackend, item_id: int, days: int) -> None:
    """Backdate an item's last change (the public API writes only the time now)."""
    stamp = (NOW - timedelta(days=days)).isoformat()
    await state.execute("UPDATE inbox SET updated_at = ? WHERE id = ?", (stamp, item_id))


async def _delivered(state: StateBackend, mid: str, days: int, chat: str = "alice") -> int:
    item = (await state.inbox.record(message(mid, chat))).item
    await state.inbox.mark_replied([item.id], "sid", [f"reply {mid}"], send_mark="1")
    await state.inbox.mark_delivered([item.id], SentMessages("test", "default", (f"out:{mid}",)))
    await _age(state, item.id, days)
    return item.id


async def test_only_finished_rows_past_the_window_go(state: StateBackend) -> None:
    inbox = state.inbox
    old = await _delivered(state, "1", days=40)
    failed = (await inbox.record(message("2"))).item.id
    await inbox.mark_failed([failed], "refused")
    await _age(state, failed, 40)
    recent = await _delivered(state, "3", days=10)
    before = NOW - timedelta(days=30)

    dry = await inbox.prune_finished(before, dry_run=True)
    assert dry.rows == 2 and dry.bytes > 0
    assert await inbox.get(old) is not None  # a dry run changes nothing

    done = await inbox.prune_finished(before)
    assert done == dry
    assert await inbox.get(old) is None and await inbox.get(failed) is None
    assert await inbox.get(recent) is not None
    # Their sent records went with them; the kept row's stay (send recovery reads them).
    assert not await inbox.is_recorded("test", "default", "out:1")
    assert await inbox.is_recorded("test", "default", "out:3")
    assert await inbox.prune_finished(before) == PruneResult()  # idempotent


async def test_nothing_at_or_after_the_oldest_open_item_goes(state: StateBackend) -> None:
    inbox = state.inbox
    first = await _delivered(state, "10", days=50)
    # A reply still to be sent (a platform outage): its send recovery reads the sent
    # records of replies after its mark, so nothing from it on may go, however old.
    waiting = (await inbox.record(message("11"))).item.id
    await inbox.mark_replied([waiting], "sid", ["later"], send_mark="5")
    await inbox.note_undelivered([waiting], "unreachable")
    await _age(state, waiting, 45)
    after = await _delivered(state, "12", days=40)
    unanswered = (await inbox.record(message("13", "bob"))).item.id
    await _age(state, unanswered, 60)

    assert (await inbox.prune_finished(NOW - timedelta(days=30))).rows == 1
    assert await inbox.get(first) is None
    for kept in (waiting, after, unanswered):
        assert await inbox.get(kept) is not None
    assert await inbox.is_recorded("test", "default", "out:12")
    assert [i.id for i in await inbox.open_items()] == [waiting, unanswered]


async def test_a_redelivery_inside_the_window_is_still_answered_once(state: StateBackend) -> None:
    inbox = state.inbox
    await _delivered(state, "20", days=40)
    inside = await _delivered(state, "21", days=INBOX_DEDUPE_DAYS - 1)
    await inbox.prune_finished(NOW - timedelta(days=INBOX_DEDUPE_DAYS))
    again = await inbox.record(message("21"))
    assert not again.is_new and again.item.id == inside and again.item.status == "delivered"
    # Catch-up after a restart still finds where the conversation stopped.
    marks = await inbox.newest_per_conversation("test", NOW - timedelta(days=INBOX_DEDUPE_DAYS))
    assert [m.message_id for m in marks] == ["21"]
    # Past the window the platform no longer redelivers: an id from then is new to us
    # (it cannot collide with a row, and recording it works).
    assert (await inbox.record(message("20"))).is_new


@pytest.mark.parametrize("days", [1, INBOX_DEDUPE_DAYS - 1])
def test_an_inbox_window_shorter_than_the_dedupe_window_is_refused(days: int) -> None:
    with pytest.raises(ConfigFileError) as caught:
        load_config(env={"PARLEY_RETENTION__INBOX_DAYS": str(days)})
    assert "retention.inbox_days" in str(caught.value) and "dedupe" in str(caught.value)
    assert load_config(env={"PARLEY_RETENTION__INBOX_DAYS": "0"}).config.retention.inbox_days == 0
