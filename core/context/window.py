"""Which context window a model has, whether it is usable, and where compaction triggers.

Resolution order (OpenClaw's guard, openclaw-design.md section 3, plus a provider step):
the operator's config for the model, then what the provider itself says (a local model
knows its own ``n_ctx``), then the built-in table, then ``config.default_window``. The
agent cap (``agent_max_tokens``) applies last and only downward: it exists to keep a
session smaller (cost, latency), never to pretend a small model is bigger.

The table is matched by exact id first (case-insensitive), then by the longest prefix, so
``claude-sonnet-4-5-20250929`` finds ``claude-`` and ``gpt-4o-mini-2024-07-18`` finds
``gpt-4o-mini`` rather than ``gpt-4``. A ``provider/`` prefix (``openai/gpt-4o``) is tried
without it when the full id is unknown. Claude ids ending in ``[1m]`` name the 1M-token
beta window.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from parley.core.context.budget import (
    HISTORY_MESSAGE_BANDS,
    HISTORY_MESSAGES_ABOVE_BANDS,
    compaction_threshold,
    derived_history_messages,
    effective_reserve,
)
from parley.core.context.config import ContextConfig
from parley.core.errors import WindowTooSmallError

log = logging.getLogger("parley.core.window")

CLAUDE_1M_SUFFIX = "[1m]"
CLAUDE_1M_WINDOW = 1_000_000

# The sizes planned from the window live in core.context.budget; these names stay
# importable from here, where they were first defined.
__all__ = [
    "HISTORY_MESSAGES_ABOVE_BANDS",
    "HISTORY_MESSAGE_BANDS",
    "KNOWN_CONTEXT_WINDOWS",
    "WindowInfo",
    "can_summarise",
    "check_window",
    "compaction_threshold",
    "derived_history_messages",
    "effective_reserve",
    "known_window",
    "model_window",
    "prompt_only_window",
    "provider_window",
    "resolve_window",
]

KNOWN_CONTEXT_WINDOWS: Mapping[str, int] = MappingProxyType(
    {
        # Anthropic: every current Claude family has 200k (1M via the "[1m]" suffix).
        "claude-": 200_000,
        "claude-3": 200_000,
        "claude-sonnet-4": 200_000,
        "claude-opus-4": 200_000,
        "claude-haiku-4": 200_000,
        "claude-2.0": 100_000,
        "claude-instant": 100_000,
        # OpenAI.
        "gpt-5": 400_000,
        "gpt-4.1": 1_047_576,
        "gpt-4o": 128_000,
        "gpt-4o-mini": 128_000,
        "gpt-4-turbo": 128_000,
        "gpt-4-1106": 128_000,
        "gpt-4-0125": 128_000,
        "gpt-4": 8_192,
        "gpt-4-32k": 32_768,
        "gpt-3.5-turbo": 16_385,
        "o1": 200_000,
        "o1-mini": 128_000,
        "o1-preview": 128_000,
        "o3": 200_000,
        "o4-mini": 200_000,
        # Local models, by their Ollama names ("llama3.1:8b" matches "llama3.1").
        "llama3": 8_192,
        "llama3.1": 131_072,
        "llama3.2": 131_072,
        "llama3.3": 131_072,
        "qwen2.5": 32_768,
        "mistral": 32_768,
        "gemma2": 8_192,
        "smollm2": 8_192,
    }
)
# Longest first, so the first prefix hit is the longest one.
_PREFIXES: tuple[str, ...] = tuple(sorted(KNOWN_CONTEXT_WINDOWS, key=len, reverse=True))

WindowSource = Literal["config", "provider", "table", "default"]


@dataclass(frozen=True)
class WindowInfo:
    tokens: int
    source: WindowSource
    capped: bool  # True when agent_max_tokens lowered the window
    # Where the provider's figure came from ("llama.cpp /props"), for messages.
    detail: str = ""


def _table_lookup(model_id: str) -> int | None:
    exact = KNOWN_CONTEXT_WINDOWS.get(model_id)
    if exact is not None:
        return exact
    for prefix in _PREFIXES:
        if model_id.startswith(prefix):
            return KNOWN_CONTEXT_WINDOWS[prefix]
    return None


def known_window(model: str) -> int | None:
    """The built-in table's window for ``model``, or None when it is not known."""
    model_id = model.strip().lower()
    if not model_id:
        return None
    candidates = [model_id]
    if "/" in model_id:
        candidates.append(model_id.rsplit("/", 1)[1])
    for candidate in candidates:
        if candidate.endswith(CLAUDE_1M_SUFFIX):
            base = candidate[: -len(CLAUDE_1M_SUFFIX)]
            if base.startswith("claude"):
                return CLAUDE_1M_WINDOW
            candidate = base
        found = _table_lookup(candidate)
        if found is not None:
            return found
    return None


