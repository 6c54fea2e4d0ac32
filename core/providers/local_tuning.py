"""How the embedded model is run: its window, its thread count, its sampling.

Each default here was chosen by measurement on the host parley's embedded model is
meant for (a small, shared 2-CPU machine) with ``bench/local_model.py``; the figures
are beside each default. ``core.providers.local`` applies them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from parley.core.providers.gguf import GGUFError, read_gguf_file
from parley.core.providers.provider_config import LocalModelConfig

log = logging.getLogger("parley.core.providers.local_tuning")

# The window when the config leaves it unset: the file's trained context, capped here so
# a 128k-context file does not claim gigabytes of KV cache on a small host.
MAX_DEFAULT_CONTEXT_TOKENS = 32_768
# Only when the GGUF header cannot be read (llama.cpp will then most likely refuse the
# file too): the window parley used before it read the header.
FALLBACK_CONTEXT_TOKENS = 8192
# Thread counts the default rule never exceeds: a 135M model gains little past a few.
MAX_DEFAULT_THREADS = 8


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def default_threads(cpus: int | None = None) -> int:
    """llama.cpp's thread count when ``LocalModelConfig.threads`` is unset: all CPUs but one.

    Measured on a 2-CPU host (``bench/local_model.py --threads``: a 673-token prompt, 96
    tokens generated, 6 runs each, 1 and 2 threads alternated), median figures:

    - host as it was: 2 threads 94 tokens/s, prompt 421 tokens/s; 1 thread 67 and 226;
    - one CPU-bound neighbour (someone's test run): 2 threads fell to 28 tokens/s
      (prompt 219), 1 thread held 68 (prompt 223). Earlier runs with more load saw 2
      threads at 3-10 tokens/s, first replies in minutes.

    llama.cpp's threads meet at a barrier every step: when one of them waits for a CPU,
    all wait. One CPU left to the rest of the machine (the event loop, the embedder,
    a neighbour) costs 30% of generation speed in the best case and removes the worst.
    Hosts with more CPUs were not measured: the same rule is applied, up to
    ``MAX_DEFAULT_THREADS``.
    """
    return max(1, min((cpus or available_cpus()) - 1, MAX_DEFAULT_THREADS))


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling fields sent with every request (llama.cpp server field names).

    Only the fields parley has a view on; llama.cpp's own defaults stand for the rest
    (top_k 40, top_p 0.95, min_p 0.05, DRY base 1.75, allowed length 2, last 64 tokens).
    A field at its neutral value (penalty 1.0 or 0.0) sends what llama.cpp does anyway,
    so ``Sampling(temperature=t)`` is exactly what parley sent before issue #21.
    """

    temperature: float
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    dry_multiplier: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @classmethod
    def for_config(cls, config: LocalModelConfig) -> Sampling:
        """The measured defaults, with the config's own values where it sets them."""
        base = DEFAULT_SAMPLING
        return replace(
            base,
            temperature=config.temperature,
            repeat_penalty=(
                base.repeat_penalty if config.repeat_penalty is None else config.repeat_penalty
            ),
            repeat_last_n=(
                base.repeat_last_n if config.repeat_last_n is None else config.repeat_last_n
            ),
        )

    def payload(self) -> dict[str, float | int]:
        return asdict(self)


# The measured defaults (temperature aside: LocalModelConfig always sets it). SmolLM2-135M
# with the small profile's prompt, 19 conversations x 3 seeded draws at temperature 0.2:
# looping replies (core.text_loops) of 57, and right answers of 33 checkable ones.
#   without a turn context:  no penalty 20/57 (20/33); DRY 0.8 13/57; DRY 1.5 10/57;
#     DRY 0.8 + presence 0.5 9/57; DRY 0.8 + frequency 0.3 6/57;
#     DRY 0.8 + repeat 1.1 over 64 tokens 0/57 (13/33); repeat 1.15 over 256 0/57 (17/33)
#   with the compact turn context:  repeat 1.1/64 2/57 (15/33); 1.1/256 1/57 (18/33);
#     1.15/64 2/57 (17/33); 1.15/256 0/57 (19/33); DRY 0.8 + repeat 1.1/64 1/57 (14/33),
#     + 1.1/256 1/57 (18/33), + 1.15/256 0/57 (19/33)
# The repetition penalty over 256 tokens (the reply cap) does it alone; DRY adds nothing
# on top, so it stays off and the config's two fields are the whole setting.
DEFAULT_SAMPLING = Sampling(temperature=0.2, repeat_penalty=1.15, repeat_last_n=256)
# What parley sent before #21: the temperature, every penalty off (the bench's baseline).
PLAIN_SAMPLING = Sampling(temperature=0.2)


def context_window_of(path: Path, configured: int | None) -> tuple[int, str]:
    """The window to run with and where it came from: the config, else the file's trained
    context (at most ``MAX_DEFAULT_CONTEXT_TOKENS``), else ``FALLBACK_CONTEXT_TOKENS``.

    Blocking (reads the GGUF header); never raises for a bad header."""
    if configured is not None:
        return configured, "config"
    try:
        trained = read_gguf_file(path).context_length
    except (GGUFError, OSError) as exc:
        log.warning(
            "cannot read the context length of %s (%s); using %d",
            path,
            exc,
            FALLBACK_CONTEXT_TOKENS,
        )
        return FALLBACK_CONTEXT_TOKENS, "default"
    if trained is None:
        log.warning("%s does not say its context length; using %d", path, FALLBACK_CONTEXT_TOKENS)
        return FALLBACK_CONTEXT_TOKENS, "default"
    return min(trained, MAX_DEFAULT_CONTEXT_TOKENS), "gguf metadata"
