"""One lane run: a session's batch of messages and tasks, in order.

Plain messages next to each other share one turn (collect mode); a reset, a
``/compact``, a recovered message or a task runs on its own. A recovered message
whose reply was stored before the crash is delivered, not answered again; one whose
delivery the transcript records is marked delivered, not sent twice.

Replies go out in the order of the chat's messages: a run first sends the chat's
replies kept after a failed send, and a reply that would overtake one still kept is
kept behind it (``Delivery.deliver(keep_order=True)``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from parley.channels.base import InboundMessage
from parley.core.transcript_store import SessionTranscript
from parley.gateway.routing import SessionRoute
from parley.gateway.runtime.commands.parsing import match_reset_trigger, parse_compact_command
from parley.gateway.runtime.context import Runtime
from parley.gateway.runtime.delivery import Delivery, reply_key, reply_to
from parley.gateway.runtime.drafts import held_drafts
from parley.gateway.runtime.lane_items import LaneItem, LaneTask
from parley.gateway.runtime.sessions import Sessions
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.runtime.turn import Turns
from parley.gateway.runtime.user_errors import INTERNAL_ERROR_TEXT, STORAGE_ERROR_TEXT
from parley.gateway.storage.errors import storage_failure
from parley.gateway.storage.inbox import InboxItem, SentMessages
from parley.gateway.storage.sessions import SessionRecord

log = logging.getLogger("parley.gateway")


class SessionLost(Exception):
    """This replica no longer holds the session (its lock connection went mid-run):
    another replica may be answering the same messages, so nothing more is sent."""


class RunSlots(Protocol):
    """The lanes' run slots, for a batch in flight (``LaneManager``)."""

    async def hold_slot(self, session_key: str) -> None: ...

    def release_slot(self, session_key: str) -> None: ...


