"""One agent's parts: its workspace, system prompt, tools, context engine, memory index
and runner, built at start (``build_agent``) on the gateway's exit stack.

Every agent shares the provider (its ``model`` is passed with each request), the state
stores and the lanes. What is private to an agent is built here from its own config
(``gateway.agents.loaded_for``): its workspace (the file tools see that one only, and
never another agent's), its memory.db (``memory/<id>/``), notes and task records, and a
memory index that reads only its own sessions' transcripts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine
from parley.core.context.flush import FlushTarget
from parley.core.context.window import model_window
from parley.core.memory.index import MemoryIndex
from parley.core.memory.notes import NoteStore
from parley.core.memory.recall import Recaller
from parley.core.model_profile import ModelProfile, choose_profile
from parley.core.prompt import SystemPromptBuilder
from parley.core.providers.base import Provider
from parley.core.runner import Runner
from parley.core.tools.builtin import default_registry
from parley.core.tools.memory import (
    MEMORY_GET_TOOL,
    MEMORY_SEARCH_TOOL,
    REMEMBER_TOOL,
    memory_tools,
)
from parley.core.tools.tool_registry import ToolRegistry
from parley.gateway.agents import AgentSpec, agent_workspace, loaded_for
from parley.gateway.audiences import header_audience
from parley.gateway.config import LoadedConfig, ParleyConfig
from parley.gateway.errors import GatewayError
from parley.gateway.memory import build_memory_index, notes_dir, private_roots
from parley.gateway.providers import build_provider
from parley.gateway.workspace import ensure_workspace

if TYPE_CHECKING:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from parley.gateway.admin.metrics import GatewayMetrics
    from parley.gateway.audiences import PersonLinks
    from parley.gateway.storage.stores import StateStores

log = logging.getLogger("parley.gateway.agents")

MEMORY_TOOL_NAMES = frozenset({MEMORY_SEARCH_TOOL, MEMORY_GET_TOOL, REMEMBER_TOOL})


class AgentToolsError(GatewayError):
    """An agent's tools_allow or tools_deny names a tool there is not."""


class AgentHost(Protocol):
    """What building an agent reads of the runtime (``gateway.runtime.context``)."""

    @property
    def loaded(self) -> LoadedConfig: ...
    @property
    def provider(self) -> Provider: ...
    @property
    def state(self) -> StateStores: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def person_links(self) -> PersonLinks: ...
    @property
    def zone(self) -> ZoneInfo: ...
    @property
    def clock(self) -> Callable[[], datetime]: ...


@dataclass(slots=True)
class AgentParts:
    """What one agent runs with."""

    spec: AgentSpec
    loaded: LoadedConfig  # the config as this agent reads it
    provider: Provider  # the gateway's, or its own ([[agents]] provider)
    model: str  # the model its requests name
    runner: Runner
    engine: ContextEngine
    prompt: SystemPromptBuilder
    profile: ModelProfile
    memory: MemoryIndex | None

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def workspace(self) -> Path:
        return self.loaded.workspace


def tools_offered(provider: Provider, context: ContextConfig, model: str | None = None) -> bool:
    """Whether the model gets tool schemas: the operator's word for the model
    (``[context.models."<id>"] tools``), else what its server said at start (llama.cpp's
    ``/props``), else yes. A model whose template has no tools would have them dropped
    silently by its server, and parley would still count them in every estimate."""
    override = context.models.get((model or provider.model).strip().lower())
    if override is not None and override.tools is not None:
        return override.tools
    return bool(getattr(provider, "supports_tools", True))


def agent_tools(registry: ToolRegistry, spec: AgentSpec) -> ToolRegistry:
    """The registry less what the agent's ``tools_allow`` / ``tools_deny`` leave out. A
    name that is no tool at all is an error: a typo must not leave a tool on."""
    known = set(registry.names) | MEMORY_TOOL_NAMES
    unknown = sorted({*(spec.tools_allow or ()), *spec.tools_deny} - known)
    if unknown:
        raise AgentToolsError(
            f"agent {spec.id!r}: no tool named {', '.join(unknown)} "
            f"(there are {', '.join(sorted(known))})"
        )
    if spec.tools_allow is None and not spec.tools_deny:
        return registry
    kept = ToolRegistry(
        max_result_chars=registry.max_result_chars, timeout_seconds=registry.timeout_seconds
    )
    for name in registry.names:
        tool = registry.get(name)
        if tool is not None and spec.keeps_tool(name):
            kept.register(tool)
    return kept


