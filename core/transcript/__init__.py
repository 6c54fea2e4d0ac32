"""Append-only JSONL transcripts: the source of truth for a session.

A transcript is a header line and then one entry per line (``message``, ``compaction``
or ``custom``), only ever appended to. ``entries`` is the line format (``Entry``,
``TranscriptHeader``, their JSON), ``base`` what every backend shares (new entries, the
live window in memory, the append API: ``LiveWindow``, ``TranscriptBase``), and
``file`` the transcript file itself (``Transcript``: durable appends, opening by
reading backwards only as far as the live window).

The names the runtime and the gateway use are re-exported here, so importers say
``from core.transcript import Transcript, Entry``.
"""

from parley.core.transcript.base import (
    LiveWindow,
    LoadReport,
    TranscriptBase,
    new_header,
)
from parley.core.transcript.entries import (
    ENTRY_COMPACTION,
    ENTRY_CUSTOM,
    ENTRY_MESSAGE,
    TRANSCRIPT_VERSION,
    Entry,
    TranscriptHeader,
    encode_header,
    parse_entry_or_none,
)
from parley.core.transcript.file import FILE_MODE, Transcript

__all__ = [
    "ENTRY_COMPACTION",
    "ENTRY_CUSTOM",
    "ENTRY_MESSAGE",
    "FILE_MODE",
    "TRANSCRIPT_VERSION",
    "Entry",
    "LiveWindow",
    "LoadReport",
    "Transcript",
    "TranscriptBase",
    "TranscriptHeader",
    "encode_header",
    "new_header",
    "parse_entry_or_none",
]
