"""``Runtime``: what every stage of the gateway's work shares.

Built with the gateway; the model-side parts (provider, engine, runner, prompt,
memory index) are filled in by ``Gateway.start`` and read through properties that
fail loudly before then. The rules every stage applies the same way live here too:
which session a message belongs to, whose memory it writes and reads, the context
window of a session's model, and how a state write that must not fail a message is
made.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from parley.channels.base import Channel, InboundMessage
from parley.core.context.compaction.stats import CompactionStats
from parley.core.context.engine import ContextEngine
from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.index import MemoryIndex
from parley.core.model_profile import STANDARD, ModelProfile
from parley.core.prompt import SystemPromptBuilder
from parley.core.providers.base import Provider
from parley.core.runner import Runner
from parley.core.transcript_store import SessionTranscript
from parley.gateway.admin.gateway_view import ProviderHealth
from parley.gateway.admin.metrics import GatewayMetrics
from parley.gateway.admin.session_figures import SessionFiguresCache
from parley.gateway.admin.session_figures import figures as session_figures
from parley.gateway.agents import AgentSpec, Bindings, agent_specs
from parley.gateway.audiences import PersonLinks, audience_for, viewer_for
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import NotStarted
from parley.gateway.routing import SessionRoute, key_agent_id, resolve_session_key
from parley.gateway.storage.errors import storage_failure
from parley.gateway.storage.sessions import SessionRecord
from parley.gateway.storage.stores import StateStores

if TYPE_CHECKING:
    from parley.gateway.runtime.agents import AgentParts
    from parley.gateway.storage.inbox import Inbox
    from parley.gateway.storage.pairing import PairingStore
    from parley.gateway.storage.sessions import SessionRegistry

log = logging.getLogger("parley.gateway")


class Runtime:
    """The shared parts of one gateway (see the module doc)."""

    def __init__(
        self,
        loaded: LoadedConfig,
        *,
        channels: Mapping[str, Channel],
        state: StateStores,
        metrics: GatewayMetrics,
        clock: Callable[[], datetime],
    ) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self.channels = channels
        self.state = state
        self.metrics = metrics
        self.figures = SessionFiguresCache()
        self.clock = clock
        self.zone = ZoneInfo("UTC")  # the configured zone, resolved at start (reads files)
        # The identity links as memory reads them: which person ids are one person.
        self.person_links = PersonLinks(loaded.config.session)
        self.provider_health = ProviderHealth()
        self._provider: Provider | None = None
        # The agents (the default first), which one answers a message, and each
        # one's parts once started (gateway/runtime/agents.py). ``memory``, ``engine``,
        # ``runner``, ``prompt`` and ``profile`` below are the default agent's.
        self.agent_specs: tuple[AgentSpec, ...] = agent_specs(loaded.config)
        self.default_agent_id = self.agent_specs[0].id
        self.bindings = Bindings(loaded.config.bindings, self.default_agent_id)
        self.agents: dict[str, AgentParts] = {}
        self._default_parts: AgentParts | None = None

    # -- the state stores (read through: an operator's tool may swap one) --------------------

    @property
    def registry(self) -> SessionRegistry:
        return self.state.registry

    @property
    def inbox(self) -> Inbox:
        return self.state.inbox

    @property
    def pairing(self) -> PairingStore:
        return self.state.pairing

    # -- the parts built at start ---------------------------------------------------------

    @property
    def provider(self) -> Provider:
        if self._provider is None:
            raise NotStarted("the gateway is not started")
        return self._provider

    @provider.setter
    def provider(self, provider: Provider) -> None:
        self._provider = provider

    @property
    def has_provider(self) -> bool:
        return self._provider is not None

    # The default agent's parts (``add_agent``): what callers that know no session ask.

    def _default(self) -> AgentParts:
        if self._default_parts is None:
            raise NotStarted("the gateway is not started")
        return self._default_parts

    @property
    def memory(self) -> MemoryIndex | None:
        """None before start, after stop, and for good when [memory] enabled = false."""
        return self._default_parts.memory if self._default_parts else None

    @property
    def profile(self) -> ModelProfile:
        """How the model is driven (core/model_profile.py), chosen at start."""
        return self._default_parts.profile if self._default_parts else STANDARD

    @property
    def engine(self) -> ContextEngine:
        return self._default().engine

    @property
    def engine_or_none(self) -> ContextEngine | None:
        return self._default_parts.engine if self._default_parts else None

    @property
    def runner(self) -> Runner:
        return self._default().runner

    @property
    def runner_or_none(self) -> Runner | None:
        return self._default_parts.runner if self._default_parts else None

    @property
    def prompt(self) -> SystemPromptBuilder:
        return self._default().prompt

    @property
    def prompt_or_none(self) -> SystemPromptBuilder | None:
        return self._default_parts.prompt if self._default_parts else None

    def add_agent(self, parts: AgentParts) -> None:
        """One agent started; the default agent's parts are also the properties above."""
        self.agents[parts.id] = parts
        if parts.spec.is_default:
            self._default_parts = parts

    def agent(self, key: str | None) -> AgentParts:
        """The parts of the agent a session key names (``agent:<id>:...``); the default
        agent's for None or an agent no longer configured. Raises NotStarted before start."""
        parts = self._default_parts
        if parts is None:
            raise NotStarted("the gateway is not started")
        if key is None or len(self.agents) == 1:
            return parts
        return self.agents.get(key_agent_id(key), parts)

    # -- rules every stage applies --------------------------------------------------------

    def route(self, message: InboundMessage) -> SessionRoute:
        """The session a message belongs to; the binding decides its agent."""
        return resolve_session_key(
            agent_id=self.bindings.agent_for(message),
            channel=message.channel,
            account=message.account,
            chat_type=message.chat_type,
            chat_id=message.chat_id,
            sender_id=message.sender_id,
            thread_id=message.thread_id,
            config=self.config.session,
        )

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

    def window_for(self, record: SessionRecord | None) -> int:
        """The session's context window in tokens: its model's, or the smaller one a
        provider's refusal taught the session (``ContextEngine.session_window``)."""
        key = record.key if record else None
        parts = self.agent(key)
        model = (record.settings.get("model") if record else None) or parts.model
        return parts.engine.session_window(key, model)

    async def note_figures(
        self,
        record: SessionRecord,
        transcript: SessionTranscript,
        used: int,
        *,
        compacted: bool = False,
    ) -> CompactionStats:
        """Refresh the session's figures (and its metrics) after a turn or compaction.
        Whatever was appended since the last refresh is folded in, a compaction among
        it or not, so ``compacted`` needs no special path (it reads the new entries
        only, ``SessionFiguresCache``)."""
        stats = await self.figures.stats(record.session_id, transcript)
        self.metrics.session(
            record.session_id, session_figures(stats, used, self.window_for(record))
        )
        return stats

    async def bookkeep(self, what: str, write: Awaitable[Any]) -> bool:
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


def last_entry_id(transcript: SessionTranscript) -> str | None:
    last = transcript.last_entry
    return last.id if last is not None else None
