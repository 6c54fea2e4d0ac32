"""Cutting one oversized tool result down to a character budget.

A tool result is capped once, when it enters the session (``ToolRegistry.run``), so one
huge output cannot flood the window. The cap scales with the model's window
(``tool_result_cap``) but never drops below ``TOOL_RESULT_MIN_CHARS``: smaller than that a
result stops being useful to the model.

``truncate_tool_result`` keeps the head, and also the tail when the tail looks like it
carries the outcome (an error, a traceback, an exit status, a summary line, the closing
brace of a JSON document): the end of a build log or a test run is usually the part that
matters. The marker between the parts says how much was left out, so the model knows the
result is partial and can ask for a narrower slice. Cuts move to a line break when one is
close, so the model does not see half lines. The result never exceeds the budget, marker
included, whatever the budget (see ``truncate_tool_result``).
"""

from __future__ import annotations

import re

TOOL_RESULT_WINDOW_SHARE = 0.3
TOOL_RESULT_HARD_MAX_CHARS = 40_000
TOOL_RESULT_MIN_CHARS = 2_000
CHARS_PER_TOKEN = 4

# How much of the end is inspected to decide whether the tail is worth keeping.
IMPORTANT_TAIL_CHARS = 2_000
# The tail's share of the budget, and its absolute limit: the head stays the main part.
TAIL_BUDGET_SHARE = 0.3
TAIL_MAX_CHARS = 4_000
# A cut moves to a line break only when that loses at most this share of the part.
SNAP_WITHIN_SHARE = 0.2

_IMPORTANT = re.compile(
    r"\b(?:errors?|exceptions?|traceback|exit(?:ed)?[ _-]?(?:code|status)|fail(?:ed|ure|ures)"
    r"|total|summary|done)\b",
    re.IGNORECASE,
)


def tool_result_cap(window_tokens: int, configured_max: int = TOOL_RESULT_HARD_MAX_CHARS) -> int:
    """The character cap for one tool result with a window of ``window_tokens``.

    ``TOOL_RESULT_WINDOW_SHARE`` of the window in characters, at most ``configured_max``
    (so a 128k window is already capped at 40k), and never below ``TOOL_RESULT_MIN_CHARS``
    even when the configured maximum is lower: a smaller result is not worth having.
    """
    share = int(window_tokens * TOOL_RESULT_WINDOW_SHARE * CHARS_PER_TOKEN)
    return max(TOOL_RESULT_MIN_CHARS, min(share, configured_max))


def looks_important(tail: str) -> bool:
    """True when the end of a result looks like it holds the outcome.

    Only the last ``IMPORTANT_TAIL_CHARS`` characters are looked at: an error word at the
    start of a long log says nothing about how it ended.
    """
    end = tail[-IMPORTANT_TAIL_CHARS:]
    if end.rstrip().endswith("}"):
        return True
    return _IMPORTANT.search(end) is not None


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def _full_marker(chars: int, lines: int) -> str:
    return f"[... {_plural(chars, 'character')} ({_plural(lines, 'line')}) omitted ...]"


def _short_marker(chars: int, lines: int) -> str:
    del lines  # no room to say it
    return f"[...{chars} omitted]"


_MARKERS = (_full_marker, _short_marker)


def _omitted_lines(omitted: str) -> int:
    """Lines the omitted span touches (a partial line at the end counts)."""
    return omitted.count("\n") + (0 if omitted.endswith("\n") else 1)


def _snap_head(text: str, budget: int) -> str:
    """The first ``budget`` characters, ending after a line break when one is near the end."""
    head = text[:budget]
    newline = head.rfind("\n")
    if newline >= 0 and newline + 1 >= budget * (1 - SNAP_WITHIN_SHARE):
        head = head[: newline + 1]
    return head


def _snap_tail(text: str, budget: int) -> str:
    """The last ``budget`` characters, starting after a line break when one is near the start."""
    if budget <= 0:
        return ""
    tail = text[-budget:]
    newline = tail.find("\n")
    if newline >= 0 and newline + 1 <= budget * SNAP_WITHIN_SHARE:
        tail = tail[newline + 1 :]
    return tail


def _join(head: str, marker: str, tail: str) -> str:
    before = "" if not head or head.endswith("\n") else "\n"
    after = "\n" if tail else ""
    return f"{head}{before}{marker}{after}{tail}"


def truncate_tool_result(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, marker included.

    A text that fits is returned unchanged (the same object). Otherwise the head is kept,
    plus the tail when ``looks_important`` says so (the tail gets at most
    ``TAIL_BUDGET_SHARE`` of the budget and ``TAIL_MAX_CHARS``); the marker between them
    names the characters and lines omitted. Room for the marker is sized for the largest
    counts it could report, so the whole always fits. With a budget too small for the
    full marker a short one is used, and below that the text is cut bare: the bound on
    the length is the one promise that always holds.
    """
    if max_chars < 0:
        raise ValueError("max_chars must not be negative")
    if len(text) <= max_chars:
        return text
    worst_lines = text.count("\n") + 1
    for marker_for in _MARKERS:
        # Two line breaks may frame the marker; counts only shrink from the worst case.
        room = len(marker_for(len(text), worst_lines)) + 2
        budget = max_chars - room
        if budget >= 0:
            break
    else:
        return text[:max_chars]

    tail_budget = 0
    if looks_important(text):
        tail_budget = min(int(budget * TAIL_BUDGET_SHARE), TAIL_MAX_CHARS)
    head = _snap_head(text, budget - tail_budget)
    tail = _snap_tail(text, tail_budget)
    omitted = text[len(head) : len(text) - len(tail)]
    return _join(head, marker_for(len(omitted), _omitted_lines(omitted)), tail)
