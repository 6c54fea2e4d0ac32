"""Reset triggers as typed: ``/new``, ``/reset`` and configured ones, with a bot's
name or a leading mention."""

from __future__ import annotations

import pytest

from parley.gateway.runtime.commands.parsing import ResetCommand, match_reset_trigger

TRIGGERS = ["/new", "/reset"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/new", ResetCommand("/new", "")),
        ("/NEW", ResetCommand("/new", "")),
        ("  /reset  ", ResetCommand("/reset", "")),
        ("/reset please summarise the plan", ResetCommand("/reset", "please summarise the plan")),
        ("/new\nfirst line\nsecond", ResetCommand("/new", "first line\nsecond")),
        ("/new@parley_bot", ResetCommand("/new", "")),
        ("/New@Parley_Bot  hello", ResetCommand("/new", "hello")),
        ("/newer", None),
        ("/new-ish", None),
        ("/new@", None),
        ("/new@ hi", None),
        ("hello /new", None),
        ("", None),
        ("new", None),
    ],
)
def test_trigger_table(text: str, expected: ResetCommand | None) -> None:
    assert match_reset_trigger(text, TRIGGERS) == expected


def test_suffix_naming_another_bot_is_not_ours() -> None:
    assert match_reset_trigger("/new@other_bot", TRIGGERS, bot_username="parley_bot") is None
    assert match_reset_trigger("/new@PARLEY_BOT x", TRIGGERS, bot_username="@parley_bot") == (
        ResetCommand("/new", "x")
    )


@pytest.mark.parametrize("text", ["@parley /new hi", "<@123> /new hi", "<@!123>: /new hi"])
def test_leading_mention_is_skipped_only_when_not_already_stripped(text: str) -> None:
    assert match_reset_trigger(text, TRIGGERS) is None
    assert match_reset_trigger(text, TRIGGERS, bot_mention_stripped=False) == ResetCommand(
        "/new", "hi"
    )


def test_longest_trigger_wins_and_configured_spelling_is_returned() -> None:
    triggers = ["/New", "/new chat"]
    assert match_reset_trigger("/NEW CHAT about taxes", triggers) == ResetCommand(
        "/new chat", "about taxes"
    )
    assert match_reset_trigger("/new about taxes", triggers) == ResetCommand("/New", "about taxes")
    assert match_reset_trigger("/new", []) is None
