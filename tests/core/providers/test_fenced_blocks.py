"""A gateway block's fence is the runtime's own bookkeeping: every provider sends the
text alone, byte for byte what an unfenced block sends (so the prompt cache is not
disturbed), and the strict fake, like the real API, accepts nothing more."""

from __future__ import annotations

from datetime import UTC, datetime

from parley.core.fences import RECALL_CLOSE, RECALL_OPEN
from parley.core.messages import FENCE_RECALLED_MEMORY, Message, TextBlock
from parley.core.prompt import render_turn_context, turn_context_block
from parley.core.providers import anthropic, local, openai_compat
from parley.core.providers.anthropic import AnthropicProvider, build_params
from parley.core.providers.base import ProviderRequest
from tests.core.providers.conftest import TEST_ANTHROPIC_MODEL
from tests.fakes.anthropic_api import FakeAnthropic, InvalidRequest, validate

SYSTEM = "You are Parley."
CONTEXT = render_turn_context(
    now=datetime(2026, 11, 23, 9, 30, tzinfo=UTC),
    channel="telegram",
    chat_type="dm",
    sender_name="Ann",
    sender_id="42",
)
RECALLED = f"{RECALL_OPEN}\nnotes\n[MEMORY.md#L1-L2] tea, not coffee\n{RECALL_CLOSE}"


def history(*, fenced: bool) -> tuple[Message, ...]:
    recalled = TextBlock(RECALLED, FENCE_RECALLED_MEMORY if fenced else None)
    context = turn_context_block(CONTEXT) if fenced else TextBlock(CONTEXT)
    return (
        Message("user", (TextBlock("hello"), context)),
        Message.assistant("Hi Ann."),
        Message("user", (recalled, TextBlock("what do I drink?"), context)),
    )


def request(messages: tuple[Message, ...]) -> ProviderRequest:
    return ProviderRequest(TEST_ANTHROPIC_MODEL, SYSTEM, messages, (), 256)


def test_every_translator_sends_a_fenced_block_as_plain_text() -> None:
    fenced, bare = history(fenced=True), history(fenced=False)
    assert fenced != bare  # the fences are there ...
    # ... and invisible on every wire: the same bytes as bare blocks.
    assert build_params(request(fenced)) == build_params(request(bare))
    assert anthropic.to_wire_messages(fenced) == anthropic.to_wire_messages(bare)
    assert openai_compat.to_wire_messages(SYSTEM, fenced) == openai_compat.to_wire_messages(
        SYSTEM, bare
    )
    assert local.to_chat_messages(SYSTEM, fenced) == local.to_chat_messages(SYSTEM, bare)
    for message in build_params(request(fenced))["messages"]:
        for block in message["content"]:
            assert set(block) <= {"type", "text", "cache_control"}


def test_the_strict_fake_refuses_a_field_the_api_does_not_know() -> None:
    body = build_params(request(history(fenced=True)))
    validate(body)
    body["messages"][0]["content"][1]["fence"] = "turn-context"
    try:
        validate(body)
    except InvalidRequest as exc:
        assert "fence" in str(exc)
    else:
        raise AssertionError("a text block with an unknown field was accepted")


async def test_a_fenced_turn_is_accepted_by_the_strict_fake(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    response = await anthropic_provider.complete(request(history(fenced=True)))
    assert response.message.text
    (body,) = anthropic_fake.requests_bodies
    assert "fence" not in str(body)
