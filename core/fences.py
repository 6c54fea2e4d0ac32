"""Fences: the gateway's own blocks, and why untrusted text cannot pass for one.

The gateway writes four kinds of text block around what people say:

* the turn context, ``<turn-context>time: …; from: NAME [id]</turn-context>``, the
  last block of every user message (``core.prompt.render_turn_context``);
* recalled memory, ``<recalled-memory>…</recalled-memory>``, the first block of a user
  message when recall found something (``core.memory.recall``);
* the compaction summary that heads the model's view (``core.context.history``);
* group context, ``<group-context>…</group-context>``, before the words of a user
  message in a group: what others said there since the agent last answered
  (``core.group_context.render_group_context``).

Each holds text the gateway does not control: sender names and ids, snippets of what
anyone once wrote, a model's summary of it. Two rules keep that text in its place.

1. ``neutralise`` escapes whatever in untrusted text reads like one of the gateway's
   markers: the angle brackets of ``<turn-context>``, ``</recalled-memory>`` and their
   variants (any case; spaces, line breaks or invisible characters anywhere inside;
   ``_``, a space or nothing for the ``-``; no ``>`` at all; full-width and look-alike
   brackets, slashes, hyphens and letters) become ``&lt;`` / ``&gt;``. It is applied
   where untrusted text enters a gateway block (each recalled snippet and citation,
   the sender fields of the turn context, the summary), and to the words of every
   user message as a transcript is read (``read_user_message``), so a message cannot
   imitate a block to the model either. Tool results are left as they are: they
   travel in their own tool_result blocks, never inside a gateway fence.
2. A block is the gateway's because ``TextBlock.fence`` says so: a field stored in the
   transcript and set only by the code that renders the block (the runner for the turn
   context, ``Recall.block``, ``summary_message``), never derived from text.
   ``core.prompt.is_turn_context`` / ``is_recall_block`` / ``is_volatile`` and
   ``core.context.history.is_summary_block`` read the field and nothing else.

Transcripts written before fences (the legacy rule of ``read_user_message``): a user
message none of whose blocks carries a fence was written by the runner as::

    [<recalled-memory> block]  the user's words  [<turn-context> block]

(the runner's first version put the turn context first: ``<turn-context> block, words``).
The user's words are always exactly one block, so the rule claims at most the first and
the last block, by position and marker together, and never all of them:

* the last block is the turn context when it is text starting with ``<turn-context>``
  and not the only block;
* the first is recalled memory when it is text starting with ``<recalled-memory>`` and at
  least two blocks are unclaimed (the words must remain);
* failing both, the first is the turn context when it starts with ``<turn-context>`` and
  there are two or more blocks (the first version's layout).

A lone block is always the user's words, whatever it starts with; so is the middle
block of three. A legacy block so claimed gets its fence in memory (the file is never
rewritten) and its inside neutralised as if it had been rendered today. The rule only
ever meets legacy lines: since fences, a user message of two or more blocks always
carries a fenced one (the runner fences the turn context and the recall block it
adds), and a message with a fenced block is read by its fences alone.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

from parley.core.messages import (
    FENCE_GROUP_CONTEXT,
    FENCE_RECALLED_MEMORY,
    FENCE_SUMMARY,
    FENCE_TURN_CONTEXT,
    Block,
    Message,
    TextBlock,
)

__all__ = [
    "GATEWAY_TAGS",
    "GROUP_CONTEXT_CLOSE",
    "GROUP_CONTEXT_OPEN",
    "RECALL_CLOSE",
    "RECALL_OPEN",
    "SUMMARY_TAGS",
    "TURN_CONTEXT_CLOSE",
    "TURN_CONTEXT_OPEN",
    "fenced",
    "neutralise",
    "neutralise_line",
    "read_user_message",
]

TURN_CONTEXT_OPEN = "<turn-context>"
TURN_CONTEXT_CLOSE = "</turn-context>"
RECALL_OPEN = "<recalled-memory>"
RECALL_CLOSE = "</recalled-memory>"
GROUP_CONTEXT_OPEN = "<group-context>"
GROUP_CONTEXT_CLOSE = "</group-context>"
_MARKERS = {
    FENCE_TURN_CONTEXT: (TURN_CONTEXT_OPEN, TURN_CONTEXT_CLOSE),
    FENCE_RECALLED_MEMORY: (RECALL_OPEN, RECALL_CLOSE),
}

# The markers neutralised in a user's words, a recalled snippet, a sender name or a
# line of group context. Group context came after the legacy rule: never claimed by it.
GATEWAY_TAGS: tuple[str, ...] = (FENCE_TURN_CONTEXT, FENCE_RECALLED_MEMORY, FENCE_GROUP_CONTEXT)
# In the compaction summary, its own wrapper too. Not in a user's words: "<summary>"
# is an HTML element people write about, and a message never sits inside the summary.
SUMMARY_TAGS: tuple[str, ...] = (*GATEWAY_TAGS, FENCE_SUMMARY)

LT_ESCAPE = "&lt;"
GT_ESCAPE = "&gt;"

# Look-alikes folded before matching. Each maps one code point to one, so a match in
# the folded text has the same span in the original.
_LESS = "<\u2039\u2329\u27e8\u276e\u3008\u1438\u02c2\u29fc\ufe64\uff1c\u226a"
_GREATER = ">\u203a\u232a\u27e9\u276f\u3009\u1433\u02c3\u29fd\ufe65\uff1e\u226b"
_SLASHES = "/\\\u2044\u2215\u29f8\u29f9\uff0f\uff3c"
_HYPHENS = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d\u00b7\u30fb"
_LETTERS = {
    "a": "\u0430\u0410\u03b1\u0391",
    "c": "\u0441\u0421\u03f2\u217d",
    "d": "\u0501\u217e",
    "e": "\u0435\u0415\u0395",
    "l": "I1\u04cf\u04c0\u217c\u2113\u01c0",
    "m": "\u043c\u041c\u039c\u217f",
    "n": "\u039d",
    "o": "0\u043e\u041e\u03bf\u039f\u0585",
    "r": "\u0433",
    "s": "\u0455\u0405",
    "t": "\u0442\u0422\u03a4",
    "u": "\u057d\u03c5",
    "x": "\u0445\u0425\u03a7\u00d7",
    "y": "\u0443\u0423\u03a5\u04af",
}
# Invisible characters a marker may hide behind: zero-width and bidi controls,
# variation selectors, Unicode tag characters, combining marks, fillers.
_JUNK = (
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\U000e0000-\U000e007f"
    "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"
)
_GAP = rf"(?:\s|{_JUNK})*"
_SEPARATOR = rf"(?:[\s\-_.]|{_JUNK})*"
_BRACKETS = re.compile(f"[{re.escape(_LESS + _GREATER)}]")
# Control characters and line breaks, which a one-line field must not carry.
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SPACES = re.compile(r"\s+")


def _fold_table() -> dict[int, str]:
    table: dict[int, str] = {}
    for start, end in ((0xFF01, 0xFF5F), (0x1D400, 0x1D800)):  # full-width, math letters
        for cp in range(start, end):
            folded = unicodedata.normalize("NFKC", chr(cp))
            if len(folded) == 1 and folded.isascii():
                table[cp] = folded
    for chars, to in ((_LESS, "<"), (_GREATER, ">"), (_SLASHES, "/"), (_HYPHENS, "-")):
        table.update({ord(c): to for c in chars})
    for letter, lookalikes in _LETTERS.items():
        table.update({ord(c): letter for c in lookalikes})
    return table


_FOLD = _fold_table()


def _name(tag: str) -> str:
    words = tag.split("-")
    return _SEPARATOR.join(f"{_JUNK}*".join(re.escape(c) for c in word) for word in words)


@lru_cache(maxsize=8)
def _pattern(tags: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(_name(tag) for tag in tags)
    return re.compile(
        rf"(?P<lt><)?{_GAP}(?:/{_GAP})?(?:{names})(?:{_GAP}(?P<gt>>))?", re.IGNORECASE
    )


def neutralise(text: str, tags: Sequence[str] = GATEWAY_TAGS) -> str:
    """``text`` with every marker of ``tags`` (open or close, in any disguise) escaped:
    its brackets become ``&lt;`` / ``&gt;``, everything else is kept. Idempotent; text
    without a bracket-like character is returned as is (the common case, one scan)."""
    if not text or not _BRACKETS.search(text):
        return text
    folded = text.translate(_FOLD)
    out: list[str] = []
    last = 0
    for match in _pattern(tuple(tags)).finditer(folded):
        for group, escape in (("lt", LT_ESCAPE), ("gt", GT_ESCAPE)):
            start, end = match.span(group)
            if start >= 0:
                out += (text[last:start], escape)
                last = end
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def neutralise_line(text: str) -> str:
    """A one-line field (a sender name or id): control characters, line breaks and bidi
    overrides become spaces, runs of space one, then ``neutralise``."""
    return neutralise(_SPACES.sub(" ", _BREAKS.sub(" ", text)).strip())


def fenced(text: str, fence: str) -> TextBlock:
    """The gateway block ``fence`` holding ``text`` (rendered by the gateway)."""
    return TextBlock(text, fence)


def read_user_message(message: Message) -> Message:
    """``message`` as the runtime reads it from a transcript: a legacy message's gateway
    blocks fenced by the legacy rule (module docstring), and the user's own words
    neutralised. The same object when nothing changed; other roles untouched."""
    if message.role != "user":
        return message
    blocks: list[Block] = list(message.content)
    if not any(isinstance(b, TextBlock) and b.fence is not None for b in blocks):
        _fence_legacy(blocks)
    for i, block in enumerate(blocks):
        if isinstance(block, TextBlock) and block.fence is None:
            safe = neutralise(block.text)
            if safe != block.text:
                blocks[i] = TextBlock(safe)
    if all(a is b for a, b in zip(blocks, message.content, strict=True)):
        return message
    return Message("user", tuple(blocks))


def _fence_legacy(blocks: list[Block]) -> None:
    if len(blocks) < 2:
        return
    first, last = 0, len(blocks) - 1
    claims: dict[int, str] = {}
    if _text(blocks[last]).startswith(TURN_CONTEXT_OPEN):
        claims[last] = FENCE_TURN_CONTEXT
    if _text(blocks[first]).startswith(RECALL_OPEN) and len(blocks) - len(claims) >= 2:
        claims[first] = FENCE_RECALLED_MEMORY
    elif not claims and _text(blocks[first]).startswith(TURN_CONTEXT_OPEN):
        claims[first] = FENCE_TURN_CONTEXT
    for i, fence in claims.items():
        blocks[i] = fenced(_refence(_text(blocks[i]), fence), fence)


def _text(block: Block) -> str:
    return block.text if isinstance(block, TextBlock) else ""


def _refence(text: str, fence: str) -> str:
    """A legacy block rendered as today: its inside neutralised between its markers."""
    opening, closing = _MARKERS[fence]
    inside = text.removeprefix(opening).removesuffix(closing)
    return f"{opening}{neutralise(inside)}{closing}"
