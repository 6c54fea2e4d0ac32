"""The model's view of a session: live transcript entries in, provider-ready messages out.

``build_history`` puts the latest compaction's summary first (as a user message wrapped
in ``COMPACTION_SUMMARY_PREFIX`` / ``COMPACTION_SUMMARY_SUFFIX``), then the kept message
entries and everything after the compaction; custom entries are never shown.

``repair_history`` then makes the view valid for every provider. It is pure: the
transcript is never changed, so a repair can be refined later without a migration.
The view it returns keeps these invariants, which provider translators may rely on:

- it is empty or starts with a ``user`` message (leading assistant and tool_result
  messages are dropped, so the history never starts mid tool call; a fabricated user
  turn would put words in the user's mouth, and after a compaction the summary is
  the first message anyway);
- every assistant ``tool_use`` is answered by the ``tool_result`` message right after
  it, one result per call in call order: a result found later in the view is moved
  there, a missing one (a run killed mid tool loop) is synthesised as an error;
- a ``tool_result`` message holds only ToolResultBlocks, and every result answers a
  call of the assistant message before it: orphans (no earlier call) and duplicate
  results for one call are dropped;
- roles alternate between ``assistant`` and the user side (``user`` / ``tool_result``):
  consecutive user messages, and consecutive assistant messages, are merged block by
  block. The one user-side pair that remains is ``tool_result`` followed by ``user``
  (the user spoke after a tool loop); a translator for an API without a tool role
  joins the two into one user turn;
- no message is empty, and no text block is blank.

Per-turn cost is one pass over the live window; each entry's ``Message`` is parsed
once, when the entry is (``Entry.message``), and untouched messages are reused as-is.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from core.messages import Block, Message, TextBlock, ToolResultBlock, ToolUseBlock
from core.transcript import ENTRY_COMPACTION, ENTRY_MESSAGE, Entry

COMPACTION_SUMMARY_PREFIX = (
    "The conversation history before this point was compacted into the following summary:\n"
    "<summary>\n"
)
COMPACTION_SUMMARY_SUFFIX = "\n</summary>"
MISSING_TOOL_RESULT = "[tool result missing: the run was interrupted]"


@lru_cache(maxsize=64)
def summary_message(summary: str) -> Message:
    """The user message that stands for everything a compaction summarised."""
    return Message.user(f"{COMPACTION_SUMMARY_PREFIX}{summary}{COMPACTION_SUMMARY_SUFFIX}")


def build_history(entries: Sequence[Entry]) -> list[Message]:
    """The repaired model view of ``entries`` (normally ``Transcript.live_entries()``).

    Entries before the latest compaction's first kept entry are skipped, so passing
    every entry of a file gives the same view as passing the live window.
    """
    return repair_history(view_messages(entries))


def view_messages(entries: Sequence[Entry]) -> list[Message]:
    """The unrepaired view: summary first, then the message entries of the window."""
    start = 0
    messages: list[Message] = []
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if entry.type != ENTRY_COMPACTION:
            continue
        messages.append(summary_message(entry.payload["summary"]))
        start = _window_start(entries, index)
        break
    messages.extend(e.message for e in entries[start:] if e.type == ENTRY_MESSAGE)
    return messages


def _window_start(entries: Sequence[Entry], compaction_at: int) -> int:
    kept = entries[compaction_at].payload.get("first_kept_entry_id")
    if kept is None:
        return compaction_at
    for index in range(compaction_at - 1, -1, -1):
        if entries[index].id == kept:
            return index
    # Not there: the caller already cut the window (or the kept entry was lost).
    return 0


def repair_history(messages: Sequence[Message]) -> list[Message]:
    """Make a message sequence valid for the providers (see the module docstring)."""
    # Pass 1: the first result after each call answers it; anything else is dropped.
    called: set[str] = set()
    answers: dict[str, ToolResultBlock] = {}
    for message in messages:
        if message.role == "assistant":
            called.update(b.id for b in message.content if isinstance(b, ToolUseBlock))
            continue
        for block in message.content:
            if (
                isinstance(block, ToolResultBlock)
                and block.tool_use_id in called
                and block.tool_use_id not in answers
            ):
                answers[block.tool_use_id] = block

    # Pass 2: rebuild, placing each call's results right after it.
    out: list[Message] = []
    emitted_calls: set[str] = set()
    for index, message in enumerate(messages):
        if message.role == "assistant":
            kept = _assistant_blocks(message, emitted_calls)
            if not kept:
                continue
            _push(out, message if len(kept) == len(message.content) else _rebuild(message, kept))
            calls = [b for b in kept if isinstance(b, ToolUseBlock)]
            if calls:
                results = tuple(answers.get(c.id) or _missing(c.id) for c in calls)
                out.append(_results_message(messages, index + 1, results))
        else:
            kept = [b for b in message.content if _user_side_keeps(b)]
            if kept:
                unchanged = message.role == "user" and len(kept) == len(message.content)
                _push(out, message if unchanged else Message("user", tuple(kept)))

    for start, message in enumerate(out):
        if message.role == "user":
            return out[start:] if start else out
    return []


def _assistant_blocks(message: Message, emitted_calls: set[str]) -> list[Block]:
    kept: list[Block] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock) or _blank(block):
            continue
        if isinstance(block, ToolUseBlock):
            if block.id in emitted_calls:  # a repeated call id would be rejected by the API
                continue
            emitted_calls.add(block.id)
        kept.append(block)
    return kept


def _user_side_keeps(block: Block) -> bool:
    # Results were placed after their calls in pass 2; calls never come from this side.
    return not isinstance(block, ToolResultBlock | ToolUseBlock) and not _blank(block)


def _blank(block: Block) -> bool:
    return isinstance(block, TextBlock) and not block.text.strip()


def _rebuild(message: Message, blocks: list[Block]) -> Message:
    return Message(message.role, tuple(blocks))


def _results_message(
    messages: Sequence[Message], at: int, results: tuple[ToolResultBlock, ...]
) -> Message:
    # The usual case: the next message already is exactly this answer; reuse it.
    if (
        at < len(messages)
        and messages[at].role == "tool_result"
        and messages[at].content == results
    ):
        return messages[at]
    return Message("tool_result", results)


def _missing(tool_use_id: str) -> ToolResultBlock:
    return ToolResultBlock(tool_use_id, MISSING_TOOL_RESULT, is_error=True)


def _push(out: list[Message], message: Message) -> None:
    """Append, merging into the previous message when it has the same role."""
    if out and out[-1].role == message.role:
        out[-1] = Message(message.role, out[-1].content + message.content)
    else:
        out.append(message)
