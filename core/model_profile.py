"""How parley drives a model by its size: the "standard" profile and the "small" one.

A large model takes parley's full system prompt (identity, tooling, safety, memory
recall, workspace, the workspace files up to 150,000 characters, silent replies) and a
turn-context block on every user message in its stride. A small one does not:
SmolLM2-135M, the embedded default, looped on 9 of 19 replies with them and answered
worse; with a two-sentence system prompt and a few hundred characters of the workspace
files it looped far less (``bench/local_model.py``; figures in ``docs`` of issue #21).

A ``ModelProfile`` says what the small profile changes; each part of parley reads the
field that concerns it:

- the system prompt (``core.prompt.SystemPromptBuilder``): ``short_prompt`` and
  ``workspace_max_chars``;
- the turn context (``core.prompt.render_turn_context``): ``compact_turn_context``;
- sampling (a provider that passes llama.cpp's sampling fields on, for a small model
  behind an OpenAI-compatible server): ``sampling`` hints. The embedded provider
  applies its own measured defaults (``core.providers.local_tuning``), the same values.

- compaction and the memory flush (the context engine): ``summaries``. The small profile
  does not ask the model for compaction summaries or flush notes unless the operator
  says it can (``[context.models."<id>"] summaries = true``; a model that says it cannot,
  like the embedded one, never is): SmolLM2-135M behind llama.cpp at a 2,048 window
  wrote "The conversation is currently paused…" as its summary, the next replies
  echoed it, and each summary call held the reply back by up to a minute on 2 cores.
  Compaction then folds by a strategy that needs no model call
  (``core.context.window.can_summarise``).

``choose_profile`` picks one from the ``[agent] profile`` setting: "auto" takes the
small profile for a window under ``SMALL_WINDOW_TOKENS`` or for the embedded model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

ProfileName = Literal["standard", "small"]
ProfileSetting = Literal["auto", "standard", "small"]
PROFILE_SETTINGS: tuple[str, ...] = get_args(ProfileSetting)

# Below this window "auto" takes the small profile: a model served with a window this
# small is a small model, or runs on a host where every prompt token costs.
SMALL_WINDOW_TOKENS = 16_384
# The workspace files' share of the short system prompt, in characters. Measured on
# SmolLM2-135M with parley's own workspace templates: the first 248 characters
# (IDENTITY.md, SOUL.md) did no harm; 300 to 800 (USER.md's and MEMORY.md's "write here
# what ..." template text came next) doubled to tripled the looping replies.
SMALL_WORKSPACE_MAX_CHARS = 300
# llama.cpp's field names; the embedded provider's measured defaults
# (core.providers.local_tuning.DEFAULT_SAMPLING) are the same values.
SMALL_SAMPLING_HINTS: tuple[tuple[str, float], ...] = (
    # llama.cpp's server samples at 0.8 unless told; the embedded model's measured 0.2.
    ("temperature", 0.2),
    ("repeat_penalty", 1.15),
    ("repeat_last_n", 256),
)


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What parley changes for a model of this size (module docstring)."""

    name: ProfileName
    # The short system prompt: identity and one line of style, tooling and memory recall
    # only when offered, no safety/workspace/silent-reply sections.
    short_prompt: bool = False
    # The workspace files' total in the short prompt (the standard prompt keeps the
    # [context] file_max_chars / total_max_chars caps).
    workspace_max_chars: int = SMALL_WORKSPACE_MAX_CHARS
    # The turn context as one short line (time and channel) instead of the full block.
    compact_turn_context: bool = False
    # Ask the model for compaction summaries and flush notes when nobody said otherwise.
    summaries: bool = True
    sampling_hints: tuple[tuple[str, float], ...] = ()

    def sampling(self) -> Mapping[str, float]:
        """The sampling hints as llama.cpp request fields (empty: send none)."""
        return dict(self.sampling_hints)


STANDARD = ModelProfile(name="standard")
SMALL = ModelProfile(
    name="small",
    short_prompt=True,
    compact_turn_context=True,
    summaries=False,
    sampling_hints=SMALL_SAMPLING_HINTS,
)
_BY_NAME: dict[str, ModelProfile] = {"standard": STANDARD, "small": SMALL}


def is_embedded(provider: object) -> bool:
    """Is ``provider`` the in-process model (its ``facts.server`` says "embedded")?"""
    facts = getattr(provider, "facts", None)
    return getattr(facts, "server", "") == "embedded"


def choose_profile(setting: str, *, window: int | None, provider: object) -> ModelProfile:
    """The profile for ``setting`` ("auto", "standard" or "small").

    "auto" is small for the embedded model, for a provider that says it cannot write
    summaries (``supports_summaries = False``), and for a window under
    ``SMALL_WINDOW_TOKENS``; standard otherwise, an unknown window (``None``) included.
    """
    if setting in _BY_NAME:
        return _BY_NAME[setting]
    if setting != "auto":
        raise ValueError(f"unknown model profile {setting!r}; expected one of {PROFILE_SETTINGS}")
    small = (
        is_embedded(provider)
        or getattr(provider, "supports_summaries", True) is False
        or (window is not None and window < SMALL_WINDOW_TOKENS)
    )
    return SMALL if small else STANDARD
