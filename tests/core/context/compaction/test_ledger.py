"""The ledger: deterministic extraction of what a summary must never lose."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.context.compaction.ledger import (
    DEFAULT_MAX_ASKS,
    DEFAULT_MAX_IDENTIFIERS,
    MAX_SENTENCE_CHARS,
    SHORT_TOOL_RESULT_CHARS,
    Ledger,
    extract_ledger,
    missing_identifiers,
)
from parley.core.identifiers import absent_identifiers, find_identifiers
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock


def call(tool_id: str, name: str, **inputs: object) -> Message:
    return Message("assistant", (ToolUseBlock(tool_id, name, dict(inputs)),))


def result(tool_id: str, content: str, *, is_error: bool = False) -> Message:
    return Message("tool_result", (ToolResultBlock(tool_id, content, is_error),))


# --- identifiers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see 123e4567-E89B-12d3-a456-426614174000 now", "123e4567-E89B-12d3-a456-426614174000"),
        ("commit 9f8e7d6c5b4a landed", "9f8e7d6c5b4a"),
        ("docs at https://example.com/a/b?x=1&y=2.", "https://example.com/a/b?x=1&y=2"),
        ("(see https://example.com/wiki/Foo_(bar))", "https://example.com/wiki/Foo_(bar)"),
        ("edit /etc/nginx/nginx.conf, then reload", "/etc/nginx/nginx.conf"),
        ("notes in ~/notes/today.md.", "~/notes/today.md"),
        (r"open C:\Users\bob\report.xlsx please", r"C:\Users\bob\report.xlsx"),
        ("db at db.example.com:5432.", "db.example.com:5432"),
        ("serve on localhost:8080", "localhost:8080"),
        ("ping 192.168.1.20 now", "192.168.1.20"),
        ("order number 88123456 is late", "88123456"),
        ("ticket ABC-1234 is open", "ABC-1234"),
        ("ref ORD_88123 shipped", "ORD_88123"),
        ("mail bob.smith@example.co.uk today", "bob.smith@example.co.uk"),
    ],
)
def test_each_identifier_kind_is_found_exactly(text: str, expected: str) -> None:
    assert find_identifiers(text) == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "meet at 10:30 tomorrow",  # a time is not host:port
        "type /compact to shrink",  # a one-segment slash command is not a path
        "deadbeef and cafebabe",  # hex without a digit is a word
        "version 1.2.3.4.5",  # not an IPv4 address
        "UTF-8 and 12345 items",  # short numbers, an encoding name
        "and/or 1/2 km/h",
    ],
)
def test_ordinary_text_yields_no_identifiers(text: str) -> None:
    assert find_identifiers(text) == []


def test_overlapping_matches_keep_the_longest_whole_token() -> None:
    text = "GET http://10.0.0.1:8080/api/v1/items/1234567 failed"
    assert find_identifiers(text) == ["http://10.0.0.1:8080/api/v1/items/1234567"]


def test_hex_identifiers_dedupe_case_insensitively_keeping_the_first_spelling() -> None:
    ledger = extract_ledger(
        [Message.user("build ABCDEF1234 failed"), Message.assistant("abcdef1234 is bad")]
    )
    assert ledger.identifiers == ("ABCDEF1234",)


def test_non_hex_identifiers_are_case_sensitive() -> None:
    ledger = extract_ledger([Message.user("files /srv/App/x.py and /srv/app/x.py")])
    assert ledger.identifiers == ("/srv/App/x.py", "/srv/app/x.py")


def test_identifiers_come_from_text_tool_inputs_and_short_results_only() -> None:
    bulk = "x" * SHORT_TOOL_RESULT_CHARS + " 11111111-2222-3333-4444-555555555555"
    ledger = extract_ledger(
        [
            Message.user("look at ORD-12345"),
            call("t1", "read", path="/srv/app/config.yaml", lines=[1234567]),
            result("t1", "host: 10.1.2.3"),
            call("t2", "grep", pattern="foo"),
            result("t2", bulk),
            Message.assistant("It points at https://internal.example.com/x"),
        ]
    )
    assert ledger.identifiers == (
        "ORD-12345",
        "/srv/app/config.yaml",
        "1234567",
        "10.1.2.3",
        "https://internal.example.com/x",
    )


def test_identifiers_keep_first_seen_order_across_messages() -> None:
    ledger = extract_ledger(
        [Message.user("first ZZ-100 then /a/b/c"), Message.user("then 123456 and ZZ-100 again")]
    )
    assert ledger.identifiers == ("ZZ-100", "/a/b/c", "123456")


def test_missing_identifiers_matches_hex_case_insensitively_and_the_rest_exactly() -> None:
    ledger = Ledger(identifiers=("ABCDEF1234", "https://example.com/A", "ORD-1"))
    summary = "hash abcdef1234, url https://example.com/a, ord-1"
    assert missing_identifiers(ledger, summary) == ["https://example.com/A", "ORD-1"]
    assert absent_identifiers(["x"], "") == ["x"]
    assert missing_identifiers(Ledger(), "anything") == []


# --- asks ----------------------------------------------------------------------------


def test_an_ask_answered_in_the_same_turn_is_closed() -> None:
    ledger = extract_ledger(
        [Message.user("What is the capital of France?"), Message.assistant("Paris.")]
    )
    assert ledger.asks == ()


def test_the_last_unanswered_ask_stays_open() -> None:
    ledger = extract_ledger(
        [
            Message.user("Can you check the build?"),
            Message.assistant("It passed."),
            Message.user("Could you deploy it to staging"),
        ]
    )
    assert ledger.asks == ("Could you deploy it to staging",)


def test_an_ask_followed_by_the_next_user_turn_without_reply_stays_open() -> None:
    ledger = extract_ledger(
        [
            Message.user("Please rotate the keys."),
            call("t1", "rotate"),
            result("t1", "boom", is_error=True),
            Message.user("hello?"),
            Message.assistant("Hi!"),
        ]
    )
    assert ledger.asks == ("Please rotate the keys.",)


def test_a_tool_preamble_or_error_notice_does_not_answer_an_ask() -> None:
    preamble = Message("assistant", (TextBlock("Let me look."), ToolUseBlock("t1", "ls", {})))
    ledger = extract_ledger(
        [
            Message.user("Can you list the files?"),
            preamble,
            result("t1", "a b c"),
            Message.assistant("Error: the provider failed"),
            Message.assistant("   "),
        ]
    )
    assert ledger.asks == ("Can you list the files?",)


def test_a_burst_of_user_messages_is_answered_by_one_reply() -> None:
    ledger = extract_ledger(
        [
            Message.user("Where is the log?"),
            Message.user("And who owns it?"),
            Message.assistant("In /var/log/app.log, owned by ops."),
        ]
    )
    assert ledger.asks == ()


def test_deferred_asks_stay_open_even_after_a_reply() -> None:
    ledger = extract_ledger(
        [
            Message.user("Remind me to renew the cert. Can you check it later? How are you?"),
            Message.assistant("Sure, noted. I'm fine."),
        ]
    )
    assert ledger.asks == ("Remind me to renew the cert.", "Can you check it later?")


def test_asks_are_capped_keeping_the_newest() -> None:
    messages = [Message.user(f"Question number {i}?") for i in range(DEFAULT_MAX_ASKS + 5)]
    ledger = extract_ledger(messages)
    assert len(ledger.asks) == DEFAULT_MAX_ASKS
    assert ledger.asks[-1] == f"Question number {DEFAULT_MAX_ASKS + 4}?"
    assert ledger.asks[0] == "Question number 5?"


def test_long_sentences_are_clipped() -> None:
    ledger = extract_ledger([Message.user("Can you " + "very " * 100 + "carefully check?")])
    (ask,) = ledger.asks
    assert len(ask) == MAX_SENTENCE_CHARS
    assert ask.endswith("…")


# --- remember and decisions ----------------------------------------------------------


def test_remember_notes_are_collected_from_user_messages() -> None:
    ledger = extract_ledger(
        [
            Message.user(
                "Remember that prod is read-only. Don't forget the 5% fee. "
                "Note that Bob is on leave. Keep in mind the budget. Do you remember me?"
            ),
            Message.assistant("Remember: I am a bot."),
        ]
    )
    assert ledger.remember == (
        "Remember that prod is read-only.",
        "Don't forget the 5% fee.",
        "Note that Bob is on leave.",
        "Keep in mind the budget.",
    )


def test_decisions_from_user_and_assistant_but_not_tool_announcements() -> None:
    ledger = extract_ledger(
        [
            Message.user("We decided to use Postgres because of JSONB. I'll use the staging DB."),
            Message.assistant("Decision: keep the cron at 04:00. I'll use the grep tool now."),
            Message.user("OK, go with the blue theme. Let's go with weekly releases."),
        ]
    )
    assert ledger.decisions == (
        "We decided to use Postgres because of JSONB.",
        "I'll use the staging DB.",
        "Decision: keep the cron at 04:00.",
        "OK, go with the blue theme.",
        "Let's go with weekly releases.",
    )


# --- merge, render, serialisation ----------------------------------------------------


def test_merge_across_ten_ledgers_keeps_the_first_identifiers_up_to_the_cap() -> None:
    merged = Ledger()
    for n in range(10):
        merged = merged.merge(Ledger(identifiers=tuple(f"ID-{n}{i:03d}" for i in range(50))))
    assert len(merged.identifiers) == DEFAULT_MAX_IDENTIFIERS
    assert merged.identifiers[0] == "ID-0000"
    assert merged.identifiers[-1] == "ID-7049"
    assert "ID-8000" not in merged.identifiers


def test_merge_is_an_ordered_union_and_sentence_lists_keep_the_newest() -> None:
    old = Ledger(
        identifiers=("abcdef12", "A-11"),
        asks=tuple(f"old ask {i}?" for i in range(DEFAULT_MAX_ASKS)),
        remember=("Remember X.",),
    )
    new = Ledger(
        identifiers=("ABCDEF12", "B-22"),
        asks=("new ask?",),
        remember=("remember   x.", "Remember Y."),
        decisions=("We decided Z.",),
    )
    merged = old.merge(new)
    assert merged.identifiers == ("abcdef12", "A-11", "B-22")
    assert merged.asks[-1] == "new ask?"
    assert merged.asks[0] == "old ask 1?"
    assert len(merged.asks) == DEFAULT_MAX_ASKS
    assert merged.remember == ("Remember X.", "Remember Y.")
    assert merged.decisions == ("We decided Z.",)


def test_render_is_stable_and_omits_empty_sections() -> None:
    ledger = Ledger(identifiers=("ORD-12345", "/a/b"), decisions=("We decided Z.",))
    expected = (
        "## Ledger (kept verbatim across compactions)\n"
        "### Exact identifiers\n- ORD-12345\n- /a/b\n"
        "### Decisions\n- We decided Z."
    )
    assert ledger.render() == expected
    assert Ledger.from_dict(ledger.to_dict()).render() == expected
    assert Ledger().render() == ""
    assert Ledger().is_empty()
    assert not ledger.is_empty()


def test_render_lists_all_sections_in_a_fixed_order() -> None:
    ledger = Ledger(identifiers=("X-10",), asks=("Why?",), remember=("Remember R.",))
    ledger = ledger.merge(Ledger(decisions=("Decision: D.",)))
    titles = [line for line in ledger.render().splitlines() if line.startswith("#")]
    assert titles == [
        "## Ledger (kept verbatim across compactions)",
        "### Exact identifiers",
        "### Open asks",
        "### Remember",
        "### Decisions",
    ]


def test_from_dict_tolerates_missing_and_malformed_fields() -> None:
    assert Ledger.from_dict(None) == Ledger()
    assert Ledger.from_dict({"identifiers": "nope", "asks": [1, None, "Why?", " "]}) == Ledger(
        asks=("Why?",)
    )


def test_extraction_of_an_empty_or_tool_only_history_is_empty() -> None:
    assert extract_ledger([]).is_empty()
    assert extract_ledger([call("t1", "ls"), result("t1", "ok")]).is_empty()


_FRAGMENTS = st.sampled_from(
    [
        "https://x.org/a(b)",
        "ABCdef1234",
        "/srv/a/b.",
        "~/x",
        r"C:\tmp\y",
        "host.io:443",
        "10.0.0.1",
        "1234567",
        "ORD_991",
        "a@b.io",
        "?",
        ". ",
        "\n",
        "(",
        ")",
        ":",
        "please ",
    ]
)
_TEXTS = st.lists(st.one_of(st.text(max_size=20), _FRAGMENTS), max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(_TEXTS, max_size=6))
def test_every_identifier_appears_verbatim_in_the_source(texts: list[str]) -> None:
    messages = [
        Message.user(t) if i % 2 == 0 else Message.assistant(t) for i, t in enumerate(texts)
    ]
    ledger = extract_ledger(messages)
    joined = "\n".join(texts)
    for ident in ledger.identifiers:
        assert ident in joined
    assert ledger.render() == extract_ledger(messages).render()
    assert missing_identifiers(ledger, joined) == []


# --- rendering within a small window --------------------------------------------------


def _words(text: str) -> int:
    return len(text.split())


def test_render_within_a_budget_keeps_remember_and_first_identifiers() -> None:
    ledger = Ledger(
        identifiers=tuple(f"ORD-{n:05d}" for n in range(100)),
        asks=tuple(f"could you check item {n}?" for n in range(20)),
        remember=("Remember: my car is on level 3, spot 42.",),
        decisions=tuple(f"we decided to use plan {n}" for n in range(20)),
    )
    full = ledger.render()
    small = ledger.render(60, _words)
    assert _words(small) <= 60 < _words(full)
    # The user's own "remember" first, then the first-seen identifiers, the newest asks
    # and decisions, in turns; a last line says how much was left out.
    assert "level 3, spot 42" in small
    assert "ORD-00000" in small and "ORD-00099" not in small
    assert "item 19?" in small and "item 0?" not in small
    assert "left out to fit the context window" in small
    # Same ledger, same budget, same bytes; a budget it fits in changes nothing.
    assert ledger.render(60, _words) == small
    assert ledger.render(10_000, _words) == full


def test_render_within_a_budget_shows_an_ask_that_is_a_remember_note_once() -> None:
    said = "Please remember ORD-88123 for later."
    ledger = Ledger(identifiers=("ORD-88123",), asks=(said,), remember=(said,))
    small = ledger.render(200, _words)
    assert small.count(said) == 1 and "### Open asks" not in small
    # Shown once is not left out: everything fit, so no note says otherwise.
    assert "left out" not in small
    # Without a budget the rendering is today's, byte for byte.
    assert ledger.render().count(said) == 2


def test_render_within_a_budget_does_not_repeat_an_identifier_a_sentence_shows() -> None:
    said = "Please remember db-replica-2.internal:5433 for later."
    ledger = Ledger(identifiers=("db-replica-2.internal:5433", "ORD-88123"), remember=(said,))
    small = ledger.render(60, _words)
    assert small.count("db-replica-2.internal:5433") == 1
    assert "ORD-88123" in small and "left out" not in small
