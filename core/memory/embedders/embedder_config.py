"""The embedder's config: ``[memory.embedder]``, nested in the ``[memory]`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from parley.core.memory.embedders.openai_compat import (
    DEFAULT_OPENAI_EMBEDDING_MODEL,
    DEFAULT_OPENAI_TIMEOUT_SECONDS,
)
from parley.core.memory.embedders.resilient import DEFAULT_FAILURE_LIMIT, DEFAULT_LOCKOUT_SECONDS

EmbedderProviderName = Literal["auto", "local", "e5", "openai", "none"]
FallbackProviderName = Literal["none", "e5", "local", "openai"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OpenAIEmbedderSettings(_Strict):
    base_url: str | None = Field(
        None,
        description="an OpenAI-compatible server, with or without /v1; "
        "api.openai.com when only api_key is set",
    )
    api_key: SecretStr | None = Field(None, description="sent as a Bearer token when set")
    model: str = Field(DEFAULT_OPENAI_EMBEDDING_MODEL, min_length=1)
    dimensions: int | None = Field(
        None, ge=1, le=16_384, description="ask for shortened vectors; default: the model's"
    )
    timeout_seconds: float = Field(DEFAULT_OPENAI_TIMEOUT_SECONDS, gt=0, le=600)

    @property
    def configured(self) -> bool:
        """Whether the operator pointed us at a server (``auto`` never guesses one)."""
        has_key = self.api_key is not None and bool(self.api_key.get_secret_value())
        return bool(self.base_url) or has_key


class EmbedderSettings(_Strict):
    # "auto": e5, else local (MiniLM), else openai when configured, else none (keyword-only).
    provider: EmbedderProviderName = "auto"
    # Overrides the primary's model. The in-process providers ship one model each, so
    # for them it may only name that model ("auto" passes over them when it does not).
    model: str | None = Field(None, min_length=1)
    fallback: FallbackProviderName = "none"
    openai: OpenAIEmbedderSettings = OpenAIEmbedderSettings()
    batch_size: int | None = Field(
        None, ge=1, le=2048, description="texts per call; default: the provider's own"
    )
    failure_limit: int = Field(DEFAULT_FAILURE_LIMIT, ge=1, le=100)
    lockout_seconds: float = Field(DEFAULT_LOCKOUT_SECONDS, ge=0, le=86_400)

    @model_validator(mode="after")
    def _fallback_is_another_embedder(self) -> EmbedderSettings:
        if self.fallback != "none" and self.fallback == self.provider:
            raise ValueError(f"fallback {self.fallback!r} is the provider itself")
        if self.provider == "none" and self.fallback != "none":
            raise ValueError(
                "provider 'none' is keyword-only by choice: a fallback would never run"
            )
        return self
