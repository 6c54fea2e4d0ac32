"""What fills the context window, for ``/context list|detail|json``.

A user whose agent "forgets" or whose bill climbs needs to see where the tokens go:
each system prompt section, each workspace file (kept whole, truncated or missing),
the tool schemas (sent on every call, never shown as text), the history, the memories
the last turn recalled automatically (part of the history: they ride in its user
message), and the total against the window. The report is plain data (``ContextReport``) built once,
then rendered as text or JSON; the counter is passed in (any object with the
``ContextCounter`` methods), so this module does not depend on a tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from parley.core.context.history import is_summary_block
from parley.core.messages import Message, TextBlock, ToolSpec
from parley.core.prompt import InjectedFile, SystemPrompt

MODE_LIST = "list"
MODE_DETAIL = "detail"
MODE_JSON = "json"
CONTEXT_MODES = (MODE_LIST, MODE_DETAIL, MODE_JSON)
DEFAULT_MODE = MODE_LIST
USAGE = "Usage: /context [list|detail|json]"
REPORT_TITLE = "Context breakdown"

STATUS_OK = "OK"
STATUS_TRUNCATED = "TRUNCATED"
STATUS_MISSING = "MISSING"


class ContextCounter(Protocol):
    """The token counting the report needs (``core.tokens.TokenCounter`` fits)."""

    def text(self, s: str) -> int: ...

    def message(self, m: Message) -> int: ...

    def tools(self, specs: Sequence[ToolSpec]) -> int: ...


@dataclass(frozen=True, slots=True)
class SectionUsage:
    name: str
    chars: int
    tokens: int


@dataclass(frozen=True, slots=True)
class FileUsage:
    name: str
    path: str
    status: str  # STATUS_OK | STATUS_TRUNCATED | STATUS_MISSING
    raw_chars: int
    injected_chars: int


@dataclass(frozen=True, slots=True)
class ToolUsage:
    name: str
    chars: int
    tokens: int


@dataclass(frozen=True, slots=True)
class RoleUsage:
    role: str
    messages: int
    tokens: int


@dataclass(frozen=True, slots=True)
class RecalledItem:
    citation: str
    tokens: int
    score: float | None


@dataclass(frozen=True, slots=True)
class RecallUsage:
    """The last turn's automatic recall, from its user message's ``meta["recall"]``."""

    mode: str
    reason: str
    tokens: int
    skipped_present: int
    hits: tuple[RecalledItem, ...]

    @classmethod
    def from_meta(cls, record: Mapping[str, Any]) -> RecallUsage:
        hits = tuple(
            RecalledItem(
                str(h.get("citation", "")),
                _as_int(h.get("tokens")),
                float(h["score"]) if isinstance(h.get("score"), int | float) else None,
            )
            for h in record.get("hits") or ()
            if isinstance(h, Mapping)
        )
        return cls(
            mode=str(record.get("mode", "")),
            reason=str(record.get("reason", "")),
            tokens=_as_int(record.get("tokens")),
            skipped_present=_as_int(record.get("skipped_present")),
            hits=hits,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "reason": self.reason,
            "tokens": self.tokens,
            "skipped_present": self.skipped_present,
            "hits": [
                {"citation": h.citation, "tokens": h.tokens, "score": h.score} for h in self.hits
            ],
        }


def _as_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class ContextReport:
    workspace: str
    file_max_chars: int
    total_max_chars: int
    system_chars: int
    system_tokens: int
    sections: tuple[SectionUsage, ...]
    files: tuple[FileUsage, ...]
    tool_count: int
    tool_chars: int
    tool_tokens: int
    tools: tuple[ToolUsage, ...]  # largest first
    history_messages: int
    history_tokens: int
    history_roles: tuple[RoleUsage, ...]
    summary_tokens: int | None  # the compaction summary, when the history starts with one
    total_tokens: int
    window: int
    share: float  # total_tokens / window (0.0 for a window of 0)
    session_tokens: int | None  # last provider-reported context size, when known
    recall: RecallUsage | None = None  # the last turn's automatic recall, if it had one

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable form (``/context json``); keys are part of the interface."""
        return {
            "workspace": self.workspace,
            "caps": {
                "file_max_chars": self.file_max_chars,
                "total_max_chars": self.total_max_chars,
            },
            "system_prompt": {
                "chars": self.system_chars,
                "tokens": self.system_tokens,
                "sections": [
                    {"name": s.name, "chars": s.chars, "tokens": s.tokens} for s in self.sections
                ],
            },
            "files": [
                {
                    "name": f.name,
                    "path": f.path,
                    "status": f.status,
                    "raw_chars": f.raw_chars,
                    "injected_chars": f.injected_chars,
                }
                for f in self.files
            ],
            "tools": {
                "count": self.tool_count,
                "chars": self.tool_chars,
                "tokens": self.tool_tokens,
                "items": [
                    {"name": t.name, "chars": t.chars, "tokens": t.tokens} for t in self.tools
                ],
            },
            "history": {
                "messages": self.history_messages,
                "tokens": self.history_tokens,
                "roles": [
                    {"role": r.role, "messages": r.messages, "tokens": r.tokens}
                    for r in self.history_roles
                ],
                "summary_tokens": self.summary_tokens,
            },
            "total_tokens": self.total_tokens,
            "window": self.window,
            "share": round(self.share, 4),
            "session_tokens": self.session_tokens,
            "recall": self.recall.to_dict() if self.recall is not None else None,
        }


