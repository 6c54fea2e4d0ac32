"""The ``selective`` strategy: keep the folded part's important messages verbatim.

No model call. The folded messages (and the bullet lines of the previous summary,
older than all of them) are scored by the written-down rules of ``core.importance``,
highest first:

- errors (tracebacks, "failed", tool results marked as errors): 0.95;
- decisions ("we decided", "let's go with"): 0.90;
- constraints and rules ("must", "never", deadlines): 0.85;
- "remember ..." and stated preferences: 0.80;
- exact identifiers (ids, hashes, URLs, paths): 0.70;
- open asks and TODOs: 0.60;
- tool calls and results: 0.50 (medium);
- anything else with substance: 0.40;
- clarifications and acknowledgements ("ok", "thanks", "what do you mean"): 0.15;
- empty text, silent replies and exact repeats: 0.05.

A tool call and the results answering it are one unit scored by its best message,
so a failed call keeps the call that failed. What the person wrote scores
``PERSON_BONUS`` above the model's answers: their words are where the facts come from
("my car is on level 3, spot 42"), while a small model's answer is often noise. Units
are dropped lowest score first, the oldest first among equals, until the rendered text
is under the budget; then the dropped units that still fit come back, most important
first, so one long answer does not push out every short message before it (only units
scoring above plain substance: filler and chatter stay out). The budget:
``selective_target_ratio`` (default 0.25) of the compaction threshold. A quarter
leaves the kept turns (at most ``MAX_KEEP_SHARE`` of the threshold), the system
prompt and a few turns of growth room before the next compaction. The survivors
are rendered one per line (``[User]: ...``) in their original order.

``/compact <focus>``: units that mention one of the focus's words (of 4 letters or
more, case-insensitive) score ``FOCUS_BOOST`` higher, so what the person asked to keep
is dropped last.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from parley.core.context.compaction.strategies.base import (
    CountText,
    Fold,
    FoldRequest,
    KeepsPlannedCut,
    previous_bullets,
)
from parley.core.context.compaction.summarizer import group_units, serialize_message
from parley.core.importance import (
    DEFAULT,
    Scored,
    least_important_first,
    message_importance,
    text_importance,
)

SELECTIVE_HEADER = "Earlier conversation, its most important messages verbatim (oldest first):"
# Bullets of the previous summary carried forward at most (the budget prunes further).
MAX_PREVIOUS_LINES = 400
# Above every rule's score: a unit the focus names outranks any it does not.
FOCUS_BOOST = 1.0
# Less than the gap between two rules: a person's plain message outranks a plain answer,
# never an answer that carries an error, a decision or an identifier.
PERSON_BONUS = 0.04
PERSON_LINE = "[User]: "  # how serialize_message renders what the person wrote
_FOCUS_WORD = re.compile(r"\w{4,}")


@dataclass(frozen=True, slots=True)
class _Item:
    text: str
    score: float
    tokens: int


def focus_words(focus: str) -> frozenset[str]:
    return frozenset(w.casefold() for w in _FOCUS_WORD.findall(focus))


def _focused(text: str, words: frozenset[str]) -> bool:
    return bool(words) and not words.isdisjoint(w.casefold() for w in _FOCUS_WORD.findall(text))


def _items(request: FoldRequest, count_text: CountText) -> list[_Item]:
    words = focus_words(request.focus)
    items = [
        _Item(line[2:], _bullet_score(line[2:]), count_text(line))
        for line in previous_bullets(request.previous_summary, MAX_PREVIOUS_LINES)
    ]
    seen: set[str] = set()
    for unit in group_units(request.messages):
        text = "\n".join(t for t in (serialize_message(m) for m in unit) if t)
        if not text:
            continue
        key = " ".join(text.split()).casefold()
        # An exact repeat says nothing new; calls are exempt (a retried call is work).
        repeat = key in seen and not any(m.tool_uses for m in unit)
        seen.add(key)
        score = 0.05 if repeat else max(message_importance(m) for m in unit)
        if not repeat and all(m.role == "user" for m in unit):
            score += PERSON_BONUS
        items.append(_Item(_one_line(text), score, count_text(text)))
    if words:
        items = [
            _Item(i.text, i.score + FOCUS_BOOST, i.tokens) if _focused(i.text, words) else i
            for i in items
        ]
    return items


def _bullet_score(text: str) -> float:
    """A line an earlier selective fold kept: the person's words keep their bonus, or
    the next fold would drop them before the newer answers it kept them over."""
    bonus = PERSON_BONUS if text.startswith(PERSON_LINE) else 0.0
    return text_importance(text) + bonus


def _one_line(text: str) -> str:
    # One line per unit keeps the summary compact and each unit easy to tell apart.
    return " ⏎ ".join(part for part in text.splitlines() if part.strip())


def select(items: Sequence[_Item], budget: int) -> tuple[list[int], int]:
    """Indices of the items kept under ``budget`` tokens, in order, and how many were
    dropped (lowest score first, oldest first among equals; then what still fits comes
    back, most important and newest first)."""
    total = sum(i.tokens for i in items)
    dropped: list[Scored] = []
    order = least_important_first(Scored(n, item.score) for n, item in enumerate(items))
    for scored in order:
        if total <= budget:
            break
        dropped.append(scored)
        total -= items[scored.index].tokens
    left_out = {s.index for s in dropped}
    for scored in reversed(dropped):
        tokens = items[scored.index].tokens
        if scored.score > DEFAULT and total + tokens <= budget:
            left_out.discard(scored.index)
            total += tokens
    return [n for n in range(len(items)) if n not in left_out], len(left_out)


class SelectiveStrategy(KeepsPlannedCut):
    name = "selective"

    def __init__(self, *, target_ratio: float, count_text: CountText) -> None:
        self.target_ratio = target_ratio
        self.count_text = count_text

    async def fold(self, request: FoldRequest) -> Fold:
        items = _items(request, self.count_text)
        budget = max(1, int(request.threshold * self.target_ratio))
        if request.fold_tokens is not None:
            # A small window's room after the system prompt (core.context.budget).
            budget = min(budget, request.fold_tokens)
        kept, dropped = select(items, budget)
        lines = [SELECTIVE_HEADER, *(f"- {items[n].text}" for n in kept)]
        if dropped:
            lines.append(f"[{dropped} less important message(s) left out]")
        return Fold(
            "\n".join(lines),
            details={"selected": len(kept), "dropped": dropped, "budget_tokens": budget},
        )
