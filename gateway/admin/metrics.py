"""Prometheus metrics for one gateway, served by the admin API.

`GatewayMetrics` owns its own `CollectorRegistry` instead of using prometheus_client's
global default registry. Metric names must be unique per registry, and one process can
hold several gateways (the test suite starts many, and a gateway can be rebuilt in place);
with the global registry the second gateway would fail with "Duplicated timeseries", or
worse, two gateways would silently add into the same counters. An own registry also keeps
the process collectors (python_gc_*, process_*) out of the gateway's scrape.

Label cardinality is kept bounded: channels are the configured channel names, outcomes and
token kinds are fixed sets, and free-form kinds (errors, compaction triggers) that do not
look like short snake_case identifiers are recorded as "other".

Per-session figures (context utilisation, compactions by strategy and by trigger, the
last compaction's tokens before and after) are labelled by session id and kept for the
``SESSIONS_KEPT`` most recently active sessions only, so a busy bot's scrape stays
bounded; the admin API and ``/status`` have every session's figures.

Gauges that mirror live state (lane runs, queue depth, open inbox items) are not updated
by the code that changes that state: they are read from callbacks at scrape time, so the
value is always fresh and nothing can drift. A callback that raises is logged and its
gauge left out of that scrape; the rest of the scrape is unaffected.
"""

from __future__ import annotations

import logging
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

log = logging.getLogger("parley.gateway.admin.metrics")

ReplyOutcome = Literal["delivered", "failed", "rejected"]
REPLY_OUTCOMES: tuple[str, ...] = ("delivered", "failed", "rejected")
TURN_OUTCOMES: tuple[str, ...] = ("ok", "error")
TOKEN_KINDS: tuple[str, ...] = ("input", "output", "cache_read", "cache_write")

# An LLM turn takes from tens of milliseconds (a cached, tiny local model) to minutes
# (long tool loops on a slow provider).
TURN_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
SEARCH_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

_LABEL_RE = re.compile(r"[a-z0-9_]{1,40}")
# Sessions whose figures the scrape carries (the most recently active ones).
SESSIONS_KEPT = 256

GaugeValue = float | dict[tuple[str, ...], float]


class UsageLike(Protocol):
    """What `tokens()` reads; `core.messages.Usage` has it. Read-only properties, so a
    frozen dataclass matches."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cache_read_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...


def bounded_label(value: str) -> str:
    """`value` if it is a short snake_case identifier, else "other"."""
    return value if _LABEL_RE.fullmatch(value) else "other"


def name_label(value: str) -> str:
    """A known name with hyphens ("sliding-window") as a label ("sliding_window")."""
    return bounded_label(value.replace("-", "_"))


@dataclass(frozen=True, slots=True)
class SessionFigures:
    """One session's context figures, as the gateway last saw them."""

    utilisation: float  # context used / window
    compactions_by_strategy: Mapping[str, int]
    compactions_by_trigger: Mapping[str, int]
    last_tokens_before: int | None = None
    last_tokens_after: int | None = None


