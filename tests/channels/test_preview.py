"""The slots of a reply shown while it is written (``channels.preview``): drafts,
the final reply put in their place, what a restart hands over, flood pauses; and the
blocks of block mode, which must be the same while a reply is written as at its end."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.channels.base import DeliveryError, OutboundMessage, ReplyDraft
from parley.channels.preview import (
    STATUS_PREFIX,
    DraftPaused,
    GoneMessage,
    Previews,
    complete_blocks,
    split_blocks,
)
from parley.channels.text import split_message

LIMIT = 200


def split(text: str) -> list[str]:
    return [p for p in split_message(text, LIMIT) if p.strip()]


@dataclass
class Chat:
    """A platform: messages by id, and every call made."""

    messages: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    pause_next: float | None = None
    fail_create: bool = False
    next_id: int = 100

    async def create(self, route: OutboundMessage, index: int, text: str, *, draft: bool) -> str:
        self.calls.append(("create", text))
        if self.pause_next is not None and draft:
            seconds, self.pause_next = self.pause_next, None
            raise DraftPaused(seconds)
        if self.fail_create:
            raise DeliveryError("network", retryable=True)
        self.next_id += 1
        self.messages[str(self.next_id)] = text
        return str(self.next_id)

    async def edit(
        self, route: OutboundMessage, message_id: str, text: str, *, draft: bool
    ) -> None:
        self.calls.append(("edit", text))
        if message_id not in self.messages:
            raise GoneMessage(message_id)
        self.messages[message_id] = text

    async def delete(self, route: OutboundMessage, message_id: str) -> None:
        self.calls.append(("delete", message_id))
        self.messages.pop(message_id, None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def previews(chat: Chat, clock: Clock | None = None) -> Previews:
    return Previews(chat, split, order=int, clock=clock or Clock())


def draft(text: str, **fields: object) -> ReplyDraft:
    return ReplyDraft("t", "default", "c", "reply:1", text, **fields)  # type: ignore[arg-type]


def reply(text: str, **fields: object) -> OutboundMessage:
    return OutboundMessage("t", "default", "c", text, idempotency_key="reply:1", **fields)  # type: ignore[arg-type]


async def test_a_draft_grows_in_one_message_and_the_reply_lands_there() -> None:
    chat = Chat()
    book = previews(chat)
    assert await book.draft(draft("Hel"), "partial") == ("101",)
    assert await book.draft(draft("Hello"), "partial") == ("101",)
    assert await book.draft(draft("Hello"), "partial") == ("101",)  # unchanged: no call
    assert chat.calls == [("create", "Hel"), ("edit", "Hello")]
    result = await book.finish(reply("Hello there"), split("Hello there"))
    assert result is not None and result.platform_message_ids == ("101",)
    assert chat.messages == {"101": "Hello there"}
    assert await book.finish(reply("again"), ["again"]) is None  # forgotten once sent


async def test_the_reply_ends_as_the_same_messages_as_one_sent_at_once() -> None:
    text = "\n\n".join(f"paragraph {n} " + "word " * 30 for n in range(6))
    chat = Chat()
    book = previews(chat)
    for end in range(0, len(text), 37):
        await book.draft(draft(text[:end]), "partial")
    result = await book.finish(reply(text), split(text))
    assert result is not None
    assert [chat.messages[i] for i in result.platform_message_ids] == split(text)
    assert len(chat.messages) == len(split(text))  # no draft left over


async def test_a_shorter_reply_removes_the_drafts_it_does_not_need() -> None:
    chat = Chat()
    book = previews(chat)
    long = "word " * 60  # two parts
    await book.draft(draft(long), "partial")
    assert len(chat.messages) == 2
    result = await book.finish(reply("short"), ["short"])
    assert result is not None and chat.messages == {"101": "short"}


async def test_a_status_line_rides_at_the_end_and_goes_with_the_reply() -> None:
    chat = Chat()
    book = previews(chat)
    await book.draft(draft("", status="running web_search"), "partial")
    assert chat.messages == {"101": f"{STATUS_PREFIX}running web_search"}
    await book.draft(draft("Found it", status="running fetch"), "partial")
    assert chat.messages == {"101": f"Found it\n\n{STATUS_PREFIX}running fetch"}
    await book.finish(reply("Found it."), ["Found it."])
    assert chat.messages == {"101": "Found it."}


async def test_a_withdrawn_reply_takes_its_drafts_away() -> None:
    chat = Chat()
    book = previews(chat)
    await book.draft(draft("thinking"), "partial")
    assert await book.draft(draft("", reset="withdrawn"), "partial") == ()
    assert chat.messages == {}
    assert await book.finish(reply("x"), ["x"]) is None


async def test_drafts_held_over_a_restart_are_edited_not_sent_again() -> None:
    chat = Chat(messages={"7": "half a rep", "9": "ly and"})
    book = previews(chat)
    # No draft this time (the reply was in the transcript): the send takes them over.
    result = await book.finish(reply("whole", shown=("9", "7")), ["whole"])
    assert result is not None and result.platform_message_ids == ("7",)
    assert chat.messages == {"7": "whole"}
    # A draft after the restart takes them over as well.
    chat = Chat(messages={"7": "half"})
    book = previews(chat)
    await book.draft(draft("new text", held=("7",)), "partial")
    assert chat.messages == {"7": "new text"}
    assert [c for c, _ in chat.calls] == ["edit"]


async def test_a_deleted_draft_moves_the_reply_to_new_messages_in_order() -> None:
    chat = Chat(messages={"7": "a"})
    book = previews(chat)
    del chat.messages["7"]  # someone deleted it
    result = await book.finish(reply("b", shown=("7",)), ["b"])
    assert result is not None and [chat.messages[i] for i in result.platform_message_ids] == ["b"]


async def test_flood_control_pauses_drafts_not_the_reply() -> None:
    chat, clock = Chat(), Clock()
    book = previews(chat, clock)
    chat.pause_next = 5.0
    assert await book.draft(draft("one"), "partial") == ()
    assert await book.draft(draft("one two"), "partial") == ()  # paused: no call
    assert len(chat.calls) == 1
    clock.now = 5.0
    assert await book.draft(draft("one two three"), "partial") == ("101",)
    await book.finish(reply("done"), ["done"])
    assert chat.messages == {"101": "done"}


async def test_a_failed_send_keeps_what_it_did_for_the_next_try() -> None:
    chat = Chat()
    book = previews(chat)
    await book.draft(draft("part"), "partial")
    chat.fail_create = True
    long = "word " * 60
    with pytest.raises(DeliveryError) as failed:
        await book.finish(reply(long), split(long))
    assert failed.value.delivered == ("101",) and not failed.value.retryable
    chat.fail_create = False
    result = await book.finish(reply(long), split(long))
    assert result is not None and len(result.platform_message_ids) == 2
    assert [chat.messages[i] for i in result.platform_message_ids] == split(long)


async def test_block_mode_sends_complete_blocks_and_never_edits_them() -> None:
    chat = Chat()
    book = Previews(chat, lambda t: split_message(t, 4096), order=int, clock=Clock())
    paragraphs = [f"para {n} " + "x" * 450 for n in range(4)]
    text = "\n\n".join(paragraphs)
    for end in range(0, len(text), 50):
        await book.draft(draft(text[:end]), "block")
    assert all(kind == "create" for kind, _ in chat.calls)
    blocks = split_blocks(text, lambda t: split_message(t, 4096))
    result = await book.finish(reply(text), blocks)
    assert result is not None
    assert [chat.messages[i] for i in result.platform_message_ids] == paragraphs
    assert [kind for kind, _ in chat.calls].count("edit") == 0


PROSE = st.text(alphabet="ab \n", min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(lambda n, w: ("word " * n + w).strip(), st.integers(0, 400), PROSE),
            # A code block on lines of its own (as Markdown has it).
            st.builds(lambda n: "\n```py\n" + "code line\n" * n + "```\n", st.integers(0, 250)),
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["\n\n", "\n", " "]),
)
def test_blocks_shown_while_written_are_the_blocks_it_ends_with(
    pieces: list[str], joiner: str
) -> None:
    text = joiner.join(pieces)

    def fence_split(t: str) -> list[str]:
        return [p for p in split_message(t, 2000) if p.strip()]

    final = split_blocks(text, fence_split)
    for end in range(0, len(text) + 1, 97):
        shown = complete_blocks(text[:end], fence_split)
        assert final[: len(shown)] == shown
    assert all(len(b) <= 2000 for b in final)
    # Every code block that opens in a message closes in it.
    assert all(sum(line.startswith("```") for line in b.splitlines()) % 2 == 0 for b in final)

    # Nothing is lost: the blocks hold every word of the reply, in order.
    def words(t: str) -> list[str]:
        return [w for w in t.split() if "`" not in w]

    assert words(" ".join(final)) == words(text)


async def test_a_draft_whose_fate_is_unknown_is_looked_for_before_the_reply() -> None:
    chat = Chat()
    book = previews(chat)
    chat.fail_create = True  # the platform may have taken it: its answer was lost
    with pytest.raises(DeliveryError):
        await book.draft(draft("Hel"), "partial")
    chat.fail_create = False
    assert await book.draft(draft("Hello"), "partial") == ()  # no more drafts
    with pytest.raises(DeliveryError) as doubt:
        await book.finish(reply("Hello there"), ["Hello there"])
    assert doubt.value.retryable and not chat.messages  # nothing sent beside it
    chat.messages["55"] = "Hel"  # what the look found
    result = await book.finish(reply("Hello there", shown=("55",)), ["Hello there"])
    assert result is not None and result.platform_message_ids == ("55",)
    assert chat.messages == {"55": "Hello there"}
