"""Gateway + runner overhead per turn, with a zero-latency provider.

Two sessions hold the same 100 entries after their latest compaction entry; one
transcript has nothing before that compaction, the other has 10,000 entries before
it. Turns alternate between the two through the whole gateway path (inbox, lane,
transcript, runner, delivery, registry), so both see the same machine noise. The
cost of a turn must follow the live window, not the transcript's length.

The live window grows by a turn's two messages each turn (300 after 100 turns, 500
after the default 200): past the view's history limit (200 messages at the default
window) a history compaction folds the older ones, as it would in a real chat, and
keeps at most half the limit, so there are a few in a run, not one per turn.
``--memory off`` leaves the memory index out (its indexing runs on every turn).

Prints one JSON object:
{"p50_ms_100", "p95_ms_100", "p50_ms_10000", "p95_ms_10000", "ratio_p50", ...}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from parley.channels.base import (
    OPEN_POLICY,
    ChannelCapabilities,
    ChatPolicy,
    DeliveryResult,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
    WebhookRoute,
)
from parley.core.messages import Message, TextBlock, Usage
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse
from parley.core.transcript import Transcript
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from parley.gateway.storage.sessions import SessionOrigin

LIVE_ENTRIES = 100
LONG_PREFIX = 10_000


class InstantProvider:
    """Answers at once with a fixed reply: what remains is parley's own overhead."""

    name = "instant"
    model = "instant-model"

    async def complete(self, request: ProviderRequest, on_text: object = None) -> ProviderResponse:
        return ProviderResponse((TextBlock("ok"),), STOP_END, Usage(100, 2), self.model)

    async def aclose(self) -> None:
        return None


class SignalChannel:
    name = "bench"
    capabilities = ChannelCapabilities()

    def __init__(self) -> None:
        self.delivered = asyncio.Event()
        self.handler: InboundHandler | None = None

    async def start(self, handler: InboundHandler) -> None:
        self.handler = handler

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        self.delivered.set()
        return DeliveryResult(("x",), 1, datetime.now(UTC))

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        return None

    def policy(self, message: InboundMessage) -> ChatPolicy:
        return OPEN_POLICY

    def webhook_routes(self) -> list[WebhookRoute]:
        return []


def write_transcript(path: Path, session_id: str, key: str, prefix: int) -> None:
    transcript = Transcript.create(path, session_id, key)
    for i in range(prefix):
        text = f"old message {i} " + "lorem ipsum dolor sit amet " * 4
        message = Message.user(text) if i % 2 == 0 else Message.assistant(text)
        transcript.append_message(message, usage=Usage(50, 20) if i % 2 else None)
    transcript.append_compaction(
        "The user and the assistant talked about many things.",
        first_kept_entry_id=None,
        tokens_before=prefix * 30,
        tokens_after=200,
        trigger="manual",
    )
    for i in range(LIVE_ENTRIES):
        text = f"live message {i} " + "consectetur adipiscing elit " * 4
        message = Message.user(text) if i % 2 == 0 else Message.assistant(text)
        transcript.append_message(message, usage=Usage(80, 20) if i % 2 else None)
    transcript.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(turns: int, warmup: int, *, memory: bool = True) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as home:
        env = {
            "PARLEY_HOME": home,
            "PARLEY_SESSION__RESET__MODE": "off",
            "PARLEY_SESSION__TIMEZONE": "UTC",
            "PARLEY_MEMORY__ENABLED": "true" if memory else "false",
        }
        loaded = load_config(env=env)
        channel = SignalChannel()
        gateway = Gateway(loaded, channels=[channel], provider=InstantProvider())
        await gateway.start()
        peers = {100: "short", 10_000: "long"}
        for prefix, peer in peers.items():
            key = f"agent:main:bench:direct:{peer}"
            origin = SessionOrigin(key, "main", "bench", "default", "direct", peer)
            record = await gateway.registry.create(origin)
            path = loaded.sessions_dir / f"{record.session_id}.jsonl"
            await asyncio.to_thread(
                write_transcript, path, record.session_id, key, 0 if prefix == 100 else LONG_PREFIX
            )
        timings: dict[int, list[float]] = {100: [], 10_000: []}
        counter = 0
        for turn in range(warmup + turns):
            for size, peer in peers.items():
                counter += 1
                message = InboundMessage(
                    channel="bench",
                    account="default",
                    chat_type="direct",
                    chat_id=peer,
                    sender_id=peer,
                    sender_name=peer,
                    text=f"turn {turn}",
                    message_id=str(counter),
                    timestamp=datetime.now(UTC),
                )
                channel.delivered.clear()
                started = time.perf_counter()
                await gateway.handle_inbound(message)
                await channel.delivered.wait()
                await gateway.wait_idle()
                elapsed = (time.perf_counter() - started) * 1000
                if turn >= warmup:
                    timings[size].append(elapsed)
        await gateway.stop()
    p50_100 = statistics.median(timings[100])
    p50_long = statistics.median(timings[10_000])
    return {
        "p50_ms_100": round(p50_100, 3),
        "p95_ms_100": round(percentile(timings[100], 0.95), 3),
        "p50_ms_10000": round(p50_long, 3),
        "p95_ms_10000": round(percentile(timings[10_000], 0.95), 3),
        "ratio_p50": round(p50_long / p50_100, 3),
        "turns": turns,
        "memory": memory,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--memory",
        choices=("on", "off"),
        default="on",
        help="the memory index (the default configuration: on); off isolates the rest",
    )
    args = parser.parse_args()
    result = asyncio.run(run(args.turns, args.warmup, memory=args.memory == "on"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
