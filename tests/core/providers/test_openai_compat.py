"""OpenAICompatProvider through the real openai SDK against the strict fake completions API."""

from __future__ import annotations

import json
import socket

import pytest

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
from parley.core.providers.base import (
    STOP_END,
    STOP_MAX_TOKENS,
    STOP_OVERFLOW,
    STOP_REFUSAL,
    STOP_TOOL_USE,
    ModelFacts,
    Provider,
    ProviderRequest,
)
from parley.core.providers.openai_compat import OpenAICompatProvider, to_wire_messages
from tests.core.providers.conftest import TEST_KEY, TEST_OPENAI_MODEL
from tests.fakes.llm_common import (
    Hang,
    HttpError,
    RawResponse,
    Reply,
    StreamError,
    ToolCall,
    estimate_tokens,
)
from tests.fakes.openai_api import (
    FakeOpenAI,
    overloaded,
    prompt_segments,
    rate_limited,
    server_error,
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
        TEST_OPENAI_MODEL, SYSTEM, messages or (Message.user("hi"),), tools, max_tokens
    )


class TextSink:
    def __init__(self) -> None:
        self.deltas: list[str] = []

    async def __call__(self, text: str) -> None:
        self.deltas.append(text)


def data_line(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prompt_tokens(fake: FakeOpenAI) -> int:
    return sum(estimate_tokens(s) for s in prompt_segments(fake.last_body))


# -- the happy path ---------------------------------------------------------------------


async def test_is_a_provider(openai_provider: OpenAICompatProvider) -> None:
    assert isinstance(openai_provider, Provider)


async def test_streams_text_deltas_to_on_text(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    openai_fake.enqueue(Reply("One two three."))
    sink = TextSink()

    response = await openai_provider.complete(request(Message.user("count")), sink)

    assert sink.deltas == ["One ", "two ", "three."]
    assert response.content == (TextBlock("One two three."),)
    assert response.stop_reason == STOP_END
    assert response.model == TEST_OPENAI_MODEL


async def test_request_shape(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    await openai_provider.complete(request(Message.user("hello"), tools=(WEATHER,)))

    sent = openai_fake.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["Authorization"] == f"Bearer {TEST_KEY}"
    body = sent.body
    assert body["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hello"},
    ]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    # A compatible server gets the widely known name; OpenAI itself the new one.
    assert body["max_tokens"] == 256
    assert "max_completion_tokens" not in body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": WEATHER.description,
                "parameters": WEATHER.input_schema,
            },
        }
    ]


def test_openai_itself_gets_max_completion_tokens() -> None:
    provider = OpenAICompatProvider(TEST_OPENAI_MODEL, TEST_KEY)
    params = provider.build_params(request())
    assert params["max_completion_tokens"] == 256
    assert "max_tokens" not in params


# -- translation ----------------------------------------------------------------------------


def test_translation_of_tools_images_and_errors() -> None:
    history = (
        Message(
            "user", (TextBlock("see"), ImageBlock("image/png", "aGk="), ImageBlock("image/png", ""))
        ),
        Message(
            "assistant", (TextBlock("Checking."), ToolUseBlock("c1", "weather", {"city": "Oslo"}))
        ),
        Message(
            "tool_result", (ToolResultBlock("c1", "timeout", is_error=True), TextBlock("also this"))
        ),
        Message("assistant", (ToolUseBlock("c2", "weather", {"city": "Bergen"}),)),
    )

    wire = to_wire_messages("", history)

    assert wire == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}},
                {"type": "text", "text": "[image]"},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "[error] timeout"},
        {"role": "user", "content": "also this"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Bergen"}'},
                }
            ],
        },
    ]


# -- tools ----------------------------------------------------------------------------------


