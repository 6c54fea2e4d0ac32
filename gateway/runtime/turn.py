"""One turn: the user's words through ``core``'s runner, and what the gateway records
of it (metrics, the session's figures, the memory index's hints, task records, the
registry's counters). A turn a crash interrupted resumes from its transcript.

On a channel that shows replies as they are written (``LiveDrafts``), the model's text
deltas become throttled drafts (``DraftStream``); the reply itself still goes out through
the delivery path afterwards, with its exactly-once guarantees, and replaces the draft.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from parley.channels.base import (
    Channel,
    InboundMessage,
    LiveDrafts,
    ReplyDraft,
)
from parley.core.context.compaction.stats import DEFAULT_STRATEGY
from parley.core.errors import (
    AuthenticationError,
    ContextError,
    OverloadedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    ServerError,
)
from parley.core.group_context import GroupLine, render_group_context
from parley.core.memory.audience import Viewer, visible_scopes
from parley.core.memory.index import MemoryIndex
from parley.core.prompt import SILENT_REPLY, render_turn_context
from parley.core.runner import Runner, TurnRequest, TurnResult
from parley.core.transcript import ENTRY_COMPACTION
from parley.core.transcript_store import SessionTranscript
from parley.gateway.admin.gateway_view import ProviderHealth
from parley.gateway.media.intake import Intake, MediaIntake, has_files, with_notices
from parley.gateway.media.store import MediaStore
from parley.gateway.memory import record_turn_task
from parley.gateway.runtime.context import Runtime, last_entry_id
from parley.gateway.runtime.delivery import Delivery, reply_key, reply_to
from parley.gateway.runtime.drafts import TYPING_STOP_SECONDS, DraftRecord, DraftStream
from parley.gateway.runtime.lane_items import LaneItem
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.runtime.user_errors import (
    EMPTY_REPLY_TEXT,
    describe_context_error,
    describe_provider_error,
)
from parley.gateway.storage.sessions import SessionRecord

log = logging.getLogger("parley.gateway")

# Provider failures that mean it could not be reached (as opposed to a refusal).
_UNREACHABLE = (
    ProviderConnectionError,
    ProviderTimeoutError,
    ServerError,
    OverloadedError,
    AuthenticationError,
)


class Turns:
    def __init__(self, rt: Runtime, transcripts: TranscriptCache, delivery: Delivery) -> None:
        self.rt = rt
        self.transcripts = transcripts
        self.delivery = delivery  # whether a reply to a chat waits for another send
        # Pictures, documents and voice notes that come with the words (gateway.media).
        self.media = MediaIntake(rt.config.media, MediaStore(rt.loaded.media_dir), rt.channels)

    async def run(
        self,
        record: SessionRecord,
        items: list[LaneItem],
        text: str,
        *,
        model_done: Callable[[], None] | None = None,
        held: tuple[str, ...] = (),
    ) -> str:
        """The reply to ``items`` (their words folded into ``text``): the model's, or
        an error text the person can act on. ``model_done`` is called once the model's
        part is over (the reply is in the transcript, or the call failed), before the
        typing indicator is stopped and the bookkeeping that follows; at most twice
        (on a failure the indicator's stop raised after it), so it must be idempotent.
        ``held``: the draft messages a kill left of this reply, taken over by its drafts."""
        rt = self.rt
        agent = rt.agent(record.key)
        runner = agent.runner
        transcript = await self.transcripts.get(record)
        first, last = items[0], items[-1]
        message = last.message
        ids = [i.inbox_id for i in items]
        resume = False
        if first.recovered is not None:
            done, reply = recovered_progress(transcript, first.inbox_id)
            if reply is not None:
                return reply  # answered before the crash, not yet delivered
            resume = done
        attempts = 1
        drafts = self._drafts(first, message, transcript, [i.inbox_id for i in items], held)

        def on_retry(attempt: int, exc: ProviderError, delay: float) -> None:
            nonlocal attempts
            attempts = attempt + 1
            log.warning("provider %s; retry %d in %.1fs", type(exc).__name__, attempt, delay)
            if drafts is not None:  # the failed attempt's text is void
                drafts.reset("retry")

        viewer = rt.viewer(first.route, message)
        now = rt.clock().astimezone(rt.zone)
        turn = TurnRequest(
            session_key=record.key,
            user_text=text,
            context_text=render_turn_context(
                now=now,
                channel=message.channel,
                chat_type=first.route.chat_type,
                sender_name=message.sender_name,
                sender_id=message.sender_id,
                compact=agent.profile.compact_turn_context,
            ),
            group_context_text=render_group_context(group_lines(items), now=now),
            meta={"inbox_ids": ids, "message_ids": [i.message.message_id for i in items]},
            resume=resume,
            model=record.settings.get("model"),
            chat_type=first.route.chat_type,
            memory_scopes=await self._memory_scopes(agent.memory, viewer),
            memory_viewer=viewer,
            media=self.media.store.loader(viewer),
        )
        intake = Intake()
        entries_before = transcript.entry_count
        started = time.perf_counter()
        started_at = rt.clock()  # the task record's start (wall clock)
        try:
            async with self.working(message):
                if not resume and any(has_files(i.message) for i in items):
                    intake = await self.media.take(
                        [i.message for i in items], viewer.audience, rt.window_for(record)
                    )
                    turn.attachments = intake.blocks
                if drafts is None:
                    result = await runner.run_turn(transcript, turn, on_retry=on_retry)
                else:
                    result = await self._run_drafted(runner, transcript, turn, on_retry, drafts)
                # Before the typing indicator stops: that may wait on the platform.
                if model_done is not None:
                    model_done()
        except (ProviderError, ContextError) as exc:
            if model_done is not None:
                model_done()
            rt.metrics.turn(message.channel, time.perf_counter() - started, ok=False)
            rt.metrics.error(error_kind(exc))
            if isinstance(exc, ProviderError):
                self.note_provider(exc)
            await rt.bookkeep(
                "record the session's entries",
                rt.registry.record_entries(
                    record.session_id, transcript.entry_count, last_entry_id(transcript)
                ),
            )
            if isinstance(exc, ContextError):
                return describe_context_error(exc)
            return describe_provider_error(exc, attempts)
        rt.metrics.turn(message.channel, time.perf_counter() - started, ok=True)
        rt.metrics.tokens(result.usage)
        self.note_provider(None)
        if result.compactions:
            for trigger, strategy in await asyncio.to_thread(
                new_compactions, transcript, entries_before
            ):
                rt.metrics.compaction(trigger, strategy)
        await rt.note_figures(
            record, transcript, result.context_tokens, compacted=bool(result.compactions)
        )
        memory = agent.memory
        if memory is not None:
            memory.notify_transcript(appended_messages=transcript.entry_count - entries_before)
            if result.compactions:
                memory.notify_compaction()
            if result.tool_calls:
                await record_turn_task(
                    memory,
                    user_text=text,
                    entries=result.entries,
                    started_at=started_at,
                    finished_at=rt.clock(),
                    scope=viewer.audience.scope,
                )
        # The reply is in the transcript (the source of truth): a registry that cannot
        # take the counters must not cost the person their answer.
        await rt.bookkeep(
            "record the turn in the registry",
            rt.registry.record_turn(
                record.session_id,
                usage=result.usage,
                compactions=result.compactions,
                context_tokens=result.context_tokens,
                entry_count=transcript.entry_count,
                last_entry_id=last_entry_id(transcript),
                model=agent.model if not record.settings.get("model") else None,
                now=rt.clock(),
            ),
        )
        return with_notices(result.reply or EMPTY_REPLY_TEXT, intake.notices)

    def _drafts(
        self,
        first_item: LaneItem,
        last: InboundMessage,
        transcript: SessionTranscript,
        ids: list[int],
        held: tuple[str, ...],
    ) -> DraftStream | None:
        """Drafts for a channel that shows them; None (no streaming cost) for the others."""
        first = first_item.message
        channel = self.rt.channels.get(last.channel)
        if channel is None or not channel.capabilities.live_drafts:
            return None
        if not isinstance(channel, LiveDrafts):
            return None
        capabilities = channel.capabilities
        record = None
        if capabilities.draft_messages:
            if self.delivery.waiting_in(last):
                # An earlier reply to this chat waits for another send: a draft would
                # show this one before it.
                return None
            route = dataclasses.replace(reply_to(last, ""), idempotency_key=reply_key(first))
            record = DraftRecord(self.rt, channel, ids, route)
        interval = capabilities.draft_interval_seconds
        if first_item.route.chat_type != "direct":
            interval = capabilities.draft_group_interval_seconds or interval
        base = ReplyDraft(
            channel=last.channel,
            account=last.account,
            chat_id=last.chat_id,
            # Delivery names the reply after the first message it answers: the same key
            # lets the channel put the reply in the draft's place.
            key=reply_key(first),
            text="",
            thread_id=last.thread_id,
            reply_to_message_id=last.message_id,
            held=held,
        )
        # The runner appends each model call's message (and tool results, compactions)
        # before the next call: a grown transcript means another call is writing.
        return DraftStream(
            channel, base, lambda: transcript.entry_count, interval=interval, record=record
        )

    async def _run_drafted(
        self,
        runner: Runner,
        transcript: SessionTranscript,
        turn: TurnRequest,
        on_retry: Callable[[int, ProviderError, float], None],
        drafts: DraftStream,
    ) -> TurnResult:
        silent = False
        try:
            result = await runner.run_turn(
                transcript, turn, on_text=drafts.on_text, on_retry=on_retry, on_status=drafts.status
            )
            silent = result.reply.strip() == SILENT_REPLY
        finally:
            # Before the reply is handed to delivery: no draft may land after it.
            await drafts.close(withdraw=silent)
        return result

    async def _memory_scopes(self, memory: MemoryIndex | None, viewer: Viewer) -> tuple[str, ...]:
        """What this turn's recall and memory_search may see in the agent's memory. An
        index that cannot list its scopes costs a linked person the other ids' memory for
        this turn, nothing more."""
        if memory is None:
            return ()
        try:
            return await memory.visible_scopes(viewer)
        except Exception as exc:  # the driver's errors too: the turn must go on
            log.warning("memory scopes unavailable, this turn sees its own only: %s", exc)
            return visible_scopes(viewer)

    def note_provider(self, error: ProviderError | None) -> None:
        """Remember whether the provider could be reached, for /health."""
        rt = self.rt
        now = rt.clock()
        if error is None:
            rt.provider_health = ProviderHealth(True, "last call succeeded", now)
        elif isinstance(error, _UNREACHABLE):
            rt.provider_health = ProviderHealth(False, f"last call failed: {error}", now)
        else:  # it answered, with a refusal about this request: reachable
            rt.provider_health = ProviderHealth(True, f"last call refused: {error}", now)

    @contextlib.asynccontextmanager
    async def working(self, message: InboundMessage) -> AsyncIterator[None]:
        """Keep the platform's typing indicator on while the agent works (a turn, or
        any other long step answering ``message``, such as ``/compact``)."""
        channel = self.rt.channels.get(message.channel)
        done = asyncio.Event()
        task = asyncio.create_task(_keep_typing(channel, message, done)) if channel else None
        try:
            yield
        finally:
            done.set()
            if task is not None:
                # Let an indicator in flight finish rather than cancel it: a request
                # cancelled mid-flight can leak its pooled connection in the platform's
                # HTTP client, and the indicator must not land after the reply.
                try:
                    await asyncio.wait_for(asyncio.shield(task), TYPING_STOP_SECONDS)
                except TimeoutError:
                    task.cancel()


async def _keep_typing(channel: Channel, message: InboundMessage, done: asyncio.Event) -> None:
    capabilities = channel.capabilities
    refresh = capabilities.typing_refresh_seconds
    if capabilities.typing_delay_seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), capabilities.typing_delay_seconds)
    while not done.is_set():
        try:
            await channel.typing(message.chat_id, message.thread_id, message.account)
        except Exception as exc:  # best effort: a typing failure never fails a turn
            log.debug("typing indicator on %s failed: %s", message.channel, exc)
        if refresh is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), refresh)


def error_kind(exc: Exception) -> str:
    """A bounded metrics label: ContextOverflowError -> context_overflow."""
    name = type(exc).__name__.removesuffix("Error") or "error"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def new_compactions(transcript: SessionTranscript, since: int) -> list[tuple[str, str]]:
    """(trigger, strategy) of the compactions written after entry line ``since``."""
    return [
        (
            str(entry.payload.get("trigger") or "unknown"),
            str((entry.payload.get("details") or {}).get("strategy") or DEFAULT_STRATEGY),
        )
        for entry in transcript.entries(since)
        if entry.type == ENTRY_COMPACTION
    ]


def recovered_progress(transcript: SessionTranscript, inbox_id: int) -> tuple[bool, str | None]:
    """Was this inbox item's user message written, and was a final reply written after it?"""
    found = False
    reply: str | None = None
    for entry in transcript.live_entries():
        if entry.type != "message":
            continue
        message = entry.message
        # Only a user message's meta is read: a short entry parses it from its line.
        if message.role == "user" and inbox_id in (entry.meta.get("inbox_ids") or ()):
            found, reply = True, None
        elif found and message.role == "assistant":
            final = not message.tool_uses
            reply = message.text.strip() if final and message.text.strip() else reply
        elif found and message.role == "user":
            break
    return found, reply


def group_lines(items: list[LaneItem]) -> list[GroupLine]:
    """What others said in the group before the turn's messages (each message carries
    the lines kept before it: ``gateway.runtime.group_context``), oldest first. A line
    whose time cannot be read (a hand-edited inbox row) keeps the message's."""
    lines: list[GroupLine] = []
    for item in items:
        for earlier in item.message.group_context:
            try:
                at = datetime.fromisoformat(earlier.timestamp)
            except (TypeError, ValueError):
                at = item.message.timestamp
            if at.tzinfo is None:
                at = at.replace(tzinfo=UTC)
            lines.append(GroupLine(earlier.sender_name, earlier.sender_id, earlier.text, at))
    return lines
