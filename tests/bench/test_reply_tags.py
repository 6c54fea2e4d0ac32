"""bench/reply_tags.py: a benchmark reply names the message it answers in a leading
``reply-to:`` tag taken from the user's own words, so markers of earlier messages that
the gateway put in the turn (automatic recall at its head) are never counted (issue 19:
matching by the first marker in an echo reported messages lost and answered twice)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bench import reply_tags
from parley.core.messages import Message, TextBlock
from parley.core.providers.base import ProviderRequest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> ModuleType:
    # bench/ is a folder of scripts, not a package: load the file as a module.
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


FILLER = "the quarterly report mentions the harbour crane and the blue teapot"
TURN_CONTEXT = (
    "<turn-context>time: 2026-01-05 10:00 UTC (Monday); from: Alice [6003]</turn-context>"
)
# Recall blocks as the gateway renders them now and as it may (escaped, with a nonce):
# the bookkeeping must not depend on the markup, only on the user's words coming after.
RECALLS = [
    f"<recalled-memory>\nNotes recalled:\n[sessions/a.jsonl#L3-L4] c6003 m1 {FILLER}\n"
    f"[sessions/a.jsonl#L5-L6] reply-to: c6003 m0\necho: c6003 m0 {FILLER}\n</recalled-memory>",
    f'<gateway-block kind="recall" nonce="9f2c">\n&lt;c6003 m2&gt; {FILLER}\n'
    f'c6003 m0 {FILLER}\n</gateway-block nonce="9f2c">',
    f"[recalled] c6003 m2 {FILLER} c6003 m1",
]


def body(*contents: list[dict[str, Any]] | str) -> dict[str, Any]:
    """A Messages API body whose user turns have these contents (assistants between)."""
    messages: list[dict[str, Any]] = []
    for content in contents:
        if messages:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}]})
        messages.append({"role": "user", "content": content})
    return {"model": "m", "max_tokens": 10, "system": "be brief", "messages": messages}


def text(*texts: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": t} for t in texts]


@pytest.mark.parametrize("recall", RECALLS)
def test_the_tag_names_the_users_own_message_not_a_recalled_one(recall: str) -> None:
    request = body(text("c6003 m2 earlier"), text(recall, f"c6003 m3 {FILLER}", TURN_CONTEXT))
    reply = reply_tags.anthropic_reply(request).text
    assert reply.startswith("reply-to: c6003 m3\n")
    assert reply_tags.replied_to(reply) == [(6003, 3)]
    assert reply_tags.names_others(reply_tags.anthropic_texts(request))


def test_only_the_leading_tag_counts() -> None:
    # The echo after the tag, a recalled reply quoted in it, and the second part of a
    # reply split over two channel messages name nothing.
    assert reply_tags.replied_to("reply-to: c1 m2\necho: c1 m1 reply-to: c1 m0") == [(1, 2)]
    assert reply_tags.replied_to("echo: reply-to: c1 m2") == []
    assert reply_tags.replied_to("c1 m2 and more") == []
    assert reply_tags.replied_to("reply-to: c1 m2x") == []
    assert reply_tags.replied_to("reply-to: c7000 r4") == [(7000, 4)]


def test_merged_user_messages_answer_the_newest() -> None:
    # An unanswered user message (a failed turn) is merged before the new one.
    merged = text("c5 m1 first", TURN_CONTEXT, RECALLS[0], "c5 m2 second", TURN_CONTEXT)
    assert reply_tags.anthropic_reply(body(merged)).text.startswith("reply-to: c5 m2\n")
    assert reply_tags.anthropic_reply(body("c5 m7 plain string")).text.startswith(
        "reply-to: c5 m7\n"
    )


def test_collect_names_every_folded_message_of_the_users_words() -> None:
    texts = [RECALLS[0], "c4 m3\n\nc4 m4\n\nc4 m5", TURN_CONTEXT]
    assert reply_tags.answered_markers(texts) == ["c4 m5"]
    assert reply_tags.answered_markers(texts, collect=True) == ["c4 m3", "c4 m4", "c4 m5"]
    reply = reply_tags.reply_text(texts, collect=True)
    assert reply is not None
    assert reply_tags.replied_to(reply) == [(4, 3), (4, 4), (4, 5)]


def test_no_marker_gets_no_tag() -> None:
    flush = body(text("c6 m1 hi", TURN_CONTEXT, "[memory flush] This is a silent turn"))
    assert reply_tags.replied_to(reply_tags.anthropic_reply(flush).text) == []
    assert reply_tags.anthropic_reply(body(text("hello", TURN_CONTEXT))).text.startswith("echo:")
    assert not reply_tags.names_others(["hello"])


def test_tally_counts_twice_out_of_order_and_untagged() -> None:
    counted = reply_tags.tally(
        [
            "reply-to: c1 m0\necho: c1 m0",
            "reply-to: c1 m2\necho: c1 m1 c1 m2",  # recalled m1 in the echo: not counted
            "reply-to: c2 m0",
            "reply-to: c1 m1",  # after m2 in chat 1
            "reply-to: c1 m2",  # twice
            "Sorry, the model provider failed.",
        ]
    )
    assert counted.counts == {(1, 0): 1, (1, 1): 1, (1, 2): 2, (2, 0): 1}
    assert counted.out_of_order == 1
    assert counted.untagged == 1


def test_crash_soak_replies_by_tag_and_summaries_untagged() -> None:
    soak = _load("crash_soak")
    turn = body(text("c6000 m0 x"), text(RECALLS[0], f"c6000 m4 {FILLER}", TURN_CONTEXT))
    assert reply_tags.replied_to(soak.respond(turn).text) == [(6000, 4)]
    summary = {**turn, "system": soak.SUMMARY_SYSTEM_PROMPT}
    assert reply_tags.replied_to(soak.respond(summary).text) == []


def test_channel_throughput_provider_tags_the_folded_messages() -> None:
    throughput = _load("channel_throughput")
    request = ProviderRequest(
        model="bench-echo",
        system="",
        messages=(
            Message.user("c9 m0"),
            Message.assistant("reply-to: c9 m0"),
            Message("user", (TextBlock(RECALLS[2]), TextBlock("c9 m1\n\nc9 m2"))),
        ),
    )
    response = throughput.tagged_reply(request)
    assert response is not None
    assert reply_tags.replied_to(response.message.text) == [(9, 1), (9, 2)]
    assert reply_tags.replied_to(throughput.baseline_reply("c9 m3")) == [(9, 3)]


def test_channel_throughput_scores_a_streamed_reply_by_the_text_it_ends_with() -> None:
    throughput = _load("channel_throughput")
    sends: list[tuple[str, float, str]] = [("a", 1.0, "reply-to: c1 m1")]  # half of "m12"
    edits: list[tuple[str, float, str]] = []
    deletions: list[str] = []
    same = lambda item: item  # noqa: E731 (each item is already (key, at, text))
    finals = throughput.FinalTexts(
        (lambda: sends, same), (lambda: edits, same), (lambda: deletions, same)
    )
    assert set(finals()) == {(1, 1)}  # a draft's half-written tag names the wrong one
    edits.append(("a", 3.0, "reply-to: c1 m12\n\nc1 m12"))
    sends.append(("b", 2.0, "reply-to: c1 m1"))  # a leftover draft, deleted at the end
    deletions.append("b")
    assert set(finals()) == {(1, 12)}
    assert finals.replies() == [(3.0, "reply-to: c1 m12\n\nc1 m12")]
    scored = throughput.score(finals.replies(), {(1, 12): 0.5, (1, 1): 0.5}, 2)
    assert (scored["lost"], scored["duplicated"]) == (1, 0)
