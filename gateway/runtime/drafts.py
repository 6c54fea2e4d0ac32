"""A reply shown while it is written (``DraftStream``), and, on platforms where the
drafts are messages of the bot's (Telegram, Discord), their record in the inbox.

Crash safety of a streamed reply. Before its first draft message the chat's send
mark is stored with the items the reply answers (``Inbox.note_preview``), and each
draft message's id is recorded as this reply's as soon as the platform returns it.
A kill mid-stream then leaves an open item whose draft messages are known (recorded)
or findable (above the mark: Telegram's probe; Discord's nonce returns the same
message again). The restarted turn takes them over (``held_drafts``): its drafts
and its reply are edited into those messages, never sent beside them, so a half
reply always ends as the whole one, and no reply is sent twice more often than a
reply sent without drafts (a kill between the platform's answer and the record).
While a reply is being streamed its item counts as an open reply
(``Inbox.open_replies``): another reply to the chat recovered after the same kill
is then sent again rather than taking a draft message for its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from parley.channels.base import (
    Channel,
    ChannelError,
    DraftReset,
    LiveDrafts,
    OutboundMessage,
    ReplyDraft,
)
from parley.core.prompt import SILENT_REPLY
from parley.gateway.runtime.context import Runtime
from parley.gateway.runtime.send_recovery import parts_already_sent, send_mark
from parley.gateway.storage.inbox import UNKNOWN_SEND_MARK, InboxItem, SentMessages
from parley.gateway.tasks import cancel_and_wait

log = logging.getLogger("parley.gateway")

# A draft push failing like this is the transport's weather (a tab closed, a socket
# reset, a slow API): logged at debug. Anything else is a bug worth a warning.
_TRANSPORT_FAILURES = (ConnectionError, OSError, asyncio.TimeoutError, ChannelError)

# How long the end of a turn waits for a draft (or typing indicator) still on its way.
TYPING_STOP_SECONDS = 5.0
# Drafts go out at most this often (the first at once) on channels that do not say:
# smooth enough to read as streaming, few enough that a long reply costs a channel
# tens of updates, not thousands.
DRAFT_INTERVAL_SECONDS = 0.15


class DraftRecord:
    """The inbox's record of one reply's draft messages (``draft_messages`` channels)."""

    def __init__(self, rt: Runtime, channel: Channel, ids: list[int], route: OutboundMessage):
        self._rt = rt
        self._channel = channel
        self._ids = ids
        self._route = route
        self._recorded: set[str] = set()

    async def before_first(self) -> bool:
        """Store the chat's send mark before the first draft message; False when it
        cannot be stored (the reply then goes without drafts: nothing unrecorded)."""
        try:
            # A platform without marks (Discord) still gets one, unknown: it says the
            # reply has drafts to take over, and it is never looked above.
            mark = await send_mark(self._channel, self._route) or UNKNOWN_SEND_MARK
            await self._rt.inbox.note_preview(self._ids, mark)
        except Exception as exc:
            log.warning("inbox %s: no drafts for this reply: %s", self._ids, exc)
            return False
        return True

    async def shown(self, message_ids: tuple[str, ...]) -> None:
        """Record the draft messages not recorded yet as this reply's."""
        new = tuple(i for i in message_ids if i not in self._recorded)
        if not new:
            return
        sent = SentMessages(self._route.channel, self._route.account, new)
        await self._rt.bookkeep(
            "record the reply's draft messages", self._rt.inbox.note_preview(self._ids, None, sent)
        )
        self._recorded.update(new)

    def knows(self, message_ids: tuple[str, ...]) -> None:
        """These are recorded already (held over from before a restart)."""
        self._recorded.update(message_ids)


async def held_drafts(
    rt: Runtime, channel: Channel | None, item: InboxItem, route: OutboundMessage
) -> tuple[str, ...]:
    """The draft messages a kill left of the reply to ``item`` (recorded, or found
    above its send mark), for the restarted reply to take over; () when none."""
    if channel is None or not channel.capabilities.draft_messages or item.send_mark is None:
        return ()
    ids = sorted({*item.reply_for, item.id})
    try:
        recorded = await rt.inbox.previews(ids)
        # What the platform holds above the mark that no reply recorded: a draft (or
        # part) whose id the kill kept from the record.
        found = await parts_already_sent(channel, rt.inbox, item, route)
    except Exception as exc:  # looking is a courtesy: without it, new messages are sent
        log.warning("inbox %s: its earlier drafts could not be looked up: %s", item.id, exc)
        return ()
    held = tuple(dict.fromkeys([*recorded, *found]))
    if held:
        log.info("inbox %s: taking over %d message(s) of its earlier drafts", item.id, len(held))
    return held


