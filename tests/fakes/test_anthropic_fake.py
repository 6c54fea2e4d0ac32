"""The fake Messages API's prompt-cache accounting, window, billing and responder.

Requests go over HTTP with aiohttp (it ignores proxy variables), as plain JSON, so
each test sees exactly the wire body the fake accounts; the provider tests cover the
real SDK against the same fake.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes.anthropic_api import (
    FakeAnthropic,
    block_indexes,
    overloaded,
    prompt_segments,
    prompt_tokens,
)
from tests.fakes.llm_common import (
    CACHE_LOOKBACK_BLOCKS,
    DEFAULT_CACHE_TTL_SECONDS,
    Billing,
    PrefixCache,
    Reply,
    Step,
    estimate_tokens,
)

KEY = "sk-test"
EPHEMERAL = {"type": "ephemeral"}
SYSTEM_TEXT = "You are a careful assistant. " * 40  # ~300 tokens, a sizeable prefix


class Clock:
    """Virtual time: tests move it forward instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def fake(clock: Clock) -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(api_key=KEY, clock=clock) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def text(value: str, *, cached: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": value}
    if cached:
        block["cache_control"] = dict(EPHEMERAL)
    return block


def body(*messages: dict[str, Any], max_tokens: int = 64, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-test-model",
        "max_tokens": max_tokens,
        "system": [text(SYSTEM_TEXT, cached=True)],
        "messages": list(messages),
        **extra,
    }


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


async def post(
    http: aiohttp.ClientSession, fake: FakeAnthropic, payload: dict[str, Any], path: str = ""
) -> tuple[int, dict[str, Any]]:
    async with http.post(
        f"{fake.base_url}/v1/messages{path}", json=payload, headers={"x-api-key": KEY}
    ) as response:
        return response.status, await response.json()


async def usage_of(
    http: aiohttp.ClientSession, fake: FakeAnthropic, payload: dict[str, Any]
) -> dict[str, int]:
    status, answer = await post(http, fake, payload)
    assert status == 200, answer
    return answer["usage"]


def tokens_through(payload: dict[str, Any], segment: int) -> int:
    """Prompt tokens of the prefix ending at segment index ``segment``."""
    segments, _ = prompt_segments(payload)
    return sum(estimate_tokens(s) for s in segments[: segment + 1])


# -- usage arithmetic --------------------------------------------------------------------


async def test_first_call_writes_and_the_same_prefix_is_read_next(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    first = body(user(text("question one", cached=True)))
    second = body(
        user(text("question one")),
        assistant(text("answer one")),
        user(text("question two", cached=True)),
    )

    write = await usage_of(http, fake, first)
    read = await usage_of(http, fake, second)

    assert write["cache_read_input_tokens"] == 0
    assert write["cache_creation_input_tokens"] == prompt_tokens(first)
    assert write["input_tokens"] == 0
    # The new breakpoint is 2 blocks past the old one: the lookback finds the old entry
    # (the cache_control marker itself is not part of the prefix).
    assert read["cache_read_input_tokens"] == prompt_tokens(first)
    assert read["cache_creation_input_tokens"] == prompt_tokens(second) - prompt_tokens(first)
    assert read["input_tokens"] == 0


async def test_tokens_after_the_last_breakpoint_are_plain_input(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    payload = body(user(text("cached part", cached=True), text("fresh tail " * 10)))
    usage = await usage_of(http, fake, payload)
    through_marker = tokens_through(payload, 2)  # system, role marker, the marked block
    assert usage["cache_creation_input_tokens"] == through_marker
    assert usage["input_tokens"] == prompt_tokens(payload) - through_marker
    assert usage["cache_read_input_tokens"] == 0


async def test_no_breakpoint_means_no_cache_at_all(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    payload = body(user(text("hello")))
    payload["system"] = [text(SYSTEM_TEXT)]
    for _ in range(2):
        usage = await usage_of(http, fake, payload)
        assert usage["input_tokens"] == prompt_tokens(payload)
        assert usage["cache_read_input_tokens"] == usage["cache_creation_input_tokens"] == 0


# -- lifetime on the virtual clock ------------------------------------------------------------


async def test_entry_expires_after_the_ttl(
    fake: FakeAnthropic, http: aiohttp.ClientSession, clock: Clock
) -> None:
    payload = body(user(text("same question", cached=True)))
    await usage_of(http, fake, payload)

    clock.now += DEFAULT_CACHE_TTL_SECONDS - 1
    assert (await usage_of(http, fake, payload))["cache_read_input_tokens"] == prompt_tokens(
        payload
    )

    # That read restarted the lifetime; a full TTL after it, the entry is gone.
    clock.now += DEFAULT_CACHE_TTL_SECONDS
    expired = await usage_of(http, fake, payload)
    assert expired["cache_read_input_tokens"] == 0
    assert expired["cache_creation_input_tokens"] == prompt_tokens(payload)


async def test_a_read_refreshes_the_lifetime(
    fake: FakeAnthropic, http: aiohttp.ClientSession, clock: Clock
) -> None:
    payload = body(user(text("same question", cached=True)))
    await usage_of(http, fake, payload)  # written at t0
    clock.now += 200
    await usage_of(http, fake, payload)  # read at t0 + 200: lives until t0 + 500
    clock.now += 250  # t0 + 450: past the first write's TTL, within the read's
    usage = await usage_of(http, fake, payload)
    assert usage["cache_read_input_tokens"] == prompt_tokens(payload)
    assert usage["cache_creation_input_tokens"] == 0


async def test_a_read_through_the_lookback_refreshes_the_entry_it_found(
    fake: FakeAnthropic, http: aiohttp.ClientSession, clock: Clock
) -> None:
    def asking(*tail: str) -> dict[str, Any]:
        blocks = [text("anchor", cached=not tail)]
        blocks += [text(t, cached=i == len(tail) - 1) for i, t in enumerate(tail)]
        payload = body(user(*blocks))
        payload["system"] = [text(SYSTEM_TEXT)]
        return payload

    anchor = asking()
    await usage_of(http, fake, anchor)  # written at t0, no other entry
    clock.now += 200
    # Found 2 blocks back, not at a breakpoint of this request: the read alone refreshes it.
    assert (await usage_of(http, fake, asking("b1", "b2")))["cache_read_input_tokens"] == (
        prompt_tokens(anchor)
    )
    clock.now += 250  # t0 + 450: alive only thanks to that read
    usage = await usage_of(http, fake, asking("c1", "c2", "c3"))
    assert usage["cache_read_input_tokens"] == prompt_tokens(anchor)


async def test_configured_ttl(clock: Clock, http: aiohttp.ClientSession) -> None:
    async with FakeAnthropic(api_key=KEY, clock=clock, cache_ttl_seconds=3600) as fake:
        payload = body(user(text("same question", cached=True)))
        await usage_of(http, fake, payload)
        clock.now += 3599
        assert (await usage_of(http, fake, payload))["cache_read_input_tokens"] > 0
        clock.now += 3600
        assert (await usage_of(http, fake, payload))["cache_read_input_tokens"] == 0


async def test_clock_can_be_swapped_on_a_running_fake(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    fake.clock = lambda: 0.0
    payload = body(user(text("q", cached=True)))
    await usage_of(http, fake, payload)
    fake.clock = lambda: DEFAULT_CACHE_TTL_SECONDS  # exactly one TTL later: expired
    assert (await usage_of(http, fake, payload))["cache_read_input_tokens"] == 0


# -- lookback window ---------------------------------------------------------------------------


def padded(extra_blocks: int, *, marks: tuple[int, ...] = ()) -> dict[str, Any]:
    """The first request's prompt plus ``extra_blocks`` new blocks, the last one marked;
    ``marks`` are indexes of extra blocks that get a breakpoint too."""
    blocks = [text("anchor block")]
    blocks += [
        text(f"extra {i}", cached=i in marks or i == extra_blocks - 1) for i in range(extra_blocks)
    ]
    return body(user(*blocks))


@pytest.mark.parametrize(
    ("extra", "hit"),
    [(CACHE_LOOKBACK_BLOCKS - 1, True), (CACHE_LOOKBACK_BLOCKS, False)],
)
async def test_read_looks_back_at_most_20_blocks(
    fake: FakeAnthropic, http: aiohttp.ClientSession, extra: int, hit: bool
) -> None:
    # No system breakpoint: the anchor entry is the only one there is to find.
    first = body(user(text("anchor block", cached=True)))
    first["system"] = [text(SYSTEM_TEXT)]
    later = padded(extra)
    later["system"] = [text(SYSTEM_TEXT)]
    await usage_of(http, fake, first)

    usage = await usage_of(http, fake, later)

    # With ``extra`` new blocks the anchor is ``extra`` boundaries before the breakpoint;
    # the breakpoint's own boundary counts as the first of the 20 positions.
    assert usage["cache_read_input_tokens"] == (prompt_tokens(first) if hit else 0)


async def test_a_nearer_breakpoint_reaches_an_older_entry(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    first = body(user(text("anchor block", cached=True)))
    first["system"] = [text(SYSTEM_TEXT)]
    later = padded(40, marks=(3,))
    later["system"] = [text(SYSTEM_TEXT)]
    await usage_of(http, fake, first)
    assert (await usage_of(http, fake, later))["cache_read_input_tokens"] == prompt_tokens(first)


def test_role_markers_are_not_blocks() -> None:
    payload = body(user(text("a"), text("b")), assistant(text("c")), user(text("d")))
    payload["tools"] = [{"name": "t", "description": "d", "input_schema": {"type": "object"}}]
    segments, _ = prompt_segments(payload)
    kinds = [segments[i].get("type", "tool") for i in block_indexes(segments)]
    assert kinds == ["tool", "text", "text", "text", "text", "text"]


# -- minimum cacheable size ---------------------------------------------------------------------


async def test_prefix_below_the_minimum_is_neither_written_nor_read(
    clock: Clock, http: aiohttp.ClientSession
) -> None:
    short = body(user(text("tiny", cached=True)))
    short["system"] = [text("Be brief.")]
    minimum = prompt_tokens(short) + 1
    async with FakeAnthropic(api_key=KEY, clock=clock, min_cache_tokens=minimum) as fake:
        for _ in range(2):
            usage = await usage_of(http, fake, short)
            assert usage["cache_creation_input_tokens"] == 0
            assert usage["cache_read_input_tokens"] == 0
            assert usage["input_tokens"] == prompt_tokens(short)
        assert len(fake.cache) == 0


async def test_only_breakpoints_past_the_minimum_count(
    clock: Clock, http: aiohttp.ClientSession
) -> None:
    payload = body(user(text("question " * 50, cached=True)))  # system mark: small prefix
    system_prefix = tokens_through(payload, 0)
    async with FakeAnthropic(api_key=KEY, clock=clock, min_cache_tokens=system_prefix + 1) as fake:
        usage = await usage_of(http, fake, payload)
        assert usage["cache_creation_input_tokens"] == prompt_tokens(payload)
        # Another question shares only the too-small system prefix: nothing to read.
        other = body(user(text("other " * 50, cached=True)))
        assert (await usage_of(http, fake, other))["cache_read_input_tokens"] == 0


# -- window ------------------------------------------------------------------------------------


async def test_window_counts_tools_and_system(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    payload = body(user(text("short question")), max_tokens=1)
    payload["tools"] = [
        {"name": f"tool_{i}", "description": "x" * 400, "input_schema": {"type": "object"}}
        for i in range(5)
    ]
    messages_only = sum(
        estimate_tokens(s) for s in prompt_segments({"messages": payload["messages"]})[0]
    )
    total = prompt_tokens(payload)
    fake.context_window = total - 1
    assert messages_only < fake.context_window
    fake.enqueue(Reply("never sent"))

    status, answer = await post(http, fake, payload)

    assert status == 400
    assert answer["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {total} tokens > {total - 1} maximum",
    }
    # Rejected before the model: the script step is still there and nothing is billed.
    assert list(fake.script) == [Reply("never sent")]
    assert fake.billing == Billing()
    assert len(fake.cache) == 0


async def test_window_counts_max_tokens_too(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    payload = body(user(text("q")), max_tokens=50)
    total = prompt_tokens(payload)
    fake.context_window = total + 49
    status, answer = await post(http, fake, payload)
    assert status == 400
    assert answer["error"]["message"] == (
        f"input length and `max_tokens` exceed context limit: {total} + 50 > {total + 49}, "
        "decrease input length or `max_tokens` and try again"
    )
    fake.context_window = total + 50
    assert (await post(http, fake, payload))[0] == 200


async def test_count_tokens_matches_the_window_count(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    payload = body(user(text("count me")))
    status, answer = await post(http, fake, payload, "/count_tokens")
    assert status == 200
    assert answer == {"input_tokens": prompt_tokens(payload)}
    assert fake.requests_bodies == []  # count_tokens is not a Messages call


# -- billing -------------------------------------------------------------------------------------


async def test_billing_sums_every_answered_request(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    fake.enqueue(Reply("one two three"), overloaded(), Reply("four"))
    first = body(user(text("q1", cached=True)))
    second = body(user(text("q1")), assistant(text("a1")), user(text("q2", cached=True)))
    usages = [await usage_of(http, fake, first)]
    assert (await post(http, fake, second))[0] == 529  # an error is not billed
    usages.append(await usage_of(http, fake, second))

    billing = fake.billing
    assert billing.requests == 2
    assert billing.input_tokens == sum(u["input_tokens"] for u in usages)
    assert billing.cache_read_tokens == sum(u["cache_read_input_tokens"] for u in usages)
    assert billing.cache_write_tokens == sum(u["cache_creation_input_tokens"] for u in usages)
    assert billing.output_tokens == estimate_tokens("one two three") + estimate_tokens("four")
    assert billing.prompt_tokens == prompt_tokens(first) + prompt_tokens(second)
    assert billing.cache_read_share == billing.cache_read_tokens / billing.prompt_tokens
    assert fake.usages == usages
    assert fake.last_usage == usages[-1]
    assert fake.requests_bodies == [first, second, second]


async def test_streamed_usage_is_billed_like_a_whole_message(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    fake.enqueue(Reply("streamed words here"))
    async with http.post(
        f"{fake.base_url}/v1/messages",
        json=body(user(text("q", cached=True)), stream=True),
        headers={"x-api-key": KEY},
    ) as response:
        assert response.status == 200
        await response.read()
    assert fake.billing.requests == 1
    assert fake.billing.output_tokens == estimate_tokens("streamed words here")
    usage = fake.last_usage
    assert usage is not None
    assert fake.billing.cache_write_tokens == usage["cache_creation_input_tokens"] > 0


def test_weighted_input_prices_reads_and_writes() -> None:
    billing = Billing(requests=2, input_tokens=100, cache_read_tokens=1000, cache_write_tokens=200)
    assert billing.weighted_input() == pytest.approx(100 + 100 + 250)
    assert billing.weighted_input(read_price=0.5, write_price=1.0) == pytest.approx(800)
    assert Billing().cache_read_share == 0.0


# -- responder ------------------------------------------------------------------------------------


async def test_responder_answers_when_the_script_is_empty(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    seen: list[dict[str, Any]] = []

    def respond(request: dict[str, Any]) -> Step | None:
        seen.append(request)
        said = request["messages"][-1]["content"][-1]["text"]
        return Reply("summary!") if said.startswith("Summarize") else None

    fake.responder = respond
    fake.enqueue(Reply("scripted first"))
    answers = []
    for question in ("Summarize this", "Summarize that", "plain question"):
        status, answer = await post(http, fake, body(user(text(question))))
        assert status == 200
        answers.append(answer["content"][0]["text"])

    assert answers == ["scripted first", "summary!", "echo: plain question"]
    # The script came first; the responder saw only the later two bodies.
    assert [r["messages"][-1]["content"][-1]["text"] for r in seen] == [
        "Summarize that",
        "plain question",
    ]


async def test_responder_can_return_errors(
    fake: FakeAnthropic, http: aiohttp.ClientSession
) -> None:
    fake.responder = lambda request: overloaded()
    status, answer = await post(http, fake, body(user(text("q"))))
    assert status == 529
    assert answer["error"]["type"] == "overloaded_error"


# -- the cache alone ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    marks=st.lists(st.integers(0, 29), min_size=1, max_size=4),
    minimum=st.integers(0, 200),
    rounds=st.integers(1, 3),
)
def test_cache_never_bills_more_than_the_prompt(
    sizes: list[int], marks: list[int], minimum: int, rounds: int
) -> None:
    segments = [f"s{i}" + "x" * size for i, size in enumerate(sizes)]
    breakpoints = sorted({m for m in marks if m < len(segments)}) or [len(segments) - 1]
    cache = PrefixCache()
    total_to_last = sum(estimate_tokens(s) for s in segments[: breakpoints[-1] + 1])
    for round_number in range(rounds):
        read, written = cache.account(
            segments,
            breakpoints,
            minimum,
            now=float(round_number),
            ttl_seconds=300,
            lookback_blocks=20,
        )
        assert read >= 0 and written >= 0
        assert read + written <= total_to_last
        assert read == 0 or read >= minimum
        if round_number:
            # The same prompt again: what was written is now read, nothing more written.
            assert written == 0


def test_expired_entries_leave_the_cache_and_refreshed_ones_stay() -> None:
    cache = PrefixCache()
    segments = [{"type": "text", "text": f"segment {i} " * 50} for i in range(3)]
    for second in range(100):  # a new prefix each second, plus the shared one refreshed
        cache.account(
            [*segments, {"type": "text", "text": f"turn {second} " * 50}],
            [2, 3],
            min_tokens=1,
            now=float(second),
            ttl_seconds=10.0,
        )
    # The shared prefix (read every second) and the last ten seconds' own prefixes.
    assert len(cache) == 1 + 10
    cache.account(segments, [2], min_tokens=1, now=200.0, ttl_seconds=10.0)
    assert len(cache) == 1  # everything else lapsed; the one just written is there


async def test_a_fake_told_to_keep_the_newest_requests_keeps_only_those() -> None:
    async with FakeAnthropic(keep_requests=2) as fake, aiohttp.ClientSession() as http:
        for word in ("one", "two", "three"):
            payload = {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": word}],
            }
            async with http.post(
                f"{fake.base_url}/v1/messages", json=payload, headers={"x-api-key": fake.api_key}
            ) as response:
                assert response.status == 200
        assert [r.body["messages"][0]["content"] for r in fake.requests] == ["two", "three"]
        assert len(fake.usages) == 2
