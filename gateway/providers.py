"""Choosing and building the model provider from config.

``providers.default = "auto"`` picks Anthropic when a key is set, else an
OpenAI-compatible server when a key or base URL is set, else the tiny local model
(with a banner saying so). SDKs are imported lazily: anthropic alone costs ~1 s.
"""

from __future__ import annotations

from dataclasses import dataclass

from parley.core.providers.base import Provider
from parley.core.providers.provider_config import ProvidersConfig

# A dummy key for OpenAI-compatible local servers (Ollama, vLLM) that need none:
# the SDK refuses to start without one.
LOCAL_SERVER_DUMMY_KEY = "not-needed"


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    name: str  # "anthropic" | "openai" | "local"
    reason: str


def choose_provider(config: ProvidersConfig) -> ProviderChoice:
    if config.default != "auto":
        return ProviderChoice(config.default, f"providers.default = {config.default!r}")
    if config.anthropic.api_key is not None:
        return ProviderChoice("anthropic", "ANTHROPIC_API_KEY is set")
    if config.openai.api_key is not None or config.openai.base_url:
        return ProviderChoice("openai", "OPENAI_API_KEY or OPENAI_BASE_URL is set")
    return ProviderChoice("local", "no API key is set")


def build_provider(config: ProvidersConfig) -> tuple[Provider, str | None]:
    """The provider and, for the local model, a banner to show users."""
    choice = choose_provider(config)
    # Streams are bounded by silence (connect, stall); a whole call only when
    # ``timeout_seconds`` is configured.
    retry = config.retry
    if choice.name == "anthropic":
        from parley.core.providers.anthropic import AnthropicProvider

        key = config.anthropic.api_key
        return (
            AnthropicProvider(
                model=config.anthropic.model,
                api_key=key.get_secret_value() if key else "",
                base_url=config.anthropic.base_url,
                timeout=retry.timeout_seconds,
                connect_timeout=retry.connect_timeout_seconds,
                stall_timeout=retry.stall_timeout_seconds,
                vision=config.anthropic.vision,
            ),
            None,
        )
    if choice.name == "openai":
        from parley.core.providers.openai_compat import OpenAICompatProvider

        key = config.openai.api_key
        return (
            OpenAICompatProvider(
                model=config.openai.model,
                api_key=key.get_secret_value() if key else LOCAL_SERVER_DUMMY_KEY,
                base_url=config.openai.base_url,
                timeout=retry.timeout_seconds,
                connect_timeout=retry.connect_timeout_seconds,
                stall_timeout=retry.stall_timeout_seconds,
                vision=config.openai.sees_images(),
            ),
            None,
        )
    from parley.core.providers.local import BANNER, LocalProvider

    return LocalProvider(config.local), BANNER
