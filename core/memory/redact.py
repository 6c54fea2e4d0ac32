"""Secret redaction for text that is indexed into long-term memory.

Transcripts are indexed so the agent can search what was said; a key pasted into a chat
must not come back as a search snippet (or sit in ``memory.db`` in clear). So every known
credential shape is replaced by ``REDACTED``; an assignment keeps its key
(``password=[redacted]``) and a credentialed URL keeps its user and host, because those
are what a later question is about ("which database did we connect to?"). Secrets with
no shape of their own (an AWS secret access key, a password) are caught by their key.

Cost: every pattern runs in linear time on hostile input. Python's ``re`` backtracks, so
each pattern (a) starts with a lookbehind that allows a match only at the start of a run
of token characters, so a run is entered once, not once per character, and (b) uses
possessive quantifiers (``++``, ``{m,}+``) or bounded repeats so that a failed attempt
gives nothing back. A PEM block is found with two searches (BEGIN, then END from there)
rather than one lazy ``.*?``, which would rescan to the end of the text for every
unmatched ``BEGIN`` line; a missing END ends the scan.

Redaction is idempotent (``redact_secrets(redact_secrets(t)) == redact_secrets(t)``):
the marker's brackets are not token characters, so no pattern matches it again.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["REDACTED", "redact_secrets"]

REDACTED = "[redacted]"

# A match may start only where no token character precedes it (see the module docstring).
_START = r"(?<![A-Za-z0-9_-])"
_END = r"(?![A-Za-z0-9_-])"

# Whole-token credentials: the match is replaced entirely.
_TOKEN_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        # Anthropic (sk-ant-…), OpenAI (sk-…, sk-proj-…) and look-alikes.
        _START + r"sk-[A-Za-z0-9_-]{20,}+",
        # GitHub classic and fine-grained tokens.
        _START + r"gh[pousr]_[A-Za-z0-9]{30,}+" + _END,
        _START + r"github_pat_[A-Za-z0-9_]{22,}+",
        # Slack bot/user/app/refresh tokens.
        _START + r"xox[abpres]-[A-Za-z0-9-]{10,}+",
        # AWS access key ids (long-term AKIA, temporary ASIA).
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])",
        # Google API keys.
        _START + r"AIza[A-Za-z0-9_-]{30,}+",
        # Telegram bot tokens: <bot id>:<35 characters> (30 or more accepted).
        r"(?<![A-Za-z0-9_:-])[0-9]{8,10}+:[A-Za-z0-9_-]{30,}+",
        # JWTs: base64url JSON header ("eyJ" is '{"'), payload, signature.
        _START + r"eyJ[A-Za-z0-9_-]{7,}+\.[A-Za-z0-9_-]{7,}+\.[A-Za-z0-9_-]*+",
        # Discord bot tokens: base64 of the bot's numeric id (so it starts with M, N or O),
        # a timestamp part and an HMAC part.
        _START + r"[MNO][A-Za-z0-9_-]{22,28}+\.[A-Za-z0-9_-]{6,7}+\.[A-Za-z0-9_-]{27,}+",
    )
)

# `Bearer <token>`; the token must look like one (_looks_like_bearer_token).
_BEARER = re.compile(r"(?i:\b(bearer)([ \t]++))([A-Za-z0-9._~+/=-]{8,}+)")

# key=value / key: value / "key": "value", where the key *ends* with a secret word
# (GITHUB_TOKEN, db_password, apiKey, aws_secret_access_key), so max_tokens=400 or
# token_count: 5 are kept. The key prefix is lazy and bounded, so each run start costs
# a constant number of steps.
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.-])"
    r"(?P<key>(?i:[A-Za-z0-9_.-]{0,48}?"
    r"(?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|"
    r"secret[_-]?key|private[_-]?key))(?![A-Za-z0-9_.-])[\"']?)"
    r"(?P<sep>[ \t]*+(?P<op>[=:])[ \t]*+)"
    r"(?:(?P<quote>[\"'])(?P<quoted>[^\"'\n]*+)(?P=quote)|(?P<bare>[^\s\"'&,;<>()\[\]{}]++))"
)

# scheme://user:password@host: the password goes, user and host stay.
_URL_CREDENTIALS = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<head>[A-Za-z][A-Za-z0-9+.-]{0,31}+://[^\s/@:]{0,256}+:)"
    r"(?P<password>[^\s/@]++)@"
)

_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]{1,16} ){0,4}PRIVATE KEY-----")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]{1,16} ){0,4}PRIVATE KEY-----")

# Values after "key:" that are plain words ("Secret: we're planning",
# "Token: nice!") stay: a credential has a digit or a symbol inside, or is long.
_SECRET_MIN_LETTERS_ONLY = 16
_PROSE_TRAILERS = ".,!?:;)"


def _looks_secret(value: str) -> bool:
    """A value that reads like a credential rather than a word of prose."""
    word = value.rstrip(_PROSE_TRAILERS)
    return bool(word) and (len(word) >= _SECRET_MIN_LETTERS_ONLY or not word.isalpha())


def _assignment(match: re.Match[str]) -> str:
    key, sep = match["key"], match["sep"]
    quote = match["quote"]
    if quote is not None:
        if not match["quoted"]:
            return match[0]
        return f"{key}{sep}{quote}{REDACTED}{quote}"
    value = match["bare"]
    # With "=" the value is an assignment's; with ":" it may be prose ("Token: nice").
    if match["op"] == ":" and not _looks_secret(value):
        return match[0]
    return f"{key}{sep}{REDACTED}"


_BEARER_MIN_CHARS = 16


def _looks_like_bearer_token(token: str) -> bool:
    """Stricter than _looks_secret, since "bearer" is a prose word too ("bearer bonds",
    "the bearer ORD-2024-1187"): real tokens are long and random, so at least 16
    characters with a digit among them, or 32 characters of anything."""
    if len(token) >= 2 * _BEARER_MIN_CHARS:
        return True
    return len(token) >= _BEARER_MIN_CHARS and any(c.isdigit() for c in token)


def _bearer(match: re.Match[str]) -> str:
    if not _looks_like_bearer_token(match[3]):
        return match[0]
    return f"{match[1]}{match[2]}{REDACTED}"


def _redact_pem(text: str) -> str:
    """Replace each private key block's body, keeping its BEGIN/END lines and the
    whitespace around the body. A block without its END line (a truncated paste) is
    redacted to the end of the text."""
    out: list[str] = []
    pos = 0
    while (begin := _PEM_BEGIN.search(text, pos)) is not None:
        end = _PEM_END.search(text, begin.end())
        stop = len(text) if end is None else end.start()
        body = text[begin.end() : stop]
        if body.strip():
            lead = body[: len(body) - len(body.lstrip())]
            trail = body[len(body.rstrip()) :]
            body = f"{lead}{REDACTED}{trail}"
        out.append(text[pos : begin.end()])
        out.append(body)
        pos = stop
    out.append(text[pos:])
    return "".join(out)


_SUBSTITUTIONS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_URL_CREDENTIALS, rf"\g<head>{REDACTED}@"),
    *((pattern, REDACTED) for pattern in _TOKEN_PATTERNS),
    (_BEARER, _bearer),
    (_ASSIGNMENT, _assignment),
)


def redact_secrets(text: str) -> str:
    """``text`` with API keys, tokens, passwords and private keys replaced by REDACTED."""
    if not text:
        return text
    text = _redact_pem(text)
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    return text
