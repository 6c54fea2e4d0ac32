"""What the terminal prints of a reply that streams: drafts as they grow, then the reply,
never twice.

A terminal cannot take text back once printed, so ``ReplyScreen`` prints only what a
draft adds to what is on screen, and the reply only where it goes on from there. Two
ways to show the line still being written:

- ``hold_partial=False`` (plain output: a pipe, a file, a terminal without line editing):
  everything is printed as it comes, half lines included.
- ``hold_partial=True`` (line editing: the prompt sits below the output): only whole lines
  are printed; the line being written is ``live`` and the prompt shows it above itself
  until it is complete.

A draft that is reset leaves what was printed (a terminal is a log): a retry says so, a
later model call starts a new block under it. Pure logic, no I/O: the channel writes
what the methods return.
"""

from __future__ import annotations

from collections import OrderedDict

from parley.channels.base import ReplyDraft

REPLY_PREFIX = "parley> "
INDENT = " " * len(REPLY_PREFIX)
RETRY_NOTE = "(interrupted; the reply starts over)"
# Replies already out, remembered so a draft that arrives late is not shown again.
_FINISHED_KEYS = 256


class ReplyScreen:
    def __init__(self, *, hold_partial: bool) -> None:
        self.hold_partial = hold_partial
        self._key: str | None = None  # the reply being drafted
        self._printed = ""  # the draft's text (leading blanks dropped) already on screen
        self._live = ""  # hold_partial: the part of the line being written not yet printed
        self._started = False  # the reply's first line (with its prefix) is on screen
        self._at_line_start = True  # the cursor is at the start of a line of the reply
        self._finished: OrderedDict[str, None] = OrderedDict()

    @property
    def live(self) -> str:
        """The line being written, as the prompt should show it above itself ("" for none)."""
        if not self._live:
            return ""
        return (INDENT if self._started else REPLY_PREFIX) + self._live

    @property
    def drafting(self) -> bool:
        return self._key is not None

    def draft(self, draft: ReplyDraft) -> str:
        """The text to print for ``draft``."""
        if draft.key in self._finished:
            return ""  # its reply is out already
        out = []
        if draft.key != self._key:
            out.append(self._close(keep_live=True))  # a draft nobody finished: leave it
            self._key = draft.key
        if draft.reset is not None:
            printed = bool(self._printed)
            # Text before a tool call stays as a line of its own; void text is not
            # printed (in plain output it is already: a note says it starts over).
            out.append(self._close(keep_live=draft.reset == "next_call"))
            if draft.reset == "retry" and printed:
                out.append(f"{INDENT}{RETRY_NOTE}\n")
            if draft.reset == "withdrawn":
                return "".join(out)
            self._key = draft.key
        text = draft.text.lstrip()
        if not text.startswith(self._printed):
            # Not a continuation (deltas only ever add): start a fresh block below.
            out.append(self._close(keep_live=False))
            self._key = draft.key
        if self.hold_partial:
            whole = text[: text.rfind("\n") + 1]
            out.append(self._emit(whole[len(self._printed) :]))
            self._printed, self._live = whole, text[len(whole) :]
        else:
            out.append(self._emit(text[len(self._printed) :]))
            self._printed = text
        return "".join(out)

    def reply(self, text: str, key: str | None) -> str:
        """The text to print for the reply ``text``: its remainder when it goes on from
        its draft, the whole of it otherwise."""
        if key is not None and key == self._key:
            rest = _remainder(self._printed, text)
            if rest is not None:
                out = self._emit(rest) + self._line_break()
            else:  # not what was drafted (an error after a partial stream): in full
                out = self._line_break() + block(text)
            self._reset_state()
            self._remember(key)
            return out
        # Another reply (a command answered at once) while a draft may be on screen:
        # it goes below what is printed; the draft then goes on under it, prefixed again.
        out = self._line_break() + block(text)
        self._started = False
        if key is not None:
            self._remember(key)
        return out

    def _line_break(self) -> str:
        if self._at_line_start:
            return ""
        self._at_line_start = True
        return "\n"

    def _close(self, *, keep_live: bool) -> str:
        """End what is on screen of the current draft and forget it: its line being
        written is printed whole (``keep_live``) or dropped."""
        out = self._emit(self._live + "\n") if keep_live and self._live else self._line_break()
        self._reset_state()
        return out

    def _reset_state(self) -> None:
        self._key = None
        self._printed = self._live = ""
        self._started, self._at_line_start = False, True

    def _emit(self, chunk: str) -> str:
        """``chunk`` of the draft as it goes on screen: the prefix before the reply's
        first line, an indent before each line after it (blank lines stay empty)."""
        out: list[str] = []
        for i, piece in enumerate(chunk.split("\n")):
            if i > 0:
                out.append("\n")
                self._at_line_start = True
            if not piece:
                continue
            if not self._started:
                out.append(REPLY_PREFIX)
                self._started = True
            elif self._at_line_start:
                out.append(INDENT)
            out.append(piece)
            self._at_line_start = False
        return "".join(out)

    def _remember(self, key: str) -> None:
        self._finished[key] = None
        while len(self._finished) > _FINISHED_KEYS:
            self._finished.popitem(last=False)


def block(text: str) -> str:
    """A whole reply as printed: the prefix, continuation lines indented, a newline."""
    lines = text.split("\n")
    rest = [f"{INDENT}{line}" if line else "" for line in lines[1:]]
    return "\n".join([REPLY_PREFIX + lines[0], *rest]) + "\n"


def _remainder(printed: str, text: str) -> str | None:
    """What of ``text`` is not on screen yet, when the screen shows its start (``printed``);
    None when it does not. The reply is stripped and its draft may not be: whitespace the
    draft printed past the reply's words is taken as printed."""
    if text.startswith(printed):
        return text[len(printed) :]
    words = printed.rstrip()
    if not text.startswith(words):
        return None
    tail, rest = printed[len(words) :], text[len(words) :]
    same = 0
    while same < min(len(tail), len(rest)) and tail[same] == rest[same]:
        same += 1
    return rest[same:]
