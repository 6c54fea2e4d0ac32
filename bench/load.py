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
window, which tell whether the bot or the fakes bound throughput.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from channel_throughput import percentile
from crash_soak import Child, child_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the protocol fakes live in tests/fakes

from bench.reply_tags import anthropic_reply, replied_to  # noqa: E402
from tests.fakes.anthropic_api import FakeAnthropic  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402

TOKEN = "700003:load-token"
MODEL = "claude-load-model"
ROUND_TIMEOUT_SECONDS = 120.0
BARE_BOT = Path(__file__).resolve().with_name("bare_bot.py")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        # The command name (field 2) may hold spaces: count fields after its ")".
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


@dataclass(frozen=True, slots=True)
class Target:
    """A bot process to measure: its arguments after the interpreter, and its config."""

    name: str
    argv: tuple[str, ...]
    config: str | None = None  # written to $PARLEY_HOME/parley.toml when set


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


async def measure(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """Drive ``target`` with rounds of ``--sessions`` messages for ``--seconds``."""
    delay_s = args.provider_ms / 1000
    with tempfile.TemporaryDirectory(prefix=f"parley-load-{target.name}-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        if target.config is not None:
            (home / "parley.toml").write_text(target.config, encoding="utf-8")
        # Fresh fakes per target: neither inherits the other's sent list or updates.
        async with FakeTelegram(length_unit="utf16") as fake, SlowAnthropic(delay_s) as llm:
            fake.add_bot(TOKEN, "load_bot", bot_id=int(TOKEN.split(":")[0]))
            # Each reply starts "reply-to: c<chat> r<round>" (bench/reply_tags.py): only
            # that tag says which message it answers, not the first marker in an echo.
            llm.responder = lambda body: anthropic_reply(body, chunk_chars=24)
            log = Path(tmp) / f"{target.name}.log"
            child = Child(child_env(home, TOKEN, fake, llm), log, target.argv)
            await child.start()
            assert child.process is not None
            pid = child.process.pid
            await fake.wait_calls("getUpdates", 1, timeout=120)  # the child is up and polling
            chats = [7000 + i for i in range(args.sessions)]
            pushed: dict[tuple[int, int], float] = {}
            latencies: list[float] = []
            seen_sent = 0
            last_round: dict[int, int] = defaultdict(lambda: -1)
            violations = errors = answered = 0
            fds: list[tuple[float, int]] = []
            # CPU over the measured window only: start-up (imports, config) is not load.
            bot_cpu_start = cpu_seconds(pid)
            round_cpu = [bot_cpu_start]  # the bot's CPU seconds at each round's end
            driver_cpu_start = time.process_time()
            started = time.perf_counter()
            rounds = 0
            while time.perf_counter() - started < args.seconds:
                for chat in chats:
                    pushed[(chat, rounds)] = time.perf_counter()
                    fake.push_message(TOKEN, chat_id=chat, text=f"c{chat} r{rounds} hello")
                want = len(fake.sent) + len(chats)
                deadline = time.perf_counter() + ROUND_TIMEOUT_SECONDS
                while len(fake.sent) < want and time.perf_counter() < deadline:
                    await asyncio.sleep(0.05)
                    fds.append((time.perf_counter() - started, sample(pid)[1]))
                matched = 0
                for sent in fake.sent[seen_sent:]:
                    named = replied_to(sent.visible_text)
                    if not named:
                        continue  # an error or "busy" reply: its message counts as an error
                    key = named[0]
                    if key[1] <= last_round[key[0]]:
                        violations += 1
                    last_round[key[0]] = key[1]
                    latencies.append(sent.received_at - pushed[key] - delay_s)
                    matched += 1
                seen_sent = len(fake.sent)
                answered += matched
                errors += len(chats) - matched
                rounds += 1
                round_cpu.append(cpu_seconds(pid))
            elapsed = time.perf_counter() - started
            driver_cpu = time.process_time() - driver_cpu_start
            bot_cpu = cpu_seconds(pid) - bot_cpu_start
            peak_kib, _ = sample(pid)
            exit_code = await child.stop()
            log_tail = log.read_text(errors="replace")[-2000:]
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
        "cpu_ms_per_msg_by_round": [
            round((b - a) * 1000 / len(chats), 2) for a, b in itertools.pairwise(round_cpu)
        ],
        **length_figures(round_cpu, len(chats)),
        # 0 is a clean shutdown on SIGTERM; null means it had to be killed.
        "exit_code": exit_code,
    }
    if errors or violations or exit_code != 0:
        result["log_tail"] = log_tail
    return result


def length_figures(round_cpu: list[float], chats: int) -> dict[str, float | None]:
    """CPU per message around the 7th and the 21st message of each chat (the mean of
    rounds 6–8 and 20–22, for noise) and their ratio; None where the run was shorter."""

    def around(turn: int) -> float | None:
        if len(round_cpu) < turn + 2:
            return None
        return (round_cpu[turn + 1] - round_cpu[turn - 2]) * 1000 / (3 * chats)

    at_7, at_21 = around(7), around(21)
    return {
        "cpu_ms_per_msg_at_7": None if at_7 is None else round(at_7, 2),
        "cpu_ms_per_msg_at_21": None if at_21 is None else round(at_21, 2),
        "cpu_21_vs_7": None if at_7 is None or at_21 is None else round(at_21 / at_7, 3),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 2)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    measured = {target.name: await measure(args, target) for target in targets(args)}
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
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