class _CallbackGauge:
    """A collector yielding one gauge family whose samples come from `read()` at scrape."""

    def __init__(
        self,
        name: str,
        documentation: str,
        read: Callable[[], GaugeValue],
        labels: tuple[str, ...],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.read = read
        self.labels = labels

    def describe(self) -> Iterable[Metric]:
        # Lets the registry reject a duplicate name at add_gauge() time without calling
        # read() (which may not be ready yet when the gauge is registered).
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        try:
            family = self._family(self.read())
        except Exception:
            log.exception("metrics: gauge %s callback failed; skipped in this scrape", self.name)
            return
        yield family

    def _family(self, value: GaugeValue) -> GaugeMetricFamily:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        if isinstance(value, dict):
            for label_values, v in value.items():
                if len(label_values) != len(self.labels):
                    raise ValueError(f"label values {label_values!r} do not match {self.labels!r}")
                family.add_metric([str(lv) for lv in label_values], float(v))
        elif self.labels:
            raise TypeError(f"labelled gauge must read a dict, got {type(value).__name__}")
        else:
            family.add_metric([], float(value))
        return family


class GatewayMetrics:
    """The metrics of one gateway, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._inbound = Counter(
            "parley_inbound_messages", "Inbound messages received", ["channel"], registry=r
        )
        self._replies = Counter(
            "parley_replies",
            "Replies by outcome (delivered, failed, rejected)",
            ["channel", "outcome"],
            registry=r,
        )
        self._turns = Counter(
            "parley_turns", "Agent turns by outcome (ok, error)", ["channel", "outcome"], registry=r
        )
        self._turn_latency = Histogram(
            "parley_turn_latency_seconds",
            "Wall time of one agent turn",
            ["channel"],
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self._tokens = Counter("parley_tokens", "Provider tokens by kind", ["kind"], registry=r)
        self._compactions = Counter(
            "parley_compactions",
            "Context compactions by trigger and strategy",
            ["trigger", "strategy"],
            registry=r,
        )
        self._sessions: OrderedDict[str, SessionFigures] = OrderedDict()
        self._register_session_gauges()
        self._errors = Counter("parley_errors", "Errors by kind", ["kind"], registry=r)
        self._search_latency = Histogram(
            "parley_memory_search_latency_seconds",
            "Wall time of one memory search",
            buckets=SEARCH_BUCKETS,
            registry=r,
        )
        for kind in TOKEN_KINDS:
            self._tokens.labels(kind=kind)

    def declare_channels(self, names: Iterable[str]) -> None:
        """Create the per-channel series at zero so dashboards show zeros, not gaps."""
        for channel in names:
            self._inbound.labels(channel=channel)
            for outcome in REPLY_OUTCOMES:
                self._replies.labels(channel=channel, outcome=outcome)
            for outcome in TURN_OUTCOMES:
                self._turns.labels(channel=channel, outcome=outcome)
            self._turn_latency.labels(channel=channel)

    def inbound(self, channel: str) -> None:
        self._inbound.labels(channel=channel).inc()

    def reply(self, channel: str, outcome: ReplyOutcome) -> None:
        if outcome not in REPLY_OUTCOMES:
            raise ValueError(f"unknown reply outcome {outcome!r}; expected one of {REPLY_OUTCOMES}")
        self._replies.labels(channel=channel, outcome=outcome).inc()

    def turn(self, channel: str, seconds: float, ok: bool = True) -> None:
        self._turns.labels(channel=channel, outcome="ok" if ok else "error").inc()
        latency = self._turn_latency.labels(channel=channel)
        if math.isfinite(seconds) and seconds >= 0:  # NaN or negative: a caller's clock bug
            latency.observe(seconds)

    def tokens(self, usage: UsageLike) -> None:
        for kind in TOKEN_KINDS:
            n = getattr(usage, f"{kind}_tokens")
            if n > 0:
                self._tokens.labels(kind=kind).inc(n)

    def compaction(self, trigger: str, strategy: str = "summary") -> None:
        self._compactions.labels(
            trigger=bounded_label(trigger), strategy=name_label(strategy)
        ).inc()

    def session(self, session_id: str, figures: SessionFigures) -> None:
        """Record a session's figures (after its turn or compaction)."""
        self._sessions[session_id] = figures
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > SESSIONS_KEPT:
            self._sessions.popitem(last=False)

    def forget_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _register_session_gauges(self) -> None:
        sessions = self._sessions

        def utilisation() -> dict[tuple[str, ...], float]:
            return {(sid,): f.utilisation for sid, f in sessions.items()}

        def by(attr: str) -> Callable[[], dict[tuple[str, ...], float]]:
            def read() -> dict[tuple[str, ...], float]:
                out: dict[tuple[str, ...], float] = {}
                for sid, figures in sessions.items():
                    for name, count in getattr(figures, attr).items():
                        key = (sid, name_label(name))
                        out[key] = out.get(key, 0) + count
                return out

            return read

        def last_tokens() -> dict[tuple[str, ...], float]:
            out: dict[tuple[str, ...], float] = {}
            for sid, f in sessions.items():
                if f.last_tokens_before is not None and f.last_tokens_after is not None:
                    out[(sid, "before")] = f.last_tokens_before
                    out[(sid, "after")] = f.last_tokens_after
            return out

        self.add_gauge(
            "parley_session_context_utilisation",
            "Context used / window, per recently active session",
            utilisation,
            ("session",),
        )
        self.add_gauge(
            "parley_session_compactions_by_strategy",
            "Compactions of a recently active session, by strategy",
            by("compactions_by_strategy"),
            ("session", "strategy"),
        )
        self.add_gauge(
            "parley_session_compactions_by_trigger",
            "Compactions of a recently active session, by trigger",
            by("compactions_by_trigger"),
            ("session", "trigger"),
        )
        self.add_gauge(
            "parley_session_last_compaction_tokens",
            "Tokens before and after a recently active session's last compaction",
            last_tokens,
            ("session", "stage"),
        )

    def error(self, kind: str) -> None:
        self._errors.labels(kind=bounded_label(kind)).inc()

    def search(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self._search_latency.observe(seconds)

    def add_gauge(
        self,
        name: str,
        help: str,
        read: Callable[[], GaugeValue],
        labels: tuple[str, ...] = (),
    ) -> None:
        """Register a gauge read from `read()` at each scrape.

        `read` returns a number (no labels) or a dict from label values (a tuple, in the
        order of `labels`) to numbers. A callback that raises, or returns the wrong shape,
        is logged and that gauge is left out of the scrape.
        """
        self.registry.register(_CallbackGauge(name, help, read, tuple(labels)))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for the /metrics response."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
