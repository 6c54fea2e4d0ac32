"""AnthropicProvider through the real anthropic SDK against the strict fake Messages API."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.errors import (
    AuthenticationError,
    ContextOverflowError,
    InvalidRequestError,
    MalformedResponseError,
    OverloadedError,
    ProviderConnectionError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
)
from parley.core.messages import (
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from parley.core.providers.anthropic import (
    AnthropicProvider,
    build_params,
    to_wire_messages,
)
from parley.core.providers.anthropic_wire import MAX_CACHE_BREAKPOINTS
from parley.core.providers.base import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    STOP_TOOL_USE,
    Provider,
    ProviderRequest,
)
from tests.core.providers.conftest import TEST_ANTHROPIC_MODEL, TEST_KEY
from tests.fakes.anthropic_api import (
    FakeAnthropic,
    overloaded,
    prompt_segments,
    prompt_tokens,
    rate_limited,
    request_too_large,
    server_error,
)
from tests.fakes.llm_common import (
    DEFAULT_CACHE_TTL_SECONDS,
    Hang,
    HttpError,
    RawResponse,
    Reply,
    StreamError,
    ToolCall,
    estimate_tokens,
)

SYSTEM = "You are Parley, a careful assistant."
WEATHER = ToolSpec(
    "weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def request(
    *messages: Message, tools: tuple[ToolSpec, ...] = (), max_tokens: int = 256
) -> ProviderRequest:
    return ProviderRequest(
        TEST_ANTHROPIC_MODEL, SYSTEM, messages or (Message.user("hi"),), tools, max_tokens
    )


class TextSink:
    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def __call__(self, text: str) -> None:
        self.deltas.append(text)


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the happy path --------------------------------------------------------------------


async def test_is_a_provider(anthropic_provider: AnthropicProvider) -> None:
    assert isinstance(anthropic_provider, Provider)
    assert anthropic_provider.name == "anthropic"


async def test_streams_text_deltas_to_on_text(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.enqueue(Reply("The quick brown fox jumps."))
    sink = TextSink()

    response = await anthropic_provider.complete(request(Message.user("Tell me")), sink)

    assert sink.deltas == ["The ", "quick ", "brown ", "fox ", "jumps."]
    assert response.content == (TextBlock("The quick brown fox jumps."),)
    assert response.stop_reason == STOP_END
    assert response.model == TEST_ANTHROPIC_MODEL


async def test_request_carries_cache_breakpoints_and_key(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    other = ToolSpec("clock", "The time.")
    await anthropic_provider.complete(
        request(
            Message.user("first"),
            Message.assistant("ok"),
            Message.user("second"),
            tools=(other, WEATHER),
        )
    )

    sent = anthropic_fake.requests[-1]
    assert sent.headers["Authorization"] == f"Bearer {TEST_KEY}"
    body = sent.body
    assert body["stream"] is True
    assert body["model"] == TEST_ANTHROPIC_MODEL
    assert body["max_tokens"] == 256
    assert body["system"] == [
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}
    ]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == {"type": "ephemeral"}
    assert body["tools"][1]["input_schema"] == WEATHER.input_schema
    # The newest message ends the cached prefix so the next turn reads the history, and
    # the previous user message ends where the previous call's prefix ended.
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in body["messages"][1]["content"][-1]


async def test_default_echo_when_nothing_is_scripted(anthropic_provider: AnthropicProvider) -> None:
    response = await anthropic_provider.complete(request(Message.user("ping")))
    assert response.message.text == "echo: ping"


# -- translation ----------------------------------------------------------------------


def test_tool_results_become_user_content_and_same_roles_merge() -> None:
    history = (
        Message.user("weather in Oslo and Bergen?"),
        Message(
            "assistant", (TextBlock("Checking."), ToolUseBlock("t1", "weather", {"city": "Oslo"}))
        ),
        Message("assistant", (ToolUseBlock("t2", "weather", {"city": "Bergen"}),)),
        Message("user", (TextBlock("hurry please"),)),
        Message("tool_result", (ToolResultBlock("t1", "sunny"),)),
        Message("tool_result", (ToolResultBlock("t2", "boom", is_error=True),)),
    )

    wire = to_wire_messages(history)

    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert [b["type"] for b in wire[1]["content"]] == ["text", "tool_use", "tool_use"]
    # Tool results lead the merged user message; the user's text follows.
    assert wire[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
        {"type": "text", "text": "hurry please"},
    ]


def test_images_and_empty_text() -> None:
    wire = to_wire_messages(
        (
            Message("user", (ImageBlock("image/png", "aGVsbG8="), ImageBlock("image/jpeg", ""))),
            Message("assistant", (TextBlock("  "),)),  # dropped: the API rejects blank text
            Message.user("and?"),
        )
    )

    assert wire == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="},
                },
                {"type": "text", "text": "[image]"},
                {"type": "text", "text": "and?"},
            ],
        }
    ]


def test_no_system_and_no_tools_send_neither() -> None:
    params = build_params(
        ProviderRequest(TEST_ANTHROPIC_MODEL, "", (Message.user("x"),), temperature=0.3)
    )
    assert "system" not in params
    assert "tools" not in params
    assert params["temperature"] == 0.3


async def test_translated_history_is_accepted_by_the_strict_fake(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    history = (
        Message.user("look at this"),
        Message("user", (ImageBlock("image/png", "aGVsbG8="),)),
        Message("assistant", (ToolUseBlock("t1", "weather", {"city": "Oslo"}),)),
        Message("tool_result", (ToolResultBlock("t1", "sunny"),)),
        Message.user("thanks"),
    )
    response = await anthropic_provider.complete(request(*history, tools=(WEATHER,)))
    assert response.message.text == "echo: sunny thanks"


# -- tools ------------------------------------------------------------------------------


async def test_tool_use_round_trip(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.enqueue(
        Reply(
            "Let me check.", (ToolCall("weather", {"city": "Oslo", "days": [1, 2]}, id="toolu_1"),)
        ),
        Reply("It is sunny in Oslo."),
    )
    question = Message.user("Weather in Oslo?")
    sink = TextSink()

    first = await anthropic_provider.complete(request(question, tools=(WEATHER,)), sink)

    assert first.stop_reason == STOP_TOOL_USE
    assert first.content == (
        TextBlock("Let me check."),
        ToolUseBlock("toolu_1", "weather", {"city": "Oslo", "days": [1, 2]}),
    )
    result = Message("tool_result", (ToolResultBlock("toolu_1", "sunny, 21 C"),))
    final = await anthropic_provider.complete(
        request(question, first.message, result, tools=(WEATHER,)), sink
    )

    assert final.message.text == "It is sunny in Oslo."
    assert final.stop_reason == STOP_END
    sent = anthropic_fake.requests[-1].body["messages"]
    assert sent[1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "weather",
        "input": {"city": "Oslo", "days": [1, 2]},
    }
    assert sent[2]["content"][0]["tool_use_id"] == "toolu_1"
    assert "".join(sink.deltas) == "Let me check.It is sunny in Oslo."


async def test_unreadable_tool_input_is_kept_raw(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.enqueue(
        Reply(tool_calls=(ToolCall("weather", raw_arguments='{"city": "Os', id="t9"),))
    )
    response = await anthropic_provider.complete(request(tools=(WEATHER,)))
    assert response.content == (ToolUseBlock("t9", "weather", {"_raw": '{"city": "Os'}),)


async def test_tool_result_without_its_call_is_an_invalid_request(
    anthropic_provider: AnthropicProvider,
) -> None:
    orphan = Message("tool_result", (ToolResultBlock("nope", "x"),))
    with pytest.raises(InvalidRequestError) as caught:
        await anthropic_provider.complete(
            request(Message.user("hi"), Message.assistant("yes"), orphan)
        )
    assert caught.value.status == 400
    assert "unexpected `tool_use_id`" in caught.value.message
    assert not caught.value.retryable


# -- usage ------------------------------------------------------------------------------


async def test_usage_maps_cache_write_then_read(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    conversation = [Message.user("first question")]
    first = await anthropic_provider.complete(request(*conversation, tools=(WEATHER,)))
    prompt_tokens = sum(estimate_tokens(s) for s in prompt_segments(anthropic_fake.last_body)[0])
    conversation += [first.message, Message.user("second question")]
    second = await anthropic_provider.complete(request(*conversation, tools=(WEATHER,)))

    assert first.usage.cache_read_tokens == 0
    assert first.usage.cache_write_tokens > 0
    assert first.usage.context_tokens == prompt_tokens
    assert first.usage.output_tokens == estimate_tokens("echo: first question")
    # The whole first prompt is the cached prefix of the second.
    assert second.usage.cache_read_tokens == prompt_tokens
    assert second.usage.cache_write_tokens > 0
    assert second.usage.input_tokens == 0


async def test_changed_system_prompt_is_not_read_from_cache(
    anthropic_provider: AnthropicProvider,
) -> None:
    await anthropic_provider.complete(request(Message.user("q")))
    other = ProviderRequest(TEST_ANTHROPIC_MODEL, SYSTEM + " Changed.", (Message.user("q"),))
    response = await anthropic_provider.complete(other)
    assert response.usage.cache_read_tokens == 0


# -- prompt caching across calls ----------------------------------------------------------

LONG_SYSTEM = "You are Parley. Follow the house rules carefully and cite sources. " * 60


class Clock:
    """Virtual time for the fake's cache lifetimes (no sleeping)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def long_request(*messages: Message, tools: tuple[ToolSpec, ...] = (WEATHER,)) -> ProviderRequest:
    return ProviderRequest(TEST_ANTHROPIC_MODEL, LONG_SYSTEM, messages, tools, 256)


