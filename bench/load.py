"""Load: 1,000 concurrent sessions against the real gateway process.

The driver runs the Telegram Bot API fake and an Anthropic fake that waits
``--provider-ms`` before it answers and then streams the reply in chunks, both on
127.0.0.1, and starts `parley run` as a child process pointed at them. In rounds,
each of ``--sessions`` private chats sends one numbered message at once; a round
ends when every chat has its reply. Rounds repeat for ``--seconds``.

Measured: messages answered per second; the latency each message adds beyond the
provider's own delay (push at the fake → reply at the fake, minus ``--provider-ms``),
p50 and p99; the child's peak RSS and its open file descriptors over time (the first
and the last minute's peaks: a leak shows as growth); errors (replies missing when a
round times out); ordering violations (a chat's replies out of its messages' order);
the CPU seconds the driver (with its fakes) and the child used over the measured
window, which tell whether the bot or the fakes bound throughput; the bot's CPU per
message in each round, and the kernel's share of it.

How CPU per message moves with a session's length is measured apart, in a length
phase on a fresh process of each bot (``measure_lengths``): two cohorts of chats, one
14 messages ahead, take turns a round each, so their 7th and 21st messages are
measured seconds apart rather than minutes (``--skip-lengths`` leaves it out).

The baseline is measured in the same run: ``bench/bare_bot.py``, the simplest correct
bot on the same client libraries, as a child process under the same load and for the
same ``--seconds``, before parley (so a run takes twice ``--seconds``, plus start-up).
``--skip-baseline`` measures parley alone.

Prints one JSON object: parley's figures at the top level, the bare bot's under
``"baseline"`` with parley ÷ bare ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the protocol fakes live in tests/fakes

from bench.channel_throughput import percentile  # noqa: E402
from bench.crash_soak import Child, child_env  # noqa: E402
from bench.reply_tags import anthropic_reply, replied_to  # noqa: E402
from tests.fakes.anthropic_api import FakeAnthropic  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402

TOKEN = "700003:load-token"
MODEL = "claude-load-model"
ROUND_TIMEOUT_SECONDS = 120.0
BARE_BOT = Path(__file__).resolve().with_name("bare_bot.py")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The session lengths compared (1-based message numbers of each chat), each the mean
# of the rounds HALF_SPAN either side.
SHORT_MESSAGE, LONG_MESSAGE, HALF_SPAN = 7, 21, 2


class SlowAnthropic(FakeAnthropic):
    """The Anthropic fake with a provider's think time before the stream starts."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(keep_requests=1)  # the newest only: see FakeLLMServer
        self.delay_s = delay_s

    def make_app(self) -> web.Application:
        app = super().make_app()
        delay = self.delay_s

        @web.middleware
        async def think(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path.endswith("/messages"):
                await asyncio.sleep(delay)
            return await handler(request)

        app.middlewares.append(think)
        return app


def config(max_runs: int) -> str:
    return f"""
[providers]
default = "anthropic"

[providers.anthropic]
model = "{MODEL}"

[lanes]
max_concurrent_runs = {max_runs}

[session]
timezone = "UTC"

[channels.telegram]
dm_policy = "open"
poll_timeout_seconds = 1
# As the bare bot does: one message per reply, scored by its one text (streamed
# replies are measured by bench/channel_throughput.py).
streaming = "off"

[memory]
enabled = false

[http]
enabled = false

[logging]
level = "WARNING"
"""


def sample(pid: int) -> tuple[int, int]:
    """(peak RSS in KiB so far, open descriptors) of ``pid``, from /proc."""
    peak = 0
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    return peak, len(os.listdir(f"/proc/{pid}/fd"))


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds ``pid`` has used so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        # The command name (field 2) may hold spaces: count fields after its ")".
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS  # utime, stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far."""
    return sum(cpu_times(pid))


@dataclass(frozen=True, slots=True)
class Target:
    """A bot process to measure: its arguments after the interpreter, and its config."""

    name: str
    argv: tuple[str, ...]
    config: str | None = None  # written to $PARLEY_HOME/parley.toml when set
    # Per phase ("load", "lengths"): the exit code and the log's tail, once stopped.
    outcomes: dict[str, tuple[int | None, str]] = field(default_factory=dict)


def targets(args: argparse.Namespace) -> list[Target]:
    parley = Target("parley", ("-m", "parley.gateway.cli.main", "run"), config(args.max_runs))
    if args.skip_baseline:
        return [parley]
    bare = Target(
        "bare",
        (str(BARE_BOT), "--model", MODEL, "--max-runs", str(args.max_runs)),
    )
    # One after the other, not interleaved: each target needs an unbroken window of
    # load (its descriptor growth from the first minute to the last, its RSS peak in a
    # steady state), and two bots alive at once would share the two cores, the idle one
    # still polling. Back to back on fresh fakes, the two see the same machine and load.
    return [bare, parley]


@dataclass
class RoundResult:
    """What one round of messages brought back."""

    matched: int  # replies naming the message they answer
    violations: int  # replies older than one the chat already had
    latencies: list[float]  # per matched reply: seconds beyond the provider's delay


@dataclass
class Driven:
    """A target's bot process on fresh fakes, driven a round at a time."""

    fake: FakeTelegram
    pid: int
    delay_s: float
    pushed: dict[tuple[int, int], float] = field(default_factory=dict)
    last_turn: dict[int, int] = field(default_factory=lambda: defaultdict(lambda: -1))
    seen_sent: int = 0

    async def round(
        self, turns: dict[int, int], on_wait: Callable[[], None] | None = None
    ) -> RoundResult:
        """Send chat ``c`` its message number ``turns[c]`` (0-based), all at once, and
        wait for as many replies (or ``ROUND_TIMEOUT_SECONDS``)."""
        for chat, turn in turns.items():
            self.pushed[(chat, turn)] = time.perf_counter()
            self.fake.push_message(TOKEN, chat_id=chat, text=f"c{chat} r{turn} hello")
        want = len(self.fake.sent) + len(turns)
        deadline = time.perf_counter() + ROUND_TIMEOUT_SECONDS
        while len(self.fake.sent) < want and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
            if on_wait is not None:
                on_wait()
        result = RoundResult(0, 0, [])
        for sent in self.fake.sent[self.seen_sent :]:
            # Each reply starts "reply-to: c<chat> r<turn>" (bench/reply_tags.py): only
            # that tag says which message it answers, not the first marker in an echo.
            named = replied_to(sent.visible_text)
            if not named:
                continue  # an error or "busy" reply: its message counts as an error
            key = named[0]
            if key[1] <= self.last_turn[key[0]]:
                result.violations += 1
            self.last_turn[key[0]] = key[1]
            result.latencies.append(sent.received_at - self.pushed[key] - self.delay_s)
            result.matched += 1
        self.seen_sent = len(self.fake.sent)
        return result


@asynccontextmanager
async def driven(args: argparse.Namespace, target: Target, tag: str) -> AsyncIterator[Driven]:
    """``target`` started on fresh fakes (neither inherits the other's sent list or
    updates) in a home of its own, up and polling; stopped on the way out. The exit
    code (0: a clean shutdown on SIGTERM; None: it had to be killed) and the log's tail
    are left in ``target.outcomes[tag]``."""
    with tempfile.TemporaryDirectory(prefix=f"parley-load-{target.name}-{tag}-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        if target.config is not None:
            (home / "parley.toml").write_text(target.config, encoding="utf-8")
        async with (
            FakeTelegram(length_unit="utf16") as fake,
            SlowAnthropic(args.provider_ms / 1000) as llm,
        ):
            fake.add_bot(TOKEN, "load_bot", bot_id=int(TOKEN.split(":")[0]))
            llm.responder = lambda body: anthropic_reply(body, chunk_chars=24)
            log = Path(tmp) / f"{target.name}.log"
            child = Child(child_env(home, TOKEN, fake, llm), log, target.argv)
            await child.start()
            try:
                assert child.process is not None
                await fake.wait_calls("getUpdates", 1, timeout=120)  # up and polling
                yield Driven(fake, child.process.pid, args.provider_ms / 1000)
            finally:
                outcome = await child.stop()
                target.outcomes[tag] = (outcome, log.read_text(errors="replace")[-2000:])


async def measure(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """Drive ``target`` with rounds of ``--sessions`` messages for ``--seconds``."""
    chats = [7000 + i for i in range(args.sessions)]
    latencies: list[float] = []
    violations = errors = answered = 0
    fds: list[tuple[float, int]] = []
    async with driven(args, target, "load") as bot:
        pid = bot.pid
        # CPU over the measured window only: start-up (imports, config) is not load.
        bot_cpu_start = cpu_seconds(pid)
        round_cpu = [bot_cpu_start]  # the bot's CPU seconds at each round's end
        round_sys = [cpu_times(pid)[1]]  # of which in the kernel (file and socket calls)
        driver_cpu_start = time.process_time()
        started = time.perf_counter()
        rounds = 0

        def sample_fds() -> None:
            fds.append((time.perf_counter() - started, sample(pid)[1]))

        while time.perf_counter() - started < args.seconds:
            got = await bot.round(dict.fromkeys(chats, rounds), sample_fds)
            latencies += got.latencies
            violations += got.violations
            answered += got.matched
            errors += len(chats) - got.matched
            rounds += 1
            user_s, sys_s = cpu_times(pid)
            round_cpu.append(user_s + sys_s)
            round_sys.append(sys_s)
        elapsed = time.perf_counter() - started
        driver_cpu = time.process_time() - driver_cpu_start
        bot_cpu = cpu_seconds(pid) - bot_cpu_start
        peak_kib, _ = sample(pid)
    exit_code, log_tail = target.outcomes["load"]
    minute = min(60.0, elapsed / 4)
    first = max((n for t, n in fds if t <= minute), default=0)
    last = max((n for t, n in fds if t >= elapsed - minute), default=0)
    # No latencies at all (nothing answered) reads as null rather than a crash.
    p50 = round(statistics.median(latencies) * 1000, 1) if latencies else None
    p99 = round(percentile(latencies, 0.99) * 1000, 1) if latencies else None
    result: dict[str, Any] = {
        "rounds": rounds,
        "messages": rounds * len(chats),
        "answered": answered,
        "errors": errors,
        "ordering_violations": violations,
        "msgs_per_s": round(answered / elapsed, 1),
        "added_latency_p50_ms": p50,
        "added_latency_p99_ms": p99,
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "fds_first_window_peak": first,
        "fds_last_window_peak": last,
        "seconds": round(elapsed, 1),
        "driver_cpu_s": round(driver_cpu, 1),
        "bot_cpu_s": round(bot_cpu, 1),
        # Round n is each chat's n-th message: how the cost moves with session length.
        "cpu_ms_per_msg_by_round": per_message(round_cpu, len(chats)),
        "sys_ms_per_msg_by_round": per_message(round_sys, len(chats)),
        **rounds_length_figures(round_cpu, len(chats)),
        "exit_code": exit_code,
    }
    if errors or violations or exit_code != 0:
        result["log_tail"] = log_tail
    return result


def per_message(cumulative: list[float], chats: int) -> list[float]:
    """Milliseconds per message of each round, from CPU seconds at each round's end."""
    return [round((b - a) * 1000 / chats, 2) for a, b in itertools.pairwise(cumulative)]


def rounds_length_figures(round_cpu: list[float], chats: int) -> dict[str, float | None]:
    """CPU per message of rounds 5–9 and 19–23 (each chat's 5th to 9th and 19th to
    23rd message) of the timed load, and their ratio; None where the run was shorter.
    These rounds are a minute apart, so a machine that drifts moves the ratio: the
    length phase (``measure_lengths``) interleaves the two instead."""

    def around(message: int) -> float | None:
        first, last = message - HALF_SPAN, message + HALF_SPAN  # 1-based message numbers
        if len(round_cpu) <= last:
            return None
        return (round_cpu[last] - round_cpu[first - 1]) * 1000 / ((last - first + 1) * chats)

    at_7, at_21 = around(SHORT_MESSAGE), around(LONG_MESSAGE)
    return {
        "rounds_cpu_ms_per_msg_at_7": None if at_7 is None else round(at_7, 2),
        "rounds_cpu_ms_per_msg_at_21": None if at_21 is None else round(at_21, 2),
        "rounds_cpu_21_vs_7": None if at_7 is None or at_21 is None else round(at_21 / at_7, 3),
    }


async def measure_lengths(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """CPU per message at each chat's 7th and 21st message, measured side by side, in
    ``--length-runs`` fresh processes of ``target``: their mean, and each run's.

    A process's own layout (its hash seed, where its objects landed) moved one run's
    figures by ±8 % against another's on the same code, so one run is not enough."""
    runs = [await _length_run(args, target, n) for n in range(args.length_runs)]
    at_7 = statistics.mean(r["at_7"] for r in runs)
    at_21 = statistics.mean(r["at_21"] for r in runs)
    return {
        "cpu_ms_per_msg_at_7": round(at_7, 2),
        "cpu_ms_per_msg_at_21": round(at_21, 2),
        "cpu_21_vs_7": round(at_21 / at_7, 3),
        "lengths_runs": runs,
        "lengths_errors": sum(r["errors"] for r in runs),
        "lengths_ordering_violations": sum(r["ordering_violations"] for r in runs),
    }


async def _length_run(args: argparse.Namespace, target: Target, n: int) -> dict[str, Any]:
    """One process: the ``--sessions`` chats split into two cohorts of equal size. The
    long cohort first sends its first 14 messages alone; then the two take turns, a
    round each, the short cohort at message m and the long one at m + 14, which side
    goes first alternating. The short cohort's messages 5–9 and the long one's 19–23
    are measured: rounds seconds apart, so a drift of the machine's speed (which moved
    the timed load's per-round figures by 20 % on the same code) falls on both alike."""
    chats = [7000 + i for i in range(args.sessions)]
    short, long = chats[: len(chats) // 2], chats[len(chats) // 2 :]
    lead = LONG_MESSAGE - SHORT_MESSAGE
    spent: dict[str, list[float]] = {"short": [], "long": []}
    errors = violations = 0
    tag = f"lengths-{n}"
    async with driven(args, target, tag) as bot:
        for turn in range(lead):
            got = await bot.round(dict.fromkeys(long, turn))
            errors += len(long) - got.matched
            violations += got.violations
        for turn in range(SHORT_MESSAGE + HALF_SPAN):  # 0-based: message turn + 1
            sides = [("short", short, turn), ("long", long, turn + lead)]
            for name, cohort, message_turn in sides if turn % 2 == 0 else sides[::-1]:
                before = cpu_seconds(bot.pid)
                got = await bot.round(dict.fromkeys(cohort, message_turn))
                after = cpu_seconds(bot.pid)
                errors += len(cohort) - got.matched
                violations += got.violations
                if turn + 1 >= SHORT_MESSAGE - HALF_SPAN:
                    spent[name].append((after - before) * 1000 / len(cohort))
    at_7, at_21 = statistics.mean(spent["short"]), statistics.mean(spent["long"])
    return {
        "at_7": round(at_7, 3),
        "at_21": round(at_21, 3),
        "ratio": round(at_21 / at_7, 3),
        "cpu_ms_by_round": {k: [round(v, 2) for v in vs] for k, vs in spent.items()},
        "errors": errors,
        "ordering_violations": violations,
        "exit_code": target.outcomes[tag][0],
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 2)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    measured: dict[str, dict[str, Any]] = {}
    for target in targets(args):
        measured[target.name] = await measure(args, target)
        if not args.skip_lengths and args.length_runs > 0:
            measured[target.name] |= await measure_lengths(args, target)
    parley = measured["parley"]
    result: dict[str, Any] = {
        "sessions": args.sessions,
        **parley,
        "provider_ms": args.provider_ms,
        "max_concurrent_runs": args.max_runs,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    bare = measured.get("bare")
    if bare is not None:
        result["baseline"] = {
            "bot": "bench/bare_bot.py",
            **bare,
            "throughput_ratio": ratio(parley["msgs_per_s"], bare["msgs_per_s"]),
            "added_latency_p50_ratio": ratio(
                parley["added_latency_p50_ms"], bare["added_latency_p50_ms"]
            ),
            "rss_ratio": ratio(parley["peak_rss_mib"], bare["peak_rss_mib"]),
            "cpu_per_msg_ratio_at_21": ratio(
                parley.get("cpu_ms_per_msg_at_21"), bare.get("cpu_ms_per_msg_at_21")
            ),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument(
        "--seconds",
        type=float,
        default=600.0,
        help="per target: with the baseline a run takes twice this",
    )
    parser.add_argument("--provider-ms", type=float, default=300.0)
    parser.add_argument("--max-runs", type=int, default=64, help="[lanes] max_concurrent_runs")
    parser.add_argument(
        "--skip-baseline", action="store_true", help="measure parley alone, no bare bot"
    )
    parser.add_argument(
        "--length-runs", type=int, default=3, help="fresh processes in the length phase"
    )
    parser.add_argument(
        "--skip-lengths",
        action="store_true",
        help="no length phase (CPU per message at the 7th and 21st message, side by side)",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
