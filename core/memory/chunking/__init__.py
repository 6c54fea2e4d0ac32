"""Chunking for long-term memory: Markdown memory files and session transcripts.

``markdown``: ``chunk_markdown``, line-based like OpenClaw's ``chunkMarkdown``, so a
citation ``path#Lx-Ly`` is exact, aware of headings and code fences. ``transcripts``:
``transcript_turns`` then ``chunk_turns``, by turn, never by line, so a snippet shows
who said what, and when. ``text``: what both share, the ``Chunk``, token counts and
cutting a text to a token budget.

Token counts are cl100k (``core.tokens``); every chunk satisfies
``count_tokens(chunk.text) <= max_tokens``, checked on the final text, not estimated.
The names importers use are re-exported here.
"""

from parley.core.memory.chunking.markdown import (
    DEFAULT_CHUNK_OVERLAP_TOKENS,
    DEFAULT_CHUNK_TOKENS,
    chunk_markdown,
)
from parley.core.memory.chunking.text import (
    CUT_MARKER,
    Chunk,
    count_tokens,
    split_lines,
    split_text,
)
from parley.core.memory.chunking.transcripts import (
    DEFAULT_TURN_CHUNK_TOKENS,
    DEFAULT_TURN_OVERLAP,
    IMAGE_NOTE,
    MAX_SPEAKER_CHARS,
    Turn,
    chunk_turns,
    format_turn_line,
    header_agent_name,
    transcript_turns,
)

__all__ = [
    "CUT_MARKER",
    "DEFAULT_CHUNK_OVERLAP_TOKENS",
    "DEFAULT_CHUNK_TOKENS",
    "DEFAULT_TURN_CHUNK_TOKENS",
    "DEFAULT_TURN_OVERLAP",
    "IMAGE_NOTE",
    "MAX_SPEAKER_CHARS",
    "Chunk",
    "Turn",
    "chunk_markdown",
    "chunk_turns",
    "count_tokens",
    "format_turn_line",
    "header_agent_name",
    "split_lines",
    "split_text",
    "transcript_turns",
]
