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
from parley.core.transcript_store import SessionTranscript


class StoredCounts:
    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        # Per open transcript: its first live entry's id, and how many live entries
        # have been looked at.
        self._seen: weakref.WeakKeyDictionary[SessionTranscript, tuple[int, int]] = (
            weakref.WeakKeyDictionary()
        )

    def take_new(self, transcript: SessionTranscript) -> None:
        """The stored counts of the live entries not looked at before. The same window
        (its first entry the same object) is looked at again from where the last look
        ended; a miss (a window read again or compacted, an id reused) only looks at
        more entries than it needed to, and a count not taken is worked out when needed."""
        live = transcript.live_entries()
        first = id(live[0]) if live else 0
        seen = self._seen.get(transcript)
        start = seen[1] if seen is not None and seen[0] == first and seen[1] <= len(live) else 0
        self.counter.know_stored(live[index] for index in range(start, len(live)))
        self._seen[transcript] = (first, len(live))
