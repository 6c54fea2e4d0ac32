"""Token counts stored in transcript entries, taken once per entry.

A message's count is stored in its entry when it is appended (``TokenCounter.stamp``).
A window read again from its file has new ``Message`` objects, which the counter has
not counted: ``TokenCounter.know_stored`` takes their counts from the entries instead
of encoding every message again. Done before each provider call, that walked the whole
live window on every turn; ``StoredCounts`` looks at each transcript's entries once.
"""

from __future__ import annotations

import weakref

from parley.core.tokens import TokenCounter
from parley.core.transcript import Entry
from parley.core.transcript_store import SessionTranscript


class StoredCounts:
    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        # Per open transcript: its first live entry (weakly), and how many live entries
        # have been looked at.
        self._seen: weakref.WeakKeyDictionary[SessionTranscript, tuple[weakref.ref[Entry], int]] = (
            weakref.WeakKeyDictionary()
        )

    def take_new(self, transcript: SessionTranscript) -> None:
        """The stored counts of the live entries not looked at before. The same window
        (its first entry the same object) is looked at again from where the last look
        ended; another window (read again, or compacted) from its start."""
        live = transcript.live_entries()
        if not live:
            return
        seen = self._seen.get(transcript)
        start = 0
        if seen is not None and seen[0]() is live[0] and seen[1] <= len(live):
            start = seen[1]
        self.counter.know_stored(live[index] for index in range(start, len(live)))
        self._seen[transcript] = (weakref.ref(live[0]), len(live))
