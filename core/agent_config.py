"""The ``[agent]`` config section: who the agent is, where its workspace is, and the
bounds of one turn (output tokens, tool iterations, the size of a tool result)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_AGENT_ID = "main"
DEFAULT_MAX_OUTPUT_TOKENS = 4096
DEFAULT_MAX_TOOL_ITERATIONS = 8
DEFAULT_TOOL_RESULT_MAX_CHARS = 40_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentConfig(_Strict):
    id: str = Field(DEFAULT_AGENT_ID, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    name: str = Field("Parley", min_length=1, max_length=64)
    workspace: Path | None = Field(None, description="default: $PARLEY_HOME/workspace")
    max_output_tokens: int = Field(DEFAULT_MAX_OUTPUT_TOKENS, ge=1, le=128_000)
    max_tool_iterations: int = Field(DEFAULT_MAX_TOOL_ITERATIONS, ge=0, le=64)
    tool_result_max_chars: int = Field(DEFAULT_TOOL_RESULT_MAX_CHARS, ge=1000, le=1_000_000)
    # How parley drives the model (core/model_profile.py): "small" is a short system
    # prompt, a compact turn context and compaction without a model call; "auto" picks
    # it for windows below 16k tokens and for the embedded model.
    profile: Literal["auto", "standard", "small"] = "auto"
