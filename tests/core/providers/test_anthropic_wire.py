"""The encoded request body (anthropic_wire.py) against build_params, its readable form."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.errors import MalformedResponseError
from parley.core.messages import (
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from parley.core.providers.anthropic import AnthropicProvider, build_params, to_wire_messages
from parley.core.providers.anthropic_wire import RequestEncoder, wire_block
from parley.core.providers.base import ProviderRequest
from tests.core.providers.conftest import TEST_ANTHROPIC_MODEL
from tests.fakes.anthropic_api import FakeAnthropic

WEATHER = ToolSpec(
    "weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolSpec("clock", "The time, «now».")

_TEXTS = st.sampled_from(["hello", "", "   ", "\n", "data", 'quote " and \\ ünïcødé ✓', "\u2028"])
_BLOCKS = st.one_of(
    st.builds(TextBlock, _TEXTS, st.sampled_from([None, "turn-context"])),
    st.builds(
        lambda n, city: ToolUseBlock(f"t{n}", "weather", {"city": city, "n": [n, 1.5, None]}),
        st.integers(0, 3),
        _TEXTS,
    ),
    st.builds(lambda n, e: ToolResultBlock(f"t{n}", "ok ✓", e), st.integers(0, 3), st.booleans()),
    st.sampled_from(["", "aGk="]).map(lambda data: ImageBlock("image/png", data)),
)
_MESSAGES = st.builds(
    lambda role, blocks: Message(role, tuple(blocks)),
    st.sampled_from(["user", "assistant", "tool_result"]),
    st.lists(_BLOCKS, min_size=1, max_size=4),
)


def reference_params(request: ProviderRequest) -> dict[str, Any]:
    """The translation written the plain way, as the SDK was once given it: dicts built
    block by block, roles merged, tool results first, breakpoints marked in place."""
    ephemeral = {"type": "ephemeral"}
    wire: list[dict[str, Any]] = []
    for message in request.messages:
        blocks = [b for b in map(wire_block, message.content) if b is not None]
        if not blocks:
            continue
        role = "assistant" if message.role == "assistant" else "user"
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    for entry in wire:
        if entry["role"] == "user":
            entry["content"].sort(key=lambda b: b["type"] != "tool_result")
    marked = [wire[-1]["content"][-1]] if wire else []
    if len(wire) >= 3:
        earlier_user = next((m for m in reversed(wire[:-1]) if m["role"] == "user"), None)
        if earlier_user is not None:
            marked.append(earlier_user["content"][-1])
    budget = 4 - (1 if request.tools else 0) - (1 if request.system.strip() else 0)
    for block in [b for b in marked if b["type"] != "text" or b["text"].strip()][:budget]:
        block["cache_control"] = dict(ephemeral)
    params: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": wire,
    }
    if request.system.strip():
        params["system"] = [{"type": "text", "text": request.system, "cache_control": ephemeral}]
    if request.tools:
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in request.tools
        ]
        tools[-1]["cache_control"] = dict(ephemeral)
        params["tools"] = tools
    if request.temperature is not None:
        params["temperature"] = request.temperature
    return params


def expected(request: ProviderRequest, model: str) -> dict[str, Any]:
    return {**reference_params(request), "model": model, "stream": True}


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(_MESSAGES, min_size=0, max_size=8),
    system=st.sampled_from(["", "  ", "System.", "Système «x»"]),
    tools=st.sampled_from([(), (WEATHER,), (CLOCK, WEATHER)]),
    temperature=st.sampled_from([None, 0.0, 0.7]),
)
def test_the_body_is_the_plain_translation_as_json(
    messages: list[Message],
    system: str,
    tools: tuple[ToolSpec, ...],
    temperature: float | None,
) -> None:
    request = ProviderRequest(TEST_ANTHROPIC_MODEL, system, tuple(messages), tools, 64, temperature)
    encoder = RequestEncoder()

    first = json.loads(encoder.body(request, "model-x"))
    again = json.loads(encoder.body(request, "model-x"))  # every block from the memo now

    assert first == expected(request, "model-x")
    assert again == first
    # What build_params and to_wire_messages read back is that same body.
    assert build_params(request) == reference_params(request)
    unmarked = [
        {**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]}
        for m in reference_params(request)["messages"]
        for blocks in [m["content"]]
    ]
    assert to_wire_messages(request.messages) == unmarked


def test_a_breakpoint_never_sticks_to_a_kept_block() -> None:
    """The newest message's last block is marked in one request; in the next, where it is
    no longer the newest, the same (remembered) block goes out unmarked."""
    encoder = RequestEncoder()
    history = [Message.user("q1"), Message.assistant("a1"), Message.user("q2")]
    later = [*history, Message.assistant("a2"), Message.user("q3")]

    for messages in (history, later, history[:1], later):
        request = ProviderRequest(TEST_ANTHROPIC_MODEL, "S", tuple(messages), (WEATHER,), 64)
        assert json.loads(encoder.body(request, "m")) == expected(request, "m")


def test_a_messages_encoding_is_kept_with_it_for_its_encoder_only() -> None:
    encoder = RequestEncoder()
    kept, twin = Message.user("kept"), Message.user("kept")
    encoder.body(ProviderRequest("m", "", (kept,)), "m")
    pieces = kept.derived(encoder._encoded)

    encoder.body(ProviderRequest("m", "", (kept, Message.assistant("a"))), "m")

    assert pieces is not None
    assert kept.derived(encoder._encoded) is pieces  # not encoded again
    assert twin.derived(encoder._encoded) is None  # equal, but another message
    assert kept.derived(RequestEncoder()._encoded) is None  # another encoder's key


def test_a_new_tool_list_is_encoded_again() -> None:
    encoder = RequestEncoder()
    one = ProviderRequest("m", "", (Message.user("x"),), (WEATHER,))
    two = ProviderRequest("m", "", (Message.user("x"),), (CLOCK, WEATHER))
    assert json.loads(encoder.body(one, "m")) == expected(one, "m")
    assert json.loads(encoder.body(two, "m")) == expected(two, "m")
    assert json.loads(encoder.body(one, "m")) == expected(one, "m")


async def test_the_strict_fake_gets_the_plain_translation(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    history = (
        Message.user("look at this ✓"),
        Message("user", (ImageBlock("image/png", "aGVsbG8="),)),
        Message("assistant", (ToolUseBlock("t1", "weather", {"city": "Oslo"}),)),
        Message("tool_result", (ToolResultBlock("t1", "sunny"),)),
        Message.user("thanks"),
    )
    request = ProviderRequest(TEST_ANTHROPIC_MODEL, "System.", history, (WEATHER,), 256)

    await anthropic_provider.complete(request)

    assert anthropic_fake.last_body == expected(request, TEST_ANTHROPIC_MODEL)


async def test_a_body_json_cannot_carry_fails_the_call_as_malformed(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    """A tool input holding NaN (JSON has none): refused before anything is sent, as
    the SDK refused it."""
    history = (
        Message.user("go"),
        Message("assistant", (ToolUseBlock("t1", "weather", {"city": math.nan}),)),
        Message("tool_result", (ToolResultBlock("t1", "?"),)),
    )
    sent_before = len(anthropic_fake.requests)

    with pytest.raises(MalformedResponseError):
        await anthropic_provider.complete(ProviderRequest(TEST_ANTHROPIC_MODEL, "", history))

    assert len(anthropic_fake.requests) == sent_before


def test_one_persons_words_never_reach_anothers_body() -> None:
    """The encoder is shared by every session of a provider and remembers messages by
    identity: a body holds only its own request's messages, also once another
    session's messages are gone and their ids are free to be reused."""
    encoder = RequestEncoder()
    for round_ in range(50):
        alice = [Message.user(f"ALICE-CANARY-{round_} my secret"), Message.assistant("ok")]
        bob = [Message.user(f"bob asks {round_}"), Message.assistant("sure")]
        alice_body = encoder.body(ProviderRequest("m", "S", tuple(alice)), "m").decode()
        del alice  # freed: a new message may now take one of its ids
        bob_body = encoder.body(ProviderRequest("m", "S", tuple(bob)), "m").decode()
        assert f"ALICE-CANARY-{round_}" in alice_body
        assert "ALICE-CANARY" not in bob_body
        assert json.loads(bob_body)["messages"][0]["content"][0]["text"] == f"bob asks {round_}"


