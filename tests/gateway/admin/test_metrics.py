"""GatewayMetrics: what a scrape shows after each recording call."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import REGISTRY

from parley.core.messages import Usage
from parley.gateway.admin.metrics import (
    SESSIONS_KEPT,
    TURN_BUCKETS,
    GatewayMetrics,
    SessionFigures,
    bounded_label,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(m: GatewayMetrics) -> Samples:
    """Every sample of a scrape, keyed by (sample name, labels); `_created` left out."""
    body, content_type = m.render()
    assert content_type == CONTENT_TYPE_LATEST
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate sample {key}"
            out[key] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def test_fresh_instance_shows_token_kinds_at_zero_and_no_channel_series() -> None:
    s = scrape(GatewayMetrics())
    for kind in ("input", "output", "cache_read", "cache_write"):
        assert value(s, "parley_tokens_total", kind=kind) == 0
    assert len(series(s, "parley_tokens_total")) == 4
    assert series(s, "parley_inbound_messages_total") == {}
    assert value(s, "parley_memory_search_latency_seconds_count") == 0


def test_declare_channels_precreates_zero_series() -> None:
    m = GatewayMetrics()
    m.declare_channels(["discord", "telegram"])
    s = scrape(m)
    for ch in ("discord", "telegram"):
        assert value(s, "parley_inbound_messages_total", channel=ch) == 0
        for outcome in ("delivered", "failed", "rejected"):
            assert value(s, "parley_replies_total", channel=ch, outcome=outcome) == 0
        for outcome in ("ok", "error"):
            assert value(s, "parley_turns_total", channel=ch, outcome=outcome) == 0
        assert value(s, "parley_turn_latency_seconds_count", channel=ch) == 0
        assert value(s, "parley_turn_latency_seconds_bucket", channel=ch, le="+Inf") == 0
    assert len(series(s, "parley_replies_total")) == 6


def test_counters_add_up_per_label() -> None:
    m = GatewayMetrics()
    for _ in range(3):
        m.inbound("discord")
    m.inbound("telegram")
    m.reply("discord", "delivered")
    m.reply("discord", "delivered")
    m.reply("discord", "failed")
    m.reply("telegram", "rejected")
    m.compaction("threshold")
    m.compaction("threshold", "selective")
    m.compaction("manual")
    s = scrape(m)
    assert series(s, "parley_inbound_messages_total") == {
        frozenset({("channel", "discord")}): 3,
        frozenset({("channel", "telegram")}): 1,
    }
    assert value(s, "parley_replies_total", channel="discord", outcome="delivered") == 2
    assert value(s, "parley_replies_total", channel="discord", outcome="failed") == 1
    assert value(s, "parley_replies_total", channel="telegram", outcome="rejected") == 1
    assert len(series(s, "parley_replies_total")) == 3
    assert value(s, "parley_compactions_total", trigger="threshold", strategy="summary") == 1
    assert value(s, "parley_compactions_total", trigger="threshold", strategy="selective") == 1
    assert value(s, "parley_compactions_total", trigger="manual", strategy="summary") == 1


def test_session_figures_are_labelled_and_bounded() -> None:
    m = GatewayMetrics()
    figures = SessionFigures(
        utilisation=0.42,
        compactions_by_strategy={"summary": 2, "sliding-window": 1},
        compactions_by_trigger={"threshold": 2, "messages": 1},
        last_tokens_before=52_000,
        last_tokens_after=9_000,
    )
    m.session("s-1", figures)
    s = scrape(m)
    assert value(s, "parley_session_context_utilisation", session="s-1") == 0.42
    assert series(s, "parley_session_compactions_by_strategy") == {
        frozenset({("session", "s-1"), ("strategy", "summary")}): 2,
        frozenset({("session", "s-1"), ("strategy", "sliding_window")}): 1,
    }
    assert value(s, "parley_session_compactions_by_trigger", session="s-1", trigger="messages") == 1
    assert value(s, "parley_session_last_compaction_tokens", session="s-1", stage="after") == 9_000
    # Only the most recently active sessions are carried: a busy bot's scrape stays small.
    for i in range(SESSIONS_KEPT):
        m.session(f"other-{i}", SessionFigures(0.1, {}, {}))
    s = scrape(m)
    assert len(series(s, "parley_session_context_utilisation")) == SESSIONS_KEPT
    assert ("parley_session_context_utilisation", frozenset({("session", "s-1")})) not in s


def test_unknown_reply_outcome_is_a_programming_error() -> None:
    m = GatewayMetrics()
    with pytest.raises(ValueError, match="unknown reply outcome"):
        m.reply("discord", "sent")  # type: ignore[arg-type]
    assert series(scrape(m), "parley_replies_total") == {}


def test_turns_count_outcomes_and_fill_latency_histogram() -> None:
    m = GatewayMetrics()
    m.turn("discord", 0.03)  # <= 0.05
    m.turn("discord", 0.7)  # <= 1
    m.turn("discord", 3.0, ok=False)  # <= 4
    m.turn("discord", 500.0)  # beyond the last bucket: +Inf only
    m.turn("telegram", 1.0)  # exactly on a bound: counted in le="1"
    s = scrape(m)
    assert value(s, "parley_turns_total", channel="discord", outcome="ok") == 3
    assert value(s, "parley_turns_total", channel="discord", outcome="error") == 1
    assert value(s, "parley_turns_total", channel="telegram", outcome="ok") == 1

    expected_le = {
        0.05: 1,
        0.1: 1,
        0.25: 1,
        0.5: 1,
        1: 2,
        2: 2,
        4: 3,
        8: 3,
        15: 3,
        30: 3,
        60: 3,
        120: 3,
    }
    assert tuple(expected_le) == TURN_BUCKETS
    buckets = {
        dict(labels)["le"]: v
        for labels, v in series(s, "parley_turn_latency_seconds_bucket").items()
        if dict(labels)["channel"] == "discord"
    }
    assert buckets == {
        **{str(float(le)): n for le, n in expected_le.items()},
        "+Inf": 4,
    }
    assert value(s, "parley_turn_latency_seconds_count", channel="discord") == 4
    assert value(s, "parley_turn_latency_seconds_sum", channel="discord") == pytest.approx(503.73)
    assert value(s, "parley_turn_latency_seconds_bucket", channel="telegram", le="1.0") == 1
    assert value(s, "parley_turn_latency_seconds_bucket", channel="telegram", le="0.5") == 0


def test_turn_with_nonsense_duration_counts_the_turn_but_not_the_latency() -> None:
    m = GatewayMetrics()
    m.turn("discord", float("nan"))
    m.turn("discord", -1.0)
    s = scrape(m)
    assert value(s, "parley_turns_total", channel="discord", outcome="ok") == 2
    assert value(s, "parley_turn_latency_seconds_count", channel="discord") == 0


def test_tokens_add_per_kind_and_ignore_zeros() -> None:
    m = GatewayMetrics()
    m.tokens(Usage(input_tokens=100, output_tokens=20))
    m.tokens(Usage(input_tokens=5, output_tokens=1, cache_read_tokens=900, cache_write_tokens=0))
    m.tokens(Usage())
    s = scrape(m)
    assert series(s, "parley_tokens_total") == {
        frozenset({("kind", "input")}): 105,
        frozenset({("kind", "output")}): 21,
        frozenset({("kind", "cache_read")}): 900,
        frozenset({("kind", "cache_write")}): 0,
    }


@pytest.mark.parametrize(
    ("kind", "label"),
    [
        ("provider_timeout", "provider_timeout"),
        ("a" * 40, "a" * 40),
        ("a" * 41, "other"),
        ("", "other"),
        ("ProviderTimeout", "other"),
        ("provider-timeout", "other"),
        ("send failed: 403 Forbidden", "other"),
        ("err\n", "other"),
    ],
)
def test_bounded_label(kind: str, label: str) -> None:
    assert bounded_label(kind) == label


def test_error_labels_stay_bounded() -> None:
    m = GatewayMetrics()
    m.error("provider_timeout")
    m.error("provider_timeout")
    m.error("send_failed")
    for i in range(50):  # free-form text must not create fifty series
        m.error(f"HTTP error {i}: something broke")
    m.error("x" * 41)
    m.compaction("user asked nicely")
    s = scrape(m)
    assert series(s, "parley_errors_total") == {
        frozenset({("kind", "provider_timeout")}): 2,
        frozenset({("kind", "send_failed")}): 1,
        frozenset({("kind", "other")}): 51,
    }
    assert series(s, "parley_compactions_total") == {
        frozenset({("trigger", "other"), ("strategy", "summary")}): 1
    }


def test_memory_search_histogram() -> None:
    m = GatewayMetrics()
    for seconds in (0.001, 0.02, 0.02, 0.3, 7.0):
        m.search(seconds)
    s = scrape(m)
    name = "parley_memory_search_latency_seconds"
    assert value(s, f"{name}_bucket", le="0.005") == 1
    assert value(s, f"{name}_bucket", le="0.01") == 1
    assert value(s, f"{name}_bucket", le="0.025") == 3
    assert value(s, f"{name}_bucket", le="0.25") == 3
    assert value(s, f"{name}_bucket", le="0.5") == 4
    assert value(s, f"{name}_bucket", le="5.0") == 4
    assert value(s, f"{name}_bucket", le="+Inf") == 5
    assert value(s, f"{name}_count") == 5
    assert value(s, f"{name}_sum") == pytest.approx(7.341)


def test_gauges_are_read_fresh_at_each_scrape() -> None:
    m = GatewayMetrics()
    state = {"open": 2.0, "lanes": {("discord",): 1.0, ("telegram",): 0.0}}
    calls = 0

    def read_open() -> float:
        nonlocal calls
        calls += 1
        return state["open"]  # type: ignore[return-value]

    m.add_gauge("parley_inbox_open", "Open inbox items", read_open)
    m.add_gauge(
        "parley_lane_active_runs",
        "Runs in progress per lane",
        lambda: state["lanes"],  # type: ignore[arg-type,return-value]
        labels=("channel",),
    )
    assert calls == 0  # registering does not read

    s = scrape(m)
    assert value(s, "parley_inbox_open") == 2
    assert series(s, "parley_lane_active_runs") == {
        frozenset({("channel", "discord")}): 1,
        frozenset({("channel", "telegram")}): 0,
    }

    state["open"] = 7.0
    state["lanes"] = {("discord",): 3.0}
    s = scrape(m)
    assert value(s, "parley_inbox_open") == 7
    assert series(s, "parley_lane_active_runs") == {frozenset({("channel", "discord")}): 3}
    assert calls == 2


def test_multi_label_gauge() -> None:
    m = GatewayMetrics()
    m.add_gauge(
        "parley_lane_queued",
        "Queued messages per lane",
        lambda: {("discord", "dm"): 2, ("discord", "guild"): 5},
        labels=("channel", "kind"),
    )
    assert series(scrape(m), "parley_lane_queued") == {
        frozenset({("channel", "discord"), ("kind", "dm")}): 2,
        frozenset({("channel", "discord"), ("kind", "guild")}): 5,
    }


def test_failing_gauge_callback_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    m = GatewayMetrics()
    m.inbound("discord")

    def boom() -> float:
        raise RuntimeError("lane table locked")

    m.add_gauge("parley_lane_active_runs", "Runs", boom)
    m.add_gauge("parley_inbox_open", "Open", lambda: 4)
    # Wrong shapes are the callback's fault too: skipped, not a broken scrape.
    m.add_gauge("parley_bad_shape", "Wrong arity", lambda: {("a", "b"): 1}, labels=("channel",))
    m.add_gauge("parley_bad_type", "Labelled but scalar", lambda: 1.0, labels=("channel",))

    with caplog.at_level(logging.ERROR, logger="parley.gateway.admin.metrics"):
        s = scrape(m)
    assert value(s, "parley_inbox_open") == 4
    assert value(s, "parley_inbound_messages_total", channel="discord") == 1
    names = {n for n, _ in s}
    assert not names & {"parley_lane_active_runs", "parley_bad_shape", "parley_bad_type"}
    failed = [r for r in caplog.records if "callback failed" in r.getMessage()]
    assert [r.args[0] for r in failed] == [  # type: ignore[index]
        "parley_lane_active_runs",
        "parley_bad_shape",
        "parley_bad_type",
    ]
    assert "lane table locked" in caplog.text


def test_duplicate_gauge_name_is_rejected() -> None:
    m = GatewayMetrics()
    m.add_gauge("parley_inbox_open", "Open", lambda: 1)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        m.add_gauge("parley_inbox_open", "Open again", lambda: 2)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        m.add_gauge("parley_inbound_messages_total", "Clashes with a counter", lambda: 2)


def test_instances_are_independent_and_leave_the_global_registry_alone() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()  # a second instance must not clash
    a.inbound("discord")
    a.error("boom")
    a.add_gauge("parley_inbox_open", "Open", lambda: 1)
    b.add_gauge("parley_inbox_open", "Open", lambda: 9)
    b.inbound("discord")
    b.inbound("discord")

    sa, sb = scrape(a), scrape(b)
    assert value(sa, "parley_inbound_messages_total", channel="discord") == 1
    assert value(sb, "parley_inbound_messages_total", channel="discord") == 2
    assert value(sa, "parley_errors_total", kind="boom") == 1
    assert series(sb, "parley_errors_total") == {}
    assert value(sa, "parley_inbox_open") == 1
    assert value(sb, "parley_inbox_open") == 9
    assert (
        REGISTRY.get_sample_value("parley_inbound_messages_total", {"channel": "discord"}) is None
    )
    # The own registry holds only parley metrics (no process_* / python_gc_* collectors).
    assert all(name.startswith("parley_") for name, _ in sa)
