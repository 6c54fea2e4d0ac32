"""truncate_tool_result: the hard length bound, head/tail choice, line snapping, the marker."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from parley.core.tools.truncation import (
    IMPORTANT_TAIL_CHARS,
    TAIL_MAX_CHARS,
    TOOL_RESULT_HARD_MAX_CHARS,
    TOOL_RESULT_MIN_CHARS,
    looks_important,
    tool_result_cap,
    truncate_tool_result,
)

FULL = re.compile(r"\[\.\.\. ([\d,]+) characters? \(([\d,]+) lines?\) omitted \.\.\.\]")
SHORT = re.compile(r"\[\.\.\.(\d+) omitted\]")


def _lines(count: int, tail: str = "") -> str:
    return "".join(f"line {i:05d} of the log\n" for i in range(count)) + tail


def _parts(text: str, out: str) -> tuple[str, str, int, int | None]:
    """(head, tail, chars, lines) of a truncated output, checked against the original.

    The marker may be framed by line breaks that are not part of the text; of the ways
    to read them, the one that accounts for every character of ``text`` is taken.
    """
    match = FULL.search(out) or SHORT.search(out)
    assert match is not None, out
    chars = int(match.group(1).replace(",", ""))
    lines = int(match.group(2).replace(",", "")) if match.re is FULL else None
    before, after = out[: match.start()], out[match.end() :]
    # Lists, not sets: two readings can both account for every character, and a set's
    # order follows the per-process string hash. The framing newline after the marker
    # is never part of the tail; the one before it only when the head lacks its own.
    heads = [before, before.removesuffix("\n")]
    tails = [after.removeprefix("\n"), after]
    for head in heads:
        for tail in tails:
            fits = text.startswith(head) and text.endswith(tail)
            if fits and len(head) + chars + len(tail) == len(text):
                return head, tail, chars, lines
    raise AssertionError(f"marker does not account for the text: {out!r}")


def _omitted_lines(omitted: str) -> int:
    return omitted.count("\n") + (0 if omitted.endswith("\n") else 1)


# -- the cap -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "configured", "expected"),
    [
        (128_000, TOOL_RESULT_HARD_MAX_CHARS, 40_000),  # 153,600 by share: capped
        (200_000, TOOL_RESULT_HARD_MAX_CHARS, 40_000),
        (16_000, TOOL_RESULT_HARD_MAX_CHARS, 19_200),
        (32_000, TOOL_RESULT_HARD_MAX_CHARS, 38_400),
        (1_000, TOOL_RESULT_HARD_MAX_CHARS, TOOL_RESULT_MIN_CHARS),  # floor
        (0, TOOL_RESULT_HARD_MAX_CHARS, TOOL_RESULT_MIN_CHARS),
        (200_000, 500, TOOL_RESULT_MIN_CHARS),  # the floor beats a tiny configured max
        (1_000_000, 100_000, 100_000),
    ],
)
def test_tool_result_cap(window: int, configured: int, expected: int) -> None:
    assert tool_result_cap(window, configured) == expected


def test_cap_defaults_to_the_hard_max() -> None:
    assert tool_result_cap(10_000_000) == TOOL_RESULT_HARD_MAX_CHARS


# -- what counts as an important tail ------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        "ok\nERROR: disk full\n",
        "raise ValueError\nValueError: bad exception here",
        "Traceback (most recent call last):\n  File x",
        "process exited with exit code 2",
        "Exit status: 1",
        "3 tests FAILED",
        "Total: 42 files",
        "## Summary\nall good",
        "Done.",
        '{"items": [1, 2, 3]\n}\n  ',
    ],
)
def test_important_tails(tail: str) -> None:
    assert looks_important(tail)


@pytest.mark.parametrize("tail", ["", "line 1\nline 2\n", "errorless", "terror", "abandoned", "{"])
def test_ordinary_tails(tail: str) -> None:
    assert not looks_important(tail)


def test_only_the_end_is_inspected() -> None:
    text = "error at the very start\n" + "x" * IMPORTANT_TAIL_CHARS

    assert not looks_important(text)
    assert looks_important(text[-IMPORTANT_TAIL_CHARS - 50 :] + " done")


# -- truncation ---------------------------------------------------------------------------


def test_a_text_that_fits_is_the_same_object() -> None:
    text = "".join(["abc"] * 100)

    assert truncate_tool_result(text, 300) is text
    assert truncate_tool_result(text, 10_000) is text
    assert truncate_tool_result("", 0) == ""


def test_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError):
        truncate_tool_result("abc", -1)


def test_head_only_cut_snaps_to_a_line_break_and_counts_what_it_dropped() -> None:
    text = _lines(2_000)

    out = truncate_tool_result(text, 1_000)

    assert len(out) <= 1_000
    head, tail, chars, lines = _parts(text, out)
    assert tail == ""
    assert head.endswith("\n")  # whole lines only
    assert len(head) >= 800  # snapping lost at most 20% of the head's share
    assert chars == len(text) - len(head)
    assert lines == text[len(head) :].count("\n")
    assert out.endswith(f"[... {chars:,} characters ({lines:,} lines) omitted ...]")


def test_head_and_tail_when_the_tail_holds_the_error() -> None:
    text = _lines(2_000, "Traceback (most recent call last):\nKeyError: 'x'\n")

    out = truncate_tool_result(text, 2_000)

    assert len(out) <= 2_000
    head, tail, _, lines = _parts(text, out)
    assert tail.endswith("KeyError: 'x'\n")
    assert "Traceback" in tail
    assert tail.startswith("line ")  # the tail starts at a line break, not mid-line
    assert head.endswith("\n")
    assert len(tail) <= 0.3 * 2_000
    assert len(head) > len(tail)
    assert lines == _omitted_lines(text[len(head) : len(text) - len(tail)])


def test_a_closing_brace_keeps_the_tail() -> None:
    body = ",\n".join(f'  "key{i}": {i}' for i in range(3_000))
    text = "{\n" + body + "\n}"

    out = truncate_tool_result(text, 3_000)

    _, tail, _, _ = _parts(text, out)
    assert tail.endswith("}")


def test_the_tail_is_capped_in_absolute_terms() -> None:
    text = _lines(20_000, "summary: 3 failed\n")

    out = truncate_tool_result(text, 40_000)

    assert len(out) <= 40_000
    _, tail, _, _ = _parts(text, out)
    assert 0 < len(tail) <= TAIL_MAX_CHARS
    assert tail.endswith("summary: 3 failed\n")


def test_without_newlines_the_cut_is_exact() -> None:
    text = "a" * 10_000

    out = truncate_tool_result(text, 1_000)

    head, tail, chars, lines = _parts(text, out)
    assert tail == ""
    assert chars == 10_000 - len(head)
    assert lines == 1
    assert len(out) >= 990  # only the marker's worst-case sizing is left unused


def test_a_far_newline_is_not_snapped_to() -> None:
    text = "a\n" + "b" * 5_000

    out = truncate_tool_result(text, 1_000)

    head, _, _, _ = _parts(text, out)
    assert len(head) > 900


def test_tiny_budgets_use_a_short_marker_then_a_bare_cut() -> None:
    text = "x" * 100

    short = truncate_tool_result(text, 25)
    assert len(short) <= 25
    assert SHORT.search(short) is not None
    _parts(text, short)

    assert truncate_tool_result(text, 5) == "xxxxx"
    assert truncate_tool_result(text, 0) == ""


def test_singular_counts_read_well() -> None:
    text = "a" * 200 + "b"

    out = truncate_tool_result(text, len(text) - 1)

    assert "(1 line)" in out


_ALPHABET = st.sampled_from(["a", "b", " ", "\n", "}", "é", "𠀀", "error", "\n\n"])


@given(
    st.lists(_ALPHABET, max_size=1_500).map("".join) | st.text(max_size=600),
    st.integers(min_value=0, max_value=700),
)
@example("x" * 500, 43)
@example("x" * 500, 44)
@example("\n" * 500, 45)
@example("a" * 5_000, 60)
def test_the_bound_always_holds(text: str, max_chars: int) -> None:
    out = truncate_tool_result(text, max_chars)

    assert len(out) <= max_chars
    if len(text) <= max_chars:
        assert out is text
    elif FULL.search(out) or SHORT.search(out):
        head, tail, _, lines = _parts(text, out)
        if lines is not None:
            assert lines == _omitted_lines(text[len(head) : len(text) - len(tail)])
    else:
        assert out == text[:max_chars]


@given(st.integers(min_value=0, max_value=200), st.integers(min_value=1, max_value=5_000))
def test_the_bound_holds_around_the_marker_size(slack: int, length: int) -> None:
    text = "y" * (length + 200)
    max_chars = 30 + slack  # the full marker alone is about 45 chars here

    out = truncate_tool_result(text, max_chars)

    assert len(out) <= max_chars