def build_context_report(
    *,
    prompt: SystemPrompt,
    tools: Sequence[ToolSpec],
    history: Sequence[Message],
    counter: ContextCounter,
    window: int,
    workspace: Path,
    file_max_chars: int,
    total_max_chars: int,
    session_tokens: int | None = None,
    recall: Mapping[str, Any] | None = None,
) -> ContextReport:
    """Measure every part of the next request (pure apart from the counter's cache)."""
    system_tokens = counter.text(prompt.text)
    sections = tuple(
        SectionUsage(s.name, len(s.text), counter.text(s.text)) for s in prompt.sections
    )
    files = tuple(_file_usage(f, workspace) for f in prompt.files)
    tool_usage = sorted(
        (ToolUsage(t.name, len(t.schema_json()), counter.tools([t])) for t in tools),
        key=lambda t: (-t.tokens, -t.chars, t.name),
    )
    tool_tokens = counter.tools(tools) if tools else 0
    tool_chars = sum(t.chars for t in tool_usage)
    per_message = [counter.message(m) for m in history]
    history_tokens = sum(per_message)
    total = system_tokens + tool_tokens + history_tokens
    return ContextReport(
        workspace=str(workspace),
        file_max_chars=file_max_chars,
        total_max_chars=total_max_chars,
        system_chars=len(prompt.text),
        system_tokens=system_tokens,
        sections=sections,
        files=files,
        tool_count=len(tools),
        tool_chars=tool_chars,
        tool_tokens=tool_tokens,
        tools=tuple(tool_usage),
        history_messages=len(history),
        history_tokens=history_tokens,
        history_roles=_role_usage(history, per_message),
        summary_tokens=_summary_tokens(history, counter),
        total_tokens=total,
        window=window,
        share=total / window if window > 0 else 0.0,
        session_tokens=session_tokens,
        recall=RecallUsage.from_meta(recall) if recall is not None else None,
    )


def _file_usage(file: InjectedFile, workspace: Path) -> FileUsage:
    if file.missing:
        status = STATUS_MISSING
    elif file.truncated:
        status = STATUS_TRUNCATED
    else:
        status = STATUS_OK
    path = file.path if file.path is not None else workspace / file.name
    return FileUsage(file.name, str(path), status, file.raw_chars, file.injected_chars)


