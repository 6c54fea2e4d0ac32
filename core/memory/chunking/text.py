"""What both chunkers share: the ``Chunk``, token counts, and cutting text to a budget.

Token counts are cl100k (``core.tokens``). ``split_text`` cuts a text into pieces of at
most ``max_tokens`` whose concatenation is the text: each cut is the longest that
fits, moved back to just after whitespace or CJK sentence punctuation when there is one
in the piece's second half, and never inside a character cluster (combining marks, ZWJ
emoji, flags).
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass

from parley.core.tokens import default_counter

MIN_CHUNK_TOKENS = 8  # a code point is at most 4 tokens, so every cut can make progress
CUT_MARKER = "…"  # ends a turn cut to fit max_tokens
# Where a long CJK line may be cut with the least damage: after sentence punctuation.
_CJK_BREAKS = frozenset("。！？；，、…」』）】\u3000")


def count_tokens(text: str) -> int:
    """cl100k tokens of ``text`` (the shared counter, so repeated texts are cached)."""
    return default_counter().text(text)


def split_lines(text: str) -> list[str]:
    """The lines that ``Chunk.start_line``/``end_line`` of a Markdown chunk number (1-based)."""
    return text.split("\n")


@dataclass(frozen=True, slots=True)
class Chunk:
    start_line: int  # 1-based, inclusive (for transcripts: JSONL file line numbers)
    end_line: int
    text: str
    hash: str  # sha256 hex of text
    entry_ids: tuple[str, ...] = ()  # transcripts: the entries this chunk came from
    ts: str | None = None  # transcripts: ISO-8601 UTC timestamp of the chunk's first turn
    speakers: tuple[str, ...] = ()  # transcripts: distinct speaker names in the chunk


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_limits(max_tokens: int, overlap: int) -> None:
    if max_tokens < MIN_CHUNK_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_CHUNK_TOKENS}")
    if overlap < 0:
        raise ValueError("the overlap must not be negative")


def _continues_cluster(text: str, i: int) -> bool:
    """Would a cut before ``text[i]`` split a user-perceived character? A practical
    subset of UAX #29: combining marks, variation selectors, ZWJ sequences, emoji
    modifiers, tag characters, halfwidth kana voicing marks, conjoining Hangul jamo and
    regional-indicator pairs."""
    if i <= 0 or i >= len(text):
        return False
    ch, prev = text[i], text[i - 1]
    code = ord(ch)
    if "\udc00" <= ch <= "\udfff" and "\ud800" <= prev <= "\udbff":
        return True  # a surrogate pair (only in text decoded with surrogatepass)
    if prev == "\u200d" or code == 0x200D:
        return True
    if unicodedata.category(ch) in ("Mn", "Mc", "Me"):
        return True
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF or 0xE0020 <= code <= 0xE007F:
        return True
    if 0x1F3FB <= code <= 0x1F3FF or code in (0xFF9E, 0xFF9F):
        return True
    if 0x1160 <= code <= 0x11FF or 0xD7B0 <= code <= 0xD7FF:
        return True  # a Hangul vowel or final jamo continues its syllable
    if 0x1100 <= code <= 0x115F and 0x1100 <= ord(prev) <= 0x115F:
        return True  # leading jamo run
    if _is_regional(ch) and _is_regional(prev):
        run = 0  # flags pair up from the start of a run of regional indicators
        j = i - 1
        while j >= 0 and _is_regional(text[j]):
            run += 1
            j -= 1
        return run % 2 == 1
    return False


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def fits(text: str, max_tokens: int) -> bool:
    return count_tokens(text) <= max_tokens


def _longest_fit(text: str, start: int, max_tokens: int, suffix: str = "") -> int:
    """The largest ``end`` such that ``text[start:end] + suffix`` fits ``max_tokens``
    (at least ``start + 1``). Doubling then bisection: O(piece · log piece) per piece."""
    n = len(text)
    lo = start + 1
    hi = min(n, start + max_tokens * 4)
    while hi < n and fits(text[start:hi] + suffix, max_tokens):
        lo = hi
        hi = min(n, start + (hi - start) * 2)
    if fits(text[start:hi] + suffix, max_tokens):
        return hi
    while hi - lo > 1:  # invariant: lo fits (or is the forced minimum), hi does not
        mid = (lo + hi) // 2
        if fits(text[start:mid] + suffix, max_tokens):
            lo = mid
        else:
            hi = mid
    return lo


def _nice_cut(text: str, start: int, end: int) -> int:
    """Move a cut back to just after whitespace or CJK punctuation in the piece's second
    half if there is one, else off any character cluster; never to ``start``."""
    if end >= len(text):
        return end
    for i in range(end - 1, start + (end - start) // 2 - 1, -1):
        boundary = text[i].isspace() or text[i] in _CJK_BREAKS
        if boundary and not _continues_cluster(text, i + 1):
            return i + 1
    cut = end
    while cut > start + 1 and _continues_cluster(text, cut):
        cut -= 1
    return cut


def _cut(text: str, start: int, max_tokens: int, suffix: str = "") -> int:
    """Where the piece starting at ``start`` ends: the longest fit, moved back to a nicer
    boundary when that still fits (BPE counts are not strictly monotone, so re-check)."""
    end = _longest_fit(text, start, max_tokens, suffix)
    nice = _nice_cut(text, start, end)
    if nice != end and not fits(text[start:nice] + suffix, max_tokens):
        return end
    return nice


def split_text(text: str, max_tokens: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_tokens`` whose concatenation is ``text``."""
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = _cut(text, start, max_tokens)
        pieces.append(text[start:end])
        start = end
    return pieces


def cut_with_marker(text: str, max_tokens: int) -> str:
    """The longest head of ``text`` that, with CUT_MARKER appended, fits ``max_tokens``."""
    head = text[: _cut(text, 0, max_tokens, CUT_MARKER)]
    trimmed = head.rstrip() or head
    return trimmed + CUT_MARKER if fits(trimmed + CUT_MARKER, max_tokens) else head + CUT_MARKER
