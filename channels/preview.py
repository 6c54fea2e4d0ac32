"""Replies shown while they are written, in messages of the bot's own (Telegram,
Discord): the shared bookkeeping of which messages show which reply.

A reply's *slots* are the platform messages that show it, in order. A draft puts the
text written so far into them: the parts of a split (``partial``: the last part grows
by edits, a part that fills up leaves the next to a new message) or only the blocks
that are complete (``block``: a paragraph-sized message each, never edited while the
reply is written). A status line (a tool, a compaction at work) rides at the end.

The reply itself goes out through ``finish``: slot *i* is edited to hold part *i* of
the reply exactly as a reply sent without drafts would be split (no edit where it
already does), the parts beyond the slots are sent as new messages, and slots left
over (the reply came out shorter than a void draft) are deleted. So a streamed reply
ends as the same messages, with the same text, as one sent at once.

After a restart the gateway hands the slots a kill left behind (``ReplyDraft.held``,
``OutboundMessage.shown``); their text is unknown, so each is edited once. A platform
that answers "too many requests" to a draft pauses this reply's drafts for as long as
it asks (drafts are previews: the next one shows the newer text anyway); ``finish``
waits it out as a send does.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from parley.channels.base import (
    ChannelCapabilities,
    ChannelError,
    DeliveryError,
    DeliveryResult,
    OutboundMessage,
    ReplyDraft,
    StreamMode,
)
from parley.channels.markdown_html import Fence, find_fences

logger = logging.getLogger("parley.channels.preview")


# Replies whose slots are remembered; a turn that died without a send leaves one
# behind, so the oldest are forgotten (their messages stay as the last draft left them).
REMEMBERED_REPLIES = 4096
STATUS_PREFIX = "⏳ "

# Block mode: a block ends at the first paragraph break after this many characters
# (outside a code block), or is cut at a line or word near ``BLOCK_MAX_CHARS``.
BLOCK_MIN_CHARS = 400
BLOCK_MAX_CHARS = 1500


class DraftPaused(ChannelError):
    """The platform asked for ``seconds`` of quiet (flood control) during a draft."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"flood control: {seconds:g} s")
        self.seconds = seconds


class GoneMessage(ChannelError):
    """A slot's message is no longer there (deleted by someone): it cannot be edited."""


class SlotOps(Protocol):
    """What a platform does for ``Previews``: ``create`` part ``index`` of ``route``'s
    reply (a quote on the first, the reply's idempotency where the platform has one) and
    return its platform id; ``edit`` a message to hold ``text`` (unchanged text is no
    error); ``delete`` one. ``create``/``edit`` raise ``DraftPaused`` on flood control
    when ``draft`` is true (a preview must not wait), and wait it out otherwise."""

    async def create(
        self, route: OutboundMessage, index: int, text: str, *, draft: bool
    ) -> str: ...

    async def edit(
        self, route: OutboundMessage, message_id: str, text: str, *, draft: bool
    ) -> None: ...

    async def delete(self, route: OutboundMessage, message_id: str) -> None: ...


@dataclass(slots=True)
class _Slot:
    message_id: str
    text: str | None  # what it shows; None: unknown (held over from before a restart)


@dataclass(slots=True)
class _Reply:
    slots: list[_Slot] = field(default_factory=list)
    paused_until: float = 0.0
    # A draft message's create failed in a way that may have reached the platform (its
    # answer lost): the reply looks for it before sending (``finish``).
    in_doubt: bool = False