def _role_usage(history: Sequence[Message], per_message: Sequence[int]) -> tuple[RoleUsage, ...]:
    counts: dict[str, list[int]] = {}
    for message, tokens in zip(history, per_message, strict=True):
        slot = counts.setdefault(message.role, [0, 0])
        slot[0] += 1
        slot[1] += tokens
    return tuple(RoleUsage(role, n, tokens) for role, (n, tokens) in counts.items())


def _summary_tokens(history: Sequence[Message], counter: ContextCounter) -> int | None:
    if not history or history[0].role != "user" or not history[0].content:
        return None
    first = history[0].content[0]
    if not isinstance(first, TextBlock) or not is_summary_block(first):
        return None
    return counter.text(first.text)


def render_context(report: ContextReport, mode: str = DEFAULT_MODE) -> str:
    """The ``/context`` reply for ``mode``; an unknown mode gets the usage line."""
    mode = mode.strip().lower() or DEFAULT_MODE
    if mode == MODE_JSON:
        return json.dumps(report.to_dict(), ensure_ascii=False, indent=2)
    if mode not in CONTEXT_MODES:
        return USAGE
    return "\n".join(_render_text(report, detail=mode == MODE_DETAIL))


def _render_text(report: ContextReport, *, detail: bool) -> list[str]:
    lines = [
        REPORT_TITLE,
        f"Workspace: {report.workspace}",
        f"Workspace file cap: {report.file_max_chars:,} chars per file, "
        f"{report.total_max_chars:,} in total",
        f"System prompt: {report.system_chars:,} chars (~{report.system_tokens:,} tok)",
    ]
    lines += [f"  {s.name}: {s.chars:,} chars (~{s.tokens:,} tok)" for s in report.sections]
    lines.append("Workspace files:")
    width = max((len(f.name) for f in report.files), default=0)
    for f in report.files:
        if f.status == STATUS_MISSING:
            lines.append(f"  {f.status:<9} | {f.name:<{width}} | expected at {f.path}")
        else:
            lines.append(
                f"  {f.status:<9} | {f.name:<{width}} | raw {f.raw_chars:,} chars | "
                f"injected {f.injected_chars:,} chars"
            )
    lines.append(
        f"Tool schemas (JSON): {report.tool_count} tools, {report.tool_chars:,} chars "
        f"(~{report.tool_tokens:,} tok; counts toward context, not shown as text)"
    )
    if detail:
        lines += [f"  {t.name}: {t.chars:,} chars (~{t.tokens:,} tok)" for t in report.tools]
    elif report.tools:
        lines.append("  " + ", ".join(sorted(t.name for t in report.tools)))
    lines.append(f"History: {report.history_messages} messages (~{report.history_tokens:,} tok)")
    if detail:
        lines += [
            f"  {r.role}: {r.messages} messages (~{r.tokens:,} tok)" for r in report.history_roles
        ]
        if report.summary_tokens is not None:
            lines.append(f"  compaction summary: ~{report.summary_tokens:,} tok")
    if report.recall is not None:
        lines += _render_recall(report.recall)
    lines.append(
        f"Total: ~{report.total_tokens:,} tok of a {report.window:,} token window "
        f"({report.share:.1%})"
    )
    if report.session_tokens is not None:
        lines.append(f"Session tokens (last reported): {report.session_tokens:,}")
    return lines


def _render_recall(recall: RecallUsage) -> list[str]:
    head = f"Recalled memory (last turn, {recall.mode}"
    head += f", {recall.reason})" if recall.reason and recall.reason != recall.mode else ")"
    if not recall.hits:
        head += ": nothing new found"
    else:
        head += f": {len(recall.hits)} hits (~{recall.tokens:,} tok, part of the history)"
    if recall.skipped_present:
        head += f"; {recall.skipped_present} skipped as already in context"
    return [head, *(f"  {h.citation} (~{h.tokens:,} tok)" for h in recall.hits)]
