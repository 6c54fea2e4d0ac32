"""The ``hierarchical`` strategy: detail that fades with age, task by task.

Tasks come from the conversation's structure: a task is a user request (a user
message that says something), the work on it (assistant and tool messages) and
its outcome (the last assistant text). Folded messages before the first request
continue a task folded earlier and form a task of their own.

- The kept part (``plan_cut``'s newest turns) stays verbatim, as in every strategy.
- The active task is the newest folded task when the kept part continues it (the
  cut fell inside a turn, or everything was folded) or when it has no outcome yet
  (it ended on a tool call or an error): it is summarised with the summariser
  (primary model, then ``fallback_model``), and by its key points when both fail.
- The ``hierarchical_recent_tasks`` most recent finished tasks keep their key
  points, extracted by code: the request, the outcome sentence, decisions,
  constraints, TODOs and follow-ups, errors and exact identifiers.
- Older tasks, and the tasks of the previous summary, shrink to one line each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from parley.core.context.compaction.strategies.base import (
    Fold,
    FoldRequest,
    KeepsPlannedCut,
    previous_bullets,
)
from parley.core.context.compaction.strategies.summary import (
    REQUIRED_IDENTIFIERS,
    NamedSummarizer,
    SummaryChainError,
    summarize_with_fallback,
)
from parley.core.context.history import is_turn_start
from parley.core.identifiers import find_identifiers
from parley.core.importance import CONSTRAINT, DECISION, ERROR, text_importance
from parley.core.messages import Message, TextBlock, ToolResultBlock, Usage
from parley.core.prompt import SILENT_REPLY

EARLIER_HEADING = "## Earlier tasks"
RECENT_HEADING = "## Recent tasks"
ACTIVE_HEADING = "## Active task"
LINE_CHARS = 160
POINT_CHARS = 240
MAX_POINTS_PER_KIND = 3
MAX_IDENTIFIERS_PER_TASK = 12
# One-line tasks carried forward at most; the ledger keeps their identifiers anyway.
MAX_EARLIER_LINES = 100

_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
# Open work a finished task may leave behind (an ask scores lower than a constraint,
# but a promised follow-up must survive the fold).
_TODO = re.compile(r"\b(?:todo|to-do|remind me|follow up|follow-up|later)\b", re.IGNORECASE)
_TODO_KIND = -1.0


@dataclass(frozen=True, slots=True)
class Task:
    request: str  # the user's words ("" for a continuation of an earlier task)
    messages: tuple[Message, ...]  # the request and the work on it, in order

    @property
    def outcome(self) -> str:
        """The last assistant text, when the task ended on one (not on a tool call)."""
        for message in reversed(self.messages):
            if message.role == "user":
                return ""
            if message.role == "tool_result" or message.tool_uses:
                return ""
            if message.role == "assistant":
                text = message.text.strip()
                if text and text != SILENT_REPLY:
                    return text
        return ""


def split_tasks(messages: Sequence[Message]) -> list[Task]:
    """The folded messages as tasks, oldest first."""
    tasks: list[list[Message]] = []
    for message in messages:
        if is_turn_start(message) or not tasks:
            tasks.append([])
        tasks[-1].append(message)
    return [
        Task(group[0].text.strip() if is_turn_start(group[0]) else "", tuple(group))
        for group in tasks
    ]


def _clip(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _first_sentence(text: str) -> str:
    return next((s for s in _SENTENCES.split(text) if s.strip()), "")


def one_line(task: Task) -> str:
    """``- request → outcome``: what an old task is reduced to."""
    request = _clip(task.request or "(continued work)", LINE_CHARS)
    outcome = _clip(_first_sentence(task.outcome), LINE_CHARS) or "(no outcome recorded)"
    return f"- {request} → {outcome}"


def key_points(task: Task) -> list[str]:
    """The task's headline and its key points as indented bullets, by code."""
    lines = [f"- Task: {_clip(task.request or '(continued work)', POINT_CHARS)}"]
    found: dict[float, list[str]] = {ERROR: [], DECISION: [], CONSTRAINT: [], _TODO_KIND: []}
    identifiers: list[str] = []
    for message in task.messages:
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                text = block.content
                if block.is_error:
                    found[ERROR].append(_clip(_first_sentence(text), POINT_CHARS))
            elif isinstance(block, TextBlock):
                text = block.text
                for sentence in _SENTENCES.split(text):
                    if not sentence.strip():
                        continue
                    score = text_importance(sentence)
                    if _TODO.search(sentence):
                        found[_TODO_KIND].append(_clip(sentence, POINT_CHARS))
                    elif score in found:
                        found[score].append(_clip(sentence, POINT_CHARS))
            else:
                continue
            identifiers.extend(i for i in find_identifiers(text) if i not in identifiers)
    kinds = (
        (DECISION, "Decision"),
        (CONSTRAINT, "Constraint"),
        (_TODO_KIND, "TODO"),
        (ERROR, "Error"),
    )
    for score, label in kinds:
        unique = list(dict.fromkeys(found[score]))
        lines.extend(f"  - {label}: {point}" for point in unique[-MAX_POINTS_PER_KIND:])
    if identifiers:
        shown = identifiers[-MAX_IDENTIFIERS_PER_TASK:]
        lines.append(f"  - Identifiers: {', '.join(shown)}")
    outcome = task.outcome
    summary = _clip(_first_sentence(outcome), POINT_CHARS) if outcome else "not finished"
    lines.append(f"  - Outcome: {summary}")
    return lines


