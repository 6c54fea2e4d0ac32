"""The runtime's message vocabulary: content blocks, messages, usage.

These are small frozen value classes with a stable JSON form (``to_dict`` /
``from_dict``): the transcript stores exactly that form, and providers translate
it to and from their wire formats. Plain dataclasses, not pydantic, because they
sit on the per-turn hot path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeAlias, TypeVar

Role = Literal["user", "assistant", "tool_result"]
ROLES: tuple[str, ...] = ("user", "assistant", "tool_result")

# The gateway's own blocks (core.fences): a text block is one of them because its
# ``fence`` says so, never because of how its text begins.
FENCE_TURN_CONTEXT = "turn-context"
FENCE_RECALLED_MEMORY = "recalled-memory"
FENCE_SUMMARY = "summary"
FENCE_GROUP_CONTEXT = "group-context"
FENCES: frozenset[str] = frozenset(
    {FENCE_TURN_CONTEXT, FENCE_RECALLED_MEMORY, FENCE_SUMMARY, FENCE_GROUP_CONTEXT}
)


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Text; ``fence`` names the gateway block it is (None: anyone's words).

    The fence is stored in the transcript (``"fence"``, only when set) and never sent to
    a provider: the translators send ``text`` alone. Only the code that renders a
    gateway block sets it; nothing a user types can."""

    text: str
    fence: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.fence is None:
            return {"type": "text", "text": self.text}
        return {"type": "text", "text": self.text, "fence": self.fence}


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    """A tool call the model made."""

    id: str
    name: str
    input: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.input}


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """The result of one tool call, sent back to the model."""

    tool_use_id: str
    content: str
    is_error: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "tool_result",
            "tool_use_id": self.tool_use_id,
            "content": self.content,
            "is_error": self.is_error,
        }


@dataclass(frozen=True, slots=True)
class ImageBlock:
    """An image. A picture someone sent lives in the gateway's media store: ``ref`` names
    the stored file (never its bytes: the transcript holds the reference, and a provider
    is handed the bytes only for the request that sends them, ``core.media``), with its
    ``name``, ``width`` and ``height`` in pixels. ``data`` is inline base64, only ever set
    on a request's own copy of a message (and read from transcripts written before the
    media store); empty with no ``ref``, the block is a bare placeholder."""

    media_type: str
    data: str = ""
    ref: str = ""
    name: str = ""
    width: int = 0
    height: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "image", "media_type": self.media_type}
        if self.ref:
            out["ref"] = self.ref
            out["name"] = self.name
            out["width"] = self.width
            out["height"] = self.height
        if self.data or not self.ref:
            out["data"] = self.data
        return out


Block: TypeAlias = TextBlock | ToolUseBlock | ToolResultBlock | ImageBlock


def block_from_dict(raw: dict[str, Any]) -> Block:
    if not isinstance(raw, dict):  # a stored line holds anything: unreadable, not a crash
        raise ValueError(f"content block is not an object: {type(raw).__name__}")
    kind = raw.get("type")
    if kind == "text":
        fence = raw.get("fence")
        known = isinstance(fence, str) and fence in FENCES  # anything else: plain text
        return TextBlock(str(raw.get("text", "")), fence if known else None)
    if kind == "tool_use":
        return ToolUseBlock(str(raw["id"]), str(raw["name"]), dict(raw.get("input") or {}))
    if kind == "tool_result":
        return ToolResultBlock(
            str(raw["tool_use_id"]), str(raw.get("content", "")), bool(raw.get("is_error", False))
        )
    if kind == "image":
        return ImageBlock(
            str(raw.get("media_type", "image/png")),
            str(raw.get("data", "")),
            ref=str(raw.get("ref", "")),
            name=str(raw.get("name", "")),
            width=_dimension(raw.get("width")),
            height=_dimension(raw.get("height")),
        )
    raise ValueError(f"unknown content block type: {kind!r}")


def _dimension(value: Any) -> int:
    """A stored width or height: a non-negative int, 0 for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


V = TypeVar("V")


class DerivedKey(Generic[V]):
    """Names one kind of value worked out from a message and kept with it
    (``Message.derived``): compared by identity, so each owner has its own."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"DerivedKey({self.name!r})"


# weakref_slot: a message can be watched going away (the tests prove that nothing kept
# with or about it keeps it alive).
@dataclass(frozen=True, slots=True, weakref_slot=True)
class Message:
    role: Role
    content: tuple[Block, ...]
    # Values worked out from this message (its token count, its size in characters, its
    # encoded wire form), kept on it: the context view hands the same Message objects
    # from turn to turn, so each is worked out once. They live exactly as long as the
    # message, and an equal message made apart never shares them (a copy.copy does: the
    # values depend on the content alone). Not part of the message's value.
    # (A memo beside the messages, keyed by identity with a weak reference each, cost
    # about a tenth of the event loop under load in its look-ups and callbacks.)
    _derived: dict[DerivedKey[Any], Any] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def derived(self, key: DerivedKey[V]) -> V | None:
        """The value kept under ``key`` (``keep_derived``), None when there is none."""
        kept = self._derived
        return None if kept is None else kept.get(key)

    def keep_derived(self, key: DerivedKey[V], value: V) -> None:
        """Keep ``value`` with this message under ``key``. From any thread: two threads
        racing to make the first value's dict can lose one value, never mix them up."""
        kept = self._derived
        if kept is None:
            kept = {}
            object.__setattr__(self, "_derived", kept)
        kept[key] = value

    @classmethod
    def user(cls, text: str) -> Message:
        return cls("user", (TextBlock(text),))

    @classmethod
    def assistant(cls, text: str) -> Message:
        return cls("assistant", (TextBlock(text),))

    @property
    def text(self) -> str:
        """The concatenated text blocks (tool calls and images left out)."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": [b.to_dict() for b in self.content]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Message:
        role = raw.get("role")
        if role not in ROLES:
            raise ValueError(f"unknown message role: {role!r}")
        content = raw.get("content")
        if isinstance(content, str):  # tolerate the short form
            blocks: tuple[Block, ...] = (TextBlock(content),)
        else:
            blocks = tuple(block_from_dict(b) for b in content or ())
        return cls(role, blocks)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage as the provider reported it for one call (or a sum of calls)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        """Everything the provider read for the prompt, cache included."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input": self.input_tokens,
            "output": self.output_tokens,
            "cache_read": self.cache_read_tokens,
            "cache_write": self.cache_write_tokens,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Usage:
        raw = raw or {}
        return cls(
            int(raw.get("input", 0)),
            int(raw.get("output", 0)),
            int(raw.get("cache_read", 0)),
            int(raw.get("cache_write", 0)),
        )


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})

    def schema_json(self) -> str:
        """The tool as the model receives it (keys in the order they are sent), as compact
        JSON: what its size is measured on, for token estimates and the /context report."""
        return json.dumps(
            {"name": self.name, "description": self.description, "input_schema": self.input_schema},
            ensure_ascii=False,
            separators=(",", ":"),
            default=str,
        )
