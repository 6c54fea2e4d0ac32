"""Several agents: who they are (``AgentSpec``), the config each one's parts read
(``loaded_for``), and which agent answers a message (``Bindings``).

Without ``[[agents]]`` there is one agent, ``[agent]``, and nothing here costs a message
anything: ``Bindings.agent_for`` returns the default at once. With bindings, a message
is matched against one dict per distinct set of fields the bindings use, most specific
set first (``gateway.agents_config``): a handful of dict lookups, never a scan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from parley.channels.base import InboundMessage
from parley.core.agent_config import AgentConfig
from parley.gateway.agents_config import BINDING_FIELDS, AgentEntry, BindingConfig
from parley.gateway.config import LoadedConfig, ParleyConfig
from parley.gateway.routing import normalise_account_id, normalise_channel

AGENTS_DIR = "agents"  # $PARLEY_HOME/agents/<id>/workspace: a non-default agent's


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One agent as the gateway runs it."""

    config: AgentConfig
    is_default: bool
    model: str | None = None  # None: the provider's
    provider: str | None = None  # None: the gateway's provider
    memory: bool = True
    tools_allow: tuple[str, ...] | None = None
    tools_deny: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def name(self) -> str:
        return self.config.name

    def keeps_tool(self, name: str) -> bool:
        if name in self.tools_deny:
            return False
        return self.tools_allow is None or name in self.tools_allow


def agent_specs(config: ParleyConfig) -> tuple[AgentSpec, ...]:
    """Every agent, the default first."""
    if not config.agents:
        return (AgentSpec(config.agent, is_default=True),)
    default = config.default_agent()
    specs = [_spec(entry, entry.id == default.id) for entry in config.agents]
    return tuple(sorted(specs, key=lambda s: not s.is_default))


def _spec(entry: AgentEntry, is_default: bool) -> AgentSpec:
    own = AgentConfig.model_validate(entry.model_dump(include=set(AgentConfig.model_fields)))
    return AgentSpec(
        own,
        is_default=is_default,
        model=entry.model,
        provider=entry.provider,
        memory=entry.memory,
        tools_allow=entry.tools_allow,
        tools_deny=entry.tools_deny,
    )


def agent_workspace(loaded: LoadedConfig, spec: AgentSpec) -> Path:
    """The default agent's workspace is where ``[agent]``'s always was; another agent's
    is its own ``workspace``, else ``$PARLEY_HOME/agents/<id>/workspace``."""
    if spec.config.workspace is not None:
        return spec.config.workspace.expanduser()
    if spec.is_default:
        return loaded.home / "workspace"
    return loaded.home / AGENTS_DIR / spec.id / "workspace"


def loaded_for(loaded: LoadedConfig, spec: AgentSpec) -> LoadedConfig:
    """The config as one agent's parts read it: ``[agent]`` is that agent, so its
    workspace, memory.db (``memory/<id>/``), notes and task records are its own. Only
    the default agent takes ``[memory]``'s ``db_path``, ``private_dir`` and absolute
    ``extra_paths``: another agent reading those would read the default's memory."""
    config = loaded.config
    if spec.is_default and config.agent == spec.config:
        return loaded
    agent = spec.config.model_copy(update={"workspace": agent_workspace(loaded, spec)})
    memory = config.memory
    if not spec.is_default:
        memory = memory.model_copy(
            update={
                "db_path": None,
                "private_dir": None,
                "extra_paths": tuple(p for p in memory.extra_paths if not p.is_absolute()),
            }
        )
    memory = memory.model_copy(update={"enabled": memory.enabled and spec.memory})
    derived = config.model_copy(update={"agent": agent, "memory": memory})
    return dataclasses.replace(loaded, config=derived)


# -- which agent answers a message ----------------------------------------------------

_Table = tuple[tuple[str, ...], dict[tuple[str, ...], str]]


class Bindings:
    """``[[bindings]]`` as lookup tables (see the module doc)."""

    def __init__(self, bindings: Sequence[BindingConfig], default: str) -> None:
        self.default = default
        tables: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
        for binding in bindings:
            fields = binding.fields
            values = tuple(_binding_value(binding, name) for name in fields)
            tables.setdefault(fields, {}).setdefault(values, binding.agent)  # first wins
        # peer before chat before guild before account before channel, field by field.
        self._tables: tuple[_Table, ...] = tuple(
            sorted(tables.items(), key=lambda t: tuple(n not in t[0] for n in BINDING_FIELDS))
        )

    def __bool__(self) -> bool:
        return bool(self._tables)

    def agent_for(self, message: InboundMessage) -> str:
        for fields, table in self._tables:
            values = _message_values(message, fields)
            if values is not None:
                found = table.get(values)
                if found is not None:
                    return found
        return self.default


def _binding_value(binding: BindingConfig, name: str) -> str:
    value = getattr(binding, name)
    assert value is not None
    if name == "channel":
        return normalise_channel(value)
    if name == "account":
        return normalise_account_id(value)
    return str(value)


def _message_values(message: InboundMessage, fields: tuple[str, ...]) -> tuple[str, ...] | None:
    values: list[str] = []
    group = message.chat_type != "direct"
    for name in fields:
        if name == "peer":
            value = None if group else message.sender_id or message.chat_id
        elif name == "chat":
            value = message.chat_id if group else None
        elif name == "guild":
            value = message.guild_id
        elif name == "account":
            value = normalise_account_id(message.account)
        else:
            value = normalise_channel(message.channel)
        if not value:
            return None
        values.append(value.lower())
    return tuple(values)