class DraftStream:
    """One turn's reply shown while it is written.

    The text deltas of the model call that is writing are pushed to the channel as
    whole-text drafts, at most every ``interval`` seconds (the first at once), one push
    at a time: the model's stream never waits for the channel, and a slow channel gets
    fewer, fresher drafts. A retry or a later model call voids what was shown (a reset
    rides on the next draft). A failing push never fails the turn: drafts are previews,
    the reply goes out through delivery. A transport failure is logged at debug; any
    other (a bug in the channel's draft) at warning with its trace, once per turn.
    """

    def __init__(
        self,
        channel: LiveDrafts,
        base: ReplyDraft,
        calls: Callable[[], int],
        *,
        interval: float = DRAFT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        record: DraftRecord | None = None,
    ) -> None:
        """``calls``: a number that changes when the runner starts another model call.
        ``record``: the drafts are platform messages, recorded in the inbox."""
        self._record = record
        self._marked = bool(base.held)  # held drafts: their mark is stored already
        if record is not None:
            record.knows(base.held)
        self._status: str | None = None
        self._channel = channel
        self._base = base
        self._calls = calls
        self._interval = interval
        self._clock = clock
        self._sleep = sleep
        self._mark: int | None = None
        self._parts: list[str] = []
        self._reset: DraftReset | None = None  # the channel shows void text: say so
        self._shown = False  # the channel shows some text of this reply
        self._dirty = False
        self._next_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._pushing = False
        self._closed = False
        self._warned = False

    async def on_text(self, delta: str) -> None:
        if self._closed or not delta:
            return
        mark = self._calls()
        if self._mark is None:
            self._mark = mark
        elif mark != self._mark:
            self._mark = mark
            self.reset("next_call")
        self._parts.append(delta)
        self._wake()

    def status(self, text: str | None) -> None:
        """What the turn is busy with besides writing (None: nothing), shown until done."""
        if self._closed or text == self._status:
            return
        self._status = text
        self._wake()

    def reset(self, why: DraftReset) -> None:
        """What was written so far is void; the next draft says so."""
        if self._closed:
            return
        self._parts.clear()
        if self._shown or self._reset is not None:
            # A retry's reset stays one when a later call follows before it went out
            # (a reply restarted after a compaction): what was shown is void either way.
            if self._reset is None or why != "next_call":
                self._reset = why
            self._wake()

    async def close(self, *, withdraw: bool = False) -> None:
        """No draft after this returns. ``withdraw``: no reply will follow (a silent
        reply), so the draft, if any, goes away."""
        self._closed = True
        task = self._task
        if task is not None:
            if self._pushing:
                # Let a draft in flight land (before the reply) rather than cut a write
                # in half; a channel that hangs is not waited for long.
                try:
                    await asyncio.wait_for(asyncio.shield(task), TYPING_STOP_SECONDS)
                except TimeoutError:
                    task.cancel()
            else:
                await cancel_and_wait(task)
        if withdraw:
            # Even with nothing shown: the channel learns that no reply is coming, and
            # stops saying that parley is working.
            self._shown, self._reset = False, None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._push(dataclasses.replace(self._base, reset="withdrawn")),
                    TYPING_STOP_SECONDS,
                )

    def _wake(self) -> None:
        self._dirty = True
        if self._task is None:
            self._task = asyncio.create_task(self._pump(), name="reply-drafts")

    async def _pump(self) -> None:
        try:
            while self._dirty and not self._closed:
                wait = self._next_at - self._clock()
                if wait > 0:
                    await self._sleep(wait)
                    continue
                self._dirty = False
                text = "".join(self._parts)
                if SILENT_REPLY.startswith(text.strip()):
                    text = ""  # nothing yet, or a silent reply on its way: show nothing
                if not text and self._reset is None and self._status is None:
                    continue
                draft = dataclasses.replace(
                    self._base, text=text, reset=self._reset, status=self._status
                )
                self._reset, self._shown = None, bool(text)
                self._next_at = self._clock() + self._interval
                await self._push(draft)
        finally:
            self._task = None

    async def _push(self, draft: ReplyDraft) -> None:
        self._pushing = True
        try:
            record = self._record
            if record is not None and not self._marked:
                self._marked = True
                if not await record.before_first():
                    self._closed = True  # no mark stored: no draft message may go out
                    return
            shown = await self._channel.draft(draft)
            if record is not None and shown:
                await record.shown(shown)
        except _TRANSPORT_FAILURES as exc:  # a preview: its failure never fails the turn
            log.debug("draft on %s failed: %s", draft.channel, exc)
        except Exception as exc:
            if self._warned:
                log.debug("draft on %s failed again: %r", draft.channel, exc)
            else:
                self._warned = True
                log.warning(
                    "draft on %s failed (the reply is still sent): %r",
                    draft.channel,
                    exc,
                    exc_info=True,
                )
        finally:
            self._pushing = False
