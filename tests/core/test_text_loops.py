from __future__ import annotations

import pytest

from parley.core.text_loops import LOOP_THRESHOLD, is_looping, loop_share, words

# Replies SmolLM2-135M gave in bench/local_model.py's runs.
LOOPED_LINE = "I'm sorry for any misunderstanding.\n\n" * 6
LOOPED_HEADINGS = "The Autumn of the World\n\n" + "## SNAPSHELL\n\nSNAPSHELL\n\n" * 8
GOOD_REPLY = (
    "One tip for sleeping better is to avoid heavy meals and caffeine before bedtime. "
    "These can interfere with sleep patterns."
)


def test_words_are_lower_cased_and_stripped_of_surrounding_punctuation() -> None:
    assert words('Hello, WORLD! "quoted" -- x.y (it\'s)') == [
        "hello",
        "world",
        "quoted",
        "x.y",
        "it's",
    ]


def test_a_line_repeated_until_the_cap_is_all_loop() -> None:
    assert loop_share(LOOPED_LINE) == 1.0
    assert is_looping(LOOPED_LINE)


def test_repeated_headings_after_a_real_first_line_are_a_loop() -> None:
    share = loop_share(LOOPED_HEADINGS)

    assert 0.5 < share < 1.0  # the title's five words are not covered
    assert is_looping(LOOPED_HEADINGS)


def test_an_ordinary_reply_is_not_a_loop() -> None:
    assert loop_share(GOOD_REPLY) == 0.0
    assert not is_looping(GOOD_REPLY)


def test_one_repeated_phrase_in_prose_covers_only_its_words() -> None:
    text = (
        "at the end of the day we went home, and at the end of the week we rested by the "
        "lake with our friends"
    )

    # "at the end of" and "the end of the" twice each: "at the end of the", 10 of 24 words.
    assert loop_share(text) == pytest.approx(10 / 24)
    assert not is_looping(text)


def test_exactly_half_is_not_over_the_threshold() -> None:
    # 8 covered words ("a b c d" twice) out of 16.
    text = "a b c d e f g h a b c d i j k l"

    assert loop_share(text) == LOOP_THRESHOLD
    assert not is_looping(text)


def test_texts_too_short_to_hold_a_repeat_score_zero() -> None:
    assert loop_share("") == 0.0
    assert loop_share("yes yes yes yes yes yes yes") == 0.0  # 7 words < 2 * 4
    assert loop_share("yes yes yes yes yes yes yes yes") == 1.0


def test_punctuation_differences_do_not_hide_a_loop() -> None:
    assert is_looping("Hello there my friend! hello there, my friend. Hello there my friend")


def test_n_is_configurable_and_checked() -> None:
    text = "red blue red green red yellow"

    assert loop_share(text, n=1) == pytest.approx(3 / 6)
    assert loop_share(text, n=2) == 0.0
    with pytest.raises(ValueError):
        loop_share(text, n=0)
