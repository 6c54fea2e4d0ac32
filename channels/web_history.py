"""The web chat's recent conversation per client, so a tab that opens or reloads shows it.

Kept in memory, in the order the client saw it: the person's messages as they are handed
to the gateway (taken back when it does not take them), and replies once a tab got them
(replies still waiting in the backlog join when it is flushed). Only the client's own
sockets are ever sent its log. Bounded per
client (entries and characters) and in all (characters; the least recently active
client's log goes first). A restart empties it; the browser keeps its own copy too.

Nothing erases one client's log while the gateway runs, and nothing needs to: ``parley
people erase`` runs in another process and refuses while a gateway holds the home, so
the log it would have to reach is gone with the stopped gateway's memory (it is never
written to disk). What the browser keeps (localStorage) is that browser's to clear.

Entries are stored as the JSON text of the ``history`` frame's items, so a hello costs
a join, not a render of every reply again.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from typing import Any

ENTRIES_PER_CLIENT = 200
CHARS_PER_CLIENT = 400_000
CHARS_IN_ALL = 40_000_000


class _Log:
    __slots__ = ("chars", "entries", "keys")

    def __init__(self) -> None:
        self.entries: deque[tuple[str, str]] = deque()  # (role:id, JSON text)
        self.keys: set[str] = set()
        self.chars = 0


class ChatLog:
    def __init__(
        self,
        *,
        entries_per_client: int = ENTRIES_PER_CLIENT,
        chars_per_client: int = CHARS_PER_CLIENT,
        chars_in_all: int = CHARS_IN_ALL,
    ) -> None:
        self._per_client = entries_per_client
        self._chars_per_client = chars_per_client
        self._chars_in_all = chars_in_all
        self._logs: OrderedDict[str, _Log] = OrderedDict()  # least recently active first
        self._chars = 0

    def add(self, client_id: str, entry: dict[str, Any]) -> bool:
        """Log ``entry`` (with its "role" and "id") for ``client_id``; an entry already
        there (a message sent again after a reconnect) is not logged twice. True when
        it was logged now."""
        key = f"{entry['role']}:{entry['id']}"
        text = json.dumps(entry, ensure_ascii=False)
        if len(text) > self._chars_per_client:
            return False  # one entry over the whole budget: the browser's copy has it
        log = self._logs.get(client_id)
        if log is None:
            log = self._logs[client_id] = _Log()
        else:
            self._logs.move_to_end(client_id)
        if key in log.keys:
            return False
        log.keys.add(key)
        log.entries.append((key, text))
        log.chars += len(text)
        self._chars += len(text)
        while len(log.entries) > self._per_client or log.chars > self._chars_per_client:
            self._drop_oldest(log)
        while self._chars > self._chars_in_all and self._logs:
            oldest_id, oldest = next(iter(self._logs.items()))
            self._drop_oldest(oldest)
            if not oldest.entries:
                del self._logs[oldest_id]
        return key in log.keys

    def discard(self, client_id: str, role: str, entry_id: str) -> None:
        """Take back the entry ``add`` logged (a message the gateway did not take)."""
        log = self._logs.get(client_id)
        key = f"{role}:{entry_id}"
        if log is None or key not in log.keys:
            return
        for n, (logged, text) in enumerate(log.entries):
            if logged == key:
                del log.entries[n]
                log.keys.discard(key)
                log.chars -= len(text)
                self._chars -= len(text)
                break

    def frame(self, client_id: str) -> str | None:
        """The ``history`` frame for ``client_id``; None when its log is empty."""
        log = self._logs.get(client_id)
        if log is None or not log.entries:
            return None
        return '{"type": "history", "messages": [' + ", ".join(t for _, t in log.entries) + "]}"

    def _drop_oldest(self, log: _Log) -> None:
        key, text = log.entries.popleft()
        log.keys.discard(key)
        log.chars -= len(text)
        self._chars -= len(text)
