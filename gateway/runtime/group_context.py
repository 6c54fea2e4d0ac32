"""The group context buffer: messages in a group not addressed to the agent.

Where a group's activation is ``mention`` (``ChatPolicy.group_context_messages`` > 0),
a message that does not address the agent is not a turn: it is kept here, in memory,
per conversation (the session key the group's messages route to, so a forum topic
keeps its own), at most that many per conversation, newest kept. When someone
addresses the agent there, ``Inbound`` takes what is kept into that message
(``InboundMessage.group_context``, recorded with it in the inbox) and the buffer
forgets it; the turn shows it to the model as one fenced block
(``core.group_context``), and the newest of the files sent with those lines
(``[media] earlier_files``) as pictures, documents or voice notes.

Privacy: a conversation's lines are only ever handed to a message of the same
conversation (the same key: the same group, the same audience), never to another
group or a direct chat, and never written to a transcript or memory on their own.
What was said stays in the process: a restart forgets the lines not yet taken, and
the memory is bounded (per line, per conversation, and across conversations, the
least recently active conversation forgotten first).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque

from parley.channels.base import EarlierMessage, InboundMessage

log = logging.getLogger("parley.gateway.group_context")

MAX_LINE_CHARS = 2_000  # a longer message is kept cut, with an ellipsis
MAX_TOTAL_CHARS = 8_000_000  # across every conversation: ~16–32 MB of str at most
ELLIPSIS = "…"


class GroupContextBuffer:
    """Per-conversation buffers of ``EarlierMessage`` lines, bounded (module docstring).
    Used from the event loop only."""

    def __init__(
        self, *, max_line_chars: int = MAX_LINE_CHARS, max_total_chars: int = MAX_TOTAL_CHARS
    ) -> None:
        self._max_line = max_line_chars
        self._max_total = max_total_chars
        self._total = 0
        # Least recently added-to first: the first forgotten when the total is over.
        self._chats: OrderedDict[str, deque[EarlierMessage]] = OrderedDict()

    def __len__(self) -> int:
        """How many conversations have lines kept."""
        return len(self._chats)

    @property
    def total_chars(self) -> int:
        return self._total

    def keep(self, key: str, message: InboundMessage, limit: int) -> None:
        """Keep ``message`` (not addressed to the agent) in conversation ``key``'s
        buffer of at most ``limit`` lines; the oldest goes when it is full."""
        if limit <= 0:
            return
        text = message.text
        if len(text) > self._max_line:
            text = text[: self._max_line - len(ELLIPSIS)] + ELLIPSIS
        if not text.strip() and not message.attachments:
            return  # a sticker: nothing to read
        # Its files are kept described (the platform's references, a few hundred bytes):
        # the turn that addresses the agent may fetch the newest (``MediaIntake``).
        line = EarlierMessage(
            message.sender_id,
            message.sender_name,
            text,
            message.timestamp.isoformat(),
            message.attachments,
        )
        lines = self._chats.get(key)
        if lines is None:
            lines = self._chats[key] = deque()
        else:
            self._chats.move_to_end(key)
        lines.append(line)
        self._total += _size(line)
        while len(lines) > limit:
            self._total -= _size(lines.popleft())
        while self._total > self._max_total and self._chats:
            self._forget_oldest()

    def peek(self, key: str) -> tuple[EarlierMessage, ...]:
        """Conversation ``key``'s lines, oldest first (still kept: see ``drop``)."""
        lines = self._chats.get(key)
        return tuple(lines) if lines else ()

    def drop(self, key: str, taken: tuple[EarlierMessage, ...]) -> None:
        """Forget the lines ``peek`` gave, once their message is recorded. Lines kept
        since (while the record was written) stay for the next message."""
        lines = self._chats.get(key)
        if not lines or not taken:
            return
        # From the front: a full buffer may have let the oldest of them go meanwhile.
        gone = set(taken)
        while lines and lines[0] in gone:
            self._total -= _size(lines.popleft())
        if not lines:
            del self._chats[key]

    def _forget_oldest(self) -> None:
        key, lines = self._chats.popitem(last=False)
        self._total -= sum(_size(line) for line in lines)
        log.info("group context of %s forgotten: over %d characters", key, self._max_total)


def _size(line: EarlierMessage) -> int:
    files = sum(len(a.ref) + len(a.name) + len(a.mime_type) for a in line.attachments)
    return len(line.text) + len(line.sender_name) + len(line.sender_id) + files
