"""Sessions begin and end here: the daily and idle resets, ``/new``, a session's
creation with its transcript, archiving, and compaction on demand.

Every call runs in the session's lane (or under its lock with several replicas):
nothing else writes the session's registry row or transcript meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from parley.core.context.compaction.compactor import CompactionOutcome
from parley.core.errors import ContextError
from parley.core.memory.audience import Audience
from parley.core.transcript_store import SessionTranscript
from parley.gateway.audiences import scope_for_key
from parley.gateway.routing import key_agent_id
from parley.gateway.runtime.context import Runtime, last_entry_id
from parley.gateway.runtime.lane_items import LaneItem
from parley.gateway.runtime.resets import resolve_reset_policy, should_reset
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.runtime.user_errors import describe_context_error
from parley.gateway.storage.sessions import SessionOrigin, SessionRecord

log = logging.getLogger("parley.gateway")

# Settings that follow a person from an archived session into the new one.
CARRIED_SETTINGS = ("model", "verbose", "thinking")


class Sessions:
    def __init__(self, rt: Runtime, transcripts: TranscriptCache) -> None:
        self.rt = rt
        self.transcripts = transcripts
        transcripts.create_missing = self.create_transcript

    async def session_for(self, key: str, item: LaneItem) -> SessionRecord:
        """The session this message goes to: the active one, unless a reset policy
        says it is stale (then a new one), or a new one when there is none."""
        rt = self.rt
        record = await rt.registry.get_active(key)
        if record is not None and item.recovered is None:
            policy = resolve_reset_policy(
                rt.config.session, item.message.channel, item.route.chat_type
            )
            stale = should_reset(
                record.updated_at,
                rt.clock(),
                policy,
                rt.zone,
                automated=item.message.automated,
            )
            if stale is not None:
                return await self.reset(key, item, reason=stale.reason, previous=record)
        if record is not None:
            return record
        return await self.create(item)

    async def reset(
        self,
        key: str,
        item: LaneItem,
        *,
        reason: str,
        previous: SessionRecord | None = None,
    ) -> SessionRecord:
        """Archive the active session (if any) and start the next, carrying the
        person's settings over."""
        rt = self.rt
        previous = previous or await rt.registry.get_active(key)
        carried: dict[str, Any] = {}
        if previous is not None:
            carried = {k: v for k, v in previous.settings.items() if k in CARRIED_SETTINGS}
            await rt.registry.archive(previous.session_id, reason, rt.clock())
            self.transcripts.forget(previous.session_id)
            if rt.engine_or_none is not None:
                rt.agent(key).engine.forget(key)
            log.info("session %s archived (%s): %s", key, reason, previous.session_id)
        return await self.create(item, carried)

    async def create(self, item: LaneItem, settings: dict[str, Any] | None = None) -> SessionRecord:
        rt = self.rt
        route, message = item.route, item.message
        origin = SessionOrigin(
            key=route.key,
            agent_id=key_agent_id(route.key),
            channel=message.channel,
            account=message.account,
            chat_type=route.chat_type,
            peer=route.peer,
            parent_key=route.parent_key,
            display_name=message.sender_name if route.chat_type == "direct" else message.chat_id,
        )
        settings = settings or {}
        record = await rt.registry.create(
            origin, settings=settings, model=settings.get("model"), now=rt.clock()
        )
        transcript = await self.create_transcript(record, rt.audience(route, message))
        self.transcripts.keep(record.session_id, transcript)
        return record

    async def create_transcript(
        self, record: SessionRecord, audience: Audience | None = None
    ) -> SessionTranscript:
        rt = self.rt
        # The audience is decided here, by code, once: the key's when the message that
        # opened the session is not at hand (a transcript lost to a kill).
        scope = (
            audience.scope
            if audience is not None
            else scope_for_key(record.key, rt.person_links.names)
        )
        return await asyncio.to_thread(
            rt.state.transcripts.create,
            record.session_id,
            record.key,
            {
                "agent": record.agent_id,
                "agent_name": rt.agent(record.key).name,
                "memory_scope": scope,
            },
        )

    async def archive(self, record: SessionRecord, reason: str) -> None:
        """End a session without starting the next one (the next message does); the
        caller runs this in the session's lane. The transcript records why."""
        rt = self.rt
        transcript = await self.transcripts.get(record)
        await asyncio.to_thread(transcript.append_custom, "reset", {"reason": reason})
        await rt.registry.record_entries(
            record.session_id, transcript.entry_count, last_entry_id(transcript)
        )
        await rt.registry.archive(record.session_id, reason, rt.clock())
        self.transcripts.forget(record.session_id)
        if rt.engine_or_none is not None:
            rt.agent(record.key).engine.forget(record.key)
        log.info("session %s archived (%s): %s", record.key, reason, record.session_id)

    async def compact_command(self, key: str, item: LaneItem) -> tuple[SessionRecord | None, str]:
        """``/compact [focus]``, run in the session's lane like a turn."""
        record = await self.rt.registry.get_active(key)
        if record is None:
            return None, "Skipped: there is no conversation in this chat yet."
        try:
            outcome = await self.compact(record, item.route.chat_type, item.compact_focus or "")
        except ContextError as exc:
            return record, describe_context_error(exc)
        return record, outcome.describe()

    async def compact(self, record: SessionRecord, chat_type: str, focus: str) -> CompactionOutcome:
        """Compact now; the caller runs this in the session's lane. Raises ContextError."""
        rt = self.rt
        transcript = await self.transcripts.get(record)
        agent = rt.agent(record.key)
        request = await agent.runner.view_request(
            record.key, record.settings.get("model"), chat_type
        )
        outcome, events = await agent.engine.compact_now(transcript, request, focus=focus)
        await rt.registry.record_compaction(
            record.session_id,
            compactions=1 if outcome.compacted else 0,
            usage=events.usage,
            context_tokens=outcome.tokens_after if outcome.compacted else None,
            entry_count=transcript.entry_count,
            last_entry_id=last_entry_id(transcript),
        )
        if outcome.compacted:
            rt.metrics.compaction(outcome.trigger, outcome.strategy)
            await rt.note_figures(record, transcript, outcome.tokens_after, compacted=True)
            if agent.memory is not None:
                agent.memory.notify_compaction()
        return outcome
