"""The compaction ledger: facts that must survive every summary word for word.

A model-written summary can silently drop a ticket number, a path or an unanswered
question (peer-lessons rows 1 and 8). The ledger is extracted by plain code, never by
a model, so it cannot fail or hallucinate: exact identifiers, the user's open asks,
explicit "remember ..." notes and stated decisions. It is stored beside each
compaction summary, merged forward across compactions, and rendered verbatim into
the prompt, so what it holds survives however lossy the summary is.

Heuristics (deterministic, documented so their misses are predictable):

* Identifiers come from user and assistant text, tool-call inputs, and tool results
  shorter than ``SHORT_TOOL_RESULT_CHARS`` (bulk output is too noisy); their kinds and
  how overlapping matches resolve are in ``core.identifiers``. Hex ids and UUIDs are
  deduplicated case-insensitively.
* Asks: sentences of a user message that end with ``?`` or start with please / can
  you / could you / would you / remind me / make sure / don't forget. A burst of
  consecutive user messages is one turn; its asks are answered when an assistant
  text reply (non-empty, not an error notice) follows before the next user turn.
  Deferred asks (remind me, later, tomorrow, next week, todo) stay open regardless.
* Remember: user sentences starting with remember (that) / don't forget / note that /
  keep in mind.
* Decisions: sentences with we decided / decision: / let's go with / we'll use, a
  user's "I'll use", or starting with "go with". An assistant's "I'll use" is left
  out: it is how assistants announce tool calls, not decisions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from parley.core.identifiers import absent_identifiers, find_identifiers, identifier_key
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock

DEFAULT_MAX_IDENTIFIERS = 400
DEFAULT_MAX_ASKS = 20
DEFAULT_MAX_REMEMBER = 50
DEFAULT_MAX_DECISIONS = 50
MAX_SENTENCE_CHARS = 300
# Tool results at least this long are bulk output: their identifiers are not collected.
SHORT_TOOL_RESULT_CHARS = 500

LEDGER_HEADING = "## Ledger (kept verbatim across compactions)"
# Rendering within a token budget takes items from these sections in turn.
_RENDER_PRIORITY = ("remember", "identifiers", "asks", "decisions")
LEFT_OUT_NOTE_TOKENS = 16  # "(N more ledger item(s) left out ...)"
CountText = Callable[[str], int]
_SECTION_TITLES = (
    ("identifiers", "### Exact identifiers"),
    ("asks", "### Open asks"),
    ("remember", "### Remember"),
    ("decisions", "### Decisions"),
)

# --- sentences ---------------------------------------------------------------------

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?。！？])\s+|\n+")
_LEAD = r"^(?:(?:please|also|and|oh|btw|but|just|ok|okay|so|then|hey)[,\s]+)*"
_APOS = "['’]"
_ASK_START = re.compile(
    _LEAD + rf"(?:please|can you|could you|would you|remind me|make sure|don{_APOS}?t forget"
    r"|do not forget)\b",
    re.IGNORECASE,
)
_DEFERRED = re.compile(r"\b(?:remind me|later|tomorrow|next week|todo|to-do)\b", re.IGNORECASE)
_REMEMBER = re.compile(
    _LEAD + rf"(?:remember|don{_APOS}?t forget|do not forget|never forget|note that"
    r"|keep in mind)\b",
    re.IGNORECASE,
)
_DECISION_ANYWHERE = re.compile(
    rf"\b(?:we(?:{_APOS}ve| have)? decided|decision:|let{_APOS}?s go with|let us go with"
    rf"|we{_APOS}ll use|we will use)",
    re.IGNORECASE,
)
_DECISION_START = re.compile(_LEAD + r"go with\b", re.IGNORECASE)
_I_WILL_USE = re.compile(rf"\bI(?:{_APOS}ll| will) use\b", re.IGNORECASE)
_ERROR_REPLY = re.compile(r"^\s*(?:\[?error\b|⚠|❌)", re.IGNORECASE)


def _clip(sentence: str) -> str:
    sentence = " ".join(sentence.split())
    if len(sentence) <= MAX_SENTENCE_CHARS:
        return sentence
    return sentence[: MAX_SENTENCE_CHARS - 1].rstrip() + "…"


def _sentences(text: str) -> Iterator[str]:
    for raw in _SENTENCE_SPLIT.split(text):
        sentence = raw.strip().lstrip("-*•> ").strip()
        if sentence:
            yield sentence


def _is_ask(sentence: str) -> bool:
    return sentence.rstrip().endswith(("?", "？")) or bool(_ASK_START.match(sentence))


def _is_decision(sentence: str, *, from_user: bool) -> bool:
    if _DECISION_ANYWHERE.search(sentence) or _DECISION_START.match(sentence):
        return True
    return from_user and bool(_I_WILL_USE.search(sentence))


# --- the ledger --------------------------------------------------------------------


def _dedupe(items: Iterable[str], key: Any) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def _sentence_key(s: str) -> str:
    return " ".join(s.split()).casefold()


def _keep_newest(items: list[str], cap: int) -> tuple[str, ...]:
    return tuple(items[-cap:]) if cap > 0 else ()


@dataclass(frozen=True)
class Ledger:
    identifiers: tuple[str, ...] = ()
    asks: tuple[str, ...] = ()
    remember: tuple[str, ...] = ()
    decisions: tuple[str, ...] = ()

    def merge(self, newer: Ledger) -> Ledger:
        """Union in order (older first). Identifiers keep the first-seen ones up to the
        cap; the sentence lists keep their newest entries."""
        identifiers = _dedupe((*self.identifiers, *newer.identifiers), identifier_key)
        return Ledger(
            identifiers=tuple(identifiers[:DEFAULT_MAX_IDENTIFIERS]),
            asks=_keep_newest(_dedupe((*self.asks, *newer.asks), _sentence_key), DEFAULT_MAX_ASKS),
            remember=_keep_newest(
                _dedupe((*self.remember, *newer.remember), _sentence_key), DEFAULT_MAX_REMEMBER
            ),
            decisions=_keep_newest(
                _dedupe((*self.decisions, *newer.decisions), _sentence_key),
                DEFAULT_MAX_DECISIONS,
            ),
        )

    def is_empty(self) -> bool:
        return not (self.identifiers or self.asks or self.remember or self.decisions)

    def render(self, max_tokens: int | None = None, count: CountText | None = None) -> str:
        """The prompt block; "" when empty. Same ledger, same bytes (cache-stable).

        With ``max_tokens`` (and ``count``), the block stays within that many tokens:
        items are taken in turns from each section (remember, identifiers, asks,
        decisions), the user's "remember ..." first, the first-seen identifiers and the
        newest sentences first, until the next one would not fit (an ask that is also a
        remember note is shown once, an identifier inside a shown sentence is not shown
        again); a last line says how many were left out. The ledger itself keeps them
        all for the next compaction."""
        if self.is_empty():
            return ""
        shown = self._within(max_tokens, count) if max_tokens is not None and count else None
        sentences = [
            item
            for field_name in ("asks", "remember", "decisions")
            for n, item in enumerate(getattr(self, field_name))
            if shown is not None and (field_name, n) in shown
        ]
        lines = [LEDGER_HEADING]
        left_out = 0
        # An ask that is also a remember note is shown once, as the note: not left out.
        remembered = {_sentence_key(item) for item in self.remember}
        for field_name, title in _SECTION_TITLES:
            items: tuple[str, ...] = getattr(self, field_name)
            if shown is not None:
                kept = [item for n, item in enumerate(items) if (field_name, n) in shown]
                # Only what the budget dropped counts as left out to fit the window.
                left_out += sum(
                    1
                    for n, item in enumerate(items)
                    if (field_name, n) not in shown
                    and not (field_name == "asks" and _sentence_key(item) in remembered)
                )
                if field_name == "identifiers":
                    # Those inside a shown sentence are in view already: not twice.
                    kept = [i for i in kept if not any(i in t for t in sentences)]
                items = tuple(kept)
            if items:
                lines.append(title)
                lines.extend(f"- {item}" for item in items)
        if left_out:
            lines.append(f"({left_out} more ledger item(s) left out to fit the context window)")
        return "\n".join(lines)

    def _within(self, max_tokens: int, count: CountText) -> set[tuple[str, int]]:
        """Which (section, index) items fit ``max_tokens`` (see ``render``)."""
        titles = dict(_SECTION_TITLES)
        # "Please remember X for later" is an open ask and a remember note: once is enough.
        remembered = {_sentence_key(item) for item in self.remember}
        queues: list[list[tuple[str, int, str]]] = []
        for field_name in _RENDER_PRIORITY:
            items: tuple[str, ...] = getattr(self, field_name)
            newest_first = field_name != "identifiers"
            order = reversed(range(len(items))) if newest_first else range(len(items))
            queues.append(
                [
                    (field_name, n, items[n])
                    for n in order
                    if field_name != "asks" or _sentence_key(items[n]) not in remembered
                ]
            )
        budget = max_tokens - count(LEDGER_HEADING) - LEFT_OUT_NOTE_TOKENS
        chosen: set[tuple[str, int]] = set()
        opened: set[str] = set()
        shown: list[str] = []  # the sentences chosen so far
        while any(queues) and budget > 0:
            for queue in queues:
                if not queue:
                    continue
                field_name, index, item = queue.pop(0)
                if field_name == "identifiers" and any(item in text for text in shown):
                    # Already in view inside a chosen sentence ("remember X for later").
                    chosen.add((field_name, index))
                    continue
                # A section's title costs once, with its first item.
                title = 0 if field_name in opened else count(titles[field_name]) + 1
                cost = count(f"- {item}") + 1 + title
                if cost > budget:
                    continue  # a shorter item further on may still fit
                budget -= cost
                opened.add(field_name)
                chosen.add((field_name, index))
                if field_name != "identifiers":
                    shown.append(item)
        return chosen

    def to_dict(self) -> dict[str, Any]:
        return {
            "identifiers": list(self.identifiers),
            "asks": list(self.asks),
            "remember": list(self.remember),
            "decisions": list(self.decisions),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Ledger:
        """Tolerant: a missing or malformed field reads as empty (old transcripts)."""
        if not isinstance(raw, dict):
            return cls()

        def strings(name: str) -> list[str]:
            value = raw.get(name)
            if not isinstance(value, list):
                return []
            return [item for item in value if isinstance(item, str) and item.strip()]

        return cls(
            identifiers=tuple(
                _dedupe(strings("identifiers"), identifier_key)[:DEFAULT_MAX_IDENTIFIERS]
            ),
            asks=_keep_newest(_dedupe(strings("asks"), _sentence_key), DEFAULT_MAX_ASKS),
            remember=_keep_newest(
                _dedupe(strings("remember"), _sentence_key), DEFAULT_MAX_REMEMBER
            ),
            decisions=_keep_newest(
                _dedupe(strings("decisions"), _sentence_key), DEFAULT_MAX_DECISIONS
            ),
        )


def _input_strings(value: Any) -> Iterator[str]:
    """Every string (and integer) leaf of a tool-call input, in order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        yield str(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _input_strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _input_strings(item)
    elif not isinstance(value, float):
        yield json.dumps(value, default=str)


def _identifier_sources(message: Message) -> Iterator[str]:
    for block in message.content:
        if isinstance(block, TextBlock):
            yield block.text
        elif isinstance(block, ToolUseBlock):
            yield from _input_strings(block.input)
        elif isinstance(block, ToolResultBlock) and len(block.content) < SHORT_TOOL_RESULT_CHARS:
            yield block.content


def _answers(message: Message) -> bool:
    """An assistant message that replies in words: not empty, not an error notice, and
    not a preamble to tool calls ("let me check...") whose real answer may never come."""
    if message.role != "assistant" or message.tool_uses:
        return False
    text = message.text.strip()
    return bool(text) and not _ERROR_REPLY.match(text)


def extract_ledger(messages: Sequence[Message]) -> Ledger:
    """Extract the ledger from ``messages`` (deterministic, no model)."""
    identifiers: list[str] = []
    asks: list[str] = []
    remember: list[str] = []
    decisions: list[str] = []
    turn_asks: list[str] = []  # asks of the current user turn, not yet answered

    def close_turn() -> None:
        asks.extend(turn_asks)
        turn_asks.clear()

    previous_role: str | None = None
    for message in messages:
        for source in _identifier_sources(message):
            identifiers.extend(find_identifiers(source))
        if message.role == "user":
            if previous_role not in (None, "user"):
                close_turn()
            for sentence in _sentences(message.text):
                clipped = _clip(sentence)
                if _is_ask(sentence):
                    turn_asks.append(clipped)
                if _REMEMBER.match(sentence):
                    remember.append(clipped)
                if _is_decision(sentence, from_user=True):
                    decisions.append(clipped)
        elif message.role == "assistant":
            for sentence in _sentences(message.text):
                if _is_decision(sentence, from_user=False):
                    decisions.append(_clip(sentence))
            if _answers(message):
                # Answered asks drop out; deferred ones stay open until done later.
                turn_asks[:] = [a for a in turn_asks if _DEFERRED.search(a)]
        previous_role = message.role
    close_turn()

    return Ledger(
        identifiers=tuple(_dedupe(identifiers, identifier_key)[:DEFAULT_MAX_IDENTIFIERS]),
        asks=_keep_newest(_dedupe(asks, _sentence_key), DEFAULT_MAX_ASKS),
        remember=_keep_newest(_dedupe(remember, _sentence_key), DEFAULT_MAX_REMEMBER),
        decisions=_keep_newest(_dedupe(decisions, _sentence_key), DEFAULT_MAX_DECISIONS),
    )


def missing_identifiers(ledger: Ledger, summary: str) -> list[str]:
    """The ledger's identifiers that ``summary`` does not contain verbatim."""
    return absent_identifiers(ledger.identifiers, summary)