def resolve_window(
    model: str,
    config: ContextConfig,
    *,
    provider_window: int | None = None,
    provider_source: str = "",
) -> WindowInfo:
    """The usable window: config → provider → table → default, then the agent cap."""
    tokens: int
    source: WindowSource
    detail = ""
    override = config.models.get(model.strip().lower())
    configured = None
    if override is not None:
        configured = (
            override.context_tokens
            if override.context_tokens is not None
            else override.context_window
        )
    table = known_window(model)
    if configured is not None:
        tokens, source = configured, "config"
    elif provider_window is not None and provider_window > 0:
        tokens, source, detail = provider_window, "provider", provider_source
    elif table is not None:
        tokens, source = table, "table"
    else:
        tokens, source = config.default_window, "default"
    cap = config.agent_max_tokens
    if cap is not None and cap < tokens:
        return WindowInfo(cap, source, True, detail)
    return WindowInfo(tokens, source, False, detail)


def provider_window(provider: object) -> tuple[int | None, str]:
    """The window a provider knows for its own model (its ``context_window``, else what
    its server said in ``facts``) and where that came from ("llama.cpp /props")."""
    facts = getattr(provider, "facts", None)
    own = getattr(provider, "context_window", None) or getattr(facts, "context_window", None)
    return (own if isinstance(own, int) else None), str(getattr(facts, "source", "") or "")


def model_window(model: str, config: ContextConfig, provider: object) -> WindowInfo:
    """``model``'s window as the engine uses it: the provider's discovered window counts
    for its own model only (a session on another model id gets the config, the table or
    the default)."""
    own: int | None = None
    source = ""
    if model == getattr(provider, "model", None):
        own, source = provider_window(provider)
    return resolve_window(model, config, provider_window=own, provider_source=source)


def prompt_only_window(provider: object) -> bool:
    """Whether the provider's server counts only the prompt against its window (and
    stops a reply that fills it) rather than the prompt plus max_tokens."""
    return bool(getattr(getattr(provider, "facts", None), "prompt_only_window", False))


def can_summarise(
    config: ContextConfig, provider: object, model: str, *, default: bool = True
) -> bool:
    """Whether ``model`` may be asked for compaction summaries: ``context.models.<id>
    .summaries`` when set, else no when the provider says it cannot (``supports_summaries``:
    a 135M model copies the dialogue back instead of summarising it), else ``default``
    (the model profile's: the small profile does not ask)."""
    override = config.models.get(model.strip().lower())
    if override is not None and override.summaries is not None:
        return override.summaries
    if getattr(provider, "supports_summaries", True) is False:
        return False
    return default


def check_window(info: WindowInfo, *, min_tokens: int, warn_below: int) -> None:
    """Block a window too small to hold a prompt; warn about a merely small one."""
    origin = f"from {info.source}" + (f" ({info.detail})" if info.detail else "")
    origin += ", capped by agent_max_tokens" if info.capped else ""
    if info.tokens < min_tokens:
        raise WindowTooSmallError(
            f"context window of {info.tokens:,} tokens ({origin}) is below the minimum of "
            f"{min_tokens:,} tokens; use a model with a larger window or raise "
            f"context.models.<model>.context_tokens / agent_max_tokens",
            used=None,
            limit=info.tokens,
        )
    if info.tokens < warn_below:
        log.warning(
            "small context window: %s tokens (%s), below the recommended %s; "
            "expect frequent compaction and short replies",
            f"{info.tokens:,}",
            origin,
            f"{warn_below:,}",
        )
