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


# A message or custom entry whose line is at most this long keeps its line instead of
# the line's parsed JSON; the rest is parsed again when asked for (``payload``). Parsed,
# a short entry's JSON takes about five times its line (every dict, list and string of
# it: its meta, usage, counts, a delivery's record): in a window of short messages that
# was most of its memory, and of the objects freed when a window leaves memory. A long
# entry keeps its JSON, whose strings its message shares (a line would hold them twice).
COMPACT_LINE_BYTES = 4096
# Custom entries kept parsed whatever their size: their data is read on every turn (the
# context's prune decisions: core.context.pruning applies each of them to every view).
PARSED_CUSTOM_TYPES: frozenset[str] = frozenset({"context_prune"})


class Entry:
    """One transcript line, read-only. ``payload`` holds every field but the envelope.
    A message entry's ``Message`` is parsed once, at construction, and read through
    ``core.fences.read_user_message``: a user's words neutralised, the gateway's blocks
    known by their fence (a legacy line's by the legacy rule).

    An entry made from its stored line (``from_json``, ``from_raw`` with the line) may
    keep only that line and what is read on every turn (the message, a custom entry's
    type, the stored token counts; see ``COMPACT_LINE_BYTES``): its ``payload`` is then
    parsed from the line on each use, a new dict each time."""

    __slots__ = (
        "__weakref__",
        "_line",
        "_message",
        "_payload",
        "custom_type",
        "id",
        "parent_id",
        "stored_tokens",
        "ts",
        "type",
    )

    id: str
    parent_id: str | None
    ts: str
    type: str
    # A custom entry's ``custom_type`` (None for other entries, or a custom entry
    # without one): read on every turn to find prunes, flushes and deliveries.
    custom_type: str | None
    # A message entry's stored token counts by encoder (``TokenCounter.stamp``).
    stored_tokens: Mapping[str, Any] | None
    _payload: dict[str, Any] | None
    _line: bytes | None
    _message: Message | None

    def __init__(
        self, id: str, parent_id: str | None, ts: str, type: str, payload: dict[str, Any]
    ) -> None:
        self._fill(id, parent_id, ts, type, payload, None)

    def _fill(
        self,
        entry_id: str,
        parent_id: str | None,
        ts: str,
        kind: str,
        payload: dict[str, Any],
        line: bytes | None,
    ) -> None:
        get = payload.get
        message, custom_type, stored_tokens = _content(
            entry_id, kind, get("message"), get("tokens"), get("custom_type")
        )
        if kind == ENTRY_COMPACTION:
            if not isinstance(payload.get("summary"), str):
                raise TranscriptError("compaction entry without a summary")
            kept = payload.get("first_kept_entry_id")
            if kept is not None and not isinstance(kept, str):
                raise TranscriptError("compaction entry with a bad first_kept_entry_id")
        compact = line is not None and _keeps_line(len(line), kind, custom_type)
        self._set(
            entry_id,
            parent_id,
            ts,
            kind,
            custom_type,
            stored_tokens,
            message,
            None if compact else payload,
            line if compact else None,
        )

    def _set(
        self,
        entry_id: str,
        parent_id: str | None,
        ts: str,
        kind: str,
        custom_type: str | None,
        stored_tokens: Mapping[str, Any] | None,
        message: Message | None,
        payload: dict[str, Any] | None,
        line: bytes | None,
    ) -> None:
        setter = object.__setattr__
        setter(self, "id", entry_id)
        setter(self, "parent_id", parent_id)
        setter(self, "ts", ts)
        setter(self, "type", kind)
        setter(self, "custom_type", custom_type)
        setter(self, "stored_tokens", stored_tokens)
        setter(self, "_message", message)
        setter(self, "_payload", payload)
        setter(self, "_line", line)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"transcript entries are read-only (setting {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"transcript entries are read-only (deleting {name!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entry):
            return NotImplemented
        return (self.id, self.parent_id, self.ts, self.type) == (
            other.id,
            other.parent_id,
            other.ts,
            other.type,
        ) and self.payload == other.payload

    def __hash__(self) -> int:
        return hash((self.id, self.parent_id, self.ts, self.type))

    def __repr__(self) -> str:
        return (
            f"Entry(id={self.id!r}, parent_id={self.parent_id!r}, ts={self.ts!r}, "
            f"type={self.type!r}, payload={self.payload!r})"
        )

    @property
    def payload(self) -> dict[str, Any]:
        """Every field of the line but the envelope; treat it as read-only."""
        if self._payload is not None:
            return self._payload
        raw = self._parsed_line()
        for key in _ENVELOPE:
            raw.pop(key, None)
        return raw

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
        if self._line is not None:
            try:
                return self._line.decode("utf-8")  # exactly what was stored
            except UnicodeDecodeError:
                pass
        return encode_record(self.to_dict()).decode("utf-8")

    def _parsed_line(self) -> dict[str, Any]:
        assert self._line is not None
        raw = _decode(self._line)
        if not isinstance(raw, dict):
            raise TranscriptError(f"entry {self.id}: its stored line no longer parses")
        return raw

    @classmethod
    def from_json(cls, line: bytes | str) -> Entry:
        """Parse one line; raises TranscriptError when it is not a well-formed entry."""
        # A line parsed whole anyway (too long to keep, see _keeps_line) is not read twice.
        if isinstance(line, bytes) and len(line) <= COMPACT_LINE_BYTES and _is_text(line):
            try:
                head = _HEAD.decode(line)
            except (msgspec.DecodeError, ValueError, RecursionError):
                head = None  # not strict JSON, or not an object: json decides below
            if head is not None and (entry := _from_head(head, line, None)) is not None:
                return entry
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise TranscriptError(f"not JSON: {exc}") from exc
        return cls.from_raw(raw, line=line if isinstance(line, bytes) else None)

    @classmethod
    def from_raw(cls, raw: object, *, line: bytes | None = None) -> Entry:
        """An entry from its line's parsed JSON (``line``: that line, which the entry
        may keep instead of the JSON); raises TranscriptError when it is not a
        well-formed entry."""
        if not isinstance(raw, dict):
            raise TranscriptError("entry is not a JSON object")
        entry_id, parent, ts, kind = (raw.pop(k, None) for k in _ENVELOPE)
        _check_envelope(entry_id, parent, ts, kind)
        entry = cls.__new__(cls)
        entry._fill(entry_id, parent, ts, kind, raw, line)
        return entry


def _check_envelope(entry_id: object, parent: object, ts: object, kind: object) -> None:
    if not isinstance(entry_id, str) or not entry_id:
        raise TranscriptError("entry without an id")
    if parent is not None and not isinstance(parent, str):
        raise TranscriptError("entry with a bad parent_id")
    if not isinstance(ts, str) or not isinstance(kind, str) or kind == "session":
        raise TranscriptError("entry without a timestamp or type")


def _content(
    entry_id: str, kind: str, message_raw: object, tokens: object, named: object
) -> tuple[Message | None, str | None, Mapping[str, Any] | None]:
    """What an entry keeps parsed whatever else it keeps: a message entry's message and
    stored token counts, a custom entry's type."""
    if kind == ENTRY_MESSAGE:
        if not isinstance(message_raw, dict):
            raise TranscriptError("message entry without a message object")
        try:
            message = read_user_message(Message.from_dict(message_raw))
        except (KeyError, TypeError, ValueError) as exc:
            raise TranscriptError(f"unreadable message in entry {entry_id}: {exc}") from exc
        return message, None, tokens if isinstance(tokens, dict) else None
    if kind == ENTRY_CUSTOM:
        return None, named if isinstance(named, str) else None, None
    return None, None, None


def _keeps_line(size: int, kind: str, custom_type: str | None) -> bool:
    """Whether an entry of this kind whose line is ``size`` bytes keeps its line rather
    than its parsed JSON (``COMPACT_LINE_BYTES``)."""
    return size <= COMPACT_LINE_BYTES and (
        kind == ENTRY_MESSAGE or (kind == ENTRY_CUSTOM and custom_type not in PARSED_CUSTOM_TYPES)
    )


class _Head(msgspec.Struct):
    """The fields of an entry that keeps its line (``_keeps_line``), read from that line
    without the rest: its meta, usage, or a delivery's record are skipped by the
    decoder rather than built into dicts that would be dropped at once. Any JSON value
    decodes; ``_from_head`` checks them as ``Entry.from_raw`` does."""

    id: Any = None
    parent_id: Any = None
    ts: Any = None
    type: Any = None
    custom_type: Any = None
    tokens: Any = None
    message: Any = None


_HEAD = msgspec.json.Decoder(_Head)
_HEADS = msgspec.json.Decoder(list[_Head])


def _from_head(head: _Head, line: bytes, previous_id: str | None) -> Entry | None:
    """The entry ``head`` was read from (``line``, known to be text: ``_is_text``),
    when it is one that keeps its line; None when it is not (another kind, or too
    long): the caller then parses the line whole. Raises TranscriptError for an entry
    that is not well formed. ``previous_id``: the id of the line before, whose string
    a parent id equal to it shares."""
    kind, named = head.type, head.custom_type
    # The same rule as the whole parse's (any JSON value may stand in these fields).
    if not isinstance(kind, str) or not _keeps_line(
        len(line), kind, named if isinstance(named, str) else None
    ):
        return None
    entry_id, parent = head.id, head.parent_id
    _check_envelope(entry_id, parent, head.ts, kind)
    message, custom_type, stored_tokens = _content(entry_id, kind, head.message, head.tokens, named)
    if parent is not None and parent == previous_id:
        parent = previous_id  # one string for both: a window holds every id twice
    entry = Entry.__new__(Entry)
    entry._set(entry_id, parent, head.ts, kind, custom_type, stored_tokens, message, None, line)
    return entry


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


def _decode(data: bytes) -> object:
    """``data``'s JSON value: by msgspec, else (strict JSON only) by json as it always
    was; None when neither takes it."""
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, ValueError, RecursionError):  # UnicodeDecodeError too
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            return None


