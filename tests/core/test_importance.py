"""The written-down importance rules, one test per rule, and the drop order."""

from __future__ import annotations

import pytest

from parley.core.importance import (
    ASK,
    CHATTER,
    CONSTRAINT,
    DECISION,
    DEFAULT,
    ERROR,
    IDENTIFIER,
    NOTHING,
    PREFERENCE,
    TOOL,
    Scored,
    least_important_first,
    message_importance,
    score_messages,
    text_importance,
)
from parley.core.messages import Message, ToolResultBlock, ToolUseBlock


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Traceback (most recent call last): ...", ERROR),
        ("the build failed on step 3", ERROR),
        ("connection timed out", ERROR),
        ("We decided to ship on the 3rd.", DECISION),
        ("Let's go with the blue theme", DECISION),
        ("Decision: use v2", DECISION),
        ("You must never push to main.", CONSTRAINT),
        ("The report is due by Friday", CONSTRAINT),
        ("Remember that my cat is called Miso", PREFERENCE),
        ("I prefer short answers", PREFERENCE),
        ("see ORD-88123", IDENTIFIER),
        ("the file is /srv/data/q3.csv", IDENTIFIER),
        ("Can you look into it", ASK),
        ("todo: buy milk", ASK),
        ("what is the capital of Peru?", ASK),
        ("The weather is nice in spring", DEFAULT),
        ("ok thanks", CHATTER),
        ("got it!", CHATTER),
        ("What do you mean?", CHATTER),
        ("", NOTHING),
        ("NO_REPLY", NOTHING),
    ],
)
def test_text_rules(text: str, score: float) -> None:
    assert text_importance(text) == score


def test_the_highest_rule_wins() -> None:
    # An error that is also a thank-you, a decision that names an id.
    assert text_importance("thanks, but the deploy failed") == ERROR
    assert text_importance("we decided to use ORD-88123") == DECISION


def test_tool_traffic_is_at_least_medium_and_a_failed_result_is_an_error() -> None:
    call = Message("assistant", (ToolUseBlock("c1", "shell", {"cmd": "ls"}),))
    assert message_importance(call) == TOOL
    ok = Message("tool_result", (ToolResultBlock("c1", "a.txt b.txt"),))
    assert message_importance(ok) == TOOL
    failed = Message("tool_result", (ToolResultBlock("c1", "nope", is_error=True),))
    assert message_importance(failed) == ERROR
    # A tool result saying something more important keeps its higher score.
    decided = Message("tool_result", (ToolResultBlock("c1", "decision: use v2"),))
    assert message_importance(decided) == DECISION


def test_exact_repeats_score_nothing_but_the_first_copy_keeps_its_score() -> None:
    said = Message.user("Please   check the logs")
    scored = score_messages([said, Message.assistant("ok"), Message.user("please check the LOGS")])
    assert [s.score for s in scored] == [ASK, CHATTER, NOTHING]


def test_a_repeated_tool_call_is_work_not_a_repeat() -> None:
    call = Message("assistant", (ToolUseBlock("c1", "shell", {"cmd": "ls"}),))
    again = Message("assistant", (ToolUseBlock("c2", "shell", {"cmd": "ls"}),))
    assert [s.score for s in score_messages([call, again])] == [TOOL, TOOL]


def test_drop_order_is_lowest_first_then_oldest() -> None:
    order = least_important_first(
        [Scored(0, 0.9), Scored(1, 0.15), Scored(2, 0.4), Scored(3, 0.15)]
    )
    assert [s.index for s in order] == [1, 3, 2, 0]
