"""The gateway: lifecycle and the path of one message.

channel → ``handle_inbound``: access and group activation (``gateway.access``) →
record in the durable inbox (dedupe) → answer /status
and /help at once → resolve the session key → hand the message to the session's
lane. The lane runs ``_run_lane`` one batch at a time per session: reset check (or
/new), open the transcript, run the turn in ``core``, store the reply in the inbox,
deliver it, and record the delivery result in the transcript and the registry.

On start, whatever the inbox holds unanswered (a crash, a stop mid-turn) is queued
again before any new message, so nothing is lost and nothing is answered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from zoneinfo import ZoneInfo

from channels.base import (
    Channel,
    ChannelError,
    DeliveryError,
    DeliveryResult,
    InboundMessage,
    InboundNotStored,
    OutboundMessage,
    RecipientBlocked,
)
from core.compaction import CompactionOutcome
from core.compaction_stats import DEFAULT_STRATEGY, CompactionStats
from core.context_engine import ContextEngine, ContextView
from core.context_report import ContextReport, build_context_report, render_context
from core.errors import (
    AuthenticationError,
    ContextError,
    CoreError,
    OverloadedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    ServerError,
    TranscriptError,
)
from core.flush import FlushTarget
from core.memory.audience import Audience, Viewer, visible_scopes
from core.memory.index import MemoryIndex
from core.memory.notes import NoteError, NoteStore
from core.memory.recall import Recaller, last_recall
from core.memory.tasks import format_task_stats
from core.prompt import SILENT_REPLY, SystemPromptBuilder, render_turn_context
from core.providers.base import Provider
from core.runner import Runner, TurnRequest
from core.tools.builtin import default_registry
from core.tools.memory import memory_tools
from core.transcript import ENTRY_COMPACTION
from core.transcript_store import SessionTranscript
from gateway.access import AccessGate
from gateway.admin.metrics import GatewayMetrics
from gateway.audience_migration import log_legacy_memory
from gateway.audiences import (
    PersonLinks,
    audience_for,
    header_audience,
    scope_for_key,
    viewer_for,
)
from gateway.commands import (
    FORGET_USAGE,
    HELP_TEXT,
    MEMORY_USAGE,
    REMEMBER_USAGE,
    format_status,
    parse_compact_command,
    parse_info_command,
)
from gateway.config import LoadedConfig
from gateway.errors import ChannelFailure, LaneBusy
from gateway.http_server import HttpServer
from gateway.inbox import InboxItem, SentMessages, well_formed
from gateway.lane_items import LaneItem, LaneTask
from gateway.lanes import LaneManager
from gateway.memory import (
    build_memory_index,
    format_memory_status,
    format_search,
    notes_dir,
    private_roots,
    record_turn_task,
)
from gateway.providers import build_provider
from gateway.registry import SessionOrigin, SessionRecord, utcnow
from gateway.replicas import ReplicaCoordinator
from gateway.resets import (
    match_reset_trigger,
    resolve_reset_policy,
    resolve_timezone,
    should_reset,
)
from gateway.routing import SessionRoute, resolve_session_key
from gateway.send_recovery import parts_already_sent, send_mark
from gateway.session_figures import SessionFiguresCache
from gateway.session_figures import figures as session_figures
from gateway.storage_errors import storage_failure
from gateway.stores import StateStores
from gateway.user_errors import (
    BUSY_TEXT,
    EMPTY_REPLY_TEXT,
    INTERNAL_ERROR_TEXT,
    NOT_RECORDED_TEXT,
    STORAGE_ERROR_TEXT,
    describe_context_error,
    describe_provider_error,
)
from gateway.workspace import ensure_workspace

if TYPE_CHECKING:
    from gateway.pg.inbox import PgInbox

log = logging.getLogger("parley.gateway")

DELIVERY_ATTEMPTS = 3
DELIVERY_BACKOFF_SECONDS = (0.5, 2.0)
STOP_DRAIN_SECONDS = 30.0
# How long the end of a turn waits for a typing indicator still on its way.
TYPING_STOP_SECONDS = 5.0
# Settings that follow a person from an archived session into the new one.
CARRIED_SETTINGS = ("model", "verbose", "thinking")
# How many refused messages are remembered, so a platform's redelivery is told once.
NOT_RECORDED_MEMORY = 1000
# Replies that could not be sent (a platform outage) are tried again this often, and
# given up on (marked failed) this long after their message arrived.
REDELIVERY_INTERVAL_SECONDS = 30.0
REDELIVERY_MAX_BACKOFF_SECONDS = 1800.0  # per reply, doubling from the interval
REDELIVERY_GIVE_UP = timedelta(hours=24)
# Conversations with a message stored this recently are offered to ``catch_up``.
CATCH_UP_ACTIVE_DAYS = 7


@dataclass(frozen=True, slots=True)
class ProviderHealth:
    """What the last provider call said; ``ok`` is False only when it was unreachable."""

    ok: bool = True
    detail: str = "no call yet"
    at: datetime | None = None


class Gateway:
    """Owns state.db, the provider, the lanes and the channels; explicit start/stop."""

    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        channels: Sequence[Channel],
        provider: Provider | None = None,
        banner: str | None = None,
        clock: Callable[[], datetime] = utcnow,
        serve_http: bool | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        """``serve_http`` overrides ``[http] enabled`` (``parley chat`` passes False);
        ``announce`` is told where the pages are once the HTTP server listens."""
        self.loaded = loaded
        self.config = loaded.config
        # The identity links as memory reads them: which person ids are one person.
        self.person_links = PersonLinks(loaded.config.session)
        self.channels = {c.name: c for c in channels}
        self.banner = banner
        self.clock = clock
        self.zone = ZoneInfo("UTC")  # the configured zone, resolved in start() (reads files)
        self._provider = provider
        self._owns_provider = provider is None
        self.state = StateStores(loaded, now=clock)
        self.registry = self.state.registry
        self.inbox = self.state.inbox
        self.pairing = self.state.pairing
        self.access = AccessGate(self.pairing)
        self.metrics = GatewayMetrics()
        self.figures = SessionFiguresCache()
        self.metrics.declare_channels(self.channels)
        routes = [r for c in channels for r in c.webhook_routes()]
        self.http: HttpServer | None = None
        self.announce = announce
        wanted = self.config.http.enabled if serve_http is None else serve_http
        if wanted or routes:  # a channel's endpoint (a webhook) needs the server regardless
            self.http = HttpServer(
                self.config.http,
                routes,
                token_file=loaded.admin_token_file,
                gateway=self,
                metrics=self.metrics,
            )
        self.lanes: LaneManager[LaneItem | LaneTask] = LaneManager(
            self.config.lanes, self._run_lane
        )
        self.provider_health = ProviderHealth()
        self._register_gauges()  # read at scrape time: registered once, live across restarts
        self._transcripts: OrderedDict[str, SessionTranscript] = OrderedDict()
        self._opening: dict[str, asyncio.Future[SessionTranscript]] = {}
        self._not_recorded: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._redelivering: set[int] = set()  # inbox ids queued for another send
        # Per undelivered reply: (sends tried again, monotonic time of the next one).
        self._resend_schedule: dict[int, tuple[int, float]] = {}
        self._redelivery_task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._started = False
        self._stopping = False
        self.runner: Runner | None = None
        self.engine: ContextEngine | None = None
        self.prompt: SystemPromptBuilder | None = None
        self.memory: MemoryIndex | None = None
        self.replicas: ReplicaCoordinator | None = None
        if self.state.locks is not None:  # the inbox is then a PgInbox
            self.replicas = ReplicaCoordinator(
                self, self.state.locks, cast("PgInbox", self.state.inbox)
            )

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def provider(self) -> Provider:
        if self._provider is None:
            raise RuntimeError("the gateway is not started")
        return self._provider

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self.zone = await asyncio.to_thread(resolve_timezone, self.config.session.timezone)
        workspace = self.loaded.workspace
        await asyncio.to_thread(ensure_workspace, workspace)
        # Memory from before audiences, and settings they retired: a warning each.
        await asyncio.to_thread(log_legacy_memory, self.loaded)
        await asyncio.to_thread(self.loaded.sessions_dir.mkdir, parents=True, exist_ok=True)
        await self.state.open()
        if self._provider is None:
            self._provider, banner = build_provider(self.config.providers)
            self.banner = self.banner or banner
        warm_up = getattr(self._provider, "start", None)
        if warm_up is not None:  # the local model loads here, not on the first message
            await warm_up()
        agent = self.config.agent
        context = self.config.context
        tools = default_registry(
            agent.tool_result_max_chars, private_roots=private_roots(self.loaded)
        )
        offer_tools = getattr(self._provider, "supports_tools", True)
        if self.config.memory.enabled:
            # On PostgreSQL the index shares the state's pool (None: memory.db).
            self.memory = build_memory_index(self.loaded, db=self.state.pg)
            self.memory.on_search = self.metrics.search
            await self.memory.start()  # the first sync runs in the background
            for tool in memory_tools(self.memory):
                tools.register(tool)
        self.prompt = SystemPromptBuilder(
            workspace,
            agent_name=agent.name,
            tools=tools.specs() if offer_tools else (),
            file_max_chars=context.file_max_chars,
            total_max_chars=context.total_max_chars,
            memory_enabled=self.memory is not None and offer_tools,
        )
        # The engine's threshold needs the output the provider will really allow.
        max_output = min(
            agent.max_output_tokens,
            getattr(self._provider, "max_output_tokens", None) or agent.max_output_tokens,
        )
        self.engine = ContextEngine(
            config=context,
            provider=self._provider,
            retry=self.config.providers.retry,
            max_output=max_output,
            flush_target=FlushTarget(
                self.memory.notes if self.memory is not None else NoteStore(notes_dir(self.loaded)),
                lambda header: header_audience(header.to_dict(), self.person_links.names),
            ),
            checkpoints_dir=self.loaded.checkpoints_dir,
            zone=lambda: self.zone,
            now=self.clock,
        )
        # Load the tokenizer now (~0.3 s), not in the first person's turn.
        await asyncio.to_thread(self.engine.counter.text, "warm up")
        self.runner = Runner(
            provider=self._provider,
            tools=tools,
            prompt=self.prompt,
            agent=agent,
            retry=self.config.providers.retry,
            workspace=workspace,
            offer_tools=offer_tools,
            now=self.clock,
            engine=self.engine,
            recaller=(
                Recaller.for_index(self.memory, self.config.memory, self.engine.counter)
                if self.memory is not None
                else None
            ),
        )
        await self.lanes.start()
        if self.http is not None:
            await self.http.start()  # before the channels: a webhook must be reachable
            if self.announce is not None:
                self.announce(self._page_links(self.http))
        for channel in self.channels.values():
            await self._offer_catch_up(channel)
            try:
                await channel.start(self.handle_inbound)
            except ChannelError as exc:
                raise ChannelFailure(f"the {channel.name} channel did not start: {exc}") from exc
        await self._recover()
        self._redelivery_task = asyncio.create_task(self._redeliver_loop(), name="redelivery")
        self._ready.set()
        log.info(
            "gateway started: provider=%s model=%s channels=%s home=%s",
            self._provider.name,
            self._provider.model,
            ",".join(self.channels) or "-",
            self.loaded.home,
        )

    async def _offer_catch_up(self, channel: Channel) -> None:
        """Tell an adapter that can read history (``catch_up``) where each recently
        active conversation stopped, so what was sent while the bot was down is not
        lost on a platform that does not redeliver."""
        catch_up = getattr(channel, "catch_up", None)
        if catch_up is None:
            return
        since = self.clock() - timedelta(days=CATCH_UP_ACTIVE_DAYS)
        marks = await self.inbox.newest_per_conversation(channel.name, since)
        if marks:
            catch_up(marks)

    async def stop(self) -> None:
        if not self._started or self._stopping:
            return
        self._stopping = True
        if self.replicas is not None:
            await self.replicas.stop()
        task, self._redelivery_task = self._redelivery_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for channel in self.channels.values():
            try:
                await channel.stop()
            except Exception:
                log.exception("stopping channel %s failed", channel.name)
        if self.http is not None:
            await self.http.stop()
        report = await self.lanes.stop(drain=True, timeout=STOP_DRAIN_SECONDS)
        if report.unfinished:
            log.warning(
                "%d message(s) left unanswered at stop; they are answered on the next start",
                report.unfinished,
            )
        if self._provider is not None and self._owns_provider:
            await self._provider.aclose()
        if self.memory is not None:
            try:
                await self.memory.close()
            except Exception:
                log.exception("closing the memory index failed")
            self.memory = None
        for transcript in self._transcripts.values():
            transcript.close()
        self._transcripts.clear()
        await self.state.close()
        self._started = False
        self._stopping = False

    @property
    def ready(self) -> bool:
        """Started, recovered and not stopping: new messages are answered."""
        return self._ready.is_set() and not self._stopping

    async def wait_idle(self) -> None:
        await self.lanes.wait_idle()

    def _page_links(self, http: HttpServer) -> str:
        # A generated token rides in the fragment (never sent to the server, never
        # logged); an operator who configured one already knows it.
        token = http.token
        fragment = f"#token={token.value}" if token.source != "config" else ""
        lines = [f"Inspector: {http.url('/')}{fragment}"]
        if "web" in self.channels:
            lines.append(f"Web chat:  {http.url('/chat')}{fragment}")
        return "\n".join(lines)

    def _register_gauges(self) -> None:
        lanes = self.lanes
        self.metrics.add_gauge(
            "parley_lane_active_runs", "Turns running now", lambda: lanes.stats().active_runs
        )
        self.metrics.add_gauge(
            "parley_lane_queued", "Messages waiting in session lanes", lambda: lanes.stats().queued
        )
        self.metrics.add_gauge(
            "parley_open_transcripts", "Transcripts kept open", lambda: len(self._transcripts)
        )

    async def run_in_lane(self, key: str, run: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``run`` in the session's lane (after what is queued there) and return its
        result; raises ``LaneBusy`` when the lane is full or the gateway is stopping."""
        task = LaneTask(run)
        submitted = await self.lanes.submit(key, task)
        if not submitted.accepted:
            raise LaneBusy(f"the session's queue is {submitted.status.value.replace('_', ' ')}")
        return await task.done

    # -- inbound ----------------------------------------------------------------------

    async def handle_inbound(self, message: InboundMessage) -> None:
        """The channels' entry point: admitted, durable, then routed."""
        message = well_formed(message)
        channel = self.channels.get(message.channel)
        if channel is not None:
            admission = await self.access.admit(channel, message)
            if not admission.allowed:
                if admission.notice is not None:
                    await self._notify(channel, message, admission.notice)
                return
        route = self._route(message)
        try:
            recorded = await self.inbox.record(message, session_key=route.key)
        except Exception as exc:
            detail = storage_failure(exc)
            if detail is None:
                raise
            # Not durable, so not accepted: the adapter reports it and the platform (or
            # the browser) may deliver it again once state.db takes writes.
            log.error(
                "storage failure: cannot record %s message %s in the inbox: %s",
                message.channel,
                message.message_id,
                detail,
            )
            self.metrics.error("storage")
            if channel is not None:
                await self._tell_not_recorded(channel, message)
            raise InboundNotStored(f"the message was not recorded: {detail}") from exc
        if not recorded.is_new:
            log.info(
                "duplicate %s message %s ignored (%s)",
                message.channel,
                message.message_id,
                recorded.item.status,
            )
            return
        self.metrics.inbound(message.channel)
        await self._ready.wait()
        item_id = recorded.item.id
        info = parse_info_command(message.text)
        if info is not None:
            if info.name == "help":
                text = HELP_TEXT
            elif info.name == "context":
                text = await self._context_text(route, info.argument)
            elif info.name == "memory":
                text = await self._memory_text(route, message, info.argument)
            elif info.name in ("remember", "forget"):
                text = await self._note_text(route, message, info.name, info.argument)
            else:
                text = await self._status_text(route.key)
            await self._deliver([item_id], message, None, text)
            return
        item = self._lane_item(item_id, message, route)
        submitted = await self.lanes.submit(route.key, item)
        if not submitted.accepted:
            await self._deliver([item_id], message, None, BUSY_TEXT, final_status="rejected")

    def _lane_item(
        self,
        item_id: int,
        message: InboundMessage,
        route: SessionRoute,
        recovered: InboxItem | None = None,
    ) -> LaneItem:
        reset = None
        focus = None
        if not message.automated:  # automated events never reset a session
            reset = match_reset_trigger(message.text, self.config.session.reset_triggers)
            focus = parse_compact_command(message.text)
        return LaneItem(
            item_id,
            message,
            route,
            reset_text=reset.remainder if reset is not None else None,
            compact_focus=focus if reset is None else None,
            recovered=recovered,
        )

    async def _tell_not_recorded(self, channel: Channel, message: InboundMessage) -> None:
        """Tell the sender their message could not be saved: once per message, however
        often the platform delivers it again; best effort (nothing can be stored)."""
        key = (message.channel, message.account, message.message_id)
        if key in self._not_recorded:
            return
        self._not_recorded[key] = None
        while len(self._not_recorded) > NOT_RECORDED_MEMORY:
            self._not_recorded.popitem(last=False)
        try:
            await channel.send(_reply(message, NOT_RECORDED_TEXT))
        except ChannelError as exc:
            log.warning("telling %s %s failed: %s", message.channel, message.sender_id, exc)

    async def _notify(self, channel: Channel, message: InboundMessage, text: str) -> None:
        """A reply outside any session (a pairing code): sent once, not stored."""
        try:
            await channel.send(_reply(message, text, quote=False))
        except ChannelError as exc:
            log.warning("notice to %s %s failed: %s", message.channel, message.sender_id, exc)
            return
        await self.pairing.mark_notified(message.channel, message.sender_id)

    def _route(self, message: InboundMessage) -> SessionRoute:
        return resolve_session_key(
            agent_id=self.config.agent.id,
            channel=message.channel,
            account=message.account,
            chat_type=message.chat_type,
            chat_id=message.chat_id,
            sender_id=message.sender_id,
            thread_id=message.thread_id,
            config=self.config.session,
        )

    def window_for(self, record: SessionRecord | None) -> int:
        assert self.engine is not None
        model = (record.settings.get("model") if record else None) or self.provider.model
        return self.engine.window(model).tokens

    async def _status_text(self, key: str) -> str:
        record = await self.registry.get_active(key)
        # What the session's last turn or compaction in this process left: /status runs
        # outside the lane and must not read the transcript while a turn writes it.
        stats = self.figures.peek(record.session_id) if record is not None else None
        return format_status(
            record,
            key=key,
            model=self.provider.model,
            window=self.window_for(record),
            now=self.clock(),
            compactions=stats,
        )

    async def note_figures(
        self,
        record: SessionRecord,
        transcript: SessionTranscript,
        used: int,
        *,
        compacted: bool = False,
    ) -> CompactionStats:
        """Refresh the session's figures (and its metrics) after a turn or compaction."""
        stats = await self.figures.stats(record.session_id, transcript, changed=compacted)
        self.metrics.session(
            record.session_id, session_figures(stats, used, self.window_for(record))
        )
        return stats

    async def _context_text(self, route: SessionRoute, mode: str) -> str:
        """``/context [list|detail|json]``: what the next request would hold, by part."""
        record = await self.registry.get_active(route.key)
        transcript = opened = None
        if record is not None:
            transcript = await self.cached_transcript(record)
            if transcript is None:
                # Outside the lane: a read-only copy for this read (none yet: the lane
                # may be creating it), never the lane's way of opening.
                with contextlib.suppress(TranscriptError):
                    transcript = opened = await asyncio.to_thread(
                        self.state.transcripts.open, record.session_id, read_only=True
                    )
        try:
            report, _ = await self.context_report(record, transcript, route.chat_type)
        finally:
            if opened is not None:
                opened.close()
        return render_context(report, mode or "list")

    async def context_report(
        self, record: SessionRecord | None, transcript: SessionTranscript | None, chat_type: str
    ) -> tuple[ContextReport, ContextView | None]:
        """What the next request would hold, by part, and how the history was cut."""
        assert self.engine is not None and self.prompt is not None and self.runner is not None
        prompt = await asyncio.to_thread(self.prompt.build)
        tools = self.runner.tools.specs() if self.runner.offer_tools else ()
        history: list[Any] = []
        view = None
        recall = None
        if transcript is not None:
            live = transcript.live_entries()
            view = self.engine.inspect_view(live, chat_type, window=self.window_for(record))
            history = view.messages
            recall = last_recall(live)  # what the last turn recalled from memory
        report = await asyncio.to_thread(
            build_context_report,
            prompt=prompt,
            tools=tools,
            history=history,
            counter=self.engine.counter,
            window=self.window_for(record),
            workspace=self.loaded.workspace,
            file_max_chars=self.config.context.file_max_chars,
            total_max_chars=self.config.context.total_max_chars,
            session_tokens=record.context_tokens if record else None,
            recall=recall,
        )
        return report, view

    def audience(self, route: SessionRoute, message: InboundMessage) -> Audience:
        """Where this conversation's memory goes (``gateway.audiences``)."""
        return audience_for(
            route,
            channel=message.channel,
            sender_id=message.sender_id,
            chat_id=message.chat_id,
            config=self.config.session,
        )

    def viewer(self, route: SessionRoute, message: InboundMessage) -> Viewer:
        """What this conversation may read of memory (``core.memory.audience``)."""
        return viewer_for(self.audience(route, message), self.config.session, self.person_links)

    async def _memory_text(
        self, route: SessionRoute, message: InboundMessage, argument: str
    ) -> str:
        """``/memory status``, ``search <query>`` and ``stats``: this conversation's
        audiences only, as its own searches see them."""
        if self.memory is None:
            return "Long-term memory is turned off ([memory] enabled = false)."
        action, _, query = argument.partition(" ")
        try:
            viewer = self.viewer(route, message)
            if action in ("", "status"):
                return format_memory_status(await self.memory.status(viewer))
            if action == "search" and query.strip():
                scopes = await self.memory.visible_scopes(viewer)
                result = await self.memory.search(query.strip(), scopes=scopes)
                return format_search(query.strip(), result)
            if action == "stats" and not query.strip():
                scopes = await self.memory.visible_scopes(viewer)
                return format_task_stats(await self.memory.task_stats(scopes))
        except CoreError as exc:
            return f"Memory is unavailable: {exc}"
        return MEMORY_USAGE

    async def _memory_scopes(self, viewer: Viewer) -> tuple[str, ...]:
        """What this turn's recall and memory_search may see. An index that cannot list
        its scopes costs a linked person the other ids' memory for this turn, nothing more."""
        if self.memory is None:
            return ()
        try:
            return await self.memory.visible_scopes(viewer)
        except Exception as exc:  # the driver's errors too: the turn must go on
            log.warning("memory scopes unavailable, this turn sees its own only: %s", exc)
            return visible_scopes(viewer)

    async def _note_text(
        self, route: SessionRoute, message: InboundMessage, name: str, argument: str
    ) -> str:
        """``/remember <text>`` and ``/forget <text or citation>``: the notes of this
        conversation's own audience (the person's, or the group's), nobody else's."""
        if self.memory is None:
            return "Long-term memory is turned off ([memory] enabled = false)."
        if not argument:
            return REMEMBER_USAGE if name == "remember" else FORGET_USAGE
        audience = self.audience(route, message)
        where = "your memory" if audience.kind == "person" else "this group's memory"
        try:
            if name == "remember":
                citation = await self.memory.remember(audience, argument)
                return f"Remembered in {where} ({citation})."
            removed = await self.memory.forget_note(audience, argument)
        except (NoteError, OSError) as exc:
            return f"Could not change {where}: {exc}"
        if not removed:
            return f"Nothing in {where} matches that."
        lines = sum(len(f.lines) for f in removed)
        return f"Forgot {lines} line(s) from {where}: " + "; ".join(
            f"{f.path} ({len(f.lines)})" for f in removed
        )

    async def _recover(self) -> None:
        if self.replicas is not None:
            # Only what no live replica answers for: the others' items are theirs.
            await self.replicas.adopt_orphans()
            self.replicas.start()
            return
        items = await self.inbox.open_items()
        queued = 0
        for item in items:
            if item.message.channel not in self.channels:
                continue  # that channel is not running now; it stays open for later
            queued += await self._requeue(item)
        if queued:
            log.info("recovering %d unanswered message(s) from the inbox", queued)

    async def _requeue(self, item: InboxItem) -> bool:
        """Queue an inbox item again, as recovered. It was accepted once: the queue cap
        must not turn it away the second time."""
        route = self._route(item.message)
        lane_item = LaneItem(item.id, item.message, route, recovered=item)
        if not (await self.lanes.submit(route.key, lane_item, force=True)).accepted:
            return False
        self._redelivering.add(item.id)
        return True

    async def redeliver_now(self, *, due_only: bool = False) -> int:
        """Queue again every reply a platform outage kept from being sent (the inbox
        holds them as ``replied`` with an error); give up on those older than
        ``REDELIVERY_GIVE_UP``. ``due_only`` (the background loop) skips replies whose
        backoff has not run out: each try appends a delivery entry to the transcript,
        so a day-long outage must not write one every 30 s. Returns how many were queued."""
        queued = 0
        now = utcnow()  # the inbox stamps arrivals with the real time, not self.clock
        tick = time.monotonic()
        items = await self.inbox.open_items()
        mine = self.state.locks.pid if self.state.locks is not None else None
        for item in items:
            if item.status != "replied" or not item.error or item.id in self._redelivering:
                continue  # not a failed send, or already queued
            if mine is not None and item.claimed_by != mine:
                continue  # another replica's to resend (or an orphan, adopted first)
            tries, next_at = self._resend_schedule.get(item.id, (0, 0.0))
            if due_only and tick < next_at:
                continue
            if item.message.channel not in self.channels:
                continue
            if item.received_at is not None and now - item.received_at > REDELIVERY_GIVE_UP:
                await self.inbox.mark_failed([item.id], f"gave up resending: {item.error}")
                log.warning("inbox %d: gave up resending its reply: %s", item.id, item.error)
                continue
            if await self._requeue(item):
                delay = min(REDELIVERY_INTERVAL_SECONDS * 2**tries, REDELIVERY_MAX_BACKOFF_SECONDS)
                self._resend_schedule[item.id] = (tries + 1, tick + delay)
                queued += 1
        open_ids = {item.id for item in items}
        for stale in set(self._resend_schedule) - open_ids:  # delivered or given up
            del self._resend_schedule[stale]
        if queued:
            log.info("sending %d reply(ies) again after a failed delivery", queued)
        return queued

    async def _redeliver_loop(self) -> None:
        while True:
            await asyncio.sleep(REDELIVERY_INTERVAL_SECONDS)
            try:
                await self.redeliver_now(due_only=True)
            except Exception:  # a storage failure here must not end the loop
                log.exception("resending undelivered replies failed")

    # -- one lane run -----------------------------------------------------------------

    async def _run_lane(self, key: str, items: list[LaneItem | LaneTask]) -> None:
        if self.replicas is not None:  # PostgreSQL: other replicas share the session
            await self.replicas.run_locked(key, items)
        else:
            await self._run_batch(key, items)

    async def _run_batch(self, key: str, items: list[LaneItem | LaneTask]) -> None:
        """Process a batch in order; plain messages next to each other share one turn."""
        group: list[LaneItem] = []
        # A batch holds several messages in collect mode, or (several replicas) when the
        # session's lock holder answers what other replicas received: queue mode still
        # answers each in its own turn.
        fold = self.config.lanes.mode == "collect"
        for item in items:
            if isinstance(item, LaneTask):
                if group:
                    await self._answer(key, group)
                    group = []
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
        try:
            await self._answer_items(key, items)
        finally:
            self._redelivering.difference_update(i.inbox_id for i in items)

    async def _answer_items(self, key: str, items: list[LaneItem]) -> None:
        first, last = items[0], items[-1]
        ids = [i.inbox_id for i in items]
        try:
            recovered = first.recovered
            if recovered is not None and recovered.status == "replied":
                # Read again: a folded turn's reply answers several items, and the
                # first of them to come back here delivers it for all.
                stored = await self.inbox.get(recovered.id)
                if stored is None or stored.status != "replied":
                    return
                ids = sorted({*ids, *stored.reply_for})
                record = await self.registry.get(stored.session_id or "")
                if record is not None and await self._delivered_before(record, ids):
                    return
                text = (stored.reply or [""])[0]
                head = stored if ids[0] == stored.id else await self.inbox.get(ids[0])
                await self._deliver(
                    ids,
                    last.message,
                    record,
                    text,
                    resumed=stored,
                    first_message=head.message if head is not None else None,
                )
                return
            if first.compact_focus is not None:
                outcome = await self._compact(key, first)
                await self._deliver(ids, last.message, *outcome, first_message=first.message)
                return
            if first.reset_text is not None:
                record = await self._reset(key, first, reason="command")
                if not first.reset_text.strip():
                    text = (
                        f"Started a new session ({record.session_id[:8]}). The old one is archived."
                    )
                    await self._deliver(
                        ids, last.message, record, text, first_message=first.message
                    )
                    return
                text = first.reset_text
            else:
                record = await self._session_for(key, first)
                text = "\n\n".join(_turn_text(i.message) for i in items)
            if first.recovered is not None and await self._delivered_before(record, ids):
                return
            reply = await self._turn(record, items, text)
            await self._deliver(ids, last.message, record, reply, first_message=first.message)
        except Exception as exc:
            detail = storage_failure(exc)
            if detail is None:
                log.exception("answering %s in session %s failed", ids, key)
                self.metrics.error("internal")
                await self._deliver(
                    ids, last.message, None, INTERNAL_ERROR_TEXT, first_message=first.message
                )
                return
            log.error(
                "storage failure answering %s in session %s: %s (free disk space or make "
                "%s writable); the message is marked failed in the inbox",
                ids,
                key,
                detail,
                self.loaded.home,
            )
            self.metrics.error("storage")
            await self._deliver(
                ids,
                last.message,
                None,
                STORAGE_ERROR_TEXT,
                final_status="failed",
                failure=f"storage: {detail}",
                first_message=first.message,
            )

    async def _delivered_before(self, record: SessionRecord, ids: list[int]) -> bool:
        """A recovered item whose reply the transcript says went out (state.db could not
        record it): mark it delivered rather than send it twice."""
        transcript = await self.transcript(record)
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
        await self.inbox.mark_delivered(ids, sent)
        return True

    async def _compact(self, key: str, item: LaneItem) -> tuple[SessionRecord | None, str]:
        """``/compact [focus]``, run in the session's lane like a turn."""
        record = await self.registry.get_active(key)
        if record is None:
            return None, "Skipped: there is no conversation in this chat yet."
        try:
            outcome = await self.compact_session(
                record, item.route.chat_type, item.compact_focus or ""
            )
        except ContextError as exc:
            return record, describe_context_error(exc)
        return record, outcome.describe()

    async def compact_session(
        self, record: SessionRecord, chat_type: str, focus: str
    ) -> CompactionOutcome:
        """Compact now; the caller runs this in the session's lane. Raises ContextError."""
        assert self.engine is not None and self.runner is not None
        transcript = await self.transcript(record)
        request = await self.runner.view_request(
            record.key, record.settings.get("model"), chat_type
        )
        outcome, events = await self.engine.compact_now(transcript, request, focus=focus)
        await self.registry.record_compaction(
            record.session_id,
            compactions=1 if outcome.compacted else 0,
            usage=events.usage,
            context_tokens=outcome.tokens_after if outcome.compacted else None,
            entry_count=transcript.entry_count,
            last_entry_id=_last_id(transcript),
        )
        if outcome.compacted:
            self.metrics.compaction(outcome.trigger, outcome.strategy)
            await self.note_figures(record, transcript, outcome.tokens_after, compacted=True)
            if self.memory is not None:
                self.memory.notify_compaction()
        return outcome

    async def archive_session(self, record: SessionRecord, reason: str) -> None:
        """End a session without starting the next one (the next message does); the
        caller runs this in the session's lane. The transcript records why."""
        transcript = await self.transcript(record)
        await asyncio.to_thread(transcript.append_custom, "reset", {"reason": reason})
        await self.registry.record_entries(
            record.session_id, transcript.entry_count, _last_id(transcript)
        )
        await self.registry.archive(record.session_id, reason, self.clock())
        self._forget_transcript(record.session_id)
        if self.engine is not None:
            self.engine.forget(record.key)
        log.info("session %s archived (%s): %s", record.key, reason, record.session_id)

    async def _session_for(self, key: str, item: LaneItem) -> SessionRecord:
        record = await self.registry.get_active(key)
        if record is not None and item.recovered is None:
            policy = resolve_reset_policy(
                self.config.session, item.message.channel, item.route.chat_type
            )
            stale = should_reset(
                record.updated_at,
                self.clock(),
                policy,
                self.zone,
                automated=item.message.automated,
            )
            if stale is not None:
                return await self._reset(key, item, reason=stale.reason, previous=record)
        if record is not None:
            return record
        return await self._create(item)

    async def _reset(
        self,
        key: str,
        item: LaneItem,
        *,
        reason: str,
        previous: SessionRecord | None = None,
    ) -> SessionRecord:
        previous = previous or await self.registry.get_active(key)
        carried: dict[str, Any] = {}
        if previous is not None:
            carried = {k: v for k, v in previous.settings.items() if k in CARRIED_SETTINGS}
            await self.registry.archive(previous.session_id, reason, self.clock())
            self._forget_transcript(previous.session_id)
            if self.engine is not None:
                self.engine.forget(key)
            log.info("session %s archived (%s): %s", key, reason, previous.session_id)
        return await self._create(item, carried)

    async def _create(
        self, item: LaneItem, settings: dict[str, Any] | None = None
    ) -> SessionRecord:
        route, message = item.route, item.message
        origin = SessionOrigin(
            key=route.key,
            agent_id=self.config.agent.id,
            channel=message.channel,
            account=message.account,
            chat_type=route.chat_type,
            peer=route.peer,
            parent_key=route.parent_key,
            display_name=message.sender_name if route.chat_type == "direct" else message.chat_id,
        )
        settings = settings or {}
        record = await self.registry.create(
            origin, settings=settings, model=settings.get("model"), now=self.clock()
        )
        transcript = await self._create_transcript(record, self.audience(route, message))
        self._cache_transcript(record.session_id, transcript)
        return record

    async def _create_transcript(
        self, record: SessionRecord, audience: Audience | None = None
    ) -> SessionTranscript:
        # The audience is decided here, by code, once: the key's when the message that
        # opened the session is not at hand (a transcript lost to a kill).
        scope = (
            audience.scope
            if audience is not None
            else scope_for_key(record.key, self.person_links.names)
        )
        return await asyncio.to_thread(
            self.state.transcripts.create,
            record.session_id,
            record.key,
            {
                "agent": record.agent_id,
                "agent_name": self.config.agent.name,
                "memory_scope": scope,
            },
        )

    # -- transcripts ------------------------------------------------------------------

    async def transcript(self, record: SessionRecord) -> SessionTranscript:
        cached = self._transcripts.get(record.session_id)
        if cached is not None:
            self._transcripts.move_to_end(record.session_id)
            return cached
        # One open per session at a time: a reader outside the lane (/context, the admin
        # API) racing the lane's first open would otherwise make a second object on the
        # same transcript, with its own idea of where the file ends.
        opening = self._opening.get(record.session_id)
        if opening is None:
            opening = asyncio.ensure_future(self._open_transcript(record))
            self._opening[record.session_id] = opening
            opening.add_done_callback(lambda _: self._opening.pop(record.session_id, None))
        return await asyncio.shield(opening)

    async def _open_transcript(self, record: SessionRecord) -> SessionTranscript:
        store = self.state.transcripts
        try:
            transcript = await asyncio.to_thread(store.open, record.session_id)
        except TranscriptError:
            if await asyncio.to_thread(store.exists, record.session_id):
                raise
            # The row exists but the transcript never did (a kill between the two).
            transcript = await self._create_transcript(record)
        report = transcript.load_report
        if not report.clean:
            log.warning("transcript %s repaired on load: %s", record.session_id, report)
        self._cache_transcript(record.session_id, transcript)
        return transcript

    async def current_transcript(self, record: SessionRecord) -> SessionTranscript:
        """``transcript``, reopened first when another replica appended to it (in the
        session's lane)."""
        if self.replicas is not None:
            return await self.replicas.current_transcript(record)
        return await self.transcript(record)

    async def cached_transcript(self, record: SessionRecord) -> SessionTranscript | None:
        """The lane's open transcript when it has one that is current, else None; never
        opens or creates one. For readers outside the lane (/context, the admin API):
        opening the lane's way from there races the lane creating the file (a reader
        would find it empty) or puts a second writer on it; they open read-only copies."""
        cached = self._transcripts.get(record.session_id)
        if cached is None:
            return None
        is_current = getattr(cached, "is_current", None)  # PostgreSQL, several replicas
        if is_current is not None and not await asyncio.to_thread(is_current):
            return None
        return cached

    def _cache_transcript(self, session_id: str, transcript: SessionTranscript) -> None:
        self._transcripts[session_id] = transcript
        self._transcripts.move_to_end(session_id)
        while len(self._transcripts) > self.config.storage.max_open_transcripts:
            _, evicted = self._transcripts.popitem(last=False)
            evicted.close()

    def _forget_transcript(self, session_id: str) -> None:
        transcript = self._transcripts.pop(session_id, None)
        if transcript is not None:
            transcript.close()

    # -- the turn ---------------------------------------------------------------------

    async def _turn(self, record: SessionRecord, items: list[LaneItem], text: str) -> str:
        assert self.runner is not None
        transcript = await self.transcript(record)
        first, last = items[0], items[-1]
        message = last.message
        ids = [i.inbox_id for i in items]
        resume = False
        if first.recovered is not None:
            done, reply = _recovered_progress(transcript, first.inbox_id)
            if reply is not None:
                return reply  # answered before the crash, not yet delivered
            resume = done
        attempts = 1

        def on_retry(attempt: int, exc: ProviderError, delay: float) -> None:
            nonlocal attempts
            attempts = attempt + 1
            log.warning("provider %s; retry %d in %.1fs", type(exc).__name__, attempt, delay)

        viewer = self.viewer(first.route, message)
        turn = TurnRequest(
            session_key=record.key,
            user_text=text,
            context_text=render_turn_context(
                now=self.clock().astimezone(self.zone),
                channel=message.channel,
                chat_type=first.route.chat_type,
                sender_name=message.sender_name,
                sender_id=message.sender_id,
            ),
            meta={"inbox_ids": ids, "message_ids": [i.message.message_id for i in items]},
            resume=resume,
            model=record.settings.get("model"),
            chat_type=first.route.chat_type,
            memory_scopes=await self._memory_scopes(viewer),
            memory_viewer=viewer,
        )
        entries_before = transcript.entry_count
        started = time.perf_counter()
        started_at = self.clock()  # the task record's start (wall clock)
        try:
            async with self._typing(message):
                result = await self.runner.run_turn(transcript, turn, on_retry=on_retry)
        except (ProviderError, ContextError) as exc:
            self.metrics.turn(message.channel, time.perf_counter() - started, ok=False)
            self.metrics.error(_error_kind(exc))
            if isinstance(exc, ProviderError):
                self._note_provider(exc)
            await self._bookkeep(
                "record the session's entries",
                self.registry.record_entries(
                    record.session_id, transcript.entry_count, _last_id(transcript)
                ),
            )
            if isinstance(exc, ContextError):
                return describe_context_error(exc)
            return describe_provider_error(exc, attempts)
        self.metrics.turn(message.channel, time.perf_counter() - started, ok=True)
        self.metrics.tokens(result.usage)
        self._note_provider(None)
        if result.compactions:
            for trigger, strategy in await asyncio.to_thread(
                _new_compactions, transcript, entries_before
            ):
                self.metrics.compaction(trigger, strategy)
        await self.note_figures(
            record, transcript, result.context_tokens, compacted=bool(result.compactions)
        )
        if self.memory is not None:
            self.memory.notify_transcript(appended_messages=transcript.entry_count - entries_before)
            if result.compactions:
                self.memory.notify_compaction()
            if result.tool_calls:
                await record_turn_task(
                    self.memory,
                    user_text=text,
                    entries=result.entries,
                    started_at=started_at,
                    finished_at=self.clock(),
                    scope=viewer.audience.scope,
                )
        # The reply is in the transcript (the source of truth): a registry that cannot
        # take the counters must not cost the person their answer.
        await self._bookkeep(
            "record the turn in the registry",
            self.registry.record_turn(
                record.session_id,
                usage=result.usage,
                compactions=result.compactions,
                context_tokens=result.context_tokens,
                entry_count=transcript.entry_count,
                last_entry_id=_last_id(transcript),
                model=self.provider.model if not record.settings.get("model") else None,
                now=self.clock(),
            ),
        )
        return result.reply or EMPTY_REPLY_TEXT

    async def _bookkeep(self, what: str, write: Awaitable[Any]) -> bool:
        """Await a state write that must not fail the message; a storage failure is
        logged (and counted) instead of raised. False when it failed."""
        try:
            await write
        except Exception as exc:
            detail = storage_failure(exc)
            if detail is None:
                raise
            log.error("storage failure: could not %s: %s", what, detail)
            self.metrics.error("storage")
            return False
        return True

    def _note_provider(self, error: ProviderError | None) -> None:
        """Remember whether the provider could be reached, for /health."""
        now = self.clock()
        if error is None:
            self.provider_health = ProviderHealth(True, "last call succeeded", now)
        elif isinstance(error, _UNREACHABLE):
            self.provider_health = ProviderHealth(False, f"last call failed: {error}", now)
        else:  # it answered, with a refusal about this request: reachable
            self.provider_health = ProviderHealth(True, f"last call refused: {error}", now)

    @contextlib.asynccontextmanager
    async def _typing(self, message: InboundMessage) -> AsyncIterator[None]:
        """Keep the platform's typing indicator on while the agent works."""
        channel = self.channels.get(message.channel)
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

    # -- delivery ---------------------------------------------------------------------

    async def _deliver(
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
    ) -> None:
        """Store the reply in the inbox, send it, record the result. When state.db
        cannot take the reply the reply is still sent (the transcript holds it and its
        delivery, which recovery checks); nothing after the send raises for storage,
        so a reply never gets a second, error, message. ``resumed``: the open item of
        a reply stored before (a restart, a failed send); the parts the platform
        already has are not sent again (``gateway.send_recovery``). The reply's
        idempotency key names the first message it answers (``first_message``, else
        ``message``): every send of this reply, and only of this one, carries it."""
        session_id = record.session_id if record else None
        channel = self.channels.get(message.channel)
        outbound = dataclasses.replace(
            _reply(message, text), idempotency_key=_reply_key(first_message or message)
        )
        # Where the chat's numbering stands before the send, stored with the reply
        # (an earlier mark is kept: an earlier send of this reply came after it).
        mark = await send_mark(channel, outbound) if channel is not None else None
        await self._bookkeep(
            "store the reply in the inbox",
            self.inbox.mark_replied(ids, session_id, [text], send_mark=mark),
        )
        if text.strip() == SILENT_REPLY:
            await self._bookkeep("mark the reply delivered", self.inbox.mark_delivered(ids))
            return
        if channel is None:
            log.warning("no running channel %s: reply kept for later", message.channel)
            return
        found: tuple[str, ...] = ()
        if resumed is not None:
            found = await parts_already_sent(channel, self.inbox, resumed, outbound)
            outbound = dataclasses.replace(outbound, first_part=len(found))
            if not found and mark is not None:
                # Nothing above the old mark: look above this one after another kill
                # (the chat may have moved on by more than a look covers since).
                await self._bookkeep("renew the send mark", self.inbox.renew_send_mark(ids, mark))
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
        route = {
            "channel": outbound.channel,
            "account": outbound.account,
            "chat_id": outbound.chat_id,
            "thread_id": outbound.thread_id,
        }

        def sent(platform_ids: tuple[str, ...]) -> SentMessages:
            return SentMessages(outbound.channel, outbound.account, platform_ids)

        if result is None and retryable and final_status == "delivered":
            # The platform is unreachable for now: keep the reply and send it later.
            await self._bookkeep(
                "keep the reply for another send",
                self.inbox.note_undelivered(ids, error or "delivery failed"),
            )
            log.warning("delivery to %s failed, will try again: %s", route, error)
            self.metrics.reply(message.channel, "failed")
            self.metrics.error("delivery_failed")
        elif result is None:
            await self._bookkeep(
                "mark the delivery failed",
                self.inbox.mark_failed(ids, failure or error or "delivery failed", sent(partial)),
            )
            log.warning("delivery to %s failed: %s", route, error)
            self.metrics.reply(message.channel, "failed")
            self.metrics.error("delivery_failed")
        elif final_status == "rejected":
            await self._bookkeep(
                "mark the message rejected",
                self.inbox.mark_rejected(ids, "queue full", sent(result.platform_message_ids)),
            )
            self.metrics.reply(message.channel, "rejected")
        elif final_status == "failed":  # told why; the message itself was not processed
            await self._bookkeep(
                "mark the message failed",
                self.inbox.mark_failed(ids, failure or "failed", sent(result.platform_message_ids)),
            )
            self.metrics.reply(message.channel, "delivered")
        else:
            await self._bookkeep(
                "mark the reply delivered",
                self.inbox.mark_delivered(ids, sent(result.platform_message_ids)),
            )
            self.metrics.reply(message.channel, "delivered")
        if record is None:
            return
        delivery = {
            "inbox_ids": ids,
            "ok": result is not None,
            "platform_message_ids": list(result.platform_message_ids if result else partial),
            "parts": result.parts if result else len(partial),
            "error": error,
            **route,
        }
        transcript = await self.transcript(record)
        await self._bookkeep(
            "record the delivery in the transcript",
            asyncio.to_thread(transcript.append_custom, "delivery", delivery),
        )
        await self._bookkeep(
            "record the delivery in the registry",
            self.registry.record_delivery(
                record.session_id,
                route,
                error,
                entry_count=transcript.entry_count,
                last_entry_id=_last_id(transcript),
                message_ids=delivery["platform_message_ids"],
            ),
        )


