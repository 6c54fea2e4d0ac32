"""Exact identifiers in free text: URLs, ids, hashes, paths, addresses, ticket numbers.

Found by plain code, never by a model, so a finder cannot fail or hallucinate. Shared by
the compaction ledger (``core.context.compaction.ledger``), which keeps every identifier
a summary must carry word for word, and by the importance rules (``core.importance``),
which score a message that names one as worth keeping.

Kinds: URLs, emails, UUIDs, hex runs of 8+ characters with a digit (compared
case-insensitively), absolute POSIX paths with at least two segments and ``~/`` paths,
Windows paths, host:port (localhost, an IPv4 address or a dotted host name), IPv4
addresses, numbers of 6+ digits, and ticket-like ids (``ABC-1234``, ``ORD_88123``).
When matches overlap, the one that starts first (then the longest) wins, so a URL is
kept whole rather than as its host and path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_TRAILING_PUNCT = ".,;:!?'\"`"
_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}

_URL = re.compile(r"\b(?:https?|ftp|wss?|file)://[^\s<>\"'`]+", re.IGNORECASE)
_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
)
_UUID = re.compile(
    r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"(?![0-9A-Za-z])"
)
_HEX = re.compile(r"(?<![0-9A-Za-z_])[0-9a-fA-F]{8,}(?![0-9A-Za-z_])")
_WINDOWS_PATH = re.compile(r"(?<![\w])(?:[A-Za-z]:\\|\\\\[\w.-]+\\)[^\s<>\"'|?*]+")
_POSIX_PATH = re.compile(
    r"(?<![\w.~/:\\-])(?:~/[\w.+@%-]+(?:/[\w.+@%-]+)*/?|/[\w.+@%-]+(?:/[\w.+@%-]+)+/?|/[\w.+@%-]+/)"
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4_TEXT = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_HOST_PORT = re.compile(
    rf"(?<![\w.-])(?:localhost|{_IPV4_TEXT}|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z][A-Za-z0-9-]*)"
    r":(\d{2,5})(?!\w|\.\w)",
    re.IGNORECASE,
)
_IPV4 = re.compile(rf"(?<![\w.]){_IPV4_TEXT}(?![\w]|\.\d)")
_LONG_NUMBER = re.compile(r"(?<![\w.])\d{6,}(?![\w]|\.\d)")
_TICKET = re.compile(r"(?<![\w-])[A-Z][A-Z0-9]*(?:[-_][A-Z][A-Z0-9]*)*[-_]\d{2,}(?![\w-])")

_PATTERNS: tuple[re.Pattern[str], ...] = (
    _URL,
    _EMAIL,
    _UUID,
    _WINDOWS_PATH,
    _POSIX_PATH,
    _HOST_PORT,
    _IPV4,
    _TICKET,
    _HEX,
    _LONG_NUMBER,
)
_HEXLIKE = re.compile(r"[0-9a-fA-F-]+")


def _strip_trailing(token: str) -> str:
    """Drop sentence punctuation and unbalanced closing brackets glued to a match."""
    while token:
        last = token[-1]
        unbalanced = last in _CLOSERS and token.count(_CLOSERS[last]) < token.count(last)
        if last not in _TRAILING_PUNCT and not unbalanced:
            break
        token = token[:-1]
    return token


def _accept(pattern: re.Pattern[str], match: re.Match[str]) -> str | None:
    token = match.group(0)
    if pattern is _HEX and not any(c.isdigit() for c in token):
        return None
    if pattern is _HOST_PORT and int(match.group(1)) > 65_535:
        return None
    if pattern in (_URL, _WINDOWS_PATH, _POSIX_PATH, _EMAIL):
        token = _strip_trailing(token)
        if pattern is _POSIX_PATH and token.count("/") < 2 and not token.startswith("~/"):
            return None
    return token or None


def identifier_key(identifier: str) -> str:
    """The dedupe key: hex ids and UUIDs compare case-insensitively, the rest exactly."""
    return identifier.lower() if _is_hexlike(identifier) else identifier


def _is_hexlike(identifier: str) -> bool:
    return bool(_HEXLIKE.fullmatch(identifier)) and any(c.isdigit() for c in identifier)


def find_identifiers(text: str) -> list[str]:
    """Identifiers in ``text`` in order of appearance (overlaps resolved, not deduplicated)."""
    spans: list[tuple[int, int, str]] = []
    for pattern in _PATTERNS:
        for match in pattern.finditer(text):
            token = _accept(pattern, match)
            if token is not None:
                spans.append((match.start(), -len(token), token))
    spans.sort()
    found: list[str] = []
    covered_until = -1
    for start, neg_len, token in spans:
        if start < covered_until:
            continue
        found.append(token)
        covered_until = start - neg_len
    return found


def absent_identifiers(identifiers: Iterable[str], text: str) -> list[str]:
    """The identifiers not written verbatim in ``text`` (hex/UUID case-insensitively)."""
    lowered = text.lower()
    missing: list[str] = []
    for ident in identifiers:
        present = ident.lower() in lowered if _is_hexlike(ident) else ident in text
        if not present:
            missing.append(ident)
    return missing
