"""The ``memory.recall = "auto"`` classifier: each rule fires on what it names, and small
talk or general questions fire none."""

from __future__ import annotations

import pytest

from parley.core.memory.recall_rules import (
    RULE_DATE,
    RULE_DECISION,
    RULE_FILE,
    RULE_NAME,
    RULE_PAST,
    RULE_PAST_QUESTION,
    RULE_PREFERENCE,
    RULE_RELATION,
    recall_reason,
    wants_recall,
)


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("like last time, keep it short", RULE_PAST),
        ("do you remember the hotel?", RULE_PAST),
        ("as we discussed, go ahead", RULE_PAST),
        ("you said it would take a week", RULE_PAST),
        ("I told you about this already", RULE_PAST),
        ("what did I order for lunch", RULE_PAST_QUESTION),
        ("what's my locker code", RULE_PAST_QUESTION),
        ("when did the build break", RULE_PAST_QUESTION),
        ("what area was hit by a flood", RULE_PAST_QUESTION),
        ("how many tickets were sold in total?", RULE_PAST_QUESTION),
        ("what do the dancers in the photo represent", RULE_FILE),
        ("what was said in the workshop", RULE_PAST_QUESTION),
        ("how is the upcoming opening looking", RULE_FILE),
        ("send me the link again please", RULE_PAST),
        ("how is it going since yesterday", RULE_DATE),
        ("see you next tuesday", RULE_DATE),
        ("the meeting on 2024-05-01", RULE_DATE),
        ("is it due on the 3rd", RULE_DATE),
        ("how is my sister doing", RULE_RELATION),
        ("our landlord wants the keys", RULE_RELATION),
        ("open the file and fix it", RULE_FILE),
        ("update notes.md with this", RULE_FILE),
        ("look at src/gateway/app.py", RULE_FILE),
        ("which one I prefer", RULE_PREFERENCE),
        ("pick my favourite pizza", RULE_PREFERENCE),
        ("it is a deadline thing", RULE_DECISION),
        ("stick to the plan", RULE_FILE),  # "the plan" is a document first
        ("can you ask Priya to join", RULE_NAME),
        ("how goes the Falcon rollout", RULE_NAME),
    ],
)
def test_each_rule_fires_on_what_it_names(text: str, rule: str) -> None:
    assert recall_reason(text) == rule


def test_the_decision_rule_fires_alone() -> None:
    assert recall_reason("ok so it is settled on blue") == RULE_DECISION


@pytest.mark.parametrize(
    "text",
    [
        "hello!",
        "Thanks, that helps.",
        "how do magnets work?",
        "what is 17 * 23",
        "Write a haiku about the sea.",
        "OK. Sounds good. I am ready",
        "tell me a joke",
    ],
)
def test_small_talk_and_general_questions_do_not_fire(text: str) -> None:
    assert recall_reason(text) is None
    assert not wants_recall(text)


def test_a_capitalised_first_word_is_not_a_name() -> None:
    # Sentence starts are capitalised anyway; after a full stop too.
    assert recall_reason("Explain recursion. Keep it brief") is None
    assert recall_reason("Explain recursion to Marta") == RULE_NAME
