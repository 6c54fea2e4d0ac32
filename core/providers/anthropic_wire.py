"""The Messages API request body, encoded a message at a time and kept.

Every turn sends the whole history again. Built as dicts, handed to the SDK's
``messages.create``, each request was translated block by block, deep-copied by the
SDK (``_prepare.copy_tree``, which walks every container of the body) and encoded to
JSON: about a fifth of the gateway's CPU under load, growing with each session's
length. Here each message's blocks are translated and encoded once, kept as JSON
text for as long as the message lives (the context view hands the same ``Message``
objects from turn to turn), and a request is joined from those pieces and sent to
the same endpoint as bytes.

``anthropic.build_params`` and ``to_wire_messages`` read the same JSON back as data.
The tests compare it, on every shape of history, with a translation written the plain
way (dicts, then the SDK's encoder).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from parley.core.media import gone_placeholder
from parley.core.messages import (
    Block,
    DerivedKey,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from parley.core.providers.base import ProviderRequest

IMAGE_PLACEHOLDER = "[image]"
MAX_CACHE_BREAKPOINTS = 4  # the API rejects a request with more

# The SDK's own encoder settings: compact, UTF-8 as is, and NaN refused (a tool input
# holding one fails the request rather than sending JSON the API cannot read).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_FAST_ENCODER = msgspec.json.Encoder()
# Appended to a block's JSON object: the key build_params adds last.
_CACHE_CONTROL_MEMBER = ',"cache_control":{"type":"ephemeral"}}'


class WirePiece(NamedTuple):
    """One content block as sent: its JSON object, and whether it is a tool result (a
    merged user message sends those first). Every piece may carry a cache breakpoint:
    the API refuses one only on blank text, which is never sent."""

    json: str
    tool_result: bool


def encode(value: Any) -> str:
    return _ENCODER.encode(value)


def wire_block(block: Block) -> dict[str, Any] | None:
    """One of our blocks in the API's shape; None for one the API would refuse (blank
    text). The fence of a gateway block is never sent: only its text."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text} if block.text.strip() else None
    if isinstance(block, ToolUseBlock):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    if isinstance(block, ToolResultBlock):
        wire: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": block.tool_use_id,
            "content": block.content,
        }
        if block.is_error:
            wire["is_error"] = True
        return wire
    if isinstance(block, ImageBlock):
        if not block.data:  # stored pictures are resolved before (core.media)
            text = gone_placeholder(block) if block.ref else IMAGE_PLACEHOLDER
            return {"type": "text", "text": text}
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": block.media_type, "data": block.data},
        }
    raise TypeError(f"unsupported block: {block!r}")


class RequestEncoder:
    """Encodes requests for one provider. Each message's encoded blocks are kept on the
    message (``Message.derived``, under this encoder's key) for as long as it lives."""

    def __init__(self) -> None:
        # Each message's encoded blocks, kept on the message (``Message.derived``)
        # under this encoder's own key.
        self._encoded: DerivedKey[tuple[WirePiece, ...]] = DerivedKey("anthropic wire")
        # The tool list is the same tuple from turn to turn: its JSON is kept for it.
        self._tools: tuple[tuple[ToolSpec, ...], str] | None = None

    def body(self, request: ProviderRequest, model: str, *, stream: bool = True) -> bytes:
        """The request's JSON body, ``stream`` included, as the endpoint takes it."""
        messages = self._messages(request.messages)
        budget = MAX_CACHE_BREAKPOINTS - (1 if request.tools else 0)
        system = request.system.strip()
        budget -= 1 if system else 0
        for pieces in [g[1] for g in _history_breakpoints(messages)][:budget]:
            last = pieces[-1]
            pieces[-1] = last._replace(json=last.json[:-1] + _CACHE_CONTROL_MEMBER)
        parts = [
            '{"model":',
            encode(model),
            ',"max_tokens":',
            encode(request.max_tokens),
            ',"messages":',
            _join(messages),
        ]
        if system:
            parts += [',"system":[{"type":"text","text":', encode(request.system)]
            parts.append(',"cache_control":{"type":"ephemeral"}}]')
        if request.tools:
            parts += [',"tools":', self._tools_json(request.tools)]
        if request.temperature is not None:
            parts += [',"temperature":', encode(request.temperature)]
        if stream:
            parts.append(',"stream":true')
        parts.append("}")
        return "".join(parts).encode()

    def messages_json(self, messages: Sequence[Message]) -> str:
        """The messages alone, as a JSON array, without cache breakpoints."""
        return _join(self._messages(messages))

    def _messages(self, messages: Sequence[Message]) -> list[tuple[str, list[WirePiece]]]:
        """The wire messages: roles alternating, tool results first in a user message."""
        wire: list[tuple[str, list[WirePiece]]] = []
        for message in messages:
            pieces = message.derived(self._encoded)
            if pieces is None:
                pieces = _pieces(message)
                message.keep_derived(self._encoded, pieces)
            if not pieces:
                continue
            role = "assistant" if message.role == "assistant" else "user"
            if wire and wire[-1][0] == role:
                wire[-1][1].extend(pieces)
            else:
                wire.append((role, list(pieces)))
        for role, blocks in wire:
            if role == "user" and len(blocks) > 1:
                blocks.sort(key=lambda p: not p.tool_result)  # stable: order kept within
        return wire

    def _tools_json(self, tools: tuple[ToolSpec, ...]) -> str:
        if self._tools is not None and self._tools[0] is tools:
            return self._tools[1]
        wire = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in tools
        ]
        wire[-1]["cache_control"] = {"type": "ephemeral"}
        encoded = encode(wire)
        self._tools = (tools, encoded)
        return encoded


def _pieces(message: Message) -> tuple[WirePiece, ...]:
    pieces = []
    for block in message.content:
        wire = wire_block(block)
        if wire is None:
            continue
        pieces.append(WirePiece(_encode_block(wire), wire["type"] == "tool_result"))
    return tuple(pieces)


def _encode_block(wire: dict[str, Any]) -> str:
    """A block's JSON. Blocks of strings go through msgspec, several times faster than
    json (a window read again from its file is encoded again, message by message), to
    the same bytes; a tool call's input goes through json, which refuses NaN where
    msgspec would write null, and so does a string msgspec refuses (a lone surrogate)."""
    if wire["type"] != "tool_use":
        try:
            return _FAST_ENCODER.encode(wire).decode()
        except (UnicodeEncodeError, TypeError):  # TypeError: a str subclass
            pass
    return encode(wire)


def _join(messages: list[tuple[str, list[WirePiece]]]) -> str:
    return (
        "["
        + ",".join(
            f'{{"role":"{role}","content":[{",".join(p.json for p in pieces)}]}}'
            for role, pieces in messages
        )
        + "]"
    )


def _history_breakpoints(
    messages: list[tuple[str, list[WirePiece]]],
) -> list[tuple[str, list[WirePiece]]]:
    """The messages whose last block ends a cached prefix: the newest and, with 3
    messages or more, the newest earlier user message (where the previous call ended
    its prompt)."""
    if not messages:
        return []
    marked = [messages[-1]]
    if len(messages) >= 3:
        for group in reversed(messages[:-1]):
            if group[0] == "user":
                marked.append(group)
                break
    return marked