class Previews:
    """The slots of every reply being written on one channel, by idempotency key."""

    def __init__(
        self,
        ops: SlotOps,
        split: Callable[[str], list[str]],
        *,
        order: Callable[[str], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``split``: how the platform splits a whole reply (its message limit);
        ``order``: a platform id's place in the chat (slots are created in order)."""
        self._ops = ops
        self._split = split
        self._order = order
        self._clock = clock
        self._replies: OrderedDict[str, _Reply] = OrderedDict()

    def _reply(self, key: str, held: Sequence[str]) -> _Reply:
        reply = self._replies.get(key)
        if reply is None:
            reply = _Reply([_Slot(i, None) for i in sorted(set(held), key=self._order)])
            self._replies[key] = reply
            while len(self._replies) > REMEMBERED_REPLIES:
                self._replies.popitem(last=False)
        self._replies.move_to_end(key)
        return reply

    def showing(self, key: str) -> tuple[str, ...]:
        reply = self._replies.get(key)
        return tuple(s.message_id for s in reply.slots) if reply else ()

    async def draft(self, draft: ReplyDraft, mode: StreamMode) -> tuple[str, ...]:
        """Show ``draft`` in its reply's slots; the ids of the slots after it."""
        route = route_of(draft)
        if draft.reset == "withdrawn":  # a silent reply: nothing will show
            reply = self._replies.pop(draft.key, None)
            slots = reply.slots if reply else [_Slot(i, None) for i in draft.held]
            await self._delete(route, [s.message_id for s in slots])
            return ()
        reply = self._reply(draft.key, draft.held)
        if self._clock() < reply.paused_until:
            return self.showing(draft.key)
        wanted = self.draft_texts(draft.text, draft.status, mode)
        if not wanted:
            # Nothing to show yet (or a void draft with nothing new): what shows stays
            # until there is text; ``finish`` puts the reply in its place either way.
            return self.showing(draft.key)
        try:
            for index, text in enumerate(wanted):
                await self._put(route, reply, index, text, draft=True)
        except DraftPaused as exc:
            reply.paused_until = self._clock() + exc.seconds
            logger.info("%s: drafts paused %.1f s (flood control)", draft.channel, exc.seconds)
        except GoneMessage:
            # Someone deleted a slot: drafts stop here (the reply is sent anew from it).
            reply.paused_until = float("inf")
        except DeliveryError as exc:
            # No more drafts for this reply (the chat is gone, or the platform is in
            # trouble); a create whose answer was lost may have made a message.
            reply.paused_until = float("inf")
            reply.in_doubt = reply.in_doubt or exc.retryable
            raise
        return self.showing(draft.key)

    def draft_texts(self, text: str, status: str | None, mode: StreamMode) -> list[str]:
        """What the slots show for ``text`` written so far (and a status line)."""
        parts = self._split(text) if mode == "partial" else complete_blocks(text, self._split)
        if status:
            line = f"{STATUS_PREFIX}{status}"
            if (
                parts
                and mode == "partial"
                and self._split(f"{parts[-1]}\n\n{line}") == [f"{parts[-1]}\n\n{line}"]
            ):
                parts[-1] = f"{parts[-1]}\n\n{line}"
            else:
                parts.append(line)
        return parts

    async def finish(self, message: OutboundMessage, parts: list[str]) -> DeliveryResult | None:
        """Put the reply ``parts`` in its slots and send the rest; None when the reply
        has no slots (the caller sends it as usual)."""
        key = message.idempotency_key
        if key is None or (key not in self._replies and not message.shown):
            return None
        reply = self._replies.pop(key, None) or _Reply()
        # Kept until the reply is out: a send tried again finds what this one did.
        self._replies[key] = reply
        if reply.in_doubt:
            # Sent now, the reply could stand beside a draft the platform took without
            # saying so: the caller looks for it (as after a send whose answer was lost)
            # and hands it over in ``shown``.
            reply.in_doubt = False
            raise DeliveryError("a draft of this reply may have gone out", retryable=True)
        known = {s.message_id for s in reply.slots}
        held = [i for i in message.shown if i not in known]
        slots = sorted(
            [*reply.slots, *(_Slot(i, None) for i in held)],
            key=lambda s: self._order(s.message_id),
        )
        reply.slots = slots
        delivered: list[str] = []
        index = 0
        try:
            while index < len(parts):
                if index < len(slots):
                    try:
                        await self._put(message, reply, index, parts[index], draft=False)
                    except GoneMessage:
                        # Gone from the chat: what follows it moves to new messages, in order.
                        await self._delete(message, [s.message_id for s in slots[index:]])
                        del slots[index:]
                        continue
                else:
                    await self._put(message, reply, index, parts[index], draft=False)
                delivered.append(slots[index].message_id)
                index += 1
        except DeliveryError as exc:
            # The parts it holds already (edited into slots) are out: say so, as a send does.
            exc.delivered = tuple(delivered) + exc.delivered
            exc.retryable = exc.retryable and not exc.delivered
            raise
        self._replies.pop(key, None)
        await self._delete(message, [s.message_id for s in slots[len(parts) :]])
        return DeliveryResult(tuple(delivered), len(delivered), datetime.now(UTC))

    async def _put(
        self, route: OutboundMessage, reply: _Reply, index: int, text: str, *, draft: bool
    ) -> None:
        slots = reply.slots
        if index < len(slots):
            slot = slots[index]
            if slot.text != text:
                await self._ops.edit(route, slot.message_id, text, draft=draft)
                slot.text = text
            return
        message_id = await self._ops.create(route, index, text, draft=draft)
        slots.append(_Slot(message_id, text))

    async def _delete(self, route: OutboundMessage, message_ids: list[str]) -> None:
        for message_id in message_ids:
            try:
                await self._ops.delete(route, message_id)
            except Exception as exc:  # a leftover draft is untidy, never a failed reply
                logger.warning("%s: removing draft %s failed: %s", route.channel, message_id, exc)


def streaming_capabilities(
    base: ChannelCapabilities,
    mode: StreamMode,
    interval: float,
    group_interval: float | None = None,
) -> ChannelCapabilities:
    """A platform adapter's capabilities with ``streaming = mode``: drafts that are
    messages of its own, at most every ``interval`` seconds (``group_interval`` in groups)."""
    if mode == "off":
        return base
    return dataclasses.replace(
        base,
        live_drafts=True,
        draft_messages=True,
        draft_interval_seconds=interval,
        draft_group_interval_seconds=group_interval,
    )


def route_of(draft: ReplyDraft) -> OutboundMessage:
    """Where a draft goes, as the reply it previews will."""
    return OutboundMessage(
        channel=draft.channel,
        account=draft.account,
        chat_id=draft.chat_id,
        text=draft.text,
        thread_id=draft.thread_id,
        reply_to_message_id=draft.reply_to_message_id,
        idempotency_key=draft.key,
    )


def split_blocks(text: str, split: Callable[[str], list[str]]) -> list[str]:
    """A whole reply as block mode sends it: paragraph-sized blocks, each split as the
    platform splits a reply (its limit, its code fences), none blank. The blocks of a
    text are those of every longer text it begins (``complete_blocks``), so the blocks
    sent while a reply is written are the ones it ends with."""
    return _blocks(text, split, final=True)


def complete_blocks(text: str, split: Callable[[str], list[str]]) -> list[str]:
    """The blocks of ``text`` that more text cannot change (block mode's drafts)."""
    return _blocks(text, split, final=False)


def _blocks(text: str, split: Callable[[str], list[str]], *, final: bool) -> list[str]:
    parts: list[str] = []
    rest = text
    while rest.strip():
        end = _block_end(rest, final=final)
        if end is None:
            break
        parts.extend(split(rest[:end]))
        rest = rest[end:]
    return [p for p in parts if p.strip()]


def _block_end(text: str, *, final: bool) -> int | None:
    """Where the first block of ``text`` ends: at its first paragraph break outside a
    code block that lies between ``BLOCK_MIN_CHARS`` and ``BLOCK_MAX_CHARS``; with a
    code block starting within that reach, at the first break after it (a code block
    stays whole, the platform's split cuts it only when it must); prose without a
    break is cut at a line or word near ``BLOCK_MAX_CHARS``. None when more text could
    still move it (``final``: no more text comes, so the rest is a block). Each answer
    depends only on text before it, so drafts and the final split agree."""
    start = len(text) - len(text.lstrip())
    reach = start + BLOCK_MAX_CHARS
    fences = [f for f in find_fences(text) if f.end > start]
    brk = _break_outside(text, start + BLOCK_MIN_CHARS, fences)
    if brk is not None and brk < reach:
        return brk + 2
    if any(f.start < reach for f in fences) or len(text) <= reach:
        if brk is not None:
            return brk + 2
        return len(text) if final else None
    window = text[start:reach]
    for sep in ("\n", " "):
        cut = window.rfind(sep)
        if cut > BLOCK_MIN_CHARS // 2:
            return start + cut + 1
    return reach


def _break_outside(text: str, search: int, fences: list[Fence]) -> int | None:
    """The first paragraph break at or after ``search`` that is not inside a code block."""
    while (brk := text.find("\n\n", search)) >= 0:
        inside = next((f.end for f in fences if f.start <= brk < f.end), None)
        if inside is None:
            return brk
        search = inside
    return None
