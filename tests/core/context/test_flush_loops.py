"""The memory flush's guard against a looping model's note."""

from __future__ import annotations

import pytest

from parley.core.context.flush import MAX_REPEAT_SHARE, REPEAT_NGRAM, deloop
from parley.core.text_loops import loop_share

REAL_NOTE = (
    "- Ada parks on level 3, spot 42 at the office garage.\n"
    "- The user prefers tea over coffee in the mornings.\n"
    "- The user prefers short answers with the numbers first.\n"
    "- Order ORD-88123 ships on Friday; the invoice goes to billing@example.com.\n"
)


def test_a_real_note_is_no_loop() -> None:
    # Stock openings ("The user prefers") are shorter than the five-word runs counted.
    assert loop_share(REAL_NOTE, REPEAT_NGRAM) < 0.2
    assert deloop(REAL_NOTE) == REAL_NOTE


@pytest.mark.parametrize(
    "loop",
    [
        "tea " * 100,
        "the car is on level three " * 30,
        # A long period: every five-word run of it recurs.
        ("- the user said that the meeting moves to the afternoon and then " * 6),
    ],
    ids=["one-word", "short-phrase", "long-period"],
)
def test_a_loop_is_mostly_repetition_and_is_dropped(loop: str) -> None:
    assert loop_share(loop, REPEAT_NGRAM) > MAX_REPEAT_SHARE
    assert deloop(loop) is None


def test_repeated_lines_are_de_looped_to_the_note_under_them() -> None:
    looping = REAL_NOTE + "- The user likes tea.\n" * 30
    assert loop_share(looping, REPEAT_NGRAM) > MAX_REPEAT_SHARE
    kept = deloop(looping)
    assert kept is not None
    assert kept.count("- The user likes tea.") == 1
    assert "ORD-88123" in kept and loop_share(kept, REPEAT_NGRAM) <= MAX_REPEAT_SHARE


def test_a_short_text_cannot_be_judged_a_loop() -> None:
    assert loop_share("ok ok ok", REPEAT_NGRAM) == 0.0
    assert loop_share("", REPEAT_NGRAM) == 0.0


def test_a_note_repeated_once_whole_is_a_loop() -> None:
    assert loop_share(REAL_NOTE + REAL_NOTE, REPEAT_NGRAM) == 1.0
    assert deloop(REAL_NOTE + REAL_NOTE) == REAL_NOTE.strip()