async def test_tool_call_round_trip(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    openai_fake.enqueue(
        Reply(
            "On it.",
            (
                ToolCall("weather", {"city": "Oslo"}, id="call_a"),
                ToolCall("weather", {"city": "Bergen", "units": "metric"}, id="call_b"),
            ),
        ),
        Reply("Oslo sunny, Bergen rain."),
    )
    question = Message.user("Weather in Oslo and Bergen?")

    first = await openai_provider.complete(request(question, tools=(WEATHER,)))

    assert first.stop_reason == STOP_TOOL_USE
    assert first.content == (
        TextBlock("On it."),
        ToolUseBlock("call_a", "weather", {"city": "Oslo"}),
        ToolUseBlock("call_b", "weather", {"city": "Bergen", "units": "metric"}),
    )
    results = Message(
        "tool_result", (ToolResultBlock("call_a", "sunny"), ToolResultBlock("call_b", "rain"))
    )
    final = await openai_provider.complete(
        request(question, first.message, results, tools=(WEATHER,))
    )

    assert final.message.text == "Oslo sunny, Bergen rain."
    sent = openai_fake.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assert json.loads(sent[2]["tool_calls"][1]["function"]["arguments"]) == {
        "city": "Bergen",
        "units": "metric",
    }
    assert [(m["tool_call_id"], m["content"]) for m in sent[3:]] == [
        ("call_a", "sunny"),
        ("call_b", "rain"),
    ]


async def test_unanswered_tool_call_is_an_invalid_request(
    openai_provider: OpenAICompatProvider,
) -> None:
    asked = Message("assistant", (ToolUseBlock("call_x", "weather", {"city": "Oslo"}),))
    with pytest.raises(InvalidRequestError) as caught:
        await openai_provider.complete(
            request(Message.user("q"), asked, Message.user("never mind"))
        )
    assert "call_x" in caught.value.message


async def test_malformed_arguments_are_kept_raw(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    openai_fake.enqueue(
        Reply(
            tool_calls=(
                ToolCall("weather", raw_arguments="{'city': Oslo", id="c1"),
                ToolCall("weather", raw_arguments="[1]", id="c2"),
            )
        )
    )
    response = await openai_provider.complete(request(tools=(WEATHER,)))
    assert response.content == (
        ToolUseBlock("c1", "weather", {"_raw": "{'city': Oslo"}),
        ToolUseBlock("c2", "weather", {"_raw": "[1]"}),
    )


def chunk(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return data_line({"object": "chat.completion.chunk", "model": "m", "choices": [choice]})


def call_delta(arguments: str, **fields: object) -> dict:
    return {"tool_calls": [{**fields, "function": {"name": "weather", "arguments": arguments}}]}


async def test_tool_call_without_id_then_stop(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    # Some local servers send no call id and say "stop" after a tool call.
    body = chunk(call_delta('{"city":"Oslo"}', index=0), "stop") + b"data: [DONE]\n\n"
    openai_fake.enqueue(RawResponse(body))
    response = await openai_provider.complete(request(tools=(WEATHER,)))
    assert response.content == (ToolUseBlock("call_0", "weather", {"city": "Oslo"}),)
    assert response.stop_reason == STOP_TOOL_USE


async def test_tool_calls_without_index_are_told_apart_by_id(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    body = (
        chunk(call_delta('{"city":', id="a"))
        + chunk({"tool_calls": [{"function": {"arguments": '"Oslo"}'}}]})
        + chunk(call_delta('{"city":"Bergen"}', id="b"), "tool_calls")
        + b"data: [DONE]\n\n"
    )
    openai_fake.enqueue(RawResponse(body))
    response = await openai_provider.complete(request(tools=(WEATHER,)))
    assert response.content == (
        ToolUseBlock("a", "weather", {"city": "Oslo"}),
        ToolUseBlock("b", "weather", {"city": "Bergen"}),
    )


async def test_stream_cut_before_finish_is_a_connection_error(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    openai_fake.enqueue(RawResponse(chunk({"content": "Hel"})))
    sink = TextSink()
    with pytest.raises(ProviderConnectionError) as caught:
        await openai_provider.complete(request(), sink)
    assert caught.value.retryable
    assert sink.deltas == ["Hel"]


CUT_REPLY = "x" * 40  # the fake counts 4 characters a token: 10 output tokens


@pytest.mark.parametrize(
    ("finish", "expected"), [("length", STOP_MAX_TOKENS), ("content_filter", STOP_REFUSAL)]
)
async def test_finish_reasons(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider, finish: str, expected: str
) -> None:
    openai_fake.enqueue(Reply(CUT_REPLY, stop_reason=finish))
    response = await openai_provider.complete(request(max_tokens=10))
    assert response.stop_reason == expected


# -- the window's edge: "length" that the window, not max_tokens, caused ----------------------


async def test_length_short_of_max_tokens_is_overflow_only_at_the_known_window(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    openai_fake.enqueue(Reply(CUT_REPLY, stop_reason="length"))
    first = await openai_provider.complete(request(max_tokens=500))
    # No published window (vLLM, OpenAI): a short "length" is a server's own output cap,
    # which no compaction cures.
    assert first.stop_reason == STOP_MAX_TOKENS
    window = first.usage.context_tokens + first.usage.output_tokens
    openai_provider.facts = ModelFacts(context_window=window, server="llama.cpp")
    openai_fake.enqueue(Reply(CUT_REPLY, stop_reason="length"))
    second = await openai_provider.complete(request(max_tokens=500))
    assert second.stop_reason == STOP_OVERFLOW
    assert second.message.text == CUT_REPLY  # kept: valid, and paid for
    assert second.usage.output_tokens == 10
    # Below the window, the same short reply is a server-side cap's.
    openai_provider.facts = ModelFacts(context_window=window + 1, server="llama.cpp")
    openai_fake.enqueue(Reply(CUT_REPLY, stop_reason="length"))
    third = await openai_provider.complete(request(max_tokens=500))
    assert third.stop_reason == STOP_MAX_TOKENS


async def test_length_at_max_tokens_is_the_caps_even_at_the_window_edge(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    openai_fake.enqueue(Reply(CUT_REPLY, stop_reason="length"))
    first = await openai_provider.complete(request(max_tokens=10))
    window = first.usage.context_tokens + first.usage.output_tokens
    openai_provider.facts = ModelFacts(context_window=window, server="llama.cpp")
    openai_fake.enqueue(Reply(CUT_REPLY, stop_reason="length"))
    second = await openai_provider.complete(request(max_tokens=10))
    # Cap and window reached together: a retry would be cut the same way.
    assert second.stop_reason == STOP_MAX_TOKENS


async def test_length_without_usage_stays_max_tokens() -> None:
    async with FakeOpenAI(api_key=TEST_KEY, report_usage=False) as fake:
        provider = OpenAICompatProvider(TEST_OPENAI_MODEL, TEST_KEY, base_url=fake.base_url)
        try:
            fake.enqueue(Reply(CUT_REPLY, stop_reason="length"))
            response = await provider.complete(request(max_tokens=500))
        finally:
            await provider.aclose()
    assert response.stop_reason == STOP_MAX_TOKENS  # nothing to tell the two apart by


# -- usage ----------------------------------------------------------------------------------


async def test_usage_subtracts_cached_tokens(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider
) -> None:
    conversation = [Message.user("first question")]
    first = await openai_provider.complete(request(*conversation))
    first_prompt = prompt_tokens(openai_fake)
    conversation += [first.message, Message.user("second")]
    second = await openai_provider.complete(request(*conversation))
    second_prompt = prompt_tokens(openai_fake)

    assert first.usage.input_tokens == first_prompt
    assert first.usage.cache_read_tokens == 0
    assert first.usage.output_tokens == estimate_tokens("echo: first question")
    assert second.usage.cache_read_tokens == first_prompt
    assert second.usage.input_tokens == second_prompt - first_prompt
    assert second.usage.context_tokens == second_prompt


async def test_server_without_usage_gives_zeros() -> None:
    async with FakeOpenAI(api_key=TEST_KEY, report_usage=False) as fake:
        provider = OpenAICompatProvider(TEST_OPENAI_MODEL, TEST_KEY, base_url=fake.base_url)
        try:
            response = await provider.complete(request(Message.user("hey")))
        finally:
            await provider.aclose()
    assert response.message.text == "echo: hey"
    assert response.usage.to_dict() == {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "expected_after"),
    [
        (rate_limited(retry_after=2), 2.0),
        (rate_limited(retry_after=2, retry_after_ms=25), 0.025),
        (rate_limited(), None),
    ],
)
async def test_rate_limit_carries_retry_after(
    openai_fake: FakeOpenAI,
    openai_provider: OpenAICompatProvider,
    step: HttpError,
    expected_after: float | None,
) -> None:
    openai_fake.enqueue(step)
    with pytest.raises(RateLimitError) as caught:
        await openai_provider.complete(request())
    assert caught.value.retry_after == expected_after
    assert caught.value.status == 429


@pytest.mark.parametrize(
    ("step", "error_class", "status"),
    [
        (server_error(), ServerError, 500),
        (overloaded(), OverloadedError, 503),
        (
            HttpError(
                429,
                "insufficient_quota",
                "You exceeded your current quota",
                code="insufficient_quota",
            ),
            InvalidRequestError,
            429,
        ),
        (
            HttpError(
                404, "invalid_request_error", "The model `x` does not exist", code="model_not_found"
            ),
            InvalidRequestError,
            404,
        ),
        (RawResponse(b"upstream connect error", 502, "text/plain"), ServerError, 502),
    ],
)
async def test_status_errors_are_typed(
    openai_fake: FakeOpenAI,
    openai_provider: OpenAICompatProvider,
    step: HttpError | RawResponse,
    error_class: type[Exception],
    status: int,
) -> None:
    openai_fake.enqueue(step)
    with pytest.raises(error_class) as caught:
        await openai_provider.complete(request())
    assert type(caught.value) is error_class
    assert caught.value.status == status


async def test_wrong_key_is_an_authentication_error(openai_fake: FakeOpenAI) -> None:
    provider = OpenAICompatProvider(TEST_OPENAI_MODEL, "sk-wrong", base_url=openai_fake.base_url)
    try:
        with pytest.raises(AuthenticationError) as caught:
            await provider.complete(request())
    finally:
        await provider.aclose()
    assert caught.value.status == 401


@pytest.mark.parametrize(
    ("error_type", "error_class"),
    [
        ("server_error", ServerError),
        ("overloaded_error", OverloadedError),
        ("invalid_request_error", InvalidRequestError),
    ],
)
async def test_error_inside_a_stream_is_classified_by_type(
    openai_fake: FakeOpenAI,
    openai_provider: OpenAICompatProvider,
    error_type: str,
    error_class: type[Exception],
) -> None:
    openai_fake.enqueue(StreamError(error_type, "failed mid-way", partial_text="Half"))
    sink = TextSink()
    with pytest.raises(error_class) as caught:
        await openai_provider.complete(request(), sink)
    assert type(caught.value) is error_class
    assert caught.value.message == "failed mid-way"
    assert sink.deltas == ["Half"]


@pytest.mark.parametrize("partial", [None, "Started"])
async def test_hung_stream_times_out(openai_fake: FakeOpenAI, partial: str | None) -> None:
    provider = OpenAICompatProvider(
        TEST_OPENAI_MODEL, TEST_KEY, base_url=openai_fake.base_url, stall_timeout=0.3
    )
    openai_fake.enqueue(Hang(partial))
    try:
        with pytest.raises(ProviderTimeoutError) as caught:
            await provider.complete(request())
    finally:
        await provider.aclose()
    assert openai_fake.hangs_started == 1
    assert caught.value.message == "no data for 0.3 s"  # headers or events: both silence


async def test_connection_refused_is_a_connection_error() -> None:
    provider = OpenAICompatProvider(
        TEST_OPENAI_MODEL, TEST_KEY, base_url=f"http://127.0.0.1:{free_port()}/v1"
    )
    try:
        with pytest.raises(ProviderConnectionError):
            await provider.complete(request())
    finally:
        await provider.aclose()


@pytest.mark.parametrize(
    "body",
    [
        b"data: {not json\n\n",
        b"<html>hello</html>",
        data_line({"object": "chat.completion.chunk", "model": "m", "choices": None}),
        data_line({"object": "list", "data": []}),
    ],
)
async def test_unreadable_answers(
    openai_fake: FakeOpenAI, openai_provider: OpenAICompatProvider, body: bytes
) -> None:
    openai_fake.enqueue(RawResponse(body))
    with pytest.raises(MalformedResponseError):
        await openai_provider.complete(request())


# -- context overflow -------------------------------------------------------------------


async def test_openai_overflow_with_numbers() -> None:
    async with FakeOpenAI(api_key=TEST_KEY, context_window=30) as fake:
        provider = OpenAICompatProvider(TEST_OPENAI_MODEL, TEST_KEY, base_url=fake.base_url)
        try:
            with pytest.raises(ContextOverflowError) as caught:
                await provider.complete(request(Message.user("y" * 300)))
        finally:
            await provider.aclose()
        assert caught.value.observed_tokens == prompt_tokens(fake)
    assert caught.value.limit == 30


@pytest.mark.parametrize("dialect", ["openai", "vllm"])
async def test_overflow_counting_the_completion(dialect: str) -> None:
    async with FakeOpenAI(api_key=TEST_KEY, context_window=60, dialect=dialect) as fake:  # type: ignore[arg-type]
        provider = OpenAICompatProvider(TEST_OPENAI_MODEL, TEST_KEY, base_url=fake.base_url)
        try:
            with pytest.raises(ContextOverflowError) as caught:
                await provider.complete(request(max_tokens=50))
        finally:
            await provider.aclose()
        prompt = prompt_tokens(fake)
    assert prompt <= 60
    assert caught.value.observed_tokens == prompt + 50
    assert caught.value.limit == 60


async def test_llamacpp_overflow_reads_numbers_from_the_body() -> None:
    async with FakeOpenAI(api_key=TEST_KEY, context_window=20, dialect="llamacpp") as fake:
        provider = OpenAICompatProvider(TEST_OPENAI_MODEL, TEST_KEY, base_url=fake.base_url)
        try:
            with pytest.raises(ContextOverflowError) as caught:
                await provider.complete(request(Message.user("z" * 200)))
        finally:
            await provider.aclose()
        assert caught.value.observed_tokens == prompt_tokens(fake)
    assert caught.value.limit == 20


@pytest.mark.parametrize(("server", "sent"), [("llama.cpp", True), ("vllm", False), ("", False)])
def test_the_small_profiles_sampling_goes_only_to_a_llama_cpp_server(
    server: str, sent: bool
) -> None:
    provider = OpenAICompatProvider("m", "k", base_url="http://127.0.0.1:9/v1")
    provider.facts = ModelFacts(server=server)
    assert provider.use_sampling({"repeat_penalty": 1.15, "repeat_last_n": 256}) is sent
    request = ProviderRequest(model="m", system="s", messages=(Message.user("hi"),))
    params = provider.build_params(request)
    if sent:
        assert params["extra_body"] == {"repeat_penalty": 1.15, "repeat_last_n": 256}
    else:
        assert "extra_body" not in params
