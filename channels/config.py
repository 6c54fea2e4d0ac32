"""Config models owned by the channel adapters (the ``[channels]`` section)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TerminalConfig(_Strict):
    # The terminal chat is what `parley run` starts when no other channel is configured.
    enabled: bool = Field(False, description="run the terminal chat beside other channels")
    sender_id: str = Field("local", min_length=1, max_length=64, description="who you are")
    sender_name: str = Field("You", min_length=1, max_length=64)
    prompt: str = Field("you> ", max_length=32)
    max_input_chars: int = Field(32_000, ge=1, le=1_000_000, description="longer lines are refused")


class ChannelsConfig(_Strict):
    terminal: TerminalConfig = TerminalConfig()

    def configured(self) -> list[str]:
        """Names of the channels the operator turned on."""
        return [name for name in ("terminal",) if getattr(self, name).enabled]
