"""gateway.runtime.group_context: the bounded buffer of messages not addressed to the
agent, per conversation."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from parley.channels.base import Attachment, InboundMessage
from parley.gateway.runtime.group_context import ELLIPSIS, GroupContextBuffer


def said(text: str, sender: str = "bob", chat: str = "g1") -> InboundMessage:
    return InboundMessage(
        channel="test", account="default", chat_type="group", chat_id=chat,
        sender_id=sender, sender_name=sender.title(), text=text, message_id=text,
        timestamp=datetime(2026, 11, 27, 12, 0, tzinfo=UTC),
    )  # fmt: skip


def texts(buffer: GroupContextBuffer, key: str) -> list[str]:
    return [line.text for line in buffer.peek(key)]


def test_keeps_the_newest_lines_per_conversation() -> None:
    buffer = GroupContextBuffer()
    for n in range(5):
        buffer.keep("a", said(f"a{n}"), 3)
    buffer.keep("b", said("b0"), 3)
    assert texts(buffer, "a") == ["a2", "a3", "a4"]
    assert texts(buffer, "b") == ["b0"]
    assert buffer.peek("c") == ()


def test_drop_forgets_only_what_was_taken() -> None:
    buffer = GroupContextBuffer()
    buffer.keep("a", said("one"), 3)
    buffer.keep("a", said("two"), 3)
    taken = buffer.peek("a")
    buffer.keep("a", said("three"), 3)  # while the addressed message was recorded
    buffer.drop("a", taken)
    assert texts(buffer, "a") == ["three"]
    buffer.drop("a", buffer.peek("a"))
    assert len(buffer) == 0 and buffer.total_chars == 0


def test_drop_after_the_buffer_let_taken_lines_go() -> None:
    buffer = GroupContextBuffer()
    for text in ("one", "two"):
        buffer.keep("a", said(text), 2)
    taken = buffer.peek("a")
    for text in ("three",):
        buffer.keep("a", said(text), 2)  # "one" falls out: "two" is first now
    buffer.drop("a", taken)
    assert texts(buffer, "a") == ["three"]


def test_nothing_kept_with_a_zero_limit_or_blank_text() -> None:
    buffer = GroupContextBuffer()
    buffer.keep("a", said("hello"), 0)
    buffer.keep("a", said("   "), 5)
    assert len(buffer) == 0


def test_a_long_line_is_cut() -> None:
    buffer = GroupContextBuffer(max_line_chars=10)
    buffer.keep("a", said("x" * 50), 5)
    [line] = buffer.peek("a")
    assert line.text == "x" * 9 + ELLIPSIS


def test_over_the_total_the_least_recently_active_conversation_goes() -> None:
    buffer = GroupContextBuffer(max_total_chars=40)
    buffer.keep("old", said("o" * 12, sender="b"), 5)  # 12 + 1 + 1 = 14
    buffer.keep("new", said("n" * 12, sender="b"), 5)
    buffer.keep("old", said("p" * 12, sender="b"), 5)  # "old" is the most recent now
    assert buffer.total_chars == 42 - 14 and texts(buffer, "new") == []
    assert texts(buffer, "old") == ["o" * 12, "p" * 12]


def test_a_file_without_words_is_kept_with_its_file_described() -> None:
    buffer = GroupContextBuffer()
    photo = Attachment("image", "file-id-1", name="photo.jpg", mime_type="image/jpeg")
    buffer.keep("a", dataclasses.replace(said(""), attachments=(photo,)), 5)
    buffer.keep("a", said(""), 5)  # neither words nor a file: nothing
    [line] = buffer.peek("a")
    assert (line.text, line.attachments) == ("", (photo,))
    # What the file's description holds counts towards the bound.
    assert buffer.total_chars == len("Bob") + len("bob") + len("file-id-1photo.jpgimage/jpeg")
    buffer.drop("a", buffer.peek("a"))
    assert buffer.total_chars == 0
