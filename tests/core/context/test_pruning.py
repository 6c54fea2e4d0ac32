"""Cache-TTL pruning: triggers, protected zones, soft/hard, stickiness, malformed input."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.context.config import PruningConfig
from parley.core.context.pruning import (
    PRUNE_CUSTOM_TYPE,
    PRUNED_IMAGE_PLACEHOLDER,
    PruneDecision,
    apply_decisions,
    decide,
    recorded_decisions,
    soft_trim_text,
    view_chars,
)
from parley.core.messages import ImageBlock, Message, TextBlock, ToolResultBlock, ToolUseBlock
from parley.core.transcript import ENTRY_CUSTOM, Entry, Transcript

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
COLD = NOW - timedelta(hours=1)  # far past the default 5-minute TTL
WARM = NOW - timedelta(seconds=1)
PLACEHOLDER = PruningConfig().hard_clear_placeholder


def _config(**overrides: Any) -> PruningConfig:
    return PruningConfig(**overrides)


def _call(call_id: str, name: str, size: int, *, fill: str = "r") -> list[Message]:
    """An assistant tool call and its result of ``size`` characters."""
    return [
        Message("assistant", (ToolUseBlock(call_id, name, {"q": call_id}),)),
        Message("tool_result", (ToolResultBlock(call_id, fill * size),)),
    ]


def _conversation(
    sizes: list[int], *, name: str = "read_file", tail_turns: int = 3, prefix: str = "c"
) -> list[Message]:
    """A user ask, one tool call per size, then ``tail_turns`` short assistant turns."""
    messages = [Message.user("look into it")]
    for i, size in enumerate(sizes):
        messages += _call(f"{prefix}{i}", name, size)
    for i in range(tail_turns):
        messages += [Message.assistant(f"step {i}"), Message.user(f"go on {i}")]
    return messages


def _decide(
    messages: list[Message],
    *,
    window: int = 10_000,
    last: datetime | None = COLD,
    config: PruningConfig | None = None,
    already: tuple[PruneDecision, ...] = (),
) -> PruneDecision | None:
    return decide(
        messages,
        now=NOW,
        last_call_at=last,
        window_tokens=window,
        settings=config or _config(),
        already=already,
    )


def _ratio(messages: list[Message], window: int) -> float:
    return view_chars(messages) / (window * 4)


def _bytes(messages: list[Message]) -> bytes:
    return json.dumps([m.to_dict() for m in messages], ensure_ascii=False).encode()


# -- when it runs --------------------------------------------------------------------------


def test_mode_off_does_nothing() -> None:
    messages = _conversation([30_000] * 4)

    assert _decide(messages) is not None
    assert _decide(messages, config=_config(mode="off")) is None


def test_ttl_prunes_at_the_ttl_and_not_before() -> None:
    messages = _conversation([6_000] * 2)  # ratio ~0.3: soft trim only, no share trigger
    config = _config(ttl_seconds=300)
    assert 0.3 <= _ratio(messages, 10_000) <= 0.5

    at = NOW - timedelta(seconds=300)
    just_before = NOW - timedelta(seconds=299.999)

    decision = _decide(messages, last=at, config=config)
    assert decision is not None
    assert decision.reason == "ttl"
    assert _decide(messages, last=just_before, config=config) is None
    assert _decide(messages, last=None, config=config) is None


def test_a_share_over_the_hard_ratio_prunes_a_warm_cache() -> None:
    messages = _conversation([30_000] * 4)

    decision = _decide(messages, last=WARM)
    assert decision is not None
    assert decision.reason == "share"
    assert decision.ratio_before > 0.5
    assert _decide(messages, last=None) is not None
    assert _decide(messages, last=WARM, config=_config(prune_on_share=False)) is None


def test_the_share_trigger_needs_a_ratio_strictly_above_the_hard_ratio() -> None:
    messages = _conversation([10_000, 10_000])
    if view_chars(messages) % 2:
        messages = _conversation([10_000, 10_001])
    total = view_chars(messages)
    assert total % 2 == 0
    exactly_half = total // 2  # window tokens for which the ratio is exactly 0.5

    assert _decide(messages, window=exactly_half, last=WARM) is None
    assert _decide(messages, window=exactly_half - 1, last=WARM) is not None


def test_below_the_soft_ratio_nothing_happens() -> None:
    messages = _conversation([5_000])

    assert _ratio(messages, 100_000) < 0.3
    assert _decide(messages, window=100_000) is None


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(ValueError):
        _decide(_conversation([5_000]), window=0)


# -- soft and hard -------------------------------------------------------------------------


def test_soft_trim_keeps_head_and_tail_with_a_note() -> None:
    text = "H" * 1_500 + "m" * 7_000 + "T" * 1_500

    out = soft_trim_text(text, _config())

    assert out == (
        "H" * 1_500
        + "\n…\n"
        + "T" * 1_500
        + "\n[Tool result trimmed: kept first 1500 chars and last 1500 chars of 10000 chars.]"
    )
    assert soft_trim_text(out, _config()) == out  # trimming again changes nothing
    short = "s" * 4_000
    assert soft_trim_text(short, _config()) is short


def test_soft_trim_only_long_eligible_results() -> None:
    messages = _conversation([6_000, 3_000, 6_000])

    decision = _decide(messages)

    assert decision is not None
    assert decision.soft == ("c0", "c2")
    assert decision.hard == ()
    view = apply_decisions(messages, [decision], _config())
    assert view[4] is messages[4]  # the 3,000-char result
    assert view[2].content[0].content.startswith("r" * 1_500 + "\n…\n")  # type: ignore[union-attr]
    assert decision.ratio_after == pytest.approx(_ratio(view, 10_000))


def test_hard_clear_goes_oldest_first_and_stops_below_the_ratio() -> None:
    # Results too short to soft-trim: only clearing can bring the ratio down.
    messages = _conversation([4_000] * 60)
    window = 100_000  # 400k chars: ratio ~0.6

    decision = _decide(messages, window=window)

    assert decision is not None
    cleared = decision.hard
    assert 5 < len(cleared) < 57
    assert cleared == tuple(f"c{i}" for i in range(len(cleared)))  # oldest first
    view = apply_decisions(messages, [decision], _config())
    assert decision.ratio_after == pytest.approx(_ratio(view, window))
    assert decision.ratio_after < 0.5
    # Minimal: without its last clear the view would still be at or over the ratio.
    fewer = PruneDecision((), cleared[:-1], "ttl", 0, 0)
    assert _ratio(apply_decisions(messages, [fewer], _config()), window) >= 0.5
    assert decision.soft == ()
    for message in view:
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.tool_use_id in cleared:
                assert block.content == PLACEHOLDER


def test_hard_clear_needs_enough_prunable_chars() -> None:
    messages = _conversation([5_000] * 4)
    window = 4_000  # ratio > 1 even after soft trims

    strict = _decide(messages, window=window)
    lenient = _decide(messages, window=window, config=_config(min_prunable_tool_chars=1_000))

    assert strict is not None and strict.hard == ()
    assert lenient is not None and lenient.hard


def test_hard_clear_can_be_disabled() -> None:
    decision = _decide(
        _conversation([30_000] * 6), window=50_000, config=_config(hard_clear_enabled=False)
    )

    assert decision is not None
    assert decision.hard == ()
    assert len(decision.soft) == 6


# -- what is never touched -----------------------------------------------------------------


def test_the_last_assistants_and_the_results_after_them_are_kept() -> None:
    messages = [Message.user("go")]
    for i in range(5):
        messages += _call(f"c{i}", "read_file", 30_000)
    # 5 assistants; keep the last 3: c2, c3, c4 and their results stay whole.

    decision = _decide(messages, window=20_000)

    assert decision is not None
    touched = set(decision.soft) | set(decision.hard)
    assert touched == {"c0", "c1"}
    view = apply_decisions(messages, [decision], _config())
    assert view[5:] == messages[5:]
    assert all(a is b for a, b in zip(view[5:], messages[5:], strict=True))


def test_fewer_assistants_than_kept_means_no_pruning() -> None:
    messages = [Message.user("go")]
    for i in range(3):
        messages += _call(f"c{i}", "read_file", 50_000)

    assert _decide(messages, config=_config(keep_last_assistants=4)) is None
    assert _decide(messages, config=_config(keep_last_assistants=3)) is None  # all protected
    decision = _decide(messages, config=_config(keep_last_assistants=2))
    assert decision is not None
    assert set(decision.soft + decision.hard) == {"c0"}


def test_keeping_no_assistants_makes_every_result_eligible() -> None:
    messages = [Message.user("go"), *_call("c0", "read_file", 8_000)]

    decision = _decide(messages, window=5_000, config=_config(keep_last_assistants=0))

    assert decision is not None
    assert decision.soft == ("c0",)


def test_nothing_before_the_first_user_message_is_pruned() -> None:
    identity = _call("soul", "read_file", 30_000)  # bootstrap reads before the user spoke
    messages = [*identity, *_conversation([30_000] * 3)]

    decision = _decide(messages, window=20_000)

    assert decision is not None
    assert "soul" not in decision.soft + decision.hard
    view = apply_decisions(messages, [decision], _config())
    assert view[0] is messages[0] and view[1] is messages[1]


def test_user_and_assistant_text_is_never_touched() -> None:
    huge_user = Message.user("u" * 100_000)
    huge_assistant = Message("assistant", (TextBlock("a" * 100_000), ToolUseBlock("c0", "f", {})))
    messages = [
        huge_user,
        huge_assistant,
        Message("tool_result", (ToolResultBlock("c0", "r" * 50_000),)),
        *_conversation([], tail_turns=3)[1:],
    ]

    decision = _decide(messages, window=20_000, config=_config(min_prunable_tool_chars=0))

    assert decision is not None
    assert decision.hard == ("c0",)
    view = apply_decisions(messages, [decision], _config())
    assert view[0] is huge_user
    assert view[1] is huge_assistant


@pytest.mark.parametrize(
    ("allow", "deny", "expected"),
    [
        ((), (), {"c0", "c1", "c2"}),
        (("read_*",), (), {"c0", "c1"}),
        (("READ_*",), ("read_file",), {"c1"}),  # deny wins; globs are case-insensitive
        ((), ("*",), set()),
        (("*",), ("exec*",), {"c0", "c1"}),
    ],
)
def test_tool_filters(allow: tuple[str, ...], deny: tuple[str, ...], expected: set[str]) -> None:
    messages = [
        Message.user("go"),
        *_call("c0", "Read_File", 8_000),
        *_call("c1", "read_dir", 8_000),
        *_call("c2", "EXEC", 8_000),
        *_conversation([], tail_turns=3)[1:],
    ]
    config = _config(tools_allow=allow, tools_deny=deny)

    decision = _decide(messages, config=config)

    touched = set() if decision is None else set(decision.soft) | set(decision.hard)
    assert touched == expected


def test_astral_characters_count_as_characters() -> None:
    messages = _conversation([0])
    messages[2] = Message("tool_result", (ToolResultBlock("c0", "𠀀" * 6_000),))

    decision = _decide(messages, window=4_000)  # 6,000 of 16,000 chars

    assert decision is not None
    assert decision.soft == ("c0",)


# -- stickiness and applying ---------------------------------------------------------------


def test_decisions_are_deterministic_and_sticky() -> None:
    messages = _conversation([30_000] * 6)

    first = _decide(messages, window=50_000)
    again = _decide(messages, window=50_000)

    assert first is not None
    assert first == again
    assert _decide(messages, window=50_000, already=(first,)) is None  # prunes once
    one = apply_decisions(messages, [first], _config())
    two = apply_decisions(messages, [first], _config())
    assert one == two
    assert _bytes(one) == _bytes(two)


def test_a_soft_trim_is_upgraded_to_a_hard_clear_later() -> None:
    early = _conversation([6_000] * 4)
    soft = _decide(early, window=20_000)
    assert soft is not None
    assert soft.soft == ("c0", "c1", "c2", "c3") and soft.hard == ()

    # The session grows with results too short to trim: only clearing helps now.
    grown = early + _conversation([3_900] * 30, prefix="n")[1:]
    later = _decide(
        grown, window=40_000, config=_config(min_prunable_tool_chars=0), already=(soft,)
    )

    assert later is not None
    assert later.soft == ()  # never repeated
    assert later.hard[:4] == ("c0", "c1", "c2", "c3")  # upgraded, oldest first
    assert later.ratio_after < 0.5
    view = apply_decisions(grown, [soft, later], _config())
    assert view[2].content[0].content == PLACEHOLDER  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "config",
    [
        _config(),
        _config(soft_trim_max_chars=500, soft_trim_head_chars=1_500, soft_trim_tail_chars=1_500),
        _config(soft_trim_max_chars=100, soft_trim_head_chars=0, soft_trim_tail_chars=50),
    ],
)
def test_applying_twice_changes_nothing(config: PruningConfig) -> None:
    messages = _conversation([20_000, 9_000, 30_000])
    decisions = [PruneDecision(("c0", "c1"), ("c2",), "ttl", 0.6, 0.2)]

    once = apply_decisions(messages, decisions, config)
    twice = apply_decisions(once, decisions, config)

    assert once[2] is not messages[2]
    assert all(a is b for a, b in zip(twice, once, strict=True))


def test_deciding_on_a_view_that_already_has_the_decisions_applied() -> None:
    messages = _conversation([6_000] * 4) + _conversation([3_900] * 30, prefix="n")[1:]
    config = _config(min_prunable_tool_chars=0, soft_trim_max_chars=1_000)
    first = _decide(messages[:9], window=20_000, config=config)
    assert first is not None and first.soft

    raw = _decide(messages, window=40_000, config=config, already=(first,))
    applied = apply_decisions(messages, [first], config)
    pre = _decide(applied, window=40_000, config=config, already=(first,))

    assert raw is not None
    assert pre == raw


def test_hard_wins_over_soft_whatever_the_order() -> None:
    messages = _conversation([10_000])
    soft = PruneDecision(("c0",), (), "ttl", 0.5, 0.4)
    hard = PruneDecision((), ("c0",), "share", 0.6, 0.1)

    for order in ([soft, hard], [hard, soft]):
        view = apply_decisions(messages, order, _config())
        assert view[2].content[0].content == PLACEHOLDER  # type: ignore[union-attr]


def test_apply_is_pure_and_keeps_untouched_messages() -> None:
    messages = _conversation([10_000, 10_000])
    before = list(messages)
    decision = PruneDecision(("c1",), (), "ttl", 0.4, 0.3)

    view = apply_decisions(messages, [decision], _config())

    assert messages == before
    assert all(a is b for a, b in zip(messages, before, strict=True))
    assert view is not messages
    changed = [i for i, (a, b) in enumerate(zip(view, messages, strict=True)) if a is not b]
    assert changed == [4]
    assert apply_decisions(messages, [], _config()) == messages


def test_images_in_a_pruned_result_become_placeholders() -> None:
    photo = ImageBlock("image/png", "aGVsbG8=")
    pruned = Message("tool_result", (ToolResultBlock("c0", "r" * 10_000), photo))
    kept = Message("tool_result", (ToolResultBlock("c1", "small"), photo))
    user = Message("user", (TextBlock("see"), photo))
    messages = [user, pruned, kept]

    view = apply_decisions(messages, [PruneDecision((), ("c0",), "ttl", 1, 0)], _config())

    assert view[1].content == (
        ToolResultBlock("c0", PLACEHOLDER),
        TextBlock(PRUNED_IMAGE_PLACEHOLDER),
    )
    assert view[2] is kept
    assert view[0] is user


def test_an_unknown_id_changes_nothing() -> None:
    messages = _conversation([10_000])

    view = apply_decisions(messages, [PruneDecision(("nope",), ("gone",), "ttl", 0, 0)], _config())

    assert all(a is b for a, b in zip(view, messages, strict=True))


# -- malformed input -----------------------------------------------------------------------


def test_malformed_messages_do_not_crash() -> None:
    messages = [
        Message("assistant", ()),
        Message.user("go"),
        Message("user", ()),
        Message("tool_result", ()),
        Message("tool_result", (ToolResultBlock("orphan", "o" * 30_000),)),  # no call
        Message("tool_result", (TextBlock("stray text"), ToolResultBlock("c0", ""))),
        Message("assistant", (ToolUseBlock("c1", "", {"bad": {1, 2}}),)),  # not JSON
        Message("tool_result", (ToolResultBlock("c1", "x" * 30_000),)),
        *_conversation([], tail_turns=3)[1:],
    ]

    decision = _decide(messages, window=10_000, config=_config(min_prunable_tool_chars=0))

    assert decision is not None
    assert "orphan" in decision.soft + decision.hard  # unfiltered: a nameless result is eligible
    view = apply_decisions(messages, [decision], _config())
    assert view[5] is messages[5]  # the stray text and the empty result
    filtered = _decide(messages, config=_config(tools_allow=("read_*",)))
    assert filtered is None  # neither result has a name the allow list matches


def test_a_view_without_a_user_message_is_not_pruned() -> None:
    messages = [*_call("c0", "f", 100_000), Message.assistant("a"), Message.assistant("b")]

    assert _decide(messages, config=_config(keep_last_assistants=0)) is None


# -- recording -----------------------------------------------------------------------------


def test_a_decision_survives_json() -> None:
    decision = PruneDecision(("a", "b"), ("c",), "share", 0.7123456789, 0.49)

    raw = json.loads(json.dumps(decision.to_dict()))

    assert PruneDecision.from_dict(raw) == decision


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        {"soft": "a", "hard": [], "reason": "ttl"},
        {"soft": [1], "hard": [], "reason": "ttl"},
        {"soft": [], "hard": [], "reason": None},
        {"soft": [], "hard": [], "reason": "ttl", "ratio_before": "high"},
        {"soft": [], "hard": [], "reason": "ttl", "ratio_after": True},
    ],
)
def test_malformed_decisions_are_refused(raw: Any) -> None:
    with pytest.raises(ValueError):
        PruneDecision.from_dict(raw)


def test_recorded_decisions_read_back_in_order(tmp_path: Path) -> None:
    first = PruneDecision(("a",), (), "ttl", 0.4, 0.3)
    second = PruneDecision((), ("a",), "share", 0.6, 0.45)
    with Transcript.create(tmp_path / "s.jsonl", "s", "k") as transcript:
        transcript.append_message(Message.user("hi"))
        transcript.append_custom(PRUNE_CUSTOM_TYPE, first.to_dict())
        transcript.append_custom("something_else", {"soft": ["x"]})
        transcript.append_custom(PRUNE_CUSTOM_TYPE, {"soft": "broken"})
        transcript.append_custom(PRUNE_CUSTOM_TYPE, second.to_dict())
        entries = list(transcript.live_entries())

    assert recorded_decisions(entries) == [first, second]


def test_recorded_decisions_skip_foreign_entries() -> None:
    odd = Entry(
        "e1", None, "2026-01-01T00:00:00Z", ENTRY_CUSTOM, {"custom_type": PRUNE_CUSTOM_TYPE}
    )

    assert recorded_decisions([odd]) == []


# -- properties ----------------------------------------------------------------------------

_ROLE_SIZES = st.lists(
    st.tuples(
        st.sampled_from(["user", "call", "text", "orphan"]),
        st.integers(min_value=0, max_value=20_000),
        st.sampled_from(["read_file", "exec", "web"]),
    ),
    max_size=25,
)


def _build(spec: list[tuple[str, int, str]]) -> list[Message]:
    messages: list[Message] = []
    for i, (kind, size, name) in enumerate(spec):
        if kind == "user":
            messages.append(Message.user("u" * (size // 10)))
        elif kind == "call":
            messages += _call(f"c{i}", name, size)
        elif kind == "text":
            messages.append(Message.assistant("a" * (size // 10)))
        else:
            messages.append(Message("tool_result", (ToolResultBlock(f"o{i}", "o" * size),)))
    return messages


@settings(max_examples=150, deadline=None)
@given(
    _ROLE_SIZES,
    st.integers(min_value=2_000, max_value=60_000),
    st.integers(min_value=0, max_value=4),
    st.booleans(),
)
def test_pruning_properties(
    spec: list[tuple[str, int, str]], window: int, keep: int, deny_exec: bool
) -> None:
    messages = _build(spec)
    config = _config(
        keep_last_assistants=keep,
        min_prunable_tool_chars=10_000,
        tools_deny=("exec",) if deny_exec else (),
    )
    first = _decide(messages, window=window, config=config)
    if first is None:
        return
    assert first == _decide(messages, window=window, config=config)
    assert set(first.soft).isdisjoint(first.hard)
    assert first.ratio_after <= first.ratio_before

    view = apply_decisions(messages, [first], config)
    assert view == apply_decisions(messages, [first], config)
    assert first.ratio_after == pytest.approx(_ratio(view, window))
    first_user = next(i for i, m in enumerate(messages) if m.role == "user")
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    cutoff = assistants[-keep] if keep else len(messages)
    for i, (new, old) in enumerate(zip(view, messages, strict=True)):
        if new is not old:
            assert old.role == "tool_result"
            assert first_user <= i < cutoff
            if deny_exec:
                names = {b.id: b.name for m in messages for b in m.tool_uses}
                assert all(
                    names.get(b.tool_use_id) != "exec"
                    for b, o in zip(new.content, old.content, strict=True)
                    if b is not o and isinstance(b, ToolResultBlock)
                )

    second = _decide(messages, window=window, config=config, already=(first,))
    if second is not None:
        assert set(second.soft).isdisjoint(first.soft)
        assert set(second.hard).isdisjoint(first.hard)
