"""The transcript's line format: the header line, entry lines, and their JSON.

A transcript is a header line ``{"type":"session","version":1,"id","key","created",
"meta"}`` and then one entry per line ``{"id","parent_id","ts","type", ...payload}``,
where ``type`` is ``message``, ``compaction`` or ``custom``. An unknown type is kept
(written by a newer version) and ignored by the model's view. Every backend stores
exactly these bytes, so a file and a database row hold the same line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from parley.core.errors import TranscriptError
from parley.core.fences import read_user_message
from parley.core.messages import Message, Usage

TRANSCRIPT_VERSION = 1
ENTRY_MESSAGE = "message"
ENTRY_COMPACTION = "compaction"
ENTRY_CUSTOM = "custom"

_ENVELOPE = ("id", "parent_id", "ts", "type")


def iso_timestamp(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_header(header: TranscriptHeader) -> bytes:
    """The header's line as it is stored (no newline)."""
    return encode_record(header.to_dict())


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One JSON line (no newline); raises TranscriptError for anything JSON cannot hold."""
    try:
        text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (seen in platform text) is not UTF-8; \u escapes keep it.
            return json.dumps(record, separators=(",", ":"), allow_nan=False).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        raise TranscriptError(f"transcript entry cannot be serialised: {exc}") from exc


@dataclass(frozen=True)
class Entry:
    """One transcript line. ``payload`` holds every field but the envelope; treat it as
    read-only. A message entry's ``Message`` is parsed once, at construction, and read
    through ``core.fences.read_user_message``: a user's words neutralised, the gateway's
    blocks known by their fence (a legacy line's by the legacy rule)."""

    id: str
    parent_id: str | None
    ts: str
    type: str
    payload: dict[str, Any] = field(hash=False)
    _message: Message | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.type == ENTRY_MESSAGE:
            raw = self.payload.get("message")
            if not isinstance(raw, dict):
                raise TranscriptError("message entry without a message object")
            try:
                message = read_user_message(Message.from_dict(raw))
            except (KeyError, TypeError, ValueError) as exc:
                raise TranscriptError(f"unreadable message in entry {self.id}: {exc}") from exc
            object.__setattr__(self, "_message", message)
        elif self.type == ENTRY_COMPACTION:
            if not isinstance(self.payload.get("summary"), str):
                raise TranscriptError("compaction entry without a summary")
            kept = self.payload.get("first_kept_entry_id")
            if kept is not None and not isinstance(kept, str):
                raise TranscriptError("compaction entry with a bad first_kept_entry_id")

    @property
    def message(self) -> Message:
        if self._message is None:
            raise TranscriptError(f"entry {self.id} is a {self.type} entry, not a message")
        return self._message

    @property
    def usage(self) -> Usage | None:
        raw = self.payload.get("usage")
        return Usage.from_dict(raw) if isinstance(raw, dict) else None

    @property
    def meta(self) -> dict[str, Any]:
        raw = self.payload.get("meta")
        return raw if isinstance(raw, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent_id": self.parent_id,
            "ts": self.ts,
            "type": self.type,
            **self.payload,
        }

    def to_json(self) -> str:
        return encode_record(self.to_dict()).decode("utf-8")

    @classmethod
    def from_json(cls, line: bytes | str) -> Entry:
        """Parse one line; raises TranscriptError when it is not a well-formed entry."""
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise TranscriptError(f"not JSON: {exc}") from exc
        return cls.from_raw(raw)

    @classmethod
    def from_raw(cls, raw: object) -> Entry:
        """An entry from its line's parsed JSON; raises TranscriptError when it is not
        a well-formed entry."""
        if not isinstance(raw, dict):
            raise TranscriptError("entry is not a JSON object")
        entry_id, parent, ts, kind = (raw.pop(k, None) for k in _ENVELOPE)
        if not isinstance(entry_id, str) or not entry_id:
            raise TranscriptError("entry without an id")
        if parent is not None and not isinstance(parent, str):
            raise TranscriptError("entry with a bad parent_id")
        if not isinstance(ts, str) or not isinstance(kind, str) or kind == "session":
            raise TranscriptError("entry without a timestamp or type")
        return cls(entry_id, parent, ts, kind, raw)


@dataclass(frozen=True, slots=True)
class TranscriptHeader:
    id: str
    key: str
    created: str
    version: int = TRANSCRIPT_VERSION
    meta: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "session",
            "version": self.version,
            "id": self.id,
            "key": self.key,
            "created": self.created,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, line: bytes) -> TranscriptHeader:
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise TranscriptError(f"transcript header is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("type") != "session":
            raise TranscriptError("first line is not a transcript header")
        version = raw.get("version")
        if version != TRANSCRIPT_VERSION:
            raise TranscriptError(f"unsupported transcript version: {version!r}")
        sid, key, created = raw.get("id"), raw.get("key"), raw.get("created")
        if not (isinstance(sid, str) and isinstance(key, str) and isinstance(created, str)):
            raise TranscriptError("transcript header lacks id, key or created")
        meta = raw.get("meta")
        return cls(sid, key, created, version, meta if isinstance(meta, dict) else {})


def parse_entry_or_none(line: bytes | str) -> Entry | None:
    """The entry on ``line``, or None for a corrupt line (which still takes its slot)."""
    try:
        return Entry.from_json(line)
    except TranscriptError:
        return None


# One parse covers at most this much of a window: the decoder holds the GIL for the
# whole of it (a window with images can be megabytes), and the joined copy is this big.
PARSE_CHUNK_BYTES = 1 << 20
PARSE_CHUNK_LINES = 1_000
_DECODER = msgspec.json.Decoder()


def parse_entries_or_none(lines: Sequence[bytes]) -> list[Entry | None]:
    """``parse_entry_or_none`` for each line, in one JSON parse per chunk of the lines
    (``PARSE_CHUNK_BYTES``, ``PARSE_CHUNK_LINES``). One parse shares the decoder's key
    strings ("type", "text", "role"...) across its lines instead of making them anew for
    each: a loaded window takes about a sixth less memory, and parses faster."""
    entries: list[Entry | None] = []
    start = 0
    while start < len(lines):
        end, size = start, 0
        while end < len(lines) and end - start < PARSE_CHUNK_LINES:
            size += len(lines[end]) + 1
            end += 1
            if size >= PARSE_CHUNK_BYTES:
                break
        entries.extend(_parse_chunk(lines[start:end]))
        start = end
    return entries


def _parse_chunk(lines: Sequence[bytes]) -> list[Entry | None]:
    if len(lines) < 2:
        return [parse_entry_or_none(line) for line in lines]
    # msgspec: about twice as fast as json on a window, and a window read again is most
    # of what picking up a long session costs. It takes strict JSON only: a chunk it
    # refuses (a lone surrogate's \u escape, which encode_record writes on purpose, a
    # number out of range, a stray byte, or a corrupt line) is parsed by json as it
    # always was, whole, and line by line when json refuses it too.
    joined = b"[" + b",".join(lines) + b"]"
    raws: object = None
    try:
        raws = _DECODER.decode(joined)
    except (msgspec.DecodeError, ValueError, RecursionError):  # UnicodeDecodeError too
        try:
            raws = json.loads(joined)
        except (ValueError, RecursionError):
            raws = None
    # A line holding two values ("{...},{...}") parses as two: the count tells.
    if not isinstance(raws, list) or len(raws) != len(lines):
        return [parse_entry_or_none(line) for line in lines]
    entries: list[Entry | None] = []
    for raw in raws:
        try:
            entries.append(Entry.from_raw(raw))
        except TranscriptError:
            entries.append(None)
    return entries
