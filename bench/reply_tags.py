"""Which message a benchmark's reply answers: the scripted model names it in a tag.

The benchmarks that push numbered messages (``c<chat> m<n>``, ``load.py``'s
``c<chat> r<round>``) answer them with a scripted model and count, at the channel
fake, the replies each message got. They used to let the model echo the newest user
message and take the *first* marker in a reply as the message it answers. Automatic
recall (``core/memory/recall.py``) puts earlier messages of the chat at the head of
the newest user message, so the first marker in the echo was often an earlier
message's: the soak reported about 1,200 messages "lost" and 200 "answered twice"
with nothing wrong in the product (issue 19). A long echo could also be split over
two channel messages, and the second part counted again.

Now the scripted reply starts with an explicit tag naming the message it answers::

    reply-to: c12 m3
    echo: c12 m3 <the rest of the user's own words>

and the bookkeeping reads only that tag, anchored at the start of a channel message
(``replied_to``): markers anywhere else in a reply (the echo, a recalled snippet, the
second part of a long reply) name nothing.

Which words are the user's is decided by position, not by the gateway's markup (which
may change: escaped, fenced, tagged with a nonce). The runner builds the newest user
message as gateway blocks (recalled memory) first, then the user's text, then the turn
context, which holds no marker; the provider merges consecutive user messages in that
order, the newest last. So the user's own words are the last text block of the newest
user message that holds a marker, and the message a turn answers is the last marker in
it (``answered_markers``). In ``collect`` mode one turn answers every message folded
into that block, so all of its markers are named.

A request with no marker in its newest user message (the memory flush's maintenance
turn, a summary) gets no tag and is never counted as a reply.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.anthropic_api import echo_text
from tests.fakes.llm_common import Reply

MARKER = re.compile(r"\bc(\d+) [mr](\d+)\b")
TAG_PREFIX = "reply-to: "
_TAG = re.compile(r"reply-to: (c\d+ [mr]\d+(?:, c\d+ [mr]\d+)*)(?=\s|$)")
# The memory flush (core/context/flush.py) asks for notes in a user message of its own, which
# the provider merges after the turn's user message: it starts with this, has no marker.
FLUSH_OPENING = "[memory flush]"
FLUSH_NOTE = "- the user sent numbered notes about the harbour crane and the blue teapot"

Key = tuple[int, int]  # (chat, message or round number)


def user_words(texts: Sequence[str]) -> str:
    """The user's own words among the text blocks of the newest user message: the last
    block holding a marker ("" when none does)."""
    for text in reversed(texts):
        if MARKER.search(text):
            return text
    return ""


def answered_markers(texts: Sequence[str], *, collect: bool = False) -> list[str]:
    """The markers a turn on these text blocks answers: the last one of the user's
    words (``queue`` mode: one message a turn), or all of them (``collect``)."""
    found = [m.group(0) for m in MARKER.finditer(user_words(texts))]
    return found if collect else found[-1:]


def names_others(texts: Sequence[str]) -> bool:
    """Does the newest user message hold markers besides the one a turn answers (an
    earlier message recalled at its head, say)? Those fooled a first-marker match."""
    answered = answered_markers(texts)
    return bool(answered) and any(
        m.group(0) != answered[0] for text in texts for m in MARKER.finditer(text)
    )


def tag(markers: Sequence[str]) -> str:
    return TAG_PREFIX + ", ".join(markers)


def replied_to(reply: str) -> list[Key]:
    """The messages a channel message names in its leading tag ([] without one)."""
    match = _TAG.match(reply)
    if match is None:
        return []
    return [(int(chat), int(n)) for chat, n in MARKER.findall(match.group(1))]


@dataclass
class Tally:
    """What the channel messages a bot sent say, in the order the fake received them."""

    counts: Counter[Key] = field(default_factory=Counter)  # replies naming each message
    out_of_order: int = 0  # replies naming an earlier message of the chat than one before
    untagged: int = 0  # messages naming none (error or "busy" notices)


def tally(replies: Iterable[str]) -> Tally:
    result = Tally()
    last: dict[int, int] = {}
    for text in replies:
        keys = replied_to(text)
        if not keys:
            result.untagged += 1
        for chat, n in keys:
            result.counts[(chat, n)] += 1
            if n < last.get(chat, -1):
                result.out_of_order += 1
            last[chat] = max(last.get(chat, -1), n)
    return result


def is_flush(texts: Sequence[str]) -> bool:
    return bool(texts) and texts[-1].lstrip().startswith(FLUSH_OPENING)


def reply_text(texts: Sequence[str], *, collect: bool = False) -> str | None:
    """What the scripted model answers to a user message with these text blocks: the
    tag and an echo of the user's own words, a short note for a memory flush, None
    when no marker is there (the caller's default answer)."""
    if is_flush(texts):
        return FLUSH_NOTE
    markers = answered_markers(texts, collect=collect)
    if not markers:
        return None
    return f"{tag(markers)}\necho: {user_words(texts)}"


def anthropic_texts(body: Mapping[str, Any]) -> list[str]:
    """The text blocks of the newest message of a Messages API body, if the user's."""
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "user":
        return []
    content = messages[-1].get("content")
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content or () if b.get("type") == "text"]


def anthropic_reply(body: Mapping[str, Any], *, chunk_chars: int = 0) -> Reply:
    """The Anthropic fake's ``responder`` for a queue-mode benchmark (the fake's own
    echo when the newest user message holds no marker)."""
    text = reply_text(anthropic_texts(body))
    return Reply(text=echo_text(body) if text is None else text, chunk_chars=chunk_chars)


def final_texts(fake: Any) -> list[str]:
    """What a ``FakeTelegram`` bot's messages say now, in the order they appeared: a
    streamed reply's draft is edited into the reply (its first text is a draft's, with
    a half-written tag), and a draft left over is deleted."""
    texts = (fake.message_text(m.chat_id, m.message_id) for m in fake.sent)
    return [text for text in texts if text is not None]