@pytest.mark.parametrize(
    "text",
    [
        'quotes " and \\ backslashes',
        "controls \x00 \x01 \x1f \x7f \b \f \n \r \t",
        "line and paragraph separators \u2028 \u2029, emoji 🦉, ünïcode",
        "a lone surrogate \ud800 that only json writes",
    ],
)
def test_a_text_block_is_the_same_bytes_json_would_write(text: str) -> None:
    """Text goes through msgspec, a lone surrogate through json: either way the bytes are
    json's own, so a cached prompt prefix written before reads the same after."""
    messages = (Message.user(text), Message("tool_result", (ToolResultBlock("t", text),)))
    # The two user-side messages go as one on the wire, the tool result first.
    content = [
        {"type": "tool_result", "tool_use_id": "t", "content": text},
        {"type": "text", "text": text},
    ]
    expected_json = json.dumps(
        [{"role": "user", "content": content}], ensure_ascii=False, separators=(",", ":")
    )

    assert RequestEncoder().messages_json(messages) == expected_json


def test_text_of_a_str_subclass_is_encoded_as_its_text() -> None:
    class Marked(str):
        """A str subclass (as a library may hand over)."""

    messages = (Message.user(Marked("marked words")),)

    assert json.loads(RequestEncoder().messages_json(messages)) == [
        {"role": "user", "content": [{"type": "text", "text": "marked words"}]}
    ]