def breakpoints_in(params: dict) -> list[dict]:
    blocks = [*params.get("tools", []), *params.get("system", [])]
    blocks += [b for m in params["messages"] for b in m["content"]]
    return [b for b in blocks if "cache_control" in b]


async def test_second_turn_is_billed_mostly_as_cache_read(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.clock = Clock()
    history = [Message.user("What is the capital of Norway?")]
    first = await anthropic_provider.complete(long_request(*history))
    first_prompt = prompt_tokens(anthropic_fake.last_body)
    history += [first.message, Message.user("And of Sweden?")]

    second = await anthropic_provider.complete(long_request(*history))

    assert first.usage.cache_read_tokens == 0
    assert first.usage.cache_write_tokens == first_prompt
    assert second.usage.cache_read_tokens == first_prompt
    assert second.usage.cache_read_tokens / second.usage.context_tokens > 0.9
    assert anthropic_fake.billing.cache_read_tokens == first_prompt


async def test_tool_loop_reads_the_previous_calls_prefix_past_the_lookback(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    # 12 parallel calls and 12 results put 24 blocks between one call's last breakpoint
    # and the next call's final block: beyond the 20-block lookback of the service.
    calls = 12

    def tool_round(round_number: int) -> Reply:
        return Reply(
            tool_calls=tuple(
                ToolCall("weather", {"city": f"c{round_number}-{i}"}, id=f"tu_{round_number}_{i}")
                for i in range(calls)
            )
        )

    anthropic_fake.enqueue(tool_round(1), tool_round(2), Reply("All done."))
    history = [Message.user("Weather everywhere, please.")]
    previous_prompt = 0
    for round_number in (1, 2, 3):
        response = await anthropic_provider.complete(long_request(*history))
        body = anthropic_fake.last_body
        assert len(breakpoints_in(body)) <= MAX_CACHE_BREAKPOINTS
        if round_number > 1:
            # Exactly the previous call's whole prompt is read, not just tools + system.
            assert response.usage.cache_read_tokens == previous_prompt
            assert response.usage.input_tokens == 0
        previous_prompt = prompt_tokens(body)
        results = tuple(
            ToolResultBlock(block.id, f"sunny in {block.input['city']}")
            for block in response.content
            if isinstance(block, ToolUseBlock)
        )
        history += [response.message]
        if results:
            history.append(Message("tool_result", results))
    assert response.message.text == "All done."


async def test_after_the_ttl_the_prefix_is_written_again(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    clock = Clock()
    anthropic_fake.clock = clock
    history = [Message.user("First question")]
    first = await anthropic_provider.complete(long_request(*history))
    history += [first.message, Message.user("Second question, much later")]
    clock.now += DEFAULT_CACHE_TTL_SECONDS + 1

    late = await anthropic_provider.complete(long_request(*history))
    late_prompt = prompt_tokens(anthropic_fake.last_body)
    history += [late.message, Message.user("Third question, right away")]
    soon = await anthropic_provider.complete(long_request(*history))

    assert late.usage.cache_read_tokens == 0
    assert late.usage.cache_write_tokens == late_prompt
    assert soon.usage.cache_read_tokens == late_prompt


@pytest.mark.parametrize(
    "history",
    [
        (Message.user("only one"),),
        (Message.user("q"), Message.assistant("a")),  # ends with an assistant message
        (Message.user("q"), Message.assistant("a"), Message.user("q2")),
        (
            Message.user("q"),
            Message("assistant", (ToolUseBlock("t1", "weather", {"city": "Oslo"}),)),
            Message("tool_result", (ToolResultBlock("t1", "sunny"),)),
            Message.assistant("It is sunny."),
            Message.user("thanks"),
            Message.assistant("  "),  # blank: dropped, never marked
        ),
    ],
)
async def test_the_strict_fake_accepts_every_breakpoint_layout(
    anthropic_fake: FakeAnthropic,
    anthropic_provider: AnthropicProvider,
    history: tuple[Message, ...],
) -> None:
    await anthropic_provider.complete(long_request(*history))
    body = anthropic_fake.last_body
    marked = breakpoints_in(body)
    assert len(marked) == min(MAX_CACHE_BREAKPOINTS, 2 + (2 if len(body["messages"]) >= 3 else 1))
    assert body["messages"][-1]["content"][-1] in marked


def test_second_to_last_user_message_is_marked_when_the_last_is_an_assistant() -> None:
    params = build_params(
        long_request(
            Message.user("q1"), Message.assistant("a1"), Message.user("q2"), Message.assistant("a2")
        )
    )
    marked = [i for i, m in enumerate(params["messages"]) if "cache_control" in m["content"][-1]]
    assert marked == [2, 3]


_TEXTS = st.sampled_from(["hello", "", "   ", "\n", "data"])
_BLOCKS = st.one_of(
    _TEXTS.map(TextBlock),
    st.builds(lambda n: ToolUseBlock(f"t{n}", "weather", {"n": n}), st.integers(0, 3)),
    st.builds(lambda n: ToolResultBlock(f"t{n}", "ok"), st.integers(0, 3)),
    st.sampled_from(["", "aGk="]).map(lambda data: ImageBlock("image/png", data)),
)
_MESSAGES = st.builds(
    lambda role, blocks: Message(role, tuple(blocks)),
    st.sampled_from(["user", "assistant", "tool_result"]),
    st.lists(_BLOCKS, min_size=1, max_size=4),
)


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(_MESSAGES, min_size=0, max_size=8),
    system=st.sampled_from(["", "  ", "System."]),
    tools=st.sampled_from([(), (WEATHER,), (ToolSpec("clock", "The time."), WEATHER)]),
)
def test_never_more_than_four_breakpoints_and_never_on_blank_text(
    messages: list[Message], system: str, tools: tuple[ToolSpec, ...]
) -> None:
    params = build_params(ProviderRequest(TEST_ANTHROPIC_MODEL, system, tuple(messages), tools, 64))
    marked = breakpoints_in(params)
    assert len(marked) <= MAX_CACHE_BREAKPOINTS
    assert all(b.get("type") != "text" or b["text"].strip() for b in marked)
    wire = params["messages"]
    if wire:
        assert "cache_control" in wire[-1]["content"][-1]
    expected_history = (1 if wire else 0) + (
        1 if len(wire) >= 3 and any(m["role"] == "user" for m in wire[:-1]) else 0
    )
    assert len(marked) == (1 if tools else 0) + (1 if system.strip() else 0) + expected_history


# -- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "expected_after"),
    [
        (rate_limited(retry_after=3), 3.0),
        (rate_limited(retry_after=3, retry_after_ms=40), 0.04),
        (rate_limited(), None),
    ],
)
async def test_rate_limit_carries_retry_after(
    anthropic_fake: FakeAnthropic,
    anthropic_provider: AnthropicProvider,
    step: HttpError,
    expected_after: float | None,
) -> None:
    anthropic_fake.enqueue(step)
    with pytest.raises(RateLimitError) as caught:
        await anthropic_provider.complete(request())
    assert caught.value.status == 429
    assert caught.value.retry_after == expected_after
    assert caught.value.retryable


@pytest.mark.parametrize(
    ("step", "error_class", "status"),
    [
        (overloaded(), OverloadedError, 529),
        (server_error(), ServerError, 500),
        (HttpError(503, "api_error", "unavailable"), OverloadedError, 503),
        (HttpError(404, "not_found_error", "model: claude-nope"), InvalidRequestError, 404),
        (HttpError(403, "permission_error", "no access"), AuthenticationError, 403),
        (RawResponse(b"<html>bad gateway</html>", 502, "text/html"), ServerError, 502),
    ],
)
async def test_status_errors_are_typed(
    anthropic_fake: FakeAnthropic,
    anthropic_provider: AnthropicProvider,
    step: HttpError | RawResponse,
    error_class: type[Exception],
    status: int,
) -> None:
    anthropic_fake.enqueue(step)
    with pytest.raises(error_class) as caught:
        await anthropic_provider.complete(request())
    assert type(caught.value) is error_class
    assert caught.value.status == status
    assert caught.value.provider == "anthropic"


async def test_wrong_key_is_an_authentication_error(anthropic_fake: FakeAnthropic) -> None:
    provider = AnthropicProvider(TEST_ANTHROPIC_MODEL, "sk-wrong", base_url=anthropic_fake.base_url)
    try:
        with pytest.raises(AuthenticationError) as caught:
            await provider.complete(request())
    finally:
        await provider.aclose()
    assert caught.value.status == 401
    assert anthropic_fake.requests[-1].headers["Authorization"] == "Bearer sk-wrong"


@pytest.mark.parametrize(
    ("error_type", "error_class", "retryable"),
    [
        ("overloaded_error", OverloadedError, True),
        ("api_error", ServerError, True),
        ("rate_limit_error", RateLimitError, True),
        ("invalid_request_error", InvalidRequestError, False),
    ],
)
async def test_error_inside_a_stream_is_classified_by_type(
    anthropic_fake: FakeAnthropic,
    anthropic_provider: AnthropicProvider,
    error_type: str,
    error_class: type[Exception],
    retryable: bool,
) -> None:
    anthropic_fake.enqueue(StreamError(error_type, "went wrong", partial_text="Half an"))
    sink = TextSink()
    with pytest.raises(error_class) as caught:
        await anthropic_provider.complete(request(), sink)
    assert caught.value.status == 200  # the SDK's plain APIStatusError after HTTP 200
    assert caught.value.retryable is retryable
    assert "".join(sink.deltas) == "Half an"


@pytest.mark.parametrize("partial", [None, "Started then"])
async def test_hung_stream_times_out(anthropic_fake: FakeAnthropic, partial: str | None) -> None:
    provider = AnthropicProvider(
        TEST_ANTHROPIC_MODEL, TEST_KEY, base_url=anthropic_fake.base_url, stall_timeout=0.3
    )
    anthropic_fake.enqueue(Hang(partial))
    sink = TextSink()
    try:
        with pytest.raises(ProviderTimeoutError) as caught:
            await provider.complete(request(), sink)
    finally:
        await provider.aclose()
    assert anthropic_fake.hangs_started == 1
    assert caught.value.message == "no data for 0.3 s"  # headers or events: both silence
    assert "".join(sink.deltas) == (partial or "")


async def test_stopping_the_fake_releases_a_hung_request() -> None:
    fake = FakeAnthropic(api_key=TEST_KEY)
    await fake.start()
    provider = AnthropicProvider(TEST_ANTHROPIC_MODEL, TEST_KEY, base_url=fake.base_url)
    fake.enqueue(Hang("waiting"))
    try:
        call = asyncio.create_task(provider.complete(request()))
        async with asyncio.timeout(5):
            await fake.hang_started.wait()
            await fake.stop()
            with pytest.raises(ProviderConnectionError):
                await call  # the stream ended without message_stop
    finally:
        await provider.aclose()


async def test_connection_refused_is_a_connection_error() -> None:
    provider = AnthropicProvider(
        TEST_ANTHROPIC_MODEL, TEST_KEY, base_url=f"http://127.0.0.1:{free_port()}"
    )
    try:
        with pytest.raises(ProviderConnectionError) as caught:
            await provider.complete(request())
    finally:
        await provider.aclose()
    assert caught.value.retryable


START = sse(
    "message_start",
    {"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 1}}},
)


def text_delta(index: object) -> bytes:
    delta = {"type": "text_delta", "text": "x"}
    return sse(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


@pytest.mark.parametrize(
    ("body", "error_class"),
    [
        (b"<html>not an event stream</html>", MalformedResponseError),
        (b"event: message_start\ndata: {not json\n\n", MalformedResponseError),
        (START + text_delta(3), MalformedResponseError),  # a block never started
        (START + text_delta("first"), MalformedResponseError),  # a field of the wrong type
        # Cut off before message_stop: the connection, not the content, failed.
        (START, ProviderConnectionError),
    ],
)
async def test_unreadable_answers(
    anthropic_fake: FakeAnthropic,
    anthropic_provider: AnthropicProvider,
    body: bytes,
    error_class: type[Exception],
) -> None:
    anthropic_fake.enqueue(RawResponse(body))
    with pytest.raises(error_class):
        await anthropic_provider.complete(request())


async def test_on_text_errors_are_not_translated(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.enqueue(Reply("some text"))

    async def broken(text: str) -> None:
        raise KeyError(text)

    with pytest.raises(KeyError):
        await anthropic_provider.complete(request(), broken)


# -- context overflow -----------------------------------------------------------------


async def test_prompt_too_long_is_overflow_with_numbers(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.context_window = 50
    with pytest.raises(ContextOverflowError) as caught:
        await anthropic_provider.complete(request(Message.user("x" * 400)))
    observed = sum(estimate_tokens(s) for s in prompt_segments(anthropic_fake.last_body)[0])
    assert caught.value.observed_tokens == observed > 50
    assert caught.value.limit == 50
    assert caught.value.status == 400
    assert not caught.value.retryable


async def test_prompt_plus_max_tokens_over_window_is_overflow(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.context_window = 100
    with pytest.raises(ContextOverflowError) as caught:
        await anthropic_provider.complete(request(max_tokens=90))
    observed = sum(estimate_tokens(s) for s in prompt_segments(anthropic_fake.last_body)[0])
    assert observed <= 100
    assert caught.value.observed_tokens == observed + 90
    assert caught.value.limit == 100


async def test_request_too_large_is_overflow(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider
) -> None:
    anthropic_fake.enqueue(request_too_large())
    with pytest.raises(ContextOverflowError) as caught:
        await anthropic_provider.complete(request())
    assert caught.value.status == 413
    assert caught.value.observed_tokens is None


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("model_context_window_exceeded", STOP_OVERFLOW),
        ("max_tokens", STOP_MAX_TOKENS),
        ("stop_sequence", STOP_END),
        ("pause_turn", "pause_turn"),
    ],
)
async def test_stop_reasons(
    anthropic_fake: FakeAnthropic, anthropic_provider: AnthropicProvider, reason: str, expected: str
) -> None:
    anthropic_fake.enqueue(Reply("partial answer", stop_reason=reason))
    response = await anthropic_provider.complete(request())
    assert response.stop_reason == expected
    assert response.message.text == "partial answer"  # the text is kept, not thrown away


# -- lifecycle --------------------------------------------------------------------------


async def test_aclose_closes_the_client(anthropic_fake: FakeAnthropic) -> None:
    provider = AnthropicProvider(TEST_ANTHROPIC_MODEL, TEST_KEY, base_url=anthropic_fake.base_url)
    await provider.complete(request())
    await provider.aclose()
    with pytest.raises(ProviderConnectionError):
        await provider.complete(request())