async def _keep_typing(channel: Channel, message: InboundMessage, done: asyncio.Event) -> None:
    refresh = channel.capabilities.typing_refresh_seconds
    while not done.is_set():
        try:
            await channel.typing(message.chat_id, message.thread_id, message.account)
        except Exception as exc:  # best effort: a typing failure never fails a turn
            log.debug("typing indicator on %s failed: %s", message.channel, exc)
        if refresh is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), refresh)


# Provider failures that mean it could not be reached (as opposed to a refusal).
_UNREACHABLE = (
    ProviderConnectionError,
    ProviderTimeoutError,
    ServerError,
    OverloadedError,
    AuthenticationError,
)


def _error_kind(exc: Exception) -> str:
    """A bounded metrics label: ContextOverflowError -> context_overflow."""
    name = type(exc).__name__.removesuffix("Error") or "error"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _reply(message: InboundMessage, text: str, *, quote: bool = True) -> OutboundMessage:
    """``text`` back to where ``message`` came from (quoting it unless ``quote`` is off)."""
    return OutboundMessage(
        channel=message.channel,
        account=message.account,
        chat_id=message.chat_id,
        text=text,
        thread_id=message.thread_id,
        reply_to_message_id=message.message_id if quote else None,
    )


def _reply_key(message: InboundMessage) -> str:
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


