"""The ``[[agents]]`` and ``[[bindings]]`` config sections: several agents, and which
conversations each one answers.

Without ``[[agents]]`` the one agent is ``[agent]`` (id "main" by default), exactly as
before. With ``[[agents]]`` each entry is an agent: its own name, workspace, model,
memory and tools, plus the ``[agent]`` limits (which ``[agent]`` gives every entry as
defaults). The entry with ``default = true`` (else the first) answers every
conversation no binding names.

A binding names an agent and what it matches: ``peer`` (a person's sender id, in direct
chats), ``chat`` (a group or guild channel id), ``guild`` (a Discord guild id),
``account`` (a bot account) and ``channel`` (telegram, discord, web, terminal). Every
field it gives must match. The most specific binding wins: one with a ``peer`` beats one
without, then ``chat``, then ``guild``, then ``account``, then ``channel``; between two
bindings with the very same fields the first in the file wins. The resolver is in
``gateway.bindings``.

Arrays of tables are set in the TOML file only: no environment variable reaches them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from parley.core.agent_config import AgentConfig

# What ``[agent]`` hands every ``[[agents]]`` entry as defaults (not id, name, workspace).
INHERITED_LIMITS = ("max_output_tokens", "max_tool_iterations", "tool_result_max_chars", "profile")
BINDING_FIELDS = ("peer", "chat", "guild", "account", "channel")  # most specific first
_TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class AgentEntry(AgentConfig):
    """One ``[[agents]]`` entry: an ``[agent]`` section plus what makes it its own."""

    default: bool = Field(False, description="answers every conversation no binding names")
    model: str | None = Field(
        None, min_length=1, max_length=200, description="the provider's model for this agent"
    )
    provider: Literal["anthropic", "openai", "local"] | None = Field(
        None, description="another of [providers] for this agent; default: the gateway's"
    )
    memory: bool = Field(True, description="its own long-term memory (needs [memory] enabled)")
    tools_allow: tuple[str, ...] | None = Field(
        None, description="only these tools (by name); unset: every tool"
    )
    tools_deny: tuple[str, ...] = Field((), description="never these tools (by name)")

    @field_validator("tools_allow", "tools_deny")
    @classmethod
    def _tool_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for name in value or ():
            if not re.fullmatch(_TOOL_NAME, name):
                raise ValueError(f"{name!r} is not a tool name")
        return value


class BindingConfig(BaseModel):
    """One ``[[bindings]]`` entry: an agent and what it answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str = Field(min_length=1, max_length=64, description="the agent's id")
    channel: str | None = Field(None, min_length=1, description="telegram, discord, web, ...")
    account: str | None = Field(None, min_length=1, description="a bot account's name")
    guild: str | None = Field(None, min_length=1, description="a Discord guild id")
    chat: str | None = Field(None, min_length=1, description="a group or guild channel id")
    peer: str | None = Field(None, min_length=1, description="a person's sender id (DMs)")

    @field_validator("channel", "account", "guild", "chat", "peer", mode="before")
    @classmethod
    def _as_text(cls, value: object) -> object:
        # Ids are often numbers: ``peer = 12345`` means the id "12345".
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str):
            return value.strip().lower()
        return value

    @model_validator(mode="after")
    def _matches_something(self) -> BindingConfig:
        if all(getattr(self, name) is None for name in BINDING_FIELDS):
            raise ValueError(f"a binding needs at least one of {', '.join(BINDING_FIELDS)}")
        return self

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields it matches on, most specific first."""
        return tuple(name for name in BINDING_FIELDS if getattr(self, name) is not None)


def inherit_limits(data: object) -> object:
    """Raw config data with ``[agent]``'s limits copied into each ``[[agents]]`` entry
    that does not set them (before validation)."""
    if not isinstance(data, dict):
        return data
    agents, base = data.get("agents"), data.get("agent")
    if not isinstance(agents, list) or not isinstance(base, dict):
        return data
    inherited = {k: base[k] for k in INHERITED_LIMITS if k in base}
    if not inherited:
        return data
    merged = [{**inherited, **e} if isinstance(e, dict) else e for e in agents]
    return {**data, "agents": merged}


def check_agents(
    agents: tuple[AgentEntry, ...], bindings: tuple[BindingConfig, ...], single_id: str
) -> None:
    """Unique ids, one default at most, distinct workspaces, bindings to known agents;
    raises ValueError naming what is wrong."""
    ids = [a.id for a in agents] or [single_id]
    seen: set[str] = set()
    for agent_id in ids:
        if agent_id in seen:
            raise ValueError(f"agents: the id {agent_id!r} is used twice")
        seen.add(agent_id)
    defaults = [a.id for a in agents if a.default]
    if len(defaults) > 1:
        raise ValueError(f"agents: only one may be default = true, not {', '.join(defaults)}")
    places: dict[str, str] = {}
    for agent in agents:
        if agent.workspace is None:
            continue
        place = str(agent.workspace.expanduser())
        if place in places:
            raise ValueError(
                f"agents: {places[place]!r} and {agent.id!r} share the workspace {place}"
            )
        places[place] = agent.id
    for number, binding in enumerate(bindings, start=1):
        if binding.agent not in seen:
            raise ValueError(
                f"bindings: entry {number} names the agent {binding.agent!r}, which is not "
                f"one of {', '.join(sorted(seen))}"
            )