class Dispatch:
    def __init__(
        self,
        rt: Runtime,
        *,
        transcripts: TranscriptCache,
        sessions: Sessions,
        turns: Turns,
        delivery: Delivery,
        slots: RunSlots | None = None,
    ) -> None:
        self.rt = rt
        self.transcripts = transcripts
        self.sessions = sessions
        self.turns = turns
        self.delivery = delivery
        self.slots = slots
        self.redelivering: set[int] = set()  # inbox ids queued for another send
        # Several replicas: does this replica still hold the session (its lock)? Asked
        # before each reply is stored and sent; None with one process (SQLite).
        self.fence: Callable[[str], Awaitable[bool]] | None = None

    def lane_item(
        self,
        item_id: int,
        message: InboundMessage,
        route: SessionRoute,
        recovered: InboxItem | None = None,
    ) -> LaneItem:
        """What the lane carries for a message: with the reset or /compact it asks for."""
        reset = None
        focus = None
        if not message.automated:  # automated events never reset a session
            reset = match_reset_trigger(message.text, self.rt.config.session.reset_triggers)
            focus = parse_compact_command(message.text)
        return LaneItem(
            item_id,
            message,
            route,
            reset_text=reset.remainder if reset is not None else None,
            compact_focus=focus if reset is None else None,
            recovered=recovered,
        )

    async def run_batch(self, key: str, items: list[LaneItem | LaneTask]) -> None:
        """Process a batch in order; plain messages next to each other share one turn."""
        await self._send_kept_first(key, items)
        group: list[LaneItem] = []
        # A batch holds several messages in collect mode, or (several replicas) when the
        # session's lock holder answers what other replicas received: queue mode still
        # answers each in its own turn.
        fold = self.rt.config.lanes.mode == "collect"
        for item in items:
            if isinstance(item, LaneTask):
                if group:
                    await self._answer(key, group)
                    group = []
                if self.slots is not None:
                    await self.slots.hold_slot(key)
                await item.execute()
                continue
            plain = (
                fold
                and item.reset_text is None
                and item.recovered is None
                and item.compact_focus is None
            )
            # One reply goes to one place: a session can span bot accounts or chats (a
            # person writing to two bots under dm_scope "per-channel-peer"), and a folded
            # turn must not leave one of them unanswered.
            if plain and (not group or _reply_route(group[0]) == _reply_route(item)):
                group.append(item)
                continue
            if plain:
                await self._answer(key, group)
                group = [item]
                continue
            if group:
                await self._answer(key, group)
                group = []
            await self._answer(key, [item])
        if group:
            await self._answer(key, group)

    async def _answer(self, key: str, items: list[LaneItem]) -> None:
        if self.slots is not None:
            # Given back while the batch's previous reply went out: a turn counts
            # against max_concurrent_runs again.
            await self.slots.hold_slot(key)
        try:
            await self._answer_items(key, items)
        finally:
            self.redelivering.difference_update(i.inbox_id for i in items)

    async def _deliver(self, key: str, *args: Any, **kwargs: Any) -> None:
        """A lane run's reply: in the chat's order, and only while the session is ours."""
        if self.slots is not None:
            # Sending is not model work: a slow or rate-limited platform must not keep
            # other sessions' turns waiting for a run slot. The lane stays busy, so
            # this session's next turn still waits for the send.
            self.slots.release_slot(key)
        if self.fence is not None and not await self.fence(key):
            raise SessionLost(key)
        await self.delivery.deliver(*args, keep_order=True, **kwargs)

    async def _send_kept_first(self, key: str, items: list[LaneItem | LaneTask]) -> None:
        """Send the replies kept after a failed send that answer earlier messages of
        the batch's chats, oldest first: the batch's own replies must not overtake
        them (those that still cannot go keep the batch's replies behind them)."""
        batch = [i for i in items if isinstance(i, LaneItem)]
        ids = [i.inbox_id for i in batch]
        seen: set[int] = set()
        for item in batch:
            for waiting in await self.delivery.kept_before(item.message, ids):
                kept = waiting.item
                if kept is None or kept.id in seen:
                    continue  # unreadable now: the batch's replies are kept behind it
                seen.add(kept.id)
                try:
                    await self._deliver_stored(key, kept, [kept.id], kept.message)
                except SessionLost:
                    raise
                except Exception:  # the batch's replies then wait behind it: order holds
                    log.exception("sending the kept reply to inbox %s failed", kept.id)

    async def _answer_items(self, key: str, items: list[LaneItem]) -> None:
        rt = self.rt
        deliver = functools.partial(self._deliver, key)
        first, last = items[0], items[-1]
        ids = [i.inbox_id for i in items]
        try:
            recovered = first.recovered
            if recovered is not None and recovered.status == "replied":
                await self._deliver_stored(key, recovered, ids, last.message)
                return
            if first.compact_focus is not None:
                # A compaction can take minutes on a small model: show that work goes on.
                async with self.turns.working(first.message):
                    outcome = await self.sessions.compact_command(key, first)
                await deliver(ids, last.message, *outcome, first_message=first.message)
                return
            if first.reset_text is not None:
                record = await self.sessions.reset(key, first, reason="command")
                if not first.reset_text.strip():
                    text = (
                        f"Started a new session ({record.session_id[:8]}). The old one is archived."
                    )
                    await deliver(ids, last.message, record, text, first_message=first.message)
                    return
                text = first.reset_text
            else:
                record = await self.sessions.session_for(key, first)
                text = "\n\n".join(_turn_text(i.message) for i in items)
            if first.recovered is not None and await self._delivered_before(record, ids):
                return
            held = await self._held_drafts(first, last.message)
            # The model's part over, the run slot goes back: what follows (the
            # registry's counters, the send) is not model work.
            done = None if self.slots is None else functools.partial(self.slots.release_slot, key)
            reply = await self.turns.run(record, items, text, model_done=done, held=held)
            await deliver(ids, last.message, record, reply, first_message=first.message, shown=held)
        except SessionLost:
            raise  # another replica answers these now: no error message either
        except Exception as exc:
            detail = storage_failure(exc)
            if detail is None:
                log.exception("answering %s in session %s failed", ids, key)
                rt.metrics.error("internal")
                await deliver(
                    ids, last.message, None, INTERNAL_ERROR_TEXT, first_message=first.message
                )
                return
            log.error(
                "storage failure answering %s in session %s: %s (free disk space or make "
                "%s writable); the message is marked failed in the inbox",
                ids,
                key,
                detail,
                rt.loaded.home,
            )
            rt.metrics.error("storage")
            await deliver(
                ids,
                last.message,
                None,
                STORAGE_ERROR_TEXT,
                final_status="failed",
                failure=f"storage: {detail}",
                first_message=first.message,
            )

    async def _deliver_stored(
        self, key: str, recovered: InboxItem, ids: list[int], message: InboundMessage
    ) -> None:
        """Deliver a reply stored before a restart or a failed send."""
        rt = self.rt
        # Read again: a folded turn's reply answers several items, and the first of
        # them to come back here delivers it for all.
        stored = await rt.inbox.get(recovered.id)
        if stored is None or stored.status != "replied":
            return
        ids = sorted({*ids, *stored.reply_for})
        record = await rt.registry.get(stored.session_id or "")
        if record is not None and await self._delivered_before(record, ids):
            return
        text = (stored.reply or [""])[0]
        head = stored if ids[0] == stored.id else await rt.inbox.get(ids[0])
        await self._deliver(
            key,
            ids,
            message,
            record,
            text,
            resumed=stored,
            first_message=head.message if head is not None else None,
        )

    async def _held_drafts(self, first: LaneItem, last: InboundMessage) -> tuple[str, ...]:
        """The draft messages a kill left of this reply (``drafts.held_drafts``)."""
        recovered = first.recovered
        if recovered is None or recovered.send_mark is None:
            return ()
        route = dataclasses.replace(reply_to(last, "…"), idempotency_key=reply_key(first.message))
        return await held_drafts(self.rt, self.rt.channels.get(last.channel), recovered, route)

    async def _delivered_before(self, record: SessionRecord, ids: list[int]) -> bool:
        """A recovered item whose reply the transcript says went out (state.db could not
        record it): mark it delivered rather than send it twice."""
        transcript = await self.transcripts.get(record)
        delivery = _delivery_recorded(transcript, ids)
        if delivery is None:
            return False
        log.info("inbox %s was delivered before the restart; not sent again", ids)
        # Its platform ids go on record too: a later look for another reply in that
        # chat must not take these messages for its own.
        sent = SentMessages(
            str(delivery.get("channel") or ""),
            str(delivery.get("account") or ""),
            tuple(str(i) for i in delivery.get("platform_message_ids") or ()),
        )
        await self.rt.inbox.mark_delivered(ids, sent)
        return True


def _reply_route(item: LaneItem) -> tuple[str, str, str, str | None]:
    message = item.message
    return (message.channel, message.account, message.chat_id, message.thread_id)


def _turn_text(message: InboundMessage) -> str:
    """The user turn as the model sees it: who spoke in a group, and what they answer."""
    text = message.text
    if message.chat_type != "direct":
        text = f"{message.sender_name}: {text}"
    if message.reply_to_text:
        text = f"[in reply to {message.reply_to_text}]\n{text}"
    return text


def _delivery_recorded(transcript: SessionTranscript, ids: list[int]) -> dict[str, Any] | None:
    """The live transcript's record of a successful delivery for any of ``ids``."""
    wanted = set(ids)
    for entry in reversed(transcript.live_entries()):
        if entry.type != "custom" or entry.custom_type != "delivery":
            continue
        data = entry.payload.get("data") or {}
        if data.get("ok") and wanted & set(data.get("inbox_ids") or ()):
            return dict(data)
    return None