def _new_compactions(transcript: SessionTranscript, since: int) -> list[tuple[str, str]]:
    """(trigger, strategy) of the compactions written after entry line ``since``."""
    return [
        (
            str(entry.payload.get("trigger") or "unknown"),
            str((entry.payload.get("details") or {}).get("strategy") or DEFAULT_STRATEGY),
        )
        for entry in transcript.entries(since)
        if entry.type == ENTRY_COMPACTION
    ]


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


def _last_id(transcript: SessionTranscript) -> str | None:
    last = transcript.last_entry
    return last.id if last is not None else None


def _delivery_recorded(transcript: SessionTranscript, ids: list[int]) -> dict[str, Any] | None:
    """The live transcript's record of a successful delivery for any of ``ids``."""
    wanted = set(ids)
    for entry in reversed(transcript.live_entries()):
        if entry.type != "custom" or entry.payload.get("custom_type") != "delivery":
            continue
        data = entry.payload.get("data") or {}
        if data.get("ok") and wanted & set(data.get("inbox_ids") or ()):
            return dict(data)
    return None


def _recovered_progress(transcript: SessionTranscript, inbox_id: int) -> tuple[bool, str | None]:
    """Was this inbox item's user message written, and was a final reply written after it?"""
    found = False
    reply: str | None = None
    for entry in transcript.live_entries():
        if entry.type != "message":
            continue
        message = entry.message
        meta = entry.payload.get("meta") or {}
        if message.role == "user" and inbox_id in (meta.get("inbox_ids") or ()):
            found, reply = True, None
        elif found and message.role == "assistant":
            final = not message.tool_uses
            reply = message.text.strip() if final and message.text.strip() else reply
        elif found and message.role == "user":
            break
    return found, reply
