"""How much a piece of conversation or memory matters: written-down rules, no model.

Shared by the ``selective`` compaction strategy (which drops the least important
messages first) and the forgetting policies of long-term memory (which evict the
least important chunks first). The score is in [0, 1]; the highest rule that
matches wins, so a sentence that is both an error and a thank-you counts as an error.

The rules, highest first:

========  =====================================================================
score     what
========  =====================================================================
0.95      errors: tracebacks, "error:", "failed", "exception", tool errors
0.90      decisions: "we decided", "let's go with", "decision:"
0.85      constraints and rules: "must", "never", "always", "don't", deadlines
0.80      "remember ...", stated preferences ("I prefer", "I like", "I hate")
0.70      exact identifiers (ids, hashes, URLs, paths; see ``core.identifiers``)
0.60      open asks and TODOs (questions, "please", "remind me", "todo")
0.50      tool calls and their results (work that happened; medium)
0.40      anything else with substance
0.15      clarifications and acknowledgements: "ok", "thanks", "got it", "what do
          you mean", "sorry"
0.05      empty text, silent replies, exact repeats of an earlier message
========  =====================================================================
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from parley.core.identifiers import find_identifiers
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock

ERROR = 0.95
DECISION = 0.90
CONSTRAINT = 0.85
PREFERENCE = 0.80
IDENTIFIER = 0.70
ASK = 0.60
TOOL = 0.50
DEFAULT = 0.40
CHATTER = 0.15
NOTHING = 0.05

_ERROR = re.compile(
    r"\b(?:traceback|exception|error|errno|failed|failure|fatal|panic|segfault"
    r"|refused|denied|timed? ?out|not found|exit (?:code|status) [1-9])\b",
    re.IGNORECASE,
)
# "decision:" sits outside the trailing \b: a colon followed by a space is no word
# boundary, so inside it "Decision: use v2" never matched.
_DECISION = re.compile(
    r"\b(?:we(?:'ve|’ve| have)? decided|decided to|let(?:'|’)?s go with"
    r"|let us go with|we(?:'ll|’ll| will) use|agreed (?:on|to)|settled on|chose|chosen)\b"
    r"|\bdecision:",
    re.IGNORECASE,
)
_CONSTRAINT = re.compile(
    r"\b(?:must(?:n't| not)?|never|always|do not|don(?:'|’)?t|no more than|at most"
    r"|at least|only use|required?|deadline|due (?:by|on)|by (?:monday|tuesday|wednesday"
    r"|thursday|friday|saturday|sunday|tomorrow|tonight|eod|end of))\b",
    re.IGNORECASE,
)
_PREFERENCE = re.compile(
    r"\b(?:remember|keep in mind|note that|i (?:prefer|like|love|hate|dislike|want|need)"
    r"|my (?:favou?rite|preference)|call me)\b",
    re.IGNORECASE,
)
_ASK = re.compile(
    r"(?:\?\s*$|\b(?:please|can you|could you|would you|remind me|todo|to-do|follow up)\b)",
    re.IGNORECASE | re.MULTILINE,
)
_CHATTER = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|k|thanks?(?: you)?|thank you|thx|ty|got it|sure|cool|great|nice"
    r"|yes|no|yep|nope|sorry|what do you mean|i mean|never ?mind|hm+|ah|oh|lol|:\)|👍)"
    r"[\s.!?,]*)+$",
    re.IGNORECASE,
)


def text_importance(text: str) -> float:
    """The score of a piece of text by the rules above (repeats are the caller's to see)."""
    stripped = text.strip()
    if not stripped or stripped == "NO_REPLY":
        return NOTHING
    if _ERROR.search(stripped):
        return ERROR
    if _DECISION.search(stripped):
        return DECISION
    if _CONSTRAINT.search(stripped):
        return CONSTRAINT
    if _PREFERENCE.search(stripped):
        return PREFERENCE
    if find_identifiers(stripped):
        return IDENTIFIER
    if _CHATTER.match(stripped):
        return CHATTER
    if _ASK.search(stripped):
        return ASK
    return DEFAULT


def message_text(message: Message) -> str:
    """The words of a message, tool inputs and results included, for scoring."""
    parts: list[str] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            parts.append(f"{block.name} {block.input}")
        elif isinstance(block, ToolResultBlock):
            parts.append(block.content)
    return "\n".join(parts)


def message_importance(message: Message) -> float:
    """A message's score: its text's, with tool traffic at least medium and a failed
    tool result an error."""
    if any(isinstance(b, ToolResultBlock) and b.is_error for b in message.content):
        return ERROR
    score = text_importance(message_text(message))
    if any(isinstance(b, ToolUseBlock | ToolResultBlock) for b in message.content):
        return max(score, TOOL) if score > NOTHING else TOOL
    return score


@dataclass(frozen=True, slots=True)
class Scored:
    index: int
    score: float


def score_messages(messages: Sequence[Message]) -> list[Scored]:
    """Each message's score, exact repeats of an earlier message's text lowered to
    ``NOTHING`` (the first copy keeps its score)."""
    seen: set[str] = set()
    out: list[Scored] = []
    for index, message in enumerate(messages):
        key = " ".join(message_text(message).split()).casefold()
        score = message_importance(message)
        if key and key in seen and not message.tool_uses:
            score = NOTHING
        seen.add(key)
        out.append(Scored(index, score))
    return out


def least_important_first(scored: Iterable[Scored]) -> list[Scored]:
    """Drop order: lowest score first, the oldest first among equals."""
    return sorted(scored, key=lambda s: (s.score, s.index))
