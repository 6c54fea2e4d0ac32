"""Several replicas: three `parley run` processes on one PostgreSQL behind one webhook.

The driver starts an embedded PostgreSQL with pgvector (``pgserver``, the ``dev``
extra) unless ``--database-url`` names one, the Telegram Bot API fake and an
Anthropic fake that thinks ``--think-ms`` before each reply, and a round-robin load
balancer on 127.0.0.1 in front of the replicas' webhook endpoints: Telegram posts
each update to the balancer, which passes it to the next replica (the next one after
that when a replica does not answer, as a balancer's health check would).

Load: ``--chats`` private chats × ``--per-chat`` messages, all queued at the fake at
once, so each chat's messages land on different replicas and contend for the same
session. Lanes are in ``queue`` mode (one reply per message); the fake model starts
each reply with ``reply-to: c<chat> m<n>``, the last marker of the user's own words
(``bench/reply_tags.py``), and only that tag names the message a reply answers, not
whatever marker comes first in it (a recalled earlier message, say). When half the
messages are answered, one replica is killed with SIGKILL and started again. Then the
same load runs against one replica on SQLite (the embedded default), in the same run,
as the baseline.

Counted at the fake: ``lost`` (never answered), ``duplicated`` (answered more than
once), ``out_of_order`` (a reply for message n of a chat sent after the reply for a
later message of that chat), all by the text each message ends with (a streamed
reply's first text is a draft's), and ``unfinished_replies`` (a draft never finished
into its reply). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import socket
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the protocol fakes live in tests/fakes

from bench.crash_soak import Child, child_env  # noqa: E402
from bench.load import SlowAnthropic  # noqa: E402
from bench.reply_tags import anthropic_reply, final_texts, replied_to  # noqa: E402
from bench.reply_tags import tally as tally_texts  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402

TOKEN = "700003:replicas-token"
SECRET = "replicas-bench-secret"
MODEL = "claude-replicas-model"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def config(port: int, webhook_url: str, backend: str, max_runs: int) -> str:
    return f"""
[providers]
default = "anthropic"

[providers.anthropic]
model = "{MODEL}"

[lanes]
mode = "queue"
queue_cap = 200
max_concurrent_runs = {max_runs}

[session]
timezone = "UTC"

[session.reset]
mode = "off"

[storage]
backend = "{backend}"

[channels.telegram]
mode = "webhook"
dm_policy = "open"

[channels.telegram.accounts.default]
webhook_url = "{webhook_url}"
webhook_secret = "{SECRET}"

[memory]
enabled = false

[http]
port = {port}

[logging]
level = "WARNING"
"""


class Balancer:
    """Round-robin over the replicas' webhook endpoints; skips one that refuses."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/telegram/default"
        self.targets: list[str] = []
        self._next = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.failovers = 0

    async def __aenter__(self) -> Balancer:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        app = web.Application(client_max_size=2**20)
        app.router.add_post("/telegram/default", self._forward)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-")}
        headers["Content-Type"] = "application/json"
        start = next(self._next)
        for offset in range(len(self.targets)):
            target = self.targets[(start + offset) % len(self.targets)]
            try:
                async with self._session.post(target, data=body, headers=headers) as response:
                    await response.read()
                    if response.status < 500:
                        return web.Response(status=response.status)
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass  # the replica died mid-request: the next one gets the update
            self.failovers += 1
        return web.Response(status=502)


@contextlib.asynccontextmanager
async def postgres(url: str | None) -> AsyncIterator[str]:
    if url:
        yield url
        return
    short = Path(tempfile.mkdtemp(prefix="parley-pg-"))  # socket paths are short
    os.environ.setdefault("XDG_RUNTIME_DIR", str(short))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    server = await asyncio.to_thread(pgserver.get_server, str(short / "data"), cleanup_mode="stop")
    try:
        yield str(server.get_uri())
    finally:
        await asyncio.to_thread(server.cleanup)


def hooks_set(fake: FakeTelegram) -> int:
    return sum(1 for call in fake.calls if call.method.lower() == "setwebhook")


ASKED = "please confirm"  # how every message ends, so every whole reply (an echo) too


def tally(fake: FakeTelegram) -> tuple[Counter[tuple[int, int]], int, int]:
    """(replies naming each (chat, message) in their tag, replies sent out of order,
    replies not finished: a streamed reply's draft, its tag whole, its echo not yet)."""
    texts = final_texts(fake)  # a streamed reply: by the text it ends with
    counted = tally_texts(texts)
    unfinished = sum(1 for t in texts if replied_to(t) and not t.endswith(ASKED))
    return counted.counts, counted.out_of_order, unfinished


