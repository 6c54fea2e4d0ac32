"""What fills the context window, for ``/context list|detail|json``.

A user whose agent "forgets" or whose bill climbs needs to see where the tokens go:
each system prompt section, each workspace file (kept whole, truncated or missing),
the tool schemas (sent on every call, never shown as text), the history, the memories
the last turn recalled automatically (part of the history: they ride in its user
message), and the total against the window. The report is plain data (``ContextReport``) built once,
then rendered as text or JSON; the counter is passed in (any object with the
``ContextCounter`` methods), so this module does not depend on a tokenizer.

The report is also the one source of a session's context figures: ``/status``,
``/context`` and the admin inspector all print ``figure_lines(report)``, so the same
session at the same moment shows the same numbers under the same labels everywhere.
There are two figures because they answer different questions and differ by design:
the *next request*, estimated by parley's own count of the parts above, and the *last
call*, the model's own report of what it read (cache included) plus what it wrote.
The model's tokenizer and chat template are not parley's, and the last call's output
is now part of the history, so the two never match exactly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from parley.core.context.history import is_summary_block
from parley.core.context.window import WindowInfo
from parley.core.messages import Message, TextBlock, ToolSpec
from parley.core.prompt import InjectedFile, SystemPrompt
from parley.core.providers.base import ModelFacts
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_MESSAGE, Entry

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

# The labels every surface prints the figures under (part of the interface: the
# inspector shows the same lines, and tests compare them across surfaces).
WINDOW_LABEL = "Context window"
NEXT_REQUEST_LABEL = "Next request (estimated)"
LAST_CALL_LABEL = "Last call (reported by the model)"


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
class LastCall:
    """The newest provider call of the live window, as the model reported it."""

    prompt_tokens: int  # everything it read, cache included
    output_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "tokens": self.tokens,
        }


def last_call(entries: Sequence[Entry]) -> LastCall | None:
    """The last call's reported usage in ``entries`` (a transcript's live window).

    None when no call reported usage since the latest compaction: an older report
    describes a view that no longer exists. An assistant entry without usage was not
    written by a call (an import, say) and is passed over; one whose usage is all zero
    was a call whose server reported nothing, and the figure is unknown."""
    for entry in reversed(entries):
        if entry.type == ENTRY_COMPACTION:
            return None
        if entry.type != ENTRY_MESSAGE or entry.message.role != "assistant":
            continue
        usage = entry.usage
        if usage is None:
            continue
        if usage.context_tokens <= 0:
            return None
        return LastCall(usage.context_tokens, usage.output_tokens)
    return None


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
    session_tokens: int | None  # last_call's tokens (kept as a key of the JSON form)
    recall: RecallUsage | None = None  # the last turn's automatic recall, if it had one
    last_call: LastCall | None = None  # the model's report of the last call, when known
    window_note: str = ""  # the window and where it came from, in plain words

    def figures(self) -> dict[str, Any]:
        """The figures every surface shows (``figure_lines``), machine-readable."""
        return {
            "window_tokens": self.window,
            "window_source": self.window_note,
            "next_request_tokens": self.total_tokens,
            "share": round(self.share, 4),
            "last_call": self.last_call.to_dict() if self.last_call is not None else None,
            "lines": figure_lines(self),
        }

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
            "figures": self.figures(),
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
    last_call: LastCall | None = None,
    recall: Mapping[str, Any] | None = None,
    window_note: str = "",
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
        session_tokens=last_call.tokens if last_call is not None else None,
        recall=RecallUsage.from_meta(recall) if recall is not None else None,
        last_call=last_call,
        window_note=window_note,
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
    lines += figure_lines(report)
    return lines


def figure_lines(report: ContextReport) -> list[str]:
    """The session's context figures as ``/status``, ``/context`` and the inspector
    print them: the window and its source, the next request's estimate against it, and
    the last call as the model reported it."""
    window = f"{WINDOW_LABEL}: " + (report.window_note or f"{report.window:,} tokens")
    estimate = (
        f"{NEXT_REQUEST_LABEL}: ~{report.total_tokens:,} / {report.window:,} tokens "
        f"({report.share:.1%})"
    )
    call = report.last_call
    if call is not None:
        reported = (
            f"{call.tokens:,} tokens ({call.prompt_tokens:,} read + {call.output_tokens:,} written)"
        )
    elif report.summary_tokens is not None:
        reported = "none since the latest compaction"
    else:
        reported = "none yet"
    return [window, estimate, f"{LAST_CALL_LABEL}: {reported}"]


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


# -- where the figures come from, in plain words (/status, /context, `parley doctor`) ----


def describe_window(info: WindowInfo, *, model: str, facts: ModelFacts | None = None) -> str:
    """``"8,192 tokens, from the llama.cpp server (/props)"``: the window and its source.

    When the provider gave the window, ``facts`` (its ``ModelFacts``) or the engine's
    ``detail`` on ``info`` name the server or file it came from."""
    tokens = f"{info.tokens:,} tokens"
    key = f'context.models."{model}"'
    if info.source == "config":
        origin = f"from your config ({key})"
    elif info.source == "provider":
        detail = getattr(info, "detail", "")
        source = (facts.source if facts is not None else "") or (
            detail if isinstance(detail, str) else ""
        )
        origin = _provider_origin(source.strip(), facts.server.strip() if facts else "")
    elif info.source == "table":
        origin = "from parley's built-in table"
    else:
        origin = f"assumed default: set {key}.context_tokens to the model's real window"
    if info.capped:
        origin += ", capped by context.agent_max_tokens"
    return f"{tokens}, {origin}"


def _provider_origin(source: str, server: str) -> str:
    if not source:
        return "from the model's provider"
    if server == "embedded" or "gguf" in source.lower():
        return f"from the model file ({source})"
    # "llama.cpp /props" → "the llama.cpp server (/props)"
    name, _, rest = source.partition(" ")
    if rest and (name.lower() == server.lower() or (not server and rest.startswith("/"))):
        return f"from the {name} server ({rest.strip()})"
    return f"from the model server ({source})"


def describe_tools(
    offered: bool, *, count: int | None, model: str, configured: bool | None, provider: object
) -> str:
    """Whether the model is offered tools (``count`` of them, when known), and when not,
    who said so: ``configured`` is the operator's ``context.models."<id>".tools``, else
    the provider's facts (``supports_tools``) decided."""
    key = f'context.models."{model}".tools'
    if offered:
        why = [str(count)] if count is not None else []
        if configured is True:
            why.append(f"as {key} = true says")
        return "offered" + (f" ({', '.join(why)})" if why else "")
    if configured is False:
        return f"withheld: {key} = false"
    facts = getattr(provider, "facts", None)
    server = getattr(facts, "server", "") if facts is not None else ""
    if getattr(facts, "supports_tools", None) is False and server and server != "embedded":
        return f"withheld: the {server} server says the model cannot use them"
    if server == "embedded" or getattr(provider, "name", "") == "local":
        return "withheld: the embedded model cannot use them"
    return "withheld: the model's provider says it cannot use them"


def describe_profile(profile: object) -> str | None:
    """The model profile in use (``"small"``, ``"standard"``), with why when it says;
    None when there is none to show."""
    if profile is None:
        return None
    if isinstance(profile, str):
        return profile or None
    name = getattr(profile, "name", None)
    if not isinstance(name, str) or not name:
        return None
    reason = getattr(profile, "reason", None)
    return f"{name} ({reason})" if isinstance(reason, str) and reason else name
