"""What the admin API answers, computed from the running gateway.

The handlers stay thin: they validate input and serialise; this module reads the
registry, the transcripts and the memory index. Anything that changes a session
(compact, reset) runs in that session's lane, so it never overlaps a turn.

Archived transcripts are opened read-only from the configured backend's transcript
store (an inspector must never repair or append to one) and a few are kept open
between requests: paging through a long archived
transcript would otherwise re-read it from the start for every page. ``close()``
releases them; the web app pairs it with its setup through a cleanup context.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from parley.core.context.compaction.compactor import CompactionOutcome
from parley.core.context.compaction.stats import CompactionStats, utilisation
from parley.core.context.report import ContextReport
from parley.core.errors import ContextError, CoreError, TranscriptError
from parley.core.memory.audience import Viewer, audience_label
from parley.core.prompt import SECTION_PROJECT_CONTEXT
from parley.core.transcript import ENTRY_COMPACTION
from parley.core.transcript_store import SessionTranscript
from parley.gateway.admin import schemas as s
from parley.gateway.errors import ApiError, LaneBusy
from parley.gateway.storage.sessions import SessionRecord, removed_at

if TYPE_CHECKING:
    from parley.core.memory.index import MemoryIndex
    from parley.gateway.admin.gateway_view import AdminGateway

log = logging.getLogger("parley.gateway.admin")

T = TypeVar("T")

READ_ONLY_TRANSCRIPTS_KEPT = 8
_SESSION_ID = re.compile(s.SESSION_ID_PATTERN)
ADMIN_RESET_REASON = "admin"


class AdminService:
    def __init__(self, gateway: AdminGateway) -> None:
        self.gateway = gateway
        # session id -> (the store's stamp when opened, the read-only transcript)
        self._read_only: OrderedDict[str, tuple[tuple[int, ...], SessionTranscript]] = OrderedDict()
        self._read_only_lock = asyncio.Lock()

    async def close(self) -> None:
        async with self._read_only_lock:
            for _, transcript in self._read_only.values():
                transcript.close()
            self._read_only.clear()

    # -- health ---------------------------------------------------------------------------

    async def health(self) -> s.Health:
        gateway = self.gateway
        try:
            await gateway.state.ping()
            state = s.HealthCheck(ok=True, detail=gateway.state.where)
        except Exception as exc:  # any failure here is the answer, not a crash
            state = s.HealthCheck(ok=False, detail=f"{gateway.state.where} unavailable: {exc}")
        channels = {}
        for name, channel in gateway.channels.items():
            probe = getattr(channel, "connected", None)
            try:
                up = bool(probe()) if callable(probe) else True
            except Exception as exc:
                up, detail = False, f"status unknown: {exc}"
            else:
                detail = "connected" if up else "not connected"
            channels[name] = s.HealthCheck(ok=up, detail=detail)
        health = gateway.provider_health
        provider = s.HealthCheck(ok=health.ok, detail=_provider_detail(gateway, health.detail))
        ready = state.ok and provider.ok and all(c.ok for c in channels.values())
        ready = ready and gateway.ready
        return s.Health(
            status="ok" if ready else "degraded",
            live=True,
            ready=ready,
            checks=s.HealthChecks(state_db=state, channels=channels, provider=provider),
        )

    # -- sessions -------------------------------------------------------------------------

    async def sessions(self, query: s.SessionListQuery) -> s.SessionPage:
        page = await self.gateway.registry.list(
            status=query.status,
            channel=query.channel,
            agent_id=query.agent,
            query=query.q,
            limit=query.limit,
            cursor=decode_cursor(query.cursor) if query.cursor else None,
        )
        return s.SessionPage(
            items=[_summary(r) for r in page.sessions],
            next_cursor=encode_cursor(page.next_cursor) if page.next_cursor else None,
        )

    async def session(self, session_id: str) -> s.SessionDetail:
        record = await self._record(session_id)
        try:
            stats = await self.gateway.figures.stats(record.session_id, await self._open(record))
        except ApiError:  # no readable transcript: the registry's figures still answer
            stats = CompactionStats()
        window = self.gateway.window_for(record)
        usage = record.usage
        read_base = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        return s.SessionDetail(
            **_summary(record).model_dump(),
            peer=record.peer,
            parent_key=record.parent_key,
            archived_at=_iso(record.archived_at),
            settings=record.settings,
            last_route=record.last_route,
            delivery_error=record.delivery_error,
            last_entry_id=record.last_entry_id,
            tokens=s.TokenCounts(
                input=usage.input_tokens,
                output=usage.output_tokens,
                cache_read=usage.cache_read_tokens,
                cache_write=usage.cache_write_tokens,
            ),
            cache_read_share=round(usage.cache_read_tokens / read_base, 4) if read_base else None,
            window_tokens=window,
            context_utilisation=round(utilisation(record.context_tokens, window), 4),
            compactions=s.CompactionFigures(
                count=stats.count,
                by_strategy=dict(stats.by_strategy),
                by_trigger=dict(stats.by_trigger),
                with_fallbacks=stats.with_fallbacks,
                last_tokens_before=stats.last_tokens_before,
                last_tokens_after=stats.last_tokens_after,
                tokens_saved=stats.tokens_saved,
                last_at=stats.last_at,
            ),
        )

    async def transcript(self, session_id: str, query: s.TranscriptQuery) -> s.TranscriptPage:
        record = await self._record(session_id)
        transcript = await self._open(record)
        offset = int(query.cursor) if query.cursor else 0
        total, numbered = await _reading(_page, transcript, offset, query.limit)
        end = offset + query.limit
        return s.TranscriptPage(
            session_id=record.session_id,
            total=total,
            items=[s.TranscriptEntry(index=i, **entry) for i, entry in numbered],
            next_cursor=str(end) if end < total else None,
        )

    async def context(self, session_id: str) -> s.ContextBreakdown:
        record = await self._record(session_id)
        transcript = await self._open(record)
        report, view = await self.gateway.context_report(record, transcript, record.chat_type)
        pruned = s.PrunedCounts(
            trimmed=view.trimmed if view else 0,
            cleared=view.cleared if view else 0,
            dropped_turns=view.dropped_turns if view else 0,
        )
        return s.ContextBreakdown(
            session_id=record.session_id,
            status=record.status,
            total_tokens=report.total_tokens,
            window_tokens=report.window,
            share=round(report.share, 4),
            figures=s.ContextFigures.model_validate(report.figures()),
            sections=context_sections(report),
            pruned=pruned,
            report=report.to_dict(),
            recall=s.RecallInfo(**report.recall.to_dict()) if report.recall else None,
        )

    async def compactions(self, session_id: str) -> s.CompactionList:
        record = await self._record(session_id)
        transcript = await self._open(record)
        entries = await _reading(_compaction_entries, transcript)
        items = []
        for entry in entries:
            payload = entry.payload
            details = payload.get("details") if isinstance(payload.get("details"), dict) else {}
            items.append(
                s.CompactionItem(
                    entry_id=entry.id,
                    ts=entry.ts,
                    trigger=str(payload.get("trigger") or "unknown"),
                    tokens_before=_int(payload.get("tokens_before")),
                    tokens_after=_int(payload.get("tokens_after")),
                    summary=str(payload.get("summary") or ""),
                    ledger=details.get("ledger"),
                    first_kept_entry_id=payload.get("first_kept_entry_id"),
                )
            )
        return s.CompactionList(session_id=record.session_id, items=items)

    async def compact(self, session_id: str, focus: str) -> s.CompactResult:
        record = await self._active(session_id)

        async def run() -> CompactionOutcome | str:
            current = await self._still_active(record)
            try:
                return await self.gateway.compact_session(current, current.chat_type, focus)
            except ContextError as exc:
                return str(exc)

        outcome = await self._in_lane(record, run)
        if isinstance(outcome, str):
            return s.CompactResult(
                session_id=record.session_id,
                outcome="failed",
                message=f"Compaction failed: {outcome}. Nothing was lost: the history is kept.",
                tokens_before=None,
                tokens_after=None,
            )
        compacted = outcome.compacted
        return s.CompactResult(
            session_id=record.session_id,
            outcome=outcome.status,
            message=outcome.describe(),
            tokens_before=outcome.tokens_before if compacted else None,
            tokens_after=outcome.tokens_after if compacted else None,
        )

    async def reset(self, session_id: str) -> s.ResetResult:
        record = await self._active(session_id)

        async def run() -> None:
            current = await self._still_active(record)
            await self.gateway.archive_session(current, ADMIN_RESET_REASON)

        await self._in_lane(record, run)
        return s.ResetResult(
            session_id=record.session_id, status="archived", archived_reason=ADMIN_RESET_REASON
        )

    # -- memory ---------------------------------------------------------------------------

    def _memory_of(self, agent: str | None) -> MemoryIndex | None:
        try:
            return self.gateway.memory_of(agent)
        except KeyError:
            raise ApiError(404, "not_found", f"no agent {agent!r}") from None

    async def memory_status(self, query: s.MemoryStatusQuery) -> s.MemoryStatusBody:
        memory = self._memory_of(query.agent)
        if memory is None:
            return s.MemoryStatusBody(enabled=False)
        status = await self._memory_call(memory.status())
        return s.MemoryStatusBody(enabled=True, **status.to_dict())

    async def memory_stats(self, query: s.MemoryStatsQuery) -> s.MemoryStatsBody:
        """Task records: counts by outcome, the most frequent errors, tool use."""
        memory = self._memory_of(query.agent)
        scopes = [query.scope] if query.scope else None
        if memory is None:
            return s.MemoryStatsBody(enabled=False, scopes=scopes)
        stats = await self._memory_call(memory.task_stats(scopes))
        return s.MemoryStatsBody(
            enabled=True,
            scopes=scopes,
            total=stats.total,
            by_outcome=stats.by_outcome,
            top_errors=[s.TaskErrorCount(error=e, count=n) for e, n in stats.top_errors],
            tools=stats.tools,
        )

    async def memory_search(self, query: s.MemorySearchQuery) -> s.MemorySearchBody:
        memory = self._memory_of(query.agent)
        if memory is None:
            raise ApiError(409, "conflict", "long-term memory is turned off ([memory] enabled)")
        if query.scope:
            scopes = [query.scope]
        else:  # every audience (the operator's view), once caught up with the transcripts
            await self._memory_call(memory.catch_up())
            scopes = list(await self._memory_call(memory.visible_scopes(Viewer.for_operator())))
        result = await self._memory_call(
            memory.search(query.q, scopes=scopes, max_results=query.limit)
        )
        notes = [f"keyword-only: {result.fallback}"] if result.fallback else []
        return s.MemorySearchBody(
            query=query.q,
            mode=result.mode,
            notes=notes,
            scopes=list(scopes),
            items=[
                s.MemoryHit(
                    path=h.path,
                    start_line=h.start_line,
                    end_line=h.end_line,
                    score=round(h.score, 4),
                    snippet=h.snippet,
                    source=h.source,
                    scope=h.scope,
                    audience=audience_label(h.scope),
                    ts=h.ts,
                )
                for h in result.hits
            ],
        )

    # -- helpers --------------------------------------------------------------------------

    async def _record(self, session_id: str) -> SessionRecord:
        if not _SESSION_ID.match(session_id):
            raise ApiError(400, "bad_request", "a session id is 32 lowercase hex characters")
        record = await self.gateway.registry.get(session_id)
        if record is None:
            raise ApiError(404, "not_found", f"no session {session_id}")
        return record

    async def _active(self, session_id: str) -> SessionRecord:
        record = await self._record(session_id)
        if record.status != "active":
            raise ApiError(409, "conflict", f"session {session_id} is archived")
        return record

    async def _still_active(self, record: SessionRecord) -> SessionRecord:
        """Re-read in the lane: a turn queued before us may have reset the session."""
        current = await self.gateway.registry.get(record.session_id)
        if current is None or current.status != "active":
            raise ApiError(409, "conflict", f"session {record.session_id} was archived meanwhile")
        return current

    async def _in_lane(self, record: SessionRecord, run: Any) -> Any:
        try:
            return await self.gateway.run_in_lane(record.key, run)
        except LaneBusy as exc:
            raise ApiError(503, "unavailable", f"try again shortly: {exc}") from exc

    async def _memory_call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except CoreError as exc:
            raise ApiError(503, "unavailable", f"memory is unavailable: {exc}") from exc

    async def _open(self, record: SessionRecord) -> SessionTranscript:
        removed = removed_at(record)
        if removed is not None:
            raise ApiError(
                410, "gone", f"the transcript was removed by retention on {removed[:10]}"
            )
        try:
            if record.status == "active":
                # The lane's own, when it is open and current (another replica may have
                # written since); else a read-only copy like an archived one's.
                cached = await self.gateway.cached_transcript(record)
                if cached is not None:
                    return cached
            return await self._open_read_only(record)
        except TranscriptError as exc:
            raise ApiError(404, "not_found", f"the transcript cannot be read: {exc}") from exc

    async def _open_read_only(self, record: SessionRecord) -> SessionTranscript:
        store = self.gateway.state.transcripts
        async with self._read_only_lock:
            info = await asyncio.to_thread(store.info, record.session_id)
            if info is None:
                raise TranscriptError(f"transcript not found: {record.session_id}")
            # A new stamp: the transcript changed since it was cached; open it afresh
            # rather than page through what it held then.
            stamp = info.stamp
            cached = self._read_only.get(record.session_id)
            if cached is not None and cached[0] == stamp:
                self._read_only.move_to_end(record.session_id)
                return cached[1]
            if cached is not None:
                cached[1].close()
            transcript = await asyncio.to_thread(store.open, record.session_id, read_only=True)
            self._read_only[record.session_id] = (stamp, transcript)
            while len(self._read_only) > READ_ONLY_TRANSCRIPTS_KEPT:
                _, (_, evicted) = self._read_only.popitem(last=False)
                evicted.close()
            return transcript


async def _reading(read: Callable[..., T], transcript: SessionTranscript, *args: Any) -> T:
    """Read on a thread; a transcript closed under us (a reset of an active session
    between our lookup and the read) is a retryable conflict, not a 500."""
    try:
        return await asyncio.to_thread(read, transcript, *args)
    except (TranscriptError, OSError) as exc:
        if not transcript.closed:
            raise
        raise ApiError(
            409, "conflict", "the session was reset while it was read; try again"
        ) from exc


def context_sections(report: ContextReport) -> list[s.ContextSection]:
    """The bar's segments: each prompt section (workspace files split out of the
    project context by their share of its characters), tools, summary, history. They
    add up to ``report.total_tokens`` exactly."""
    sections: list[s.ContextSection] = []
    for section in report.sections:
        if section.name != SECTION_PROJECT_CONTEXT:
            sections.append(
                s.ContextSection(kind="system", name=section.name, tokens=section.tokens)
            )
            continue
        injected = [f for f in report.files if f.injected_chars > 0]
        chars = max(section.chars, sum(f.injected_chars for f in injected), 1)
        given = 0
        for file in injected:
            tokens = section.tokens * file.injected_chars // chars
            given += tokens
            sections.append(s.ContextSection(kind="file", name=file.name, tokens=tokens))
        if section.tokens - given:
            sections.append(
                s.ContextSection(kind="system", name=section.name, tokens=section.tokens - given)
            )
    # Sections tokenised one by one differ slightly from the whole prompt tokenised
    # at once (joins); the difference goes to the largest system segment.
    gap = report.system_tokens - sum(x.tokens for x in sections)
    if gap and sections:
        largest = max(range(len(sections)), key=lambda i: sections[i].tokens)
        fixed = sections[largest]
        sections[largest] = fixed.model_copy(update={"tokens": max(0, fixed.tokens + gap)})
    elif gap > 0:
        sections.append(s.ContextSection(kind="system", name="system prompt", tokens=gap))
    if report.tool_tokens:
        name = f"tools ({report.tool_count})"
        sections.append(s.ContextSection(kind="tools", name=name, tokens=report.tool_tokens))
    summary = report.summary_tokens or 0
    if summary:
        sections.append(s.ContextSection(kind="summary", name="summary", tokens=summary))
    if report.history_tokens - summary > 0:
        sections.append(
            s.ContextSection(
                kind="history",
                name=f"history ({report.history_messages} messages)",
                tokens=report.history_tokens - summary,
            )
        )
    return sections


def _summary(record: SessionRecord) -> s.SessionSummary:
    return s.SessionSummary(
        id=record.session_id,
        key=record.key,
        agent_id=record.agent_id,
        channel=record.channel,
        account=record.account,
        chat_type=record.chat_type,
        display_name=record.display_name,
        status=record.status,
        created_at=record.created_at.isoformat(),
        updated_at=record.updated_at.isoformat(),
        archived_reason=record.archived_reason,
        model=record.model,
        turn_count=record.turn_count,
        entry_count=record.entry_count,
        context_tokens=record.context_tokens,
        compaction_count=record.compaction_count,
    )


def encode_cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The registry's cursor, checked: a forged one is a 400, never a SQL surprise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8")
        stamp, _, session_id = raw.partition("|")
        datetime.fromisoformat(stamp)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ApiError(400, "bad_request", "the cursor is not one this API gave out") from None
    if not _SESSION_ID.match(session_id):
        raise ApiError(400, "bad_request", "the cursor is not one this API gave out")
    return raw


def _page(
    transcript: SessionTranscript, offset: int, limit: int
) -> tuple[int, list[tuple[int, dict]]]:
    total = transcript.entry_count
    return total, [(i, e.to_dict()) for i, e in transcript.numbered_entries(offset, limit)]


def _compaction_entries(transcript: SessionTranscript) -> list[Any]:
    return [e for e in transcript.entries() if e.type == ENTRY_COMPACTION]


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _provider_detail(gateway: AdminGateway, detail: str) -> str:
    try:
        provider = gateway.provider
    except RuntimeError:
        return f"not started; {detail}"
    return f"{provider.name} {provider.model}: {detail}"