def other_workspaces(
    loaded: LoadedConfig, specs: Sequence[AgentSpec], own: AgentSpec
) -> list[Path]:
    """The other agents' workspaces, which this agent's file tools must not reach (its
    own workspace may hold them). One that holds this agent's own is left out: the
    tools never leave their workspace anyway."""
    mine = agent_workspace(loaded, own).absolute()
    found: list[Path] = []
    for spec in specs:
        if spec.id == own.id:
            continue
        place = agent_workspace(loaded, spec).absolute()
        if place != mine and not mine.is_relative_to(place):
            found.append(place)
    return found


async def build_agent(
    rt: AgentHost,
    spec: AgentSpec,
    specs: Sequence[AgentSpec],
    *,
    on_stop: Callable[[str, Callable[[], Awaitable[Any] | None]], None],
) -> AgentParts:
    """Start one agent's parts; each part that needs stopping is registered with
    ``on_stop`` as soon as it started, so a failure later stops what did start."""
    loaded = loaded_for(rt.loaded, spec)
    config, provider = loaded.config, rt.provider
    if spec.provider is not None and spec.provider != provider.name:
        provider = await _own_provider(config, spec, on_stop)
    agent, context = config.agent, config.context
    workspace = loaded.workspace
    await asyncio.to_thread(ensure_workspace, workspace)
    model = spec.model or provider.model
    private = (*private_roots(loaded), *other_workspaces(rt.loaded, specs, spec))
    tools = default_registry(agent.tool_result_max_chars, private_roots=private)
    offer_tools = tools_offered(provider, context, model)
    # The profile follows the model's window as the server or its file states it.
    window = model_window(model, context, provider)
    profile = choose_profile(agent.profile, window=window.tokens, provider=provider)
    use_sampling = getattr(provider, "use_sampling", None)
    if use_sampling is not None and profile.sampling() and spec.is_default:
        use_sampling(profile.sampling())  # a llama.cpp server: against looping
    log.info(
        "agent %s: model %s: window %s tokens (%s), profile %s",
        spec.id,
        model,
        f"{window.tokens:,}",
        window.detail or window.source,
        profile.name,
    )
    memory = None
    if config.memory.enabled:
        # On PostgreSQL the index shares the state's pool (None: memory.db).
        memory = build_memory_index(loaded, db=rt.state.pg)
        memory.on_search = rt.metrics.search
        await memory.start()  # the first sync runs in the background
        on_stop(f"closing agent {spec.id}'s memory index", memory.close)
        for tool in memory_tools(memory):
            tools.register(tool)
    tools = agent_tools(tools, spec)
    prompt = SystemPromptBuilder(
        workspace,
        agent_name=agent.name,
        tools=tools.specs() if offer_tools else (),
        file_max_chars=context.file_max_chars,
        total_max_chars=context.total_max_chars,
        memory_enabled=memory is not None and offer_tools,
        profile=profile,
    )
    # The engine's threshold needs the output the provider will really allow.
    max_output = min(
        agent.max_output_tokens,
        getattr(provider, "max_output_tokens", None) or agent.max_output_tokens,
    )
    engine = ContextEngine(
        config=context,
        provider=provider,
        retry=config.providers.retry,
        max_output=max_output,
        flush_target=FlushTarget(
            memory.notes if memory is not None else NoteStore(notes_dir(loaded)),
            lambda header: header_audience(header.to_dict(), rt.person_links.names),
        ),
        checkpoints_dir=loaded.checkpoints_dir,
        zone=lambda: rt.zone,
        now=rt.clock,
        # A separate summary model ([context.compaction] model) is the operator's
        # choice of a summariser: the profile does not second-guess it.
        summaries_by_default=profile.summaries or context.compaction.model is not None,
    )
    # Load the tokenizer now (~0.3 s), not in the first person's turn.
    await asyncio.to_thread(engine.counter.text, "warm up")
    runner = Runner(
        provider=provider,
        tools=tools,
        prompt=prompt,
        agent=agent,
        retry=config.providers.retry,
        workspace=workspace,
        offer_tools=offer_tools,
        now=rt.clock,
        engine=engine,
        recaller=(
            Recaller.for_index(memory, config.memory, engine.counter)
            if memory is not None
            else None
        ),
        model=spec.model,
    )
    return AgentParts(spec, loaded, provider, model, runner, engine, prompt, profile, memory)


async def _own_provider(
    config: ParleyConfig,
    spec: AgentSpec,
    on_stop: Callable[[str, Callable[[], Awaitable[Any] | None]], None],
) -> Provider:
    """The agent's own provider: ``[providers]`` with its ``provider`` as the default."""
    providers = config.providers.model_copy(update={"default": spec.provider})
    provider, _ = build_provider(providers)
    on_stop(f"closing agent {spec.id}'s provider", provider.aclose)
    warm_up = getattr(provider, "start", None)
    if warm_up is not None:  # the local model loads here, not on the first message
        await warm_up()
    log.info("agent %s: provider %s (%s)", spec.id, provider.name, provider.model)
    return provider
