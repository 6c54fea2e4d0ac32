"""Transcript entries read from their lines: what a short entry keeps, and that it
reads back exactly as an entry holding its parsed JSON does."""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.core.context.pruning import PRUNE_CUSTOM_TYPE
from parley.core.errors import TranscriptError
from parley.core.messages import Message
from parley.core.transcript import Entry
from parley.core.transcript import entries as entries_module


def line(entry_id: str, kind: str, **payload: object) -> bytes:
    record = {"id": entry_id, "parent_id": None, "ts": "2026-11-26T10:00:00.000Z", "type": kind}
    return json.dumps({**record, **payload}, separators=(",", ":")).encode()


USER = {
    "message": {"role": "user", "content": [{"type": "text", "text": "hello"}]},
    "meta": {"inbox_ids": [29], "message_ids": ["7028:29"]},
    "tokens": {"cl100k_base/1": 12},
}
DELIVERY = {"custom_type": "delivery", "data": {"inbox_ids": [29], "ok": True}}


@pytest.mark.parametrize("payload", [USER, DELIVERY], ids=["message", "custom"])
def test_an_entry_from_its_line_reads_as_one_from_its_json(payload: dict[str, object]) -> None:
    kind = "message" if "message" in payload else "custom"
    stored = line("e1", kind, **payload)
    from_line = Entry.from_json(stored)
    from_json = Entry("e1", None, "2026-11-26T10:00:00.000Z", kind, json.loads(json.dumps(payload)))
    assert from_line == from_json and hash(from_line) == hash(from_json)
    assert from_line.payload == payload
    assert from_line.to_dict() == from_json.to_dict()
    assert from_line.meta == from_json.meta and from_line.usage == from_json.usage
    assert from_line.custom_type == (None if kind == "message" else "delivery")
    assert from_line.stored_tokens == (USER["tokens"] if kind == "message" else None)


def test_a_kept_line_is_given_back_as_it_was_stored_and_its_payload_cannot_be_changed() -> None:
    # As someone might write it by hand: spaces, and keys in another order.
    stored = (
        b'{"type": "message", "id": "e1", "ts": "2026-11-26T10:00:00Z", "parent_id": null, '
        b'"message": {"content": [{"type": "text", "text": "caf\\u00e9"}], "role": "user"}}'
    )
    entry = Entry.from_json(stored)
    assert entry.to_json() == stored.decode()
    assert entry.message.text == "café"
    entry.payload["message"] = "changed"  # a copy: the entry is as it was
    assert entry.payload["message"]["role"] == "user"
    with pytest.raises(AttributeError, match="read-only"):
        entry.id = "e2"  # type: ignore[misc]


def test_a_long_entry_keeps_its_json_and_shares_its_text_with_its_message() -> None:
    text = "x" * (entries_module.COMPACT_LINE_BYTES + 1)
    payload = {"message": Message.user(text).to_dict()}
    entry = Entry.from_json(line("e1", "message", **payload))
    # One copy of the text in memory: the message's block is the payload's string.
    assert entry.message.text is entry.payload["message"]["content"][0]["text"]
    assert entry.payload is entry.payload


def test_a_window_of_short_entries_takes_less_than_four_times_its_bytes() -> None:
    """This window of short messages and delivery records takes 6.9 times its lines'
    bytes kept as parsed JSON (``COMPACT_LINE_BYTES`` = 0), 2.6 kept as lines."""
    lines: list[bytes] = []
    for n in range(300):
        lines.append(line(f"u{n}", "message", **USER))
        lines.append(
            line(
                f"a{n}",
                "message",
                message=Message.assistant(f"reply-to: r{n}\necho: hello").to_dict(),
                usage={"input": 0, "output": 10, "cache_read": 1093, "cache_write": 49},
                meta={"model": "claude", "stop_reason": "end_turn", "called_at": "2026-11-26"},
                tokens={"cl100k_base/1": 21},
            )
        )
        lines.append(line(f"d{n}", "custom", **DELIVERY))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        window = entries_module.parse_entries_or_none(lines)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(entry is not None for entry in window)
    assert held < 4.0 * sum(len(one) + 1 for one in lines)


