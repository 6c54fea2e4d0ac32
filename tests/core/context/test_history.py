"""The model's view: summary first, custom entries hidden, tool pairing repaired."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.context import history as history_module
from parley.core.context.history import (
    COMPACTION_SUMMARY_PREFIX,
    COMPACTION_SUMMARY_SUFFIX,
    MISSING_TOOL_RESULT,
    build_history,
    limit_history_turns,
    repair_history,
    summary_message,
)
from parley.core.messages import (
    FENCE_SUMMARY,
    Block,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_CUSTOM, ENTRY_MESSAGE, Entry, Transcript

_ids = itertools.count()


def _entry(kind: str, payload: dict[str, Any]) -> Entry:
    return Entry(f"{next(_ids):016x}", None, "2026-01-01T00:00:00.000Z", kind, payload)


def msg(message: Message) -> Entry:
    return _entry(ENTRY_MESSAGE, {"message": message.to_dict()})


def compaction(summary: str, first_kept: str | None) -> Entry:
    return _entry(ENTRY_COMPACTION, {"summary": summary, "first_kept_entry_id": first_kept})


def use(tool_id: str, text: str = "") -> Message:
    blocks: list[Block] = [TextBlock(text)] if text else []
    blocks.append(ToolUseBlock(tool_id, "search", {"q": tool_id}))
    return Message("assistant", tuple(blocks))


def result(*tool_ids: str) -> Message:
    return Message("tool_result", tuple(ToolResultBlock(i, f"result {i}") for i in tool_ids))


USER = Message.user("hi")
REPLY = Message.assistant("hello")


def test_clean_conversation_passes_through_unchanged() -> None:
    messages = [USER, use("a"), result("a"), REPLY, Message.user("thanks")]
    entries = [msg(m) for m in messages]
    history = build_history(entries)
    assert history == messages
    assert all(h is e.message for h, e in zip(history, entries, strict=True))  # reused


def test_summary_first_then_kept_entries_then_the_rest() -> None:
    old = [msg(USER), msg(REPLY)]
    kept = [msg(Message.user("keep me")), msg(Message.assistant("kept reply"))]
    comp = compaction("they said hi", kept[0].id)
    after = [_entry(ENTRY_CUSTOM, {"custom_type": "x", "data": {}}), msg(Message.user("new"))]
    history = build_history([*kept, comp, *after])
    summary = f"{COMPACTION_SUMMARY_PREFIX}they said hi{COMPACTION_SUMMARY_SUFFIX}"
    assert summary == (
        "The conversation history before this point was compacted into the following "
        "summary:\n<summary>\nthey said hi\n</summary>"
    )
    # The summary and the first kept user message are both user turns: merged.
    assert history == [
        Message("user", (TextBlock(summary, FENCE_SUMMARY), TextBlock("keep me"))),
        Message.assistant("kept reply"),
        Message.user("new"),
    ]
    # Handing over the whole file gives the same view as the live window.
    assert build_history([*old, *kept, comp, *after]) == history


def test_compaction_keeping_nothing_and_an_older_compaction() -> None:
    first = compaction("first summary", None)
    latest = compaction("second summary", None)
    entries = [first, msg(USER), latest, msg(REPLY), msg(Message.user("q"))]
    history = build_history(entries)
    assert (
        history[0].text == f"{COMPACTION_SUMMARY_PREFIX}second summary{COMPACTION_SUMMARY_SUFFIX}"
    )
    assert history[1:] == [REPLY, Message.user("q")]


def test_orphan_results_are_dropped() -> None:
    history = repair_history([result("ghost"), USER, result("ghost2"), REPLY])
    assert history == [USER, REPLY]


def test_result_before_its_call_is_an_orphan() -> None:
    history = repair_history([USER, result("a"), use("a"), Message.user("next")])
    assert history == [
        USER,
        use("a"),
        Message("tool_result", (ToolResultBlock("a", MISSING_TOOL_RESULT, is_error=True),)),
        Message.user("next"),
    ]


def test_duplicate_results_keep_the_first() -> None:
    first = ToolResultBlock("a", "first")
    second = ToolResultBlock("a", "second")
    history = repair_history(
        [USER, use("a"), Message("tool_result", (first, second)), result("a"), REPLY]
    )
    assert history == [USER, use("a"), Message("tool_result", (first,)), REPLY]


def test_missing_results_are_synthesised_after_a_killed_tool_loop() -> None:
    calls = Message("assistant", (ToolUseBlock("a", "x", {}), ToolUseBlock("b", "y", {})))
    history = repair_history([USER, calls, result("a"), Message.user("are you there?")])
    missing = ToolResultBlock("b", MISSING_TOOL_RESULT, is_error=True)
    assert history == [
        USER,
        calls,
        Message("tool_result", (ToolResultBlock("a", "result a"), missing)),
        Message.user("are you there?"),
    ]
    # A dangling call at the very end is answered too: the view must be sendable.
    assert repair_history([USER, use("z")])[-1] == Message(
        "tool_result", (ToolResultBlock("z", MISSING_TOOL_RESULT, is_error=True),)
    )


def test_displaced_and_split_results_are_gathered_after_their_call() -> None:
    calls = Message("assistant", (ToolUseBlock("a", "x", {}), ToolUseBlock("b", "y", {})))
    history = repair_history(
        [USER, calls, result("b"), Message.user("meanwhile"), result("a"), REPLY]
    )
    assert history == [
        USER,
        calls,
        result("a", "b"),  # call order, not arrival order
        Message.user("meanwhile"),
        REPLY,
    ]


def test_consecutive_same_roles_are_merged() -> None:
    history = repair_history(
        [USER, Message.user("again"), REPLY, Message.assistant("more"), use("a"), result("a")]
    )
    assert history == [
        Message("user", (TextBlock("hi"), TextBlock("again"))),
        Message("assistant", (TextBlock("hello"), TextBlock("more"), *use("a").content)),
        result("a"),
    ]


def test_user_after_tool_results_stays_a_separate_user_turn() -> None:
    history = repair_history([USER, use("a"), result("a"), Message.user("stop")])
    assert [m.role for m in history] == ["user", "assistant", "tool_result", "user"]


def test_history_never_starts_mid_tool_call() -> None:
    assert repair_history([result("a"), use("b"), result("b"), REPLY, USER, REPLY]) == [
        USER,
        REPLY,
    ]
    assert repair_history([REPLY]) == []


def test_empty_messages_and_blank_text_are_dropped() -> None:
    blank = Message("user", (TextBlock("  \n"),))
    mixed = Message("assistant", (TextBlock(""), TextBlock("real")))
    history = repair_history([USER, Message("assistant", ()), mixed, blank, Message.user("q")])
    assert history == [USER, Message.assistant("real"), Message.user("q")]


def test_repeated_call_id_is_dropped_and_result_blocks_leave_the_assistant() -> None:
    odd = Message("assistant", (ToolUseBlock("a", "x", {}), ToolResultBlock("a", "self")))
    history = repair_history([USER, odd, result("a"), REPLY, use("a", "again"), USER])
    assert history == [
        USER,
        Message("assistant", (ToolUseBlock("a", "x", {}),)),
        result("a"),
        Message("assistant", (TextBlock("hello"), TextBlock("again"))),
        USER,
    ]


def test_stray_text_in_a_tool_result_message_becomes_user_text() -> None:
    mixed = Message("tool_result", (ToolResultBlock("a", "r"), TextBlock("note")))
    history = repair_history([USER, use("a"), mixed])
    assert history == [
        USER,
        use("a"),
        Message("tool_result", (ToolResultBlock("a", "r"),)),
        Message.user("note"),
    ]


def test_results_inside_a_user_message_move_to_a_tool_result_message() -> None:
    # The Anthropic wire shape (results in a user turn) is normalised, not passed on.
    answer = Message("user", (ToolResultBlock("a", "r"), TextBlock("and a remark")))
    history = repair_history([USER, use("a"), answer])
    assert history == [
        USER,
        use("a"),
        Message("tool_result", (ToolResultBlock("a", "r"),)),
        Message.user("and a remark"),
    ]
    only = repair_history([use("a"), Message("user", (ToolResultBlock("a", "r"),))])
    assert only == []  # a call with no user turn before it is never the start


def test_view_from_a_real_transcript(tmp_path: Path) -> None:
    with Transcript.create(tmp_path / "s.jsonl", "s", "k") as t:
        t.append_message(USER)
        t.append_message(use("a"))  # killed here: no result was ever written
        t.append_custom("turn_error", {"kind": "Killed"})
        t.append_message(Message.user("hello?"))
        history = build_history(t.live_entries())
    assert [m.role for m in history] == ["user", "assistant", "tool_result", "user"]
    assert history[2].content[0] == ToolResultBlock("a", MISSING_TOOL_RESULT, is_error=True)


# -- malformed tool calls --------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        ToolUseBlock("", "search", {}),
        ToolUseBlock("  ", "search", {}),
        ToolUseBlock("b", "", {}),
        ToolUseBlock("b", "has space", {}),
        ToolUseBlock("b", "x" * 65, {}),
        ToolUseBlock("b", "naïve", {}),
        ToolUseBlock("b", "search", ["not", "a", "dict"]),  # type: ignore[arg-type]
        ToolUseBlock("b", "search", None),  # type: ignore[arg-type]
    ],
)
def test_malformed_tool_calls_are_dropped_with_their_results(bad: ToolUseBlock) -> None:
    good = ToolUseBlock("a", "ns:tool.name-1_x", {"q": 1})
    calls = Message("assistant", (TextBlock("let me look"), good, bad))
    answers = Message(
        "tool_result", (ToolResultBlock("a", "ok"), ToolResultBlock(bad.id, "bad result"))
    )
    history = repair_history([USER, calls, answers, REPLY])
    assert history == [
        USER,
        Message("assistant", (TextBlock("let me look"), good)),
        Message("tool_result", (ToolResultBlock("a", "ok"),)),
        REPLY,
    ]


def test_an_assistant_message_of_only_malformed_calls_disappears() -> None:
    bad = Message("assistant", (ToolUseBlock("x", "bad name!", {}),))
    history = repair_history([USER, bad, result("x"), Message.user("again")])
    assert history == [Message("user", (TextBlock("hi"), TextBlock("again")))]


def test_name_limit_is_64_characters() -> None:
    ok = Message("assistant", (ToolUseBlock("a", "n" * 64, {}),))
    history = repair_history([USER, ok, result("a")])
    assert history[1] is ok


# -- turn limits --------------------------------------------------------------------------


def turns(n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        out += [Message.user(f"q{i}"), use(f"t{i}"), result(f"t{i}"), Message.assistant(f"a{i}")]
    return out


@pytest.mark.parametrize("limit", [0, -1, -100])
def test_no_limit_for_zero_or_negative(limit: int) -> None:
    messages = turns(5)
    assert limit_history_turns(messages, limit) == messages


def test_limit_keeps_from_the_nth_most_recent_user_message() -> None:
    messages = turns(5)
    kept = limit_history_turns(messages, 2)
    assert kept == messages[12:]
    assert kept[0] == Message.user("q3")
    assert limit_history_turns(messages, 5) == messages
    assert limit_history_turns(messages, 50) == messages
    assert limit_history_turns(messages, 1) == messages[16:]


def test_several_assistant_replies_per_turn() -> None:
    messages = [
        Message.user("q0"),
        Message.assistant("a"),
        Message.assistant("b"),
        Message.user("q1"),
        Message.assistant("c"),
        Message.assistant("d"),
        Message.assistant("e"),
    ]
    assert limit_history_turns(messages, 1) == messages[3:]
    assert limit_history_turns(messages, 2) == messages


def test_a_user_message_of_only_tool_results_is_not_a_turn() -> None:
    # The Anthropic wire shape: results inside a user message continue the turn.
    messages = [
        Message.user("q0"),
        use("a"),
        Message("user", (ToolResultBlock("a", "r"),)),
        Message.assistant("a0"),
        Message.user("q1"),
        use("b"),
        Message("user", (ToolResultBlock("b", "r"),)),
        Message.assistant("a1"),
    ]
    assert limit_history_turns(messages, 1) == messages[4:]
    # Results plus words do start a turn.
    mixed = Message("user", (ToolResultBlock("b", "r"), TextBlock("and also")))
    assert limit_history_turns([*messages[:6], mixed], 1) == [mixed]


def test_a_leading_summary_stays_first() -> None:
    summary = summary_message("earlier: ORD-12345")
    messages = [summary, *turns(3)]
    kept = limit_history_turns(messages, 1)
    assert kept[0] == summary and kept[1] == Message.user("q2")
    # The summary alone is no turn: a limit equal to the real turns keeps everything.
    assert limit_history_turns(messages, 3) == messages
    # Merged with the first user message by the repair: only the summary block is kept.
    merged = repair_history(messages)
    assert merged[0].content[0] == summary.content[0] and len(merged[0].content) == 2
    kept = limit_history_turns(merged, 1)
    assert kept[0] == summary and kept[1] == Message.user("q2")
    assert limit_history_turns(merged, 3) == merged


def test_limit_can_orphan_results_and_build_history_repairs_them() -> None:
    # An unrepaired view where a result lands after the cut, far from its call.
    messages = [USER, use("a"), Message.user("q1"), result("a"), REPLY]
    kept = limit_history_turns(messages, 1)
    assert kept[:2] == [Message.user("q1"), result("a")]
    assert repair_history(kept) == [Message.user("q1"), REPLY]


def test_build_history_applies_the_turn_limit_after_the_summary() -> None:
    kept = [msg(Message.user("keep me")), msg(Message.assistant("kept reply"))]
    comp = compaction("they said hi", kept[0].id)
    after = [msg(m) for m in turns(3)]
    entries = [*kept, comp, *after]
    summary = f"{COMPACTION_SUMMARY_PREFIX}they said hi{COMPACTION_SUMMARY_SUFFIX}"
    history = build_history(entries, max_turns=2)
    assert history[0] == Message("user", (TextBlock(summary, FENCE_SUMMARY), TextBlock("q1")))
    assert history[1:] == turns(3)[5:]
    assert build_history(entries, max_turns=0) == build_history(entries)
    full = build_history(entries, max_turns=10)
    assert full == build_history(entries)
    assert full[0].content == (TextBlock(summary, FENCE_SUMMARY), TextBlock("keep me"))


def test_limit_without_a_compaction() -> None:
    entries = [msg(m) for m in turns(4)]
    assert build_history(entries, max_turns=1) == turns(4)[12:]


# -- invariants over arbitrary sequences ----------------------------------------------

_tool_ids = st.sampled_from(["a", "b", "c"])
_text = st.sampled_from(["", " ", "x", "yz"])
_assistant = st.lists(
    st.one_of(
        _text.map(TextBlock),
        _tool_ids.map(lambda i: ToolUseBlock(i, "t", {})),
        _tool_ids.map(lambda i: ToolUseBlock(i, "bad name", {})),
        _tool_ids.map(lambda i: ToolResultBlock(i, "stray")),
    ),
    max_size=3,
).map(lambda blocks: Message("assistant", tuple(blocks)))
_user_side = st.builds(
    Message,
    st.sampled_from(["user", "tool_result"]),
    st.lists(
        st.one_of(_text.map(TextBlock), _tool_ids.map(lambda i: ToolResultBlock(i, "r"))),
        max_size=3,
    ).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(_assistant, _user_side), max_size=12),
    st.booleans(),
    st.integers(min_value=-1, max_value=4),
)
def test_repaired_history_is_always_valid(
    messages: list[Message], with_summary: bool, max_turns: int
) -> None:
    if with_summary:
        messages = [summary_message("s"), *messages]
    history = repair_history(limit_history_turns(repair_history(messages), max_turns))
    assert repair_history(history) == history  # idempotent
    if with_summary:
        assert history[0].content[0] == summary_message("s").content[0]
    if max_turns > 0:
        turn_starts = [
            m
            for m in history
            if m.role == "user"
            and any(
                not (isinstance(b, TextBlock) and b.text.startswith(COMPACTION_SUMMARY_PREFIX))
                for b in m.content
            )
        ]
        assert len(turn_starts) <= max_turns
    if not history:
        return
    assert history[0].role == "user"
    for prev, cur in itertools.pairwise(history):
        user_side = {"user", "tool_result"}
        assert not (prev.role == cur.role == "assistant")
        assert not (prev.role == cur.role == "user")
        assert prev.role in user_side or cur.role in user_side
    seen_calls: set[str] = set()
    for index, message in enumerate(history):
        assert message.content
        assert all(not (isinstance(b, TextBlock) and not b.text.strip()) for b in message.content)
        if message.role == "assistant":
            calls = [b.id for b in message.content if isinstance(b, ToolUseBlock)]
            assert all(b.name != "bad name" for b in message.tool_uses)
            assert not any(isinstance(b, ToolResultBlock) for b in message.content)
            assert not seen_calls & set(calls)
            seen_calls.update(calls)
            if calls:
                answer = history[index + 1]
                assert answer.role == "tool_result"
                assert [b.tool_use_id for b in answer.content] == calls
        elif message.role == "tool_result":
            assert history[index - 1].role == "assistant"
            assert all(isinstance(b, ToolResultBlock) for b in message.content)
        else:
            assert not any(isinstance(b, ToolResultBlock | ToolUseBlock) for b in message.content)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_assistant, _user_side), max_size=12))
def test_plain_messages_take_a_short_cut_to_the_same_repair(messages: list[Message]) -> None:
    # The short cut for plain messages (text and images, none blank) against the full
    # repair of every message; images stand in beside the text.
    messages = [
        Message(m.role, (*m.content, ImageBlock("image/png", "iVBO"))) if i % 4 == 3 else m
        for i, m in enumerate(messages)
    ]
    fast = repair_history(messages)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(history_module, "_plain", lambda message: False)
        slow = repair_history(messages)
    assert fast == slow


def test_a_plain_message_is_passed_on_as_it_is_and_a_blank_block_still_goes() -> None:
    question, answer = Message.user("q"), Message.assistant("a")
    blank = Message("assistant", (TextBlock("a2"), TextBlock("  ")))
    first = repair_history([question, answer, blank])
    again = repair_history([question, answer, blank])  # the status is kept on each message
    assert first == again
    assert first[0] is question
    assert first[1].content == (TextBlock("a"), TextBlock("a2"))  # merged, the blank gone