def active_task(tasks: Sequence[Task], kept: Sequence[Message]) -> Task | None:
    """The newest folded task when the kept part continues it or it is unfinished."""
    if not tasks:
        return None
    newest = tasks[-1]
    continues = not kept or not is_turn_start(kept[0])
    return newest if continues or not newest.outcome else None


class HierarchicalStrategy(KeepsPlannedCut):
    name = "hierarchical"

    def __init__(self, chain: Sequence[NamedSummarizer], *, recent_tasks: int) -> None:
        self.chain = tuple(chain)
        self.recent_tasks = recent_tasks

    async def fold(self, request: FoldRequest) -> Fold:
        tasks = split_tasks(request.messages)
        active = active_task(tasks, request.kept)
        finished = tasks[:-1] if active is not None else tasks
        split = max(0, len(finished) - self.recent_tasks)
        old, recent = finished[:split], finished[split:]

        earlier = previous_bullets(request.previous_summary, MAX_EARLIER_LINES)
        earlier = [*earlier, *(one_line(t) for t in old)][-MAX_EARLIER_LINES:]
        sections: list[str] = []
        if earlier:
            sections.append("\n".join([EARLIER_HEADING, *earlier]))
        if recent:
            sections.append(
                "\n".join([RECENT_HEADING, *(line for t in recent for line in key_points(t))])
            )
        fold_details: dict[str, object] = {
            "tasks": len(tasks),
            "old_tasks": len(old),
            "recent_tasks": len(recent),
            "active_task": active is not None,
        }
        usage = Usage()
        if active is not None:
            body, usage = await self._summarise_active(active, request, fold_details)
            sections.append(f"{ACTIVE_HEADING}\n{body}")
        return Fold("\n\n".join(sections), usage, fold_details)

    async def _summarise_active(
        self, task: Task, request: FoldRequest, details: dict[str, object]
    ) -> tuple[str, Usage]:
        identifiers = find_identifiers("\n".join(m.text for m in task.messages))
        try:
            result, produced_by, failures = await summarize_with_fallback(
                self.chain,
                task.messages,
                window=request.window,
                previous_summary=None,
                focus=request.focus,
                required_identifiers=identifiers[-REQUIRED_IDENTIFIERS:],
                max_tokens=request.summary_tokens,
            )
        except SummaryChainError as exc:
            # Key points are what the model would have had to keep anyway.
            details["active_summary"] = "key-points"
            details["fallbacks"] = list(exc.failures)
            return "\n".join(key_points(task)), Usage()
        details["active_summary"] = produced_by
        if failures:
            details["fallbacks"] = failures
        return result.text, result.usage