def test_prune_decisions_stay_parsed_and_a_line_without_a_parent_reads_as_before() -> None:
    # The context applies every recorded prune to every view: read once, not per turn.
    assert PRUNE_CUSTOM_TYPE in entries_module.PARSED_CUSTOM_TYPES
    prune = Entry.from_json(line("p1", "custom", custom_type=PRUNE_CUSTOM_TYPE, data={"a": 1}))
    assert prune.payload is prune.payload
    legacy = b'{"id":"e1","ts":"2026-11-26T10:00:00Z","type":"custom","custom_type":"x"}'
    entry = Entry.from_json(legacy)
    assert entry.to_dict() == {
        "id": "e1",
        "parent_id": None,
        "ts": "2026-11-26T10:00:00Z",
        "type": "custom",
        "custom_type": "x",
    }


# -- the window's fast read (``_Head``) against the whole parse, line by line ---------------

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
BLOCK = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("text"), "text": TEXT},
        optional={"fence": st.sampled_from(["turn-context", "recalled-memory", "bogus", 3])},
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": TEXT, "name": TEXT, "input": st.just({"q": 1.5})}
    ),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": TEXT, "content": TEXT}),
    st.fixed_dictionaries({"type": st.just("image"), "media_type": st.just("image/png")}),
    st.just({"type": "video"}),  # unknown: the entry is unreadable
    st.just("not a block"),  # unreadable too, and no crash
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "robot"])},
    optional={"content": st.one_of(st.lists(BLOCK, max_size=3), TEXT)},
)
PAYLOAD = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("message"), "message": st.one_of(MESSAGE, st.just("not an object"))},
        optional={
            "tokens": st.one_of(st.just({"cl100k_base/1": 12}), st.just([12])),
            "meta": st.just({"inbox_ids": [3]}),
            "usage": st.just({"input": 1, "output": 2}),
            "pad": st.integers(0, 5_000).map(lambda n: "p" * n),  # some lines too long to keep
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("custom")},
        optional={
            "custom_type": st.sampled_from(["delivery", PRUNE_CUSTOM_TYPE, 7]),
            "data": st.just({"ok": True}),
            "message": st.just({"role": "user", "content": "ignored: not a message entry"}),
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("compaction")},
        optional={"summary": st.sampled_from(["s", 1]), "first_kept_entry_id": st.just("e0")},
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["future-kind", "session", 5])}),
)
WELL_FORMED_ENVELOPE = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["e1", "e2"]),
        "parent_id": st.sampled_from([None, "e1", "e2"]),
        "ts": st.just("2026-11-26T10:00:00.000Z"),
    }
)
ODD_ENVELOPE = st.fixed_dictionaries(
    {},
    optional={
        "id": st.sampled_from(["e1", "e2", "", 4]),
        "parent_id": st.sampled_from([None, "e1", "e2", 9]),
        "ts": st.sampled_from(["2026-11-26T10:00:00.000Z", None]),
    },
)
# Mostly well formed, so that what follows the envelope is what decides.
ENVELOPE = st.one_of(WELL_FORMED_ENVELOPE, WELL_FORMED_ENVELOPE, ODD_ENVELOPE)


def encoded(record: dict[str, object], ascii_only: bool) -> bytes:
    # The store writes UTF-8 as it is (encode_record); escaped is JSON too.
    return json.dumps(record, ensure_ascii=ascii_only).encode()


def with_bad_byte(record: dict[str, object], ascii_only: bool) -> bytes:
    """The line with a byte that is not UTF-8 in a field the fast read skips."""
    return encoded({**record, "meta": {"note": "MARK"}}, ascii_only).replace(b"MARK", b"\xff")


RECORD = st.builds(lambda env, payload: {**env, **payload}, ENVELOPE, PAYLOAD)
LINE = st.one_of(
    st.builds(encoded, RECORD, st.booleans()),
    st.builds(with_bad_byte, RECORD, st.booleans()),
    st.sampled_from([b"[1, 2]", b'"text"', b"{not json", b'{"id":"e1"},{"id":"e2"}', b"NaN"]),
    # A lone surrogate's escape: json takes it, msgspec does not.
    st.just(b'{"id":"e3","ts":"t","type":"message","message":{"role":"user","content":"\\ud800"}}'),
)


def whole(one: bytes) -> Entry | None:
    """The entry the line holds as the whole parse reads it (``Entry.from_raw``)."""
    try:
        return Entry.from_raw(json.loads(one), line=one)
    except (ValueError, TranscriptError):
        return None