async def measure(
    args: argparse.Namespace, *, replicas: int, backend: str, database_url: str | None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="parley-replicas-") as tmp:
        async with (
            FakeTelegram(length_unit="utf16") as fake,
            SlowAnthropic(args.think_ms / 1000) as llm,
            Balancer() as balancer,
        ):
            fake.add_bot(TOKEN, "replicas_bot", bot_id=int(TOKEN.split(":")[0]))
            llm.responder = anthropic_reply
            children: list[Child] = []
            for n in range(replicas):
                home = Path(tmp) / f"replica-{n}"
                home.mkdir()
                port = free_port()
                (home / "parley.toml").write_text(
                    config(port, balancer.url, backend, args.max_runs), encoding="utf-8"
                )
                extra = {"PARLEY_DATABASE_URL": database_url} if database_url else {}
                env = child_env(home, TOKEN, fake, llm, **extra)
                balancer.targets.append(f"http://127.0.0.1:{port}/telegram/default")
                children.append(Child(env, Path(tmp) / f"replica-{n}.log"))
            for child in children:
                await child.start()
            # Each replica registers the (shared) webhook once its endpoint listens.
            await fake.wait_until(lambda: hooks_set(fake) >= replicas, timeout=120)
            plan = [(7000 + c, m) for m in range(args.per_chat) for c in range(args.chats)]
            started = time.perf_counter()
            for chat, m in plan:
                fake.push_message(TOKEN, chat_id=chat, text=f"c{chat} m{m} {ASKED}")
            killed = False
            last_progress, answered = time.monotonic(), 0
            while time.monotonic() - last_progress < args.settle:
                counts, _, drafts = tally(fake)
                now_answered = len(set(plan) & set(counts))
                if now_answered == len(plan) and not drafts:
                    break
                if replicas > 1 and not killed and now_answered >= len(plan) // 2:
                    await children[1].kill()
                    await children[1].start()
                    killed = True
                if now_answered != answered:
                    answered, last_progress = now_answered, time.monotonic()
                fake.redeliver()  # Telegram retries an update the balancer could not place
                await asyncio.sleep(0.05)
            seconds = time.perf_counter() - started
            for child in children:
                await child.stop()
            counts, out_of_order, unfinished = tally(fake)
            logs = "".join(
                (Path(tmp) / f"replica-{n}.log").read_text(errors="replace")[-1500:]
                for n in range(replicas)
            )
    done = set(plan) & set(counts)
    result: dict[str, Any] = {
        "messages": len(plan),
        "lost": len(plan) - len(done),
        "duplicated": sum(1 for key in plan if counts[key] > 1),
        "out_of_order": out_of_order,
        "unfinished_replies": unfinished,
        "draft_edits": fake.call_counts["editMessageText"],
        "seconds": round(seconds, 1),
        "msgs_per_s": round(len(done) / seconds, 1),
        "killed": replicas > 1,
        "balancer_failovers": balancer.failovers,
    }
    twice = sorted(key for key in plan if counts[key] > 1)
    if twice:  # which ones, to find them in the replicas' logs and transcripts
        result["duplicated_messages"] = [f"c{c} m{m}" for c, m in twice[:20]]
    if result["lost"] or result["duplicated"] or result["out_of_order"] or unfinished:
        result["log_tail"] = logs[-3000:]
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with postgres(args.database_url) as url:
        shared = await measure(args, replicas=args.replicas, backend="postgres", database_url=url)
    single = await measure(args, replicas=1, backend="sqlite", database_url=None)
    speedup = shared["msgs_per_s"] / single["msgs_per_s"] if single["msgs_per_s"] else None
    return {
        "replicas": args.replicas,
        "messages": shared["messages"],
        "lost": shared["lost"],
        "duplicated": shared["duplicated"],
        "out_of_order": shared["out_of_order"],
        "unfinished_replies": shared["unfinished_replies"],
        "msgs_per_s": shared["msgs_per_s"],
        "single_sqlite_msgs_per_s": single["msgs_per_s"],
        "speedup": round(speedup, 2) if speedup else None,
        "think_ms": args.think_ms,
        "max_concurrent_runs": args.max_runs,
        "postgres": shared,
        "single_sqlite": single,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--chats", type=int, default=100)
    parser.add_argument("--per-chat", type=int, default=20)
    parser.add_argument("--think-ms", type=int, default=200, help="the provider's delay")
    parser.add_argument(
        "--max-runs", type=int, default=4, help="[lanes] max_concurrent_runs of each replica"
    )
    parser.add_argument("--settle", type=float, default=90.0, help="give up after no progress")
    parser.add_argument("--database-url", default=None, help="else an embedded PostgreSQL")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
