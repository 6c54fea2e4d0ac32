"""A reply's way out: stored in the inbox with the chat's send mark, sent (the parts
a platform already has are not sent again after a crash), and its result recorded in
the inbox, the transcript and the registry.

When the state cannot take the reply it is still sent (the transcript holds it and
its delivery, which recovery checks); nothing after the send raises for storage, so a
reply never gets a second, error, message.

A chat's replies go out in the order of its messages. A reply the platform could not
take (a timeout, an outage) is kept in the inbox for ``runtime/redelivery.py``; until
it is out (or given up on), a later reply to the same chat is kept too instead of
overtaking it (``keep_order``), and the lane sends the kept ones first on the chat's
next run (``Dispatch.run_batch``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from parley.channels.base import (
    Channel,
    DeliveryError,
    DeliveryResult,
    InboundMessage,
    LiveDrafts,
    OutboundMessage,
    RecipientBlocked,
    ReplyDraft,
)
from parley.core.prompt import SILENT_REPLY
from parley.gateway.runtime.context import Runtime, last_entry_id
from parley.gateway.runtime.drafts import held_drafts
from parley.gateway.runtime.send_recovery import parts_already_sent, recovery_of, send_mark
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.storage.errors import storage_error
from parley.gateway.storage.inbox import InboxItem, SentMessages
from parley.gateway.storage.sessions import SessionRecord

log = logging.getLogger("parley.gateway")

DELIVERY_ATTEMPTS = 3
DELIVERY_BACKOFF_SECONDS = (0.5, 2.0)

# Where replies go in order: one chat (and thread) of one channel account.
ChatKey = tuple[str, str, str, str | None]


def chat_of(message: InboundMessage) -> ChatKey:
    return (message.channel, message.account, message.chat_id, message.thread_id)


@dataclasses.dataclass(frozen=True, slots=True)
class KeptReply:
    """A reply kept for another send: its inbox id, and its row (None: unreadable now)."""

    inbox_id: int
    item: InboxItem | None


class Delivery:
    def __init__(self, rt: Runtime, transcripts: TranscriptCache) -> None:
        self.rt = rt
        self.transcripts = transcripts
        # Per chat: inbox ids whose reply this process kept for another send. Only a
        # hint (another replica may send one meanwhile): ``kept_before`` reads the
        # inbox before trusting it, and it costs nothing while no send has failed.
        self._kept: dict[ChatKey, set[int]] = {}

    async def kept_before(self, message: InboundMessage, ids: list[int]) -> list[KeptReply]:
        """The replies to ``message``'s chat kept for another send that answer earlier
        messages than ``ids``, in order: sent before ``ids``' own reply, or it waits.
        One whose inbox row cannot be read now (a storage failure) counts as waiting,
        without its row: order holds, and the redelivery sends both later."""
        chat = chat_of(message)
        kept = self._kept.get(chat)
        if not kept:
            return []
        first = min(ids)
        waiting: list[KeptReply] = []
        for item_id in sorted(i for i in kept if i < first and i not in ids):
            try:
                item = await self.rt.inbox.get(item_id)
            except Exception as exc:
                if not storage_error(exc):
                    raise
                log.warning("inbox %s unreadable, its chat's replies wait: %s", item_id, exc)
                waiting.append(KeptReply(item_id, None))
                continue
            if item is not None and item.status == "replied" and item.error:
                waiting.append(KeptReply(item_id, item))
            else:  # sent (maybe by another replica) or given up on
                kept.discard(item_id)
        if not kept:
            self._kept.pop(chat, None)
        return waiting

    def waiting_in(self, message: InboundMessage) -> bool:
        """Does a reply to ``message``'s chat wait for another send (a hint: see
        ``kept_before``)?"""
        return bool(self._kept.get(chat_of(message)))

    def _note_kept(self, message: InboundMessage, ids: list[int], kept: bool) -> None:
        chat = chat_of(message)
        if kept:
            self._kept.setdefault(chat, set()).update(ids)
        elif (known := self._kept.get(chat)) is not None:
            known.difference_update(ids)
            if not known:
                del self._kept[chat]

    async def deliver(
        self,
        ids: list[int],
        message: InboundMessage,
        record: SessionRecord | None,
        text: str,
        *,
        final_status: str = "delivered",
        failure: str | None = None,
        resumed: InboxItem | None = None,
        first_message: InboundMessage | None = None,
        keep_order: bool = False,
        shown: tuple[str, ...] = (),
    ) -> None:
        """Store the reply to inbox items ``ids`` in the inbox, send it, record the
        result. ``resumed``: the open item of a reply stored before (a restart, a
        failed send); the parts the platform already has are not sent again
        (``gateway.runtime.send_recovery``). The reply's idempotency key names the first
        message it answers (``first_message``, else ``message``): every send of this
        reply, and only of this one, carries it. ``keep_order`` (a lane's reply): while
        an earlier reply to the chat waits for another send, this one is stored and
        kept behind it rather than sent. ``shown``: messages that showed this reply
        while it was written before a restart (``drafts.held_drafts``), edited into it."""
        rt = self.rt
        session_id = record.session_id if record else None
        channel = rt.channels.get(message.channel)
        outbound = dataclasses.replace(
            reply_to(message, text), idempotency_key=reply_key(first_message or message)
        )
        # Where the chat's numbering stands before the send, stored with the reply
        # (an earlier mark is kept: an earlier send of this reply came after it).
        mark = await send_mark(channel, outbound) if channel is not None else None
        await rt.bookkeep(
            "store the reply in the inbox",
            rt.inbox.mark_replied(ids, session_id, [text], send_mark=mark),
        )
        if text.strip() == SILENT_REPLY:
            if shown and channel is not None:
                await withdraw_drafts(channel, outbound, shown)
            await rt.bookkeep("mark the reply delivered", rt.inbox.mark_delivered(ids))
            return
        if channel is None:
            log.warning("no running channel %s: reply kept for later", message.channel)
            return
        if keep_order and final_status == "delivered":
            waiting = await self.kept_before(message, ids)
            if waiting:
                # Sent now, it would reach the chat before the earlier reply: kept as
                # that one is, and the redelivery (or the chat's next run) sends both
                # in order. Nothing was tried, so no delivery entry is recorded.
                await rt.bookkeep(
                    "keep the reply behind an earlier one",
                    rt.inbox.note_undelivered(
                        ids, f"waiting for the reply to inbox {waiting[0].inbox_id} to go out first"
                    ),
                )
                self._note_kept(message, ids, kept=True)
                log.info("inbox %s: reply kept behind inbox %s", ids, waiting[0].inbox_id)
                return
        found: tuple[str, ...] = ()
        drafts_are_messages = channel.capabilities.draft_messages
        if resumed is not None:
            if drafts_are_messages:
                # Drafts (or parts) a kill left: the reply is edited into them.
                shown = (*shown, *await held_drafts(rt, channel, resumed, outbound))
            else:
                found = await parts_already_sent(channel, rt.inbox, resumed, outbound)
                outbound = dataclasses.replace(outbound, first_part=len(found))
            if not found and not shown and mark is not None:
                # Nothing above the old mark: look above this one after another kill
                # (the chat may have moved on by more than a look covers since).
                await rt.bookkeep("renew the send mark", rt.inbox.renew_send_mark(ids, mark))
        if shown:
            outbound = dataclasses.replace(outbound, shown=tuple(dict.fromkeys(shown)))
        error: str | None = None
        result = None
        partial: tuple[str, ...] = ()
        retryable = False
        for attempt in range(DELIVERY_ATTEMPTS):
            try:
                result = _after_found(found, await channel.send(outbound))
                break
            except RecipientBlocked as exc:
                error = f"recipient blocked the bot: {exc}"
                partial = found + exc.delivered
                break
            except DeliveryError as exc:
                error = str(exc)
                partial = found + exc.delivered
                retryable = exc.retryable and not partial
                # Parts already out would be sent twice: only a clean failure is retried.
                if partial or not exc.retryable or attempt == DELIVERY_ATTEMPTS - 1:
                    break
                await asyncio.sleep(DELIVERY_BACKOFF_SECONDS[min(attempt, 1)])
                # A network failure may have come after the platform took the reply (a
                # timeout under load: the answer was late, not the send): look for it
                # before sending again, as a restart does after a kill.
                looked = await self._look_again(channel, ids, outbound)
                if looked and drafts_are_messages:  # taken over as drafts are
                    outbound = dataclasses.replace(outbound, shown=(*outbound.shown, *looked))
                elif looked:
                    found = looked
                    outbound = dataclasses.replace(outbound, first_part=len(found))
        route = {
            "channel": outbound.channel,
            "account": outbound.account,
            "chat_id": outbound.chat_id,
            "thread_id": outbound.thread_id,
        }

        def sent(platform_ids: tuple[str, ...]) -> SentMessages:
            return SentMessages(outbound.channel, outbound.account, platform_ids)

        kept = result is None and retryable and final_status == "delivered"
        self._note_kept(message, ids, kept=kept)
        if kept:
            # The platform is unreachable for now: keep the reply and send it later.
            await rt.bookkeep(
                "keep the reply for another send",
                rt.inbox.note_undelivered(ids, error or "delivery failed"),
            )
            log.warning("delivery to %s failed, will try again: %s", route, error)
            rt.metrics.reply(message.channel, "failed")
            rt.metrics.error("delivery_failed")
        elif result is None:
            await rt.bookkeep(
                "mark the delivery failed",
                rt.inbox.mark_failed(ids, failure or error or "delivery failed", sent(partial)),
            )
            log.warning("delivery to %s failed: %s", route, error)
            rt.metrics.reply(message.channel, "failed")
            rt.metrics.error("delivery_failed")
        elif final_status == "rejected":
            await rt.bookkeep(
                "mark the message rejected",
                rt.inbox.mark_rejected(ids, "queue full", sent(result.platform_message_ids)),
            )
            rt.metrics.reply(message.channel, "rejected")
        elif final_status == "failed":  # told why; the message itself was not processed
            await rt.bookkeep(
                "mark the message failed",
                rt.inbox.mark_failed(ids, failure or "failed", sent(result.platform_message_ids)),
            )
            rt.metrics.reply(message.channel, "delivered")
        else:
            await rt.bookkeep(
                "mark the reply delivered",
                rt.inbox.mark_delivered(ids, sent(result.platform_message_ids)),
            )
            rt.metrics.reply(message.channel, "delivered")
        if record is None:
            return
        platform_ids = list(result.platform_message_ids if result else partial)
        delivery = {
            "inbox_ids": ids,
            "ok": result is not None,
            "platform_message_ids": platform_ids,
            "parts": result.parts if result else len(partial),
            "error": error,
            **route,
        }
        transcript = await self.transcripts.get(record)
        await rt.bookkeep(
            "record the delivery in the transcript",
            asyncio.to_thread(transcript.append_custom, "delivery", delivery),
        )
        await rt.bookkeep(
            "record the delivery in the registry",
            rt.registry.record_delivery(
                record.session_id,
                route,
                error,
                entry_count=transcript.entry_count,
                last_entry_id=last_entry_id(transcript),
                message_ids=platform_ids,
            ),
        )

    async def _look_again(
        self, channel: Channel, ids: list[int], outbound: OutboundMessage
    ) -> tuple[str, ...]:
        """The parts of this reply the platform has after a failed send ((): none, or
        the channel cannot look, or it cannot tell)."""
        if recovery_of(channel) is None:
            return ()
        try:
            stored = await self.rt.inbox.get(ids[0])  # the reply with its send mark
            if stored is None or stored.status != "replied":
                return ()
            return await parts_already_sent(channel, self.rt.inbox, stored, outbound)
        except Exception as exc:  # a look is a courtesy: the send is tried again anyway
            log.warning("looking for inbox %s's reply after a failed send failed: %s", ids, exc)
            return ()


async def withdraw_drafts(
    channel: Channel, outbound: OutboundMessage, shown: tuple[str, ...]
) -> None:
    """A silent reply after a restart: the drafts shown before it go away."""
    if not isinstance(channel, LiveDrafts) or outbound.idempotency_key is None:
        return
    draft = ReplyDraft(
        channel=outbound.channel,
        account=outbound.account,
        chat_id=outbound.chat_id,
        key=outbound.idempotency_key,
        text="",
        thread_id=outbound.thread_id,
        reset="withdrawn",
        held=shown,
    )
    try:
        await channel.draft(draft)
    except Exception as exc:  # untidy, not a lost reply
        log.warning("removing the drafts of a silent reply failed: %s", exc)


def reply_to(message: InboundMessage, text: str, *, quote: bool = True) -> OutboundMessage:
    """``text`` back to where ``message`` came from (quoting it unless ``quote`` is off)."""
    return OutboundMessage(
        channel=message.channel,
        account=message.account,
        chat_id=message.chat_id,
        text=text,
        thread_id=message.thread_id,
        reply_to_message_id=message.message_id if quote else None,
    )


def reply_key(message: InboundMessage) -> str:
    """The idempotency key of the reply to ``message``: the inbox stores one reply per
    message (its unique channel, account and platform id), so the key names that
    reply across restarts, and no other (notices sent outside the inbox carry none)."""
    return f"reply:{message.channel}:{message.account}:{message.message_id}"


def _after_found(found: tuple[str, ...], result: DeliveryResult) -> DeliveryResult:
    """The delivery of a whole reply: the parts found out already, then those sent now."""
    if not found:
        return result
    ids = found + result.platform_message_ids
    return dataclasses.replace(result, platform_message_ids=ids, parts=len(ids))