def same_entry(got: Entry | None, expected: Entry | None) -> None:
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.id, got.parent_id, got.ts, got.type) == (
        expected.id,
        expected.parent_id,
        expected.ts,
        expected.type,
    )
    assert got.custom_type == expected.custom_type
    assert got.stored_tokens == expected.stored_tokens
    assert got.payload == expected.payload
    assert got.to_json() == expected.to_json()
    if expected.type == "message":
        assert got.message == expected.message


@settings(max_examples=300, deadline=None)
@given(st.lists(LINE, min_size=1, max_size=8))
def test_a_window_read_fast_holds_what_the_whole_parse_of_each_line_does(
    lines: list[bytes],
) -> None:
    window = entries_module.parse_entries_or_none(lines)
    assert len(window) == len(lines)
    for got, one in zip(window, lines, strict=True):
        same_entry(got, whole(one))
        try:
            single: Entry | None = Entry.from_json(one)
        except TranscriptError:
            single = None
        same_entry(single, whole(one))


GOOD_PAYLOAD = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "message": st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "assistant"]),
                    "content": st.lists(BLOCK.filter(lambda b: b != "not a block"), max_size=3),
                }
            ),
        },
        optional={"tokens": st.just({"cl100k_base/1": 12}), "meta": st.just({"é": [1]})},
    ),
    st.fixed_dictionaries(
        {"type": st.just("custom"), "custom_type": st.sampled_from(["delivery", "x"])},
        optional={"data": st.just({"ok": True})},
    ),
    st.just({"type": "compaction", "summary": "s", "first_kept_entry_id": None}),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(GOOD_PAYLOAD, min_size=2, max_size=12), st.booleans())
def test_a_window_of_entries_reads_fast_as_the_whole_parse_does(
    payloads: list[dict[str, object]], ascii_only: bool
) -> None:
    lines, parent = [], None
    for n, payload in enumerate(payloads):
        envelope = {"id": f"e{n}", "parent_id": parent, "ts": "2026-11-26T10:00:00.000Z"}
        lines.append(encoded({**envelope, **payload}, ascii_only))
        parent = f"e{n}"
    window = entries_module.parse_entries_or_none(lines)
    for got, one in zip(window, lines, strict=True):
        expected = whole(one)
        same_entry(got, expected)
    # Only an unknown block type makes a message unreadable here.
    readable = [whole(one) is not None for one in lines]
    assert [e is not None for e in window] == readable


def test_a_parent_id_shares_the_string_of_the_entry_before_it() -> None:
    first = line("e1", "message", **USER)
    second = json.dumps(
        {"id": "e2", "parent_id": "e1", "ts": "2026-11-26T10:00:00.000Z", "type": "custom"}
        | DELIVERY
    ).encode()
    window = entries_module.parse_entries_or_none([first, second])
    assert window[0] is not None and window[1] is not None
    assert window[1].parent_id == "e1"
    assert window[1].parent_id is window[0].id  # one string for both in memory


def test_a_line_with_a_byte_that_is_not_utf8_is_corrupt_wherever_the_byte_is() -> None:
    # In a field the fast read skips (meta): json refuses the line, and so must it.
    bad = line("e2", "message", **{**USER, "meta": {"note": "MARK"}}).replace(b"MARK", b"\xff")
    assert entries_module.parse_entry_or_none(bad) is None
    window = entries_module.parse_entries_or_none([line("e1", "custom", **DELIVERY), bad])
    assert window[0] is not None and window[1] is None


def test_a_content_block_that_is_not_an_object_makes_its_entry_unreadable() -> None:
    odd = line("e2", "message", message={"role": "user", "content": ["not a block"]})
    assert entries_module.parse_entry_or_none(odd) is None
    window = entries_module.parse_entries_or_none([line("e1", "custom", **DELIVERY), odd])
    assert window[0] is not None and window[1] is None


def test_a_window_with_a_line_that_is_not_an_object_still_reads_the_others() -> None:
    lines = [line("e1", "message", **USER), b"[1, 2]", line("e2", "custom", **DELIVERY)]
    window = entries_module.parse_entries_or_none(lines)
    assert [None if e is None else e.id for e in window] == ["e1", None, "e2"]
