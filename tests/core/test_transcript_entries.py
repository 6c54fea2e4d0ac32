"""Transcript entries read from their lines: what a short entry keeps, and that it
reads back exactly as an entry holding its parsed JSON does."""

from __future__ import annotations

import gc
import json
import tracemalloc

import pytest

from parley.core.context.pruning import PRUNE_CUSTOM_TYPE
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
