"""The gateway: its parts, their lifecycle, and where a message comes in.

channel → ``handle_inbound`` (``gateway.runtime.inbound``): access and group
activation → record in the durable inbox (dedupe) → answer the info commands at once
→ resolve the session key → hand the message to the session's lane. The lane runs a
batch at a time per session (``gateway.runtime.dispatch``): reset check (or /new),
open the transcript, run the turn in ``core``, store the reply in the inbox, deliver
it, and record the delivery in the transcript and the registry.

On start, whatever the inbox holds unanswered (a crash, a stop mid-turn) is queued
again before any new message, so nothing is lost and nothing is answered twice. Each
part that starts registers how it stops on one exit stack: a failed start stops what
did start, and a part that fails to stop is logged and the rest still stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from parley.channels.base import Channel, ChannelError, InboundMessage
from parley.core.context.compaction.compactor import CompactionOutcome
from parley.core.context.engine import ContextEngine
from parley.core.context.report import ContextReport
from parley.core.context.view import ContextView
from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.index import MemoryIndex
from parley.core.prompt import SystemPromptBuilder
from parley.core.providers.base import Provider
from parley.core.runner import Runner
from parley.core.transcript_store import SessionTranscript
from parley.gateway.admin.gateway_view import ProviderHealth
from parley.gateway.admin.metrics import GatewayMetrics
from parley.gateway.admin.session_figures import SessionFiguresCache
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import ChannelFailure, LaneBusy
from parley.gateway.home_upgrade.audiences import log_legacy_memory
from parley.gateway.http_server import HttpServer
from parley.gateway.lanes import LaneManager
from parley.gateway.providers import build_provider
from parley.gateway.retention.run import every_index
from parley.gateway.retention.service import RetentionService
from parley.gateway.routing import SessionRoute
from parley.gateway.runtime.access import AccessGate
from parley.gateway.runtime.agents import build_agent
from parley.gateway.runtime.commands.replies import CommandReplies
from parley.gateway.runtime.context import Runtime
from parley.gateway.runtime.delivery import Delivery
from parley.gateway.runtime.dispatch import Dispatch
from parley.gateway.runtime.inbound import Inbound
from parley.gateway.runtime.lane_items import LaneItem, LaneTask
from parley.gateway.runtime.redelivery import Redelivery
from parley.gateway.runtime.replicas import ReplicaCoordinator
from parley.gateway.runtime.resets import resolve_timezone
from parley.gateway.runtime.sessions import Sessions
from parley.gateway.runtime.transcripts import TranscriptCache
from parley.gateway.runtime.turn import Turns
from parley.gateway.storage.sessions import SessionRecord, utcnow
from parley.gateway.storage.stores import StateStores
from parley.gateway.tasks import cancel_and_wait

if TYPE_CHECKING:
    from parley.gateway.storage.inbox import Inbox
    from parley.gateway.storage.pairing import PairingStore
    from parley.gateway.storage.sessions import SessionRegistry

log = logging.getLogger("parley.gateway")

STOP_DRAIN_SECONDS = 30.0
# Conversations with a message stored this recently are offered to ``catch_up``.
CATCH_UP_ACTIVE_DAYS = 7


class Gateway:
    """Owns the state stores, the provider, the lanes and the channels; explicit
    start/stop (or ``async with``)."""

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
        self.channels = {c.name: c for c in channels}
        self.banner = banner
        self.announce = announce
        self._given_provider = provider
        self.state = StateStores(loaded, now=clock)
        self.metrics = GatewayMetrics()
        self.metrics.declare_channels(self.channels)
        rt = self.rt = Runtime(
            loaded, channels=self.channels, state=self.state, metrics=self.metrics, clock=clock
        )
        self.access = AccessGate(self.state.pairing)
        shared = self.state.locks is not None  # several replicas share the transcripts
        self.transcripts = TranscriptCache(
            self.state.transcripts,
            max_open=self.config.storage.max_open_transcripts,
            shared=shared,
        )
        self.lanes: LaneManager[LaneItem | LaneTask] = LaneManager(
            self.config.lanes,
            self._run_lane,
            # With several replicas a run reopens what another may have appended to.
            prefetch=None if shared else self.transcripts.prefetch,
        )
        self.transcripts.in_use = self.lanes.busy
        self.sessions = Sessions(rt, self.transcripts)
        self.delivery = Delivery(rt, self.transcripts)
        self.dispatch = Dispatch(
            rt,
            transcripts=self.transcripts,
            sessions=self.sessions,
            turns=Turns(rt, self.transcripts, self.delivery),
            delivery=self.delivery,
            slots=self.lanes,
        )
        self.redelivery = Redelivery(rt, self.dispatch, self.lanes)
        self.commands = CommandReplies(rt, self.transcripts)
        self._ready = asyncio.Event()
        self.inbound = Inbound(
            rt,
            access=self.access,
            lanes=self.lanes,
            dispatch=self.dispatch,
            delivery=self.delivery,
            commands=self.commands,
            ready=self._ready,
        )
        self.replicas: ReplicaCoordinator | None = None
        locks, shared_inbox = self.state.locks, self.state.replica_inbox
        if locks is not None and shared_inbox is not None:  # PostgreSQL: several replicas
            self.replicas = ReplicaCoordinator(
                rt,
                locks=locks,
                inbox=shared_inbox,
                lanes=self.lanes,
                transcripts=self.transcripts,
                dispatch=self.dispatch,
                redelivery=self.redelivery,
            )
        # Archived data past [retention]'s windows, once a day (gateway/retention/).
        self.retention = RetentionService(
            loaded,
            self.state,
            clock=clock,
            memory=lambda: every_index([p.memory for p in self.rt.agents.values() if p.memory]),
            forget_cached=self.transcripts.forget,
        )
        routes = [r for c in channels for r in c.webhook_routes()]
        self.http: HttpServer | None = None
        wanted = self.config.http.enabled if serve_http is None else serve_http
        if wanted or routes:  # a channel's endpoint (a webhook) needs the server regardless
            self.http = HttpServer(
                self.config.http,
                routes,
                token_file=loaded.admin_token_file,
                gateway=self,
                metrics=self.metrics,
            )
        self._register_gauges()  # read at scrape time: registered once, live across restarts
        self._stack: contextlib.AsyncExitStack | None = None
        self._stopping = False

    # -- what the rest of the house reads ---------------------------------------------

    @property
    def registry(self) -> SessionRegistry:
        return self.state.registry

    @property
    def inbox(self) -> Inbox:
        return self.state.inbox

    @property
    def pairing(self) -> PairingStore:
        return self.state.pairing

    @pairing.setter
    def pairing(self, store: PairingStore) -> None:
        self.state.pairing = store

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.rt.clock

    @property
    def figures(self) -> SessionFiguresCache:
        return self.rt.figures

    @property
    def provider(self) -> Provider:
        return self.rt.provider

    @property
    def provider_health(self) -> ProviderHealth:
        return self.rt.provider_health

    @property
    def memory(self) -> MemoryIndex | None:
        return self.rt.memory

    def memory_of(self, agent: str | None) -> MemoryIndex | None:
        """An agent's memory index (None: the default agent's); KeyError for an agent
        there is not."""
        if agent is None:
            return self.rt.memory
        if agent not in {spec.id for spec in self.rt.agent_specs}:
            raise KeyError(agent)
        parts = self.rt.agents.get(agent)
        return parts.memory if parts is not None else None

    @property
    def engine(self) -> ContextEngine | None:
        return self.rt.engine_or_none

    @property
    def runner(self) -> Runner | None:
        return self.rt.runner_or_none

    @property
    def prompt(self) -> SystemPromptBuilder | None:
        return self.rt.prompt_or_none

    @property
    def ready(self) -> bool:
        """Started, recovered and not stopping: new messages are answered."""
        return self._ready.is_set() and not self._stopping

    def window_for(self, record: SessionRecord | None) -> int:
        return self.rt.window_for(record)

    def audience(self, route: SessionRoute, message: InboundMessage) -> Audience:
        return self.rt.audience(route, message)

    def viewer(self, route: SessionRoute, message: InboundMessage) -> Viewer:
        return self.rt.viewer(route, message)

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._stack is not None:
            return
        self._stack = contextlib.AsyncExitStack()
        self._ready.clear()  # a restart answers nothing new before it has recovered
        try:
            await self._start(self._stack)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        rt, config = self.rt, self.config
        rt.zone = await asyncio.to_thread(resolve_timezone, config.session.timezone)
        # Memory from before audiences, and settings they retired: a warning each.
        await asyncio.to_thread(log_legacy_memory, self.loaded)
        await asyncio.to_thread(self.loaded.sessions_dir.mkdir, parents=True, exist_ok=True)
        # "auto" reads /proc and /sys for the memory there is: off the loop, at start.
        self.transcripts.warm_bytes = await asyncio.to_thread(config.storage.warm_transcripts_bytes)
        await self.state.open()
        _on_stop(stack, "closing the state stores", self.state.close)
        _on_stop(stack, "closing transcripts", self.transcripts.close_all)
        provider = self._given_provider
        if provider is None:
            provider, banner = build_provider(config.providers)
            self.banner = self.banner or banner
            _on_stop(stack, "closing the provider", provider.aclose)
        rt.provider = provider
        warm_up = getattr(provider, "start", None)
        if warm_up is not None:  # the local model loads here, not on the first message
            await warm_up()
        # Each agent's parts: its workspace, prompt, tools, engine, memory and runner.
        # Forgotten at stop (after their indexes closed), also when one fails to start.
        stack.callback(self._forget_agents)
        for spec in rt.agent_specs:
            parts = await build_agent(
                rt, spec, rt.agent_specs, on_stop=lambda what, stop: _on_stop(stack, what, stop)
            )
            rt.add_agent(parts)
        await self.lanes.start()
        _on_stop(stack, "stopping the lanes", self._stop_lanes)
        if self.http is not None:
            await self.http.start()  # before the channels: a webhook must be reachable
            _on_stop(stack, "stopping the HTTP server", self.http.stop)
            if self.announce is not None:
                self.announce(self._page_links(self.http))
        for channel in self.channels.values():
            await self._offer_catch_up(channel)
            try:
                await channel.start(self.handle_inbound)
            except ChannelError as exc:
                raise ChannelFailure(f"the {channel.name} channel did not start: {exc}") from exc
            _on_stop(stack, f"stopping channel {channel.name}", channel.stop)
        if self.replicas is not None:
            # Only what no live replica answers for: the others' items are theirs.
            await self.replicas.adopt_orphans()
            self.replicas.start()
            _on_stop(stack, "stopping the orphan scan", self.replicas.stop)
        else:
            await self.redelivery.recover()
        redelivery = asyncio.create_task(self.redelivery.loop(), name="redelivery")
        _on_stop(stack, "stopping redelivery", lambda: cancel_and_wait(redelivery))
        self.retention.start()
        _on_stop(stack, "stopping the retention runs", self.retention.stop)
        self._ready.set()
        log.info(
            "gateway started: provider=%s model=%s channels=%s home=%s",
            provider.name,
            provider.model,
            ",".join(self.channels) or "-",
            self.loaded.home,
        )

    async def stop(self) -> None:
        stack = self._stack
        if stack is None or self._stopping:
            return
        self._stopping = True
        try:
            await stack.aclose()
        finally:
            self._stack = None
            self._stopping = False

    async def _stop_lanes(self) -> None:
        report = await self.lanes.stop(drain=True, timeout=STOP_DRAIN_SECONDS)
        if report.unfinished:
            log.warning(
                "%d message(s) left unanswered at stop; they are answered on the next start",
                report.unfinished,
            )

    def _forget_agents(self) -> None:
        # Their memory indexes closed on their own stop steps (before this one): none
        # is handed out after the stop (``Runtime.memory`` is the default agent's).
        for parts in self.rt.agents.values():
            parts.memory = None
        self.rt.agents.clear()

    async def _offer_catch_up(self, channel: Channel) -> None:
        """Tell an adapter that can read history (``catch_up``) where each recently
        active conversation stopped, so what was sent while the bot was down is not
        lost on a platform that does not redeliver."""
        catch_up = getattr(channel, "catch_up", None)
        if catch_up is None:
            return
        since = self.rt.clock() - timedelta(days=CATCH_UP_ACTIVE_DAYS)
        marks = await self.state.inbox.newest_per_conversation(channel.name, since)
        if marks:
            catch_up(marks)

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
        lanes, transcripts = self.lanes, self.transcripts
        self.metrics.add_gauge(
            "parley_lane_active_runs", "Turns running now", lambda: lanes.stats().active_runs
        )
        self.metrics.add_gauge(
            "parley_lane_queued", "Messages waiting in session lanes", lambda: lanes.stats().queued
        )
        self.metrics.add_gauge(
            "parley_open_transcripts", "Transcripts kept open", lambda: len(transcripts)
        )

    async def wait_idle(self) -> None:
        await self.lanes.wait_idle()

    # -- messages and lane work -------------------------------------------------------

    async def handle_inbound(self, message: InboundMessage) -> None:
        """The channels' entry point: admitted, durable, then routed."""
        await self.inbound.handle(message)

    async def _run_lane(self, key: str, items: list[LaneItem | LaneTask]) -> None:
        if self.replicas is not None:  # PostgreSQL: other replicas share the session
            await self.replicas.run_locked(key, items)
        else:
            await self.dispatch.run_batch(key, items)

    async def run_in_lane(self, key: str, run: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``run`` in the session's lane (after what is queued there) and return its
        result; raises ``LaneBusy`` when the lane is full or the gateway is stopping."""
        task = LaneTask(run)
        submitted = await self.lanes.submit(key, task)
        if not submitted.accepted:
            raise LaneBusy(f"the session's queue is {submitted.status.value.replace('_', ' ')}")
        return await task.done

    async def redeliver_now(self, *, due_only: bool = False) -> int:
        """Queue again every reply a platform outage kept from being sent
        (``gateway.runtime.redelivery``). Returns how many were queued."""
        return await self.redelivery.redeliver_now(due_only=due_only)

    # -- sessions and transcripts (the admin API's view) ------------------------------

    async def transcript(self, record: SessionRecord) -> SessionTranscript:
        return await self.transcripts.get(record)

    async def current_transcript(self, record: SessionRecord) -> SessionTranscript:
        return await self.transcripts.current(record)

    async def cached_transcript(self, record: SessionRecord) -> SessionTranscript | None:
        return await self.transcripts.cached(record)

    async def compact_session(
        self, record: SessionRecord, chat_type: str, focus: str
    ) -> CompactionOutcome:
        """Compact now; the caller runs this in the session's lane. Raises ContextError."""
        return await self.sessions.compact(record, chat_type, focus)

    async def archive_session(self, record: SessionRecord, reason: str) -> None:
        """End a session; the caller runs this in the session's lane."""
        await self.sessions.archive(record, reason)

    async def context_report(
        self, record: SessionRecord | None, transcript: SessionTranscript | None, chat_type: str
    ) -> tuple[ContextReport, ContextView | None]:
        """What the next request would hold, by part, and how the history was cut."""
        return await self.commands.context_report(record, transcript, chat_type)


def _on_stop(
    stack: contextlib.AsyncExitStack, what: str, stop: Callable[[], Awaitable[Any] | None]
) -> None:
    """Register a stop step: its failure is logged and the steps after it still run."""

    async def step() -> None:
        try:
            result = stop()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                await result
        except Exception:
            log.exception("%s failed", what)

    stack.push_async_callback(step)