def _parse_chunk(lines: Sequence[bytes]) -> list[Entry | None]:
    if len(lines) < 2:
        return [parse_entry_or_none(line) for line in lines]
    heads = _heads(lines)
    if heads is None:
        # A line msgspec refuses (a lone surrogate's \u escape, which encode_record
        # writes on purpose, a number out of range, a stray byte, a corrupt line) or one
        # holding two values ("{...},{...}"): each line is read on its own, so that one
        # line does not keep the rest of its chunk from the fast read.
        return [parse_entry_or_none(line) for line in lines]
    entries: list[Entry | None] = []
    whole: list[int] = []  # the lines to parse whole, by index
    previous_id: str | None = None
    for index, (head, line) in enumerate(zip(heads, lines, strict=True)):
        try:
            entry = _from_head(head, line, previous_id)
        except TranscriptError:
            entry = None
        else:
            if entry is None:
                whole.append(index)
        entries.append(entry)
        previous_id = entry.id if entry is not None else None
    if whole:
        parsed = _parse_whole([lines[i] for i in whole])
        for index, entry in zip(whole, parsed, strict=True):
            entries[index] = entry
    return entries


def _heads(lines: Sequence[bytes]) -> list[_Head] | None:
    """Each line's ``_Head``, in one parse; None when a line is not strict JSON text
    holding one object."""
    joined = b"[" + b",".join(lines) + b"]"
    if not _is_text(joined):
        return None
    try:
        heads = _HEADS.decode(joined)
    except (msgspec.DecodeError, ValueError, RecursionError):
        return None
    return heads if len(heads) == len(lines) else None


def _parse_whole(lines: Sequence[bytes]) -> list[Entry | None]:
    """Entries that keep their parsed JSON, in one parse: it shares the decoder's key
    strings across them. msgspec, about twice as fast as json; json when msgspec
    refuses, whole, and line by line when json does too."""
    if len(lines) < 2:
        return [parse_entry_or_none(line) for line in lines]
    raws = _decode(b"[" + b",".join(lines) + b"]")
    if not isinstance(raws, list) or len(raws) != len(lines):
        return [parse_entry_or_none(line) for line in lines]
    entries: list[Entry | None] = []
    for raw, line in zip(raws, lines, strict=True):
        try:
            entries.append(Entry.from_raw(raw, line=line))
        except TranscriptError:
            entries.append(None)
    return entries


def _is_text(data: bytes) -> bool:
    """Whether ``data`` is text as json reads a line (UTF-8, surrogates let through).
    msgspec checks only the fields it decodes: a bad byte in a field ``_Head`` skips
    would otherwise pass, and the line is corrupt."""
    try:
        data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True
