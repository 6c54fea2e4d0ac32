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
- every ``tool_use`` is well formed: a non-empty id, a name matching
  ``TOOL_NAME_PATTERN`` (the providers' own rule) and a dict input. A malformed call
  (a model glitch, a hand-edited transcript) is dropped with its results, since
  one such block makes the provider reject the whole request;
- no message is empty, and no text block is blank.

``limit_history_turns`` keeps the last N user turns (the per-chat history limit). A
turn starts at a ``user`` message that says something; a user message that only
carries tool results continues the turn it belongs to. The compaction summary,
when the view starts with it, stays first whatever the limit: it is the only
trace of what came before. ``build_history`` applies the limit to the repaired view
and repairs again, because a cut can leave results whose call was cut away.

``limit_history_messages`` keeps about the last N messages: the cut moves forward
to the next turn start, so a turn's user message is never split from what follows
(and a tool call never from its result); the newest turn is kept whole even when it
alone is longer than N.

Per-turn cost is one pass over the live window; each entry's ``Message`` is parsed
once, when the entry is (``Entry.message``), and untouched messages are reused as-is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from parley.core.fences import SUMMARY_TAGS, fenced, neutralise
from parley.core.messages import (
    FENCE_SUMMARY,
    Block,
    DerivedKey,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_MESSAGE, Entry

COMPACTION_SUMMARY_PREFIX = (
    "The conversation history before this point was compacted into the following summary:\n"
    "<summary>\n"
)
COMPACTION_SUMMARY_SUFFIX = "\n</summary>"
MISSING_TOOL_RESULT = "[tool result missing: the run was interrupted]"
TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_:.-]{1,64}")
DEFAULT_MAX_TURNS = 0  # no limit
DEFAULT_MAX_MESSAGES = 0  # no limit


@lru_cache(maxsize=64)
def summary_message(summary: str) -> Message:
    """The user message that stands for everything a compaction summarised.

    The preamble is fixed (never templated with dates or counts) so the message is
    byte-identical on every turn until the next compaction: it heads the cached prefix.
    The block is fenced (``is_summary_block`` reads the fence, not the preamble, which
    anyone can type), and the summary, a model's rewording of what people said, has its
    markers neutralised so it cannot close the wrapper early (core.fences).
    """
    text = neutralise(summary, SUMMARY_TAGS)
    block = fenced(f"{COMPACTION_SUMMARY_PREFIX}{text}{COMPACTION_SUMMARY_SUFFIX}", FENCE_SUMMARY)
    return Message("user", (block,))


def build_history(
    entries: Sequence[Entry],
    *,
    max_turns: int = DEFAULT_MAX_TURNS,
    max_messages: int = DEFAULT_MAX_MESSAGES,
) -> list[Message]:
    """The repaired model view of ``entries`` (normally ``Transcript.live_entries()``).

    Entries before the latest compaction's first kept entry are skipped, so passing
    every entry of a file gives the same view as passing the live window.
    ``max_turns`` > 0 keeps only the last that many user turns, ``max_messages`` > 0
    about the last that many messages (the summary stays first either way).
    """
    history = repair_history(view_messages(entries))
    if max_turns <= 0 and max_messages <= 0:
        return history
    limited = limit_history_turns(history, max_turns)
    return repair_history(limit_history_messages(limited, max_messages))


def limit_history_messages(messages: Sequence[Message], max_messages: int) -> list[Message]:
    """Keep the last ``max_messages`` messages (not counting a leading summary), the cut
    moved forward to a turn start; the newest turn stays whole whatever its length.

    ``max_messages`` <= 0 means no limit. The result may hold orphaned tool results
    only when the input did: run ``repair_history`` on it.
    """
    if max_messages <= 0 or not messages:
        return list(messages)
    summary = _leading_summary(messages[0])
    body = len(messages) - (1 if summary is not None else 0)
    if body <= max_messages:
        return list(messages)
    starts = [
        index
        for index, message in enumerate(messages)
        if _starts_turn(message, skip_first=summary is not None and index == 0)
    ]
    if not starts:
        return list(messages)
    earliest = len(messages) - max_messages
    cut = next((s for s in starts if s >= earliest), starts[-1])
    if cut == 0:
        return list(messages)
    kept = list(messages[cut:])
    if summary is not None:
        kept.insert(0, Message("user", (summary,)))
    return kept


def limit_history_turns(messages: Sequence[Message], max_turns: int) -> list[Message]:
    """Keep the messages from the ``max_turns``-th most recent user turn onward.

    ``max_turns`` <= 0 means no limit. A leading compaction summary is kept first;
    when the repair merged it with the first user message, only its summary block is
    kept. The result may hold orphaned tool results: run ``repair_history`` on it.
    """
    if max_turns <= 0 or not messages:
        return list(messages)
    summary = _leading_summary(messages[0])
    starts = [
        index
        for index, message in enumerate(messages)
        if _starts_turn(message, skip_first=summary is not None and index == 0)
    ]
    if len(starts) <= max_turns:
        return list(messages)
    cut = starts[-max_turns]
    kept = list(messages[cut:])
    if summary is not None and cut > 0:
        kept.insert(0, Message("user", (summary,)))
    return kept


def is_summary_block(block: Block) -> bool:
    """Whether ``block`` is the text of a compaction summary message (``summary_message``
    made it: known by its fence, not by the preamble)."""
    return isinstance(block, TextBlock) and block.fence == FENCE_SUMMARY


def _leading_summary(message: Message) -> TextBlock | None:
    if message.role != "user" or not message.content:
        return None
    first = message.content[0]
    return first if isinstance(first, TextBlock) and is_summary_block(first) else None


def is_turn_start(message: Message) -> bool:
    """A user message that says something: not one that only carries tool results."""
    return message.role == "user" and any(
        not isinstance(b, ToolResultBlock) for b in message.content
    )


def _starts_turn(message: Message, *, skip_first: bool) -> bool:
    """``is_turn_start``, not counting a leading summary block (``skip_first``)."""
    if skip_first:
        message = Message(message.role, message.content[1:])
    return is_turn_start(message)


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


# Whether a message goes through the repair as it is whatever surrounds it (``_plain``),
# kept on the message: the repair walks the whole window on every turn, and it stripped
# every text block of it again to find the blank ones (bench/load.py: the repair was
# ~7 % of the event loop's busy time in the late rounds, windows of ~270 entries).
_PLAIN: DerivedKey[bool] = DerivedKey("plain for the repair")


def _plain(message: Message) -> bool:
    """A user or assistant message of text (none of it blank) and images only: no call
    or result to place, nothing to drop, so the repair keeps it as it is."""
    plain = message.derived(_PLAIN)
    if plain is None:
        plain = (
            message.role != "tool_result"
            and bool(message.content)
            and all(
                isinstance(b, ImageBlock) or (isinstance(b, TextBlock) and not _blank(b))
                for b in message.content
            )
        )
        message.keep_derived(_PLAIN, plain)
    return plain


def repair_history(messages: Sequence[Message]) -> list[Message]:
    """Make a message sequence valid for the providers (see the module docstring)."""
    # Pass 1: the first result after each call answers it; anything else is dropped.
    called: set[str] = set()
    answers: dict[str, ToolResultBlock] = {}
    for message in messages:
        if _plain(message):
            continue  # no call, no result
        if message.role == "assistant":
            called.update(
                b.id for b in message.content if isinstance(b, ToolUseBlock) and _well_formed(b)
            )
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
        if _plain(message):
            _push(out, message)
            continue
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
            if not _well_formed(block):
                continue
            if block.id in emitted_calls:  # a repeated call id would be rejected by the API
                continue
            emitted_calls.add(block.id)
        kept.append(block)
    return kept


def _well_formed(call: ToolUseBlock) -> bool:
    return (
        isinstance(call.id, str)
        and bool(call.id.strip())
        and isinstance(call.name, str)
        and TOOL_NAME_PATTERN.fullmatch(call.name) is not None
        and isinstance(call.input, dict)
    )


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
