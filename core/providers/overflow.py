"""Recognising "the prompt does not fit" in the many ways providers say it.

Providers word context overflow differently and only some give machine-readable
codes, so detection is a table of text patterns plus a few known error types and
codes. When the wording carries numbers they are parsed out, because the runner
uses them to decide how much to compact.

Conventions for the parsed numbers:

- ``observed_tokens`` is what the request needed, ``limit`` the window. When the
  provider counts the output reservation in (Anthropic's ``a + b > c``, OpenAI's
  "you requested N tokens (x in the messages, y in the completion)"), it is included,
  so ``observed_tokens - limit`` is always the excess the caller has to remove.
- A number the message does not give stays ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Error types and codes that mean overflow whatever the message says.
OVERFLOW_ERROR_TYPES: frozenset[str] = frozenset(
    {"request_too_large", "exceed_context_size_error", "context_length_exceeded"}
)
OVERFLOW_ERROR_CODES: frozenset[str] = frozenset(
    {"context_length_exceeded", "context_window_exceeded", "string_above_max_length"}
)


@dataclass(frozen=True, slots=True)
class OverflowMatch:
    observed_tokens: int | None = None
    limit: int | None = None


def _ints(match: re.Match[str]) -> list[int]:
    return [int(g.replace(",", "")) for g in match.groups()]


def _observed_limit(m: re.Match[str]) -> OverflowMatch:
    observed, limit = _ints(m)
    return OverflowMatch(observed, limit)


def _limit_observed(m: re.Match[str]) -> OverflowMatch:
    limit, observed = _ints(m)
    return OverflowMatch(observed, limit)


def _sum_limit(m: re.Match[str]) -> OverflowMatch:
    prompt, output, limit = _ints(m)
    return OverflowMatch(prompt + output, limit)


def _limit_input_output(m: re.Match[str]) -> OverflowMatch:
    # The window first, then prompt and requested output: the need is their sum.
    limit, prompt, output = _ints(m)
    return OverflowMatch(prompt + output, limit)


def _limit_only(m: re.Match[str]) -> OverflowMatch:
    return OverflowMatch(None, _ints(m)[0])


def _no_numbers(_: re.Match[str]) -> OverflowMatch:
    return OverflowMatch()


_N = r"(\d[\d,]*)"

# Most specific first: the first pattern that matches decides the numbers.
_PATTERNS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], OverflowMatch]], ...] = (
    # Anthropic: "prompt is too long: 203284 tokens > 200000 maximum"
    (re.compile(rf"prompt is too long:\s*{_N} tokens?\s*>\s*{_N}", re.I), _observed_limit),
    # Anthropic: "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000"
    (re.compile(rf"exceed context limit:\s*{_N}\s*\+\s*{_N}\s*>\s*{_N}", re.I), _sum_limit),
    # vLLM (newer): "maximum context length is 4096 tokens and your request has 3500 input
    # tokens (1000 > 4096 - 3500)"
    (
        re.compile(
            rf"maximum context length is {_N} tokens? and your request has {_N} input "
            rf"tokens? \({_N} >",
            re.I,
        ),
        _limit_input_output,
    ),
    # OpenAI / vLLM: "maximum context length is 8192 tokens. However, you requested 9000
    # tokens (...)" or "... your messages resulted in 9000 tokens"
    (
        re.compile(
            rf"maximum context length is {_N} tokens?.*?(?:you requested|resulted in) {_N} tokens?",
            re.I | re.S,
        ),
        _limit_observed,
    ),
    # Mistral / TGI style: "Input validation error: `inputs` tokens + `max_new_tokens` must
    # be <= 4096. Given: 4000 `inputs` tokens and 500 `max_new_tokens`"
    (
        re.compile(rf"must be <= {_N}\. Given: {_N} `inputs` tokens and {_N}", re.I),
        _limit_input_output,
    ),
    (re.compile(rf"maximum context length is {_N} tokens?", re.I), _limit_only),
    (re.compile(rf"context (?:length|window|size) (?:of|is) (?:only )?{_N}", re.I), _limit_only),
    # Wording with no numbers we can trust.
    (
        re.compile(
            r"prompt is too long|exceed(?:s|ed)? (?:the )?(?:available )?context|"
            r"context[_ ]length[_ ]exceeded|maximum context length|context window|"
            r"input is too long",
            re.I,
        ),
        _no_numbers,
    ),
)


def _from_body(body: Mapping[str, Any] | None) -> OverflowMatch:
    """llama.cpp puts the numbers beside the message: ``n_prompt_tokens`` and ``n_ctx``."""
    if not body:
        return OverflowMatch()
    observed = body.get("n_prompt_tokens")
    limit = body.get("n_ctx")
    return OverflowMatch(
        observed if isinstance(observed, int) else None,
        limit if isinstance(limit, int) else None,
    )


def match_overflow(
    message: str | None,
    *,
    status: int | None = None,
    error_type: str | None = None,
    code: str | None = None,
    body: Mapping[str, Any] | None = None,
) -> OverflowMatch | None:
    """Return what we could parse when the error means context overflow, else ``None``.

    ``status`` screens out errors that cannot be overflow (rate limits, auth, 5xx) even
    when their text mentions context; ``None`` or 200 (an error inside a stream) is
    judged on the text and type alone.
    """
    if status is not None and status not in (200, 400, 413, 422):
        return None
    text = message or ""
    for pattern, build in _PATTERNS:
        found = pattern.search(text)
        if found:
            parsed = build(found)
            extra = _from_body(body)
            return OverflowMatch(
                parsed.observed_tokens
                if parsed.observed_tokens is not None
                else extra.observed_tokens,
                parsed.limit if parsed.limit is not None else extra.limit,
            )
    if (error_type in OVERFLOW_ERROR_TYPES) or (code in OVERFLOW_ERROR_CODES) or status == 413:
        return _from_body(body)
    return None
