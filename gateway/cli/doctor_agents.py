"""`parley doctor`'s ``agents`` findings: every agent (id, name, workspace, model,
memory, tools) and every binding, most specific first, as the gateway resolves them
(``gateway.agents``). A workspace that is not there yet is fine (the first run makes
it); one that is a file is an error."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from parley.core.tools.builtin import default_registry
from parley.gateway.agents import AgentSpec, agent_specs, agent_workspace
from parley.gateway.agents_config import BINDING_FIELDS
from parley.gateway.config import LoadedConfig
from parley.gateway.runtime.agents import AgentToolsError, agent_tools

Severity = Literal["ok", "warning", "error"]


def agents_findings(loaded: LoadedConfig) -> list[tuple[str, Severity, str]]:
    """(check, severity, detail) per agent, then one for the bindings (blocking: stats
    the workspaces; call it from a thread)."""
    config = loaded.config
    found: list[tuple[str, Severity, str]] = []
    for spec in agent_specs(config):
        workspace = agent_workspace(loaded, spec)
        severity: Severity = "ok"
        note = ""
        if workspace.exists() and not workspace.is_dir():
            severity, note = "error", " (not a directory)"
        elif not workspace.exists():
            note = " (created on the first run)"
        try:  # a tool name that is none: the gateway would refuse to start
            agent_tools(default_registry(), spec)
        except AgentToolsError as exc:
            severity, note = "error", f"{note}; {exc}"
        found.append((f"agent {spec.id}", severity, _describe(spec, workspace, note, loaded)))
    bindings = config.bindings
    if not config.agents and not bindings:
        return found
    if not bindings:
        found.append(("bindings", "ok", f"none: {agent_specs(config)[0].id} answers everything"))
        return found
    order = sorted(
        range(len(bindings)),
        key=lambda i: (tuple(n not in bindings[i].fields for n in BINDING_FIELDS), i),
    )
    lines = []
    for i in order:
        binding = bindings[i]
        match = ", ".join(f"{n}={getattr(binding, n)}" for n in binding.fields)
        lines.append(f"{match} -> {binding.agent}")
    default = agent_specs(config)[0].id
    found.append(
        (
            "bindings",
            "ok",
            f"{len(bindings)}, most specific first: " + "; ".join(lines) + f"; else {default}",
        )
    )
    return found


def _describe(spec: AgentSpec, workspace: Path, note: str, loaded: LoadedConfig) -> str:
    memory = "on" if loaded.config.memory.enabled and spec.memory else "off"
    tools = "all tools"
    if spec.tools_allow is not None:
        tools = "tools " + ", ".join(spec.tools_allow)
    if spec.tools_deny:
        tools += " but " + ", ".join(spec.tools_deny)
    model = spec.model or "the provider default"
    if spec.provider is not None:
        model += f" on {spec.provider}"
    return (
        f"{spec.name}{' (default)' if spec.is_default else ''}; workspace {workspace}{note}; "
        f"model {model}; memory {memory}; {tools}"
    )
