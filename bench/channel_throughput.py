"""Channel throughput: 100 chats x 20 messages through the real client libraries.

For each of Telegram and Discord: a protocol fake on 127.0.0.1 (the ones the tests
use), the real adapter (python-telegram-bot / discord.py), the whole gateway path
(access, inbox, lanes, transcripts, registry, delivery) and a zero-latency provider
that answers what it was sent. 100 direct chats each send 20 numbered messages, all
at once. A reply may answer several messages (the lanes fold what queued up during a
turn), so the provider starts each reply with a tag naming them all,
``reply-to: c3 m4, c3 m5``, taken from the user's own words only (``bench/reply_tags.py``:
the last text block of the newest user message that holds a marker, never a block the
gateway put before it), and each reply is scored by that tag alone:

- lost: messages no reply named; duplicated: messages named more than once;
- out_of_order: within a chat, a reply naming an earlier message than a previous
  reply did;
- msgs_per_s: messages answered / (last reply received - first message pushed);
- added_latency_ms: per message, push → the reply reaching the fake (the provider
  takes no time, so all of it is parley plus the client libraries).

The baseline bots (the same libraries, no parley) answer each message with the same
tag, so both are scored alike.

Streaming (``streaming``): the same chats again against a model that takes its time
(each reply written in ``WRITE_PIECES`` deltas ``WRITE_PAUSE_SECONDS`` apart), once
with the channel's streaming off and once with ``partial`` (drafts edited in place),
in the same run. Each reply is scored by the text its messages end with (a draft
shows a half-written tag on its way), in the order the messages appeared, and each
run reports ``api_calls_per_reply``: the platform calls that carry text (send, edit,
delete) per reply.

Prints one JSON object per channel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the protocol fakes live in tests/fakes

from bench.reply_tags import answered_markers, replied_to, reply_text, tag  # noqa: E402
from parley.core.messages import TextBlock, Usage  # noqa: E402
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse  # noqa: E402
from parley.gateway.app import Gateway  # noqa: E402
from parley.gateway.channel_factory import build_channels  # noqa: E402
from parley.gateway.config import load_config  # noqa: E402
from tests.fakes.discord_api import (  # noqa: E402
    DELETE_MESSAGE,
    EDIT_MESSAGE,
    SEND_MESSAGE,
    FakeDiscord,
)
from tests.fakes.scripted_provider import ScriptedProvider  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402

TELEGRAM_TOKEN = "700001:bench-token-telegram"
DISCORD_TOKEN = "bench.discord.token"
DISCORD_BOT_ID = 900_000_000_000_000_001
DEADLINE_SECONDS = 60.0
# The streaming runs' model: each reply in this many deltas, this far apart.
WRITE_PIECES = 4
WRITE_PAUSE_SECONDS = 0.4
STREAM_MODES = ("off", "partial")

Push = Callable[[int, int], object]  # (chat, n): send message n of chat (maybe async)
# A fake's list of what it received, and what one of its items says.
Source = tuple[Callable[[], Sequence[Any]], Callable[[Any], Any]]
WaitUntil = Callable[[Callable[[], bool], float], Awaitable[None]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def gateway_env(home: Path) -> dict[str, str]:
    return {
        "PARLEY_HOME": str(home),
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_MEMORY__ENABLED": "false",
        "PARLEY_LOGGING__LEVEL": "WARNING",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
    }


def score(
    replies: Iterable[tuple[float, str]],
    pushed_at: dict[tuple[int, int], float],
    messages: int,
) -> dict[str, Any]:
    """Which messages each reply answered, in the order the fake received them."""
    seen: dict[tuple[int, int], float] = {}
    duplicated = 0
    out_of_order = 0
    last_in_chat: dict[int, int] = defaultdict(lambda: -1)
    for received_at, text in replies:
        for key in replied_to(text):
            if key not in pushed_at:
                continue
            if key in seen:
                duplicated += 1
                continue
            seen[key] = received_at
            if key[1] < last_in_chat[key[0]]:
                out_of_order += 1
            last_in_chat[key[0]] = max(last_in_chat[key[0]], key[1])
    latencies = [(seen[k] - pushed_at[k]) * 1000 for k in seen]
    elapsed = (max(seen.values()) - min(pushed_at.values())) if seen else float("nan")
    return {
        "messages": messages,
        "replied": len(seen),
        "lost": messages - len(seen),
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "msgs_per_s": round(len(seen) / elapsed, 1) if seen else 0.0,
        "added_latency_ms_p50": round(statistics.median(latencies), 2) if latencies else None,
        "added_latency_ms_p99": round(percentile(latencies, 0.99), 2) if latencies else None,
        "elapsed_s": round(elapsed, 3),
    }


async def drive(
    push: Push,
    answered: Callable[[], set[tuple[int, int]]],
    wait_until: WaitUntil,
    chats: int,
    per_chat: int,
) -> dict[tuple[int, int], float]:
    """Every chat sends its messages at once; wait until each one has a reply."""
    pushed_at: dict[tuple[int, int], float] = {}

    async def one_chat(chat: int) -> None:
        for n in range(per_chat):
            pushed_at[(chat, n)] = time.perf_counter()
            sent = push(chat, n)
            if inspect.isawaitable(sent):
                await sent
            await asyncio.sleep(0)  # let the other chats interleave

    await asyncio.gather(*(one_chat(c) for c in range(chats)))
    with contextlib.suppress(TimeoutError):  # what never came is counted as lost
        await wait_until(lambda: len(answered()) >= chats * per_chat, DEADLINE_SECONDS)
    return pushed_at


def new_items(items: Sequence[Any], read: int) -> Sequence[Any]:
    """The items after the first ``read``, and only those: the check runs on every call
    the fake takes, in the bot's own event loop, so it must not cost what all the
    replies so far do (it did, and took CPU from the bot it measures)."""
    return items[read:]


class Coverage:
    """Which messages the replies received so far name; reads only the new replies."""

    def __init__(self, replies: Callable[[], Sequence[Any]], text: Callable[[Any], str]) -> None:
        self._replies = replies
        self._text = text
        self._read = 0
        self.seen: set[tuple[int, int]] = set()

    def __call__(self) -> set[tuple[int, int]]:
        replies = self._replies()
        for reply in new_items(replies, self._read):
            self.seen.update(replied_to(self._text(reply)))
        self._read = len(replies)
        return self.seen


class FinalTexts:
    """What the bot's messages say now (sends, then edits in place, deletions), and the
    messages their tags name; reads only what changed since the last call."""

    def __init__(
        self,
        sends: Source,
        edits: Source,
        deletions: Source,
    ) -> None:
        """Each source: the fake's list, and what one of its items says (a deletion:
        only its key)."""
        self._sources = (sends, edits)
        self._deletions = deletions
        self._read = [0, 0, 0]
        self.first_at: dict[Any, float] = {}
        self.final_at: dict[Any, float] = {}
        self.text: dict[Any, str] = {}
        self._tags: dict[Any, list[tuple[int, int]]] = {}
        self._named: Counter[tuple[int, int]] = Counter()

    def _set(self, key: Any, text: str | None) -> None:
        for old in self._tags.pop(key, ()):
            self._named[old] -= 1
            if not self._named[old]:
                del self._named[old]
        if text is None:
            self.text.pop(key, None)
            return
        self.text[key] = text
        self._tags[key] = replied_to(text)
        self._named.update(self._tags[key])

    def __call__(self) -> Any:
        for index, (listing, read) in enumerate(self._sources):
            items = listing()
            for item in new_items(items, self._read[index]):
                key, at, text = read(item)
                self.first_at.setdefault(key, at)
                self.final_at[key] = at
                self._set(key, text)
            self._read[index] = len(items)
        listing, read = self._deletions
        gone = listing()
        for item in new_items(gone, self._read[2]):
            self._set(read(item), None)
        self._read[2] = len(gone)
        return self._named.keys()

    def replies(self, *, first: bool = False) -> list[tuple[float, str]]:
        """(when its final text landed, that text) per message, in the chat's order;
        ``first``: when the message first showed (a draft), with its final text."""
        self()
        keys = sorted(self.text, key=lambda k: self.first_at[k])
        landed = self.first_at if first else self.final_at
        return [(landed[k], self.text[k]) for k in keys]


class WritingProvider(ScriptedProvider):
    """The tagged reply, written in ``WRITE_PIECES`` deltas ``WRITE_PAUSE_SECONDS`` apart."""

    async def complete(self, request: ProviderRequest, on_text: Any = None) -> ProviderResponse:
        response = tagged_reply(request)
        if response is None:
            return await super().complete(request, on_text)
        text = response.message.text
        size = max(1, -(-len(text) // WRITE_PIECES))
        for start in range(0, len(text), size):
            if on_text is not None:
                await on_text(text[start : start + size])
            await asyncio.sleep(WRITE_PAUSE_SECONDS)
        return response


def tagged_reply(request: ProviderRequest) -> ProviderResponse | None:
    """The scripted provider's answer: ``reply-to:`` naming every message folded into
    the user's words (in ``queue`` mode that is one), then an echo of those words."""
    last = request.messages[-1] if request.messages else None
    if last is None or last.role != "user":
        return None
    texts = [b.text for b in last.content if isinstance(b, TextBlock)]
    text = reply_text(texts, collect=True)
    if text is None:
        return None  # no marker: the provider's own echo (it names nothing)
    return ProviderResponse((TextBlock(text),), STOP_END, Usage(10, 5), "bench-echo")


def baseline_reply(text: str) -> str:
    """What a baseline bot (no parley, no model) answers: the tag of its message."""
    return tag(answered_markers([text], collect=True))


async def with_gateway(
    home: Path,
    extra_env: dict[str, str],
    body: Callable[[], Awaitable[dict[str, Any]]],
    *,
    writing: bool = False,
) -> dict[str, Any]:
    lanes = {k: v for k, v in os.environ.items() if k.startswith("PARLEY_LANES__")}
    loaded = load_config(env={**gateway_env(home), **lanes, **extra_env})
    channels = build_channels(loaded.config.channels)
    provider = WritingProvider("bench-echo") if writing else ScriptedProvider("bench-echo")
    provider.responder = tagged_reply
    gateway = Gateway(loaded, channels=channels, provider=provider)
    async with gateway:
        result = await body()
        await gateway.wait_idle()
    return result


async def bench_telegram(chats: int, per_chat: int, streaming: str | None = None) -> dict[str, Any]:
    """``streaming``: None, the zero-latency model; else the writing model, with the
    channel's streaming set to it."""
    async with FakeTelegram() as fake:
        fake.add_bot(TELEGRAM_TOKEN, "parley_bench_bot")
        env = {
            "TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN,
            "TELEGRAM_API_BASE_URL": fake.base_url,
            "PARLEY_CHANNELS__TELEGRAM__DM_POLICY": "open",
            "PARLEY_CHANNELS__TELEGRAM__POLL_TIMEOUT_SECONDS": "1",
            "PARLEY_CHANNELS__TELEGRAM__STREAMING": streaming or "off",
        }

        def push(chat: int, n: int) -> None:
            fake.push_message(
                TELEGRAM_TOKEN,
                chat_id=10_000 + chat,
                sender_id=10_000 + chat,
                sender_first_name=f"User{chat}",
                text=f"c{chat} m{n}",
            )

        finals = FinalTexts(
            (
                lambda: fake.sent,
                lambda m: ((m.chat_id, m.message_id), m.received_at, m.visible_text),
            ),
            (
                lambda: fake.text_edits,
                lambda e: ((e.chat_id, e.message_id), e.received_at, e.visible_text),
            ),
            (lambda: fake.deletions, lambda d: (d.chat_id, d.message_id)),
        )
        calls = ("sendMessage", "editMessageText", "deleteMessage")

        async def body() -> dict[str, Any]:
            # A running bot, not one starting: until its first poll comes back short the
            # poller is catching up and replies wait (``caught_up``), so a burst pushed
            # before it folds into two turns a chat, and one pushed after it is answered
            # turn by turn. Which of the two a run measured was a race (one run in four
            # was 4x slower); the second poll is only asked once the first came back.
            await fake.wait_until(lambda: polls(fake) >= 2, DEADLINE_SECONDS)
            pushed_at = await drive(push, finals, fake.wait_until, chats, per_chat)
            await asyncio.sleep(0.5)  # let any duplicate reach the fake before scoring
            result = score(finals.replies(), pushed_at, chats * per_chat)
            return with_calls(result, sum(fake.call_counts[c] for c in calls), finals, pushed_at)

        with tempfile.TemporaryDirectory(prefix="parley-bench-") as home:
            result = await with_gateway(Path(home), env, body, writing=streaming is not None)
    return {"channel": "telegram", **result}


def polls(fake: FakeTelegram) -> int:
    """The ``getUpdates`` calls the fake has been asked so far."""
    return sum(1 for call in fake.calls if call.method == "getUpdates")


def with_calls(
    result: dict[str, Any], calls: int, finals: FinalTexts, pushed_at: dict[Any, float]
) -> dict[str, Any]:
    """The platform calls that carry a reply's text, per reply (a message it ends in),
    and how long a message waited before its reply began to show (a draft, or the reply)."""
    replies = sum(1 for text in finals.text.values() if replied_to(text))
    shown = score(finals.replies(first=True), pushed_at, len(pushed_at))
    return {
        **result,
        "api_calls_per_reply": round(calls / replies, 3) if replies else None,
        "first_text_ms_p50": shown["added_latency_ms_p50"],
    }


async def baseline_telegram(chats: int, per_chat: int) -> dict[str, Any]:
    """The same library and fake with no parley: poll, echo each update, nothing stored."""
    from parley.channels.config import TelegramAccountConfig
    from parley.channels.telegram import _make_bot

    async with FakeTelegram() as fake:
        fake.add_bot(TELEGRAM_TOKEN, "parley_bench_bot")
        account = TelegramAccountConfig(token=TELEGRAM_TOKEN, api_base_url=fake.base_url)
        bot = _make_bot(account)
        await bot.initialize()

        async def echo_bot() -> None:
            offset = 0
            while True:
                updates = await bot.get_updates(offset=offset, timeout=1)
                sends = [
                    bot.send_message(u.message.chat.id, baseline_reply(u.message.text or ""))
                    for u in updates
                    if u.message is not None
                ]
                await asyncio.gather(*sends)
                if updates:
                    offset = updates[-1].update_id + 1

        def push(chat: int, n: int) -> None:
            fake.push_message(
                TELEGRAM_TOKEN, chat_id=10_000 + chat, sender_id=10_000 + chat, text=f"c{chat} m{n}"
            )

        answered = Coverage(lambda: fake.sent, lambda m: m.visible_text)
        task = asyncio.create_task(echo_bot())
        try:
            pushed_at = await drive(push, answered, fake.wait_until, chats, per_chat)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await bot.shutdown()
        replies = [(m.received_at, m.visible_text) for m in fake.sent]
        return score(replies, pushed_at, chats * per_chat)


async def bench_discord(chats: int, per_chat: int, streaming: str | None = None) -> dict[str, Any]:
    import discord
    import yarl

    async with FakeDiscord() as fake:
        fake.add_bot(DISCORD_TOKEN, DISCORD_BOT_ID, "parley-bench")
        dm_of: dict[int, int] = {}
        for chat in range(chats):
            user = {"id": str(800_000 + chat), "username": f"user{chat}", "global_name": None}
            dm_of[chat] = int(fake.add_dm(DISCORD_TOKEN, user))
        env = {
            "DISCORD_BOT_TOKEN": DISCORD_TOKEN,
            "PARLEY_CHANNELS__DISCORD__DM_POLICY": "open",
            "PARLEY_CHANNELS__DISCORD__API_BASE_URL": fake.api_base,
            "PARLEY_CHANNELS__DISCORD__GATEWAY_URL": fake.gateway_url,
            "PARLEY_CHANNELS__DISCORD__STREAMING": streaming or "off",
        }

        def push(chat: int, n: int) -> Awaitable[dict[str, Any]]:
            return fake.push_message(
                DISCORD_TOKEN,
                channel_id=dm_of[chat],
                content=f"c{chat} m{n}",
                author={"id": str(800_000 + chat), "username": f"user{chat}"},
            )

        finals = FinalTexts(
            (lambda: fake.sent, lambda m: (m.id, m.received_at, m.content)),
            (lambda: fake.edits, lambda e: (e.id, e.received_at, e.content)),
            (lambda: fake.deletions, lambda d: d.id),
        )
        calls = (SEND_MESSAGE, EDIT_MESSAGE, DELETE_MESSAGE)

        async def body() -> dict[str, Any]:
            pushed_at = await drive(push, finals, fake.wait_until, chats, per_chat)
            await asyncio.sleep(0.5)
            result = score(finals.replies(), pushed_at, chats * per_chat)
            return with_calls(result, sum(fake.call_counts[c] for c in calls), finals, pushed_at)

        saved = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
        try:
            with tempfile.TemporaryDirectory(prefix="parley-bench-") as home:
                result = await with_gateway(Path(home), env, body, writing=streaming is not None)
        finally:
            discord.http.Route.BASE = saved[0]
            discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(str(saved[1]))
    return {"channel": "discord", **result}


async def baseline_discord(chats: int, per_chat: int) -> dict[str, Any]:
    """discord.py echoing each message from on_message, with no parley."""
    import discord
    import yarl

    async with FakeDiscord() as fake:
        fake.add_bot(DISCORD_TOKEN, DISCORD_BOT_ID, "parley-bench")
        dm_of = {
            chat: int(fake.add_dm(DISCORD_TOKEN, {"id": str(800_000 + chat), "username": "u"}))
            for chat in range(chats)
        }
        saved = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
        discord.http.Route.BASE = fake.api_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
        intents = discord.Intents.default()
        intents.message_content = True
        client = discord.Client(intents=intents, guild_ready_timeout=0)
        ready = asyncio.Event()

        @client.event
        async def on_ready() -> None:
            ready.set()

        @client.event
        async def on_message(message: discord.Message) -> None:
            if client.user is not None and message.author.id != client.user.id:
                await message.channel.send(baseline_reply(message.content))

        task = asyncio.create_task(client.start(DISCORD_TOKEN))
        try:
            async with asyncio.timeout(30):
                await ready.wait()

            def push(chat: int, n: int) -> Awaitable[dict[str, Any]]:
                return fake.push_message(
                    DISCORD_TOKEN,
                    channel_id=dm_of[chat],
                    content=f"c{chat} m{n}",
                    author={"id": str(800_000 + chat), "username": f"user{chat}"},
                )

            answered = Coverage(lambda: fake.sent, lambda m: m.content)
            pushed_at = await drive(push, answered, fake.wait_until, chats, per_chat)
        finally:
            await client.close()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            discord.http.Route.BASE = saved[0]
            discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(str(saved[1]))
        replies = [(m.received_at, m.content) for m in fake.sent]
        return score(replies, pushed_at, chats * per_chat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=100)
    parser.add_argument("--messages", type=int, default=20, help="per chat")
    parser.add_argument("--channel", choices=["telegram", "discord", "both"], default="both")
    parser.add_argument(
        "--skip-streaming", action="store_true", help="no streaming off/partial pair"
    )
    args = parser.parse_args()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(name, None)
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    logging.basicConfig(level=logging.ERROR)
    runs = {
        "telegram": (bench_telegram, baseline_telegram),
        "discord": (bench_discord, baseline_discord),
    }
    names = list(runs) if args.channel == "both" else [args.channel]
    for name in names:
        bench, baseline = runs[name]
        result = asyncio.run(bench(args.chats, args.messages))
        # The same library and fake without parley, in the same run: machines are noisy.
        base = asyncio.run(baseline(args.chats, args.messages))
        result.update(
            baseline_msgs_per_s=base["msgs_per_s"],
            baseline_latency_ms_p50=base["added_latency_ms_p50"],
            baseline_lost=base["lost"],
            ratio_to_baseline=round(result["msgs_per_s"] / base["msgs_per_s"], 3)
            if base["msgs_per_s"]
            else None,
            lanes_mode=os.environ.get("PARLEY_LANES__MODE", "collect"),
            python=platform.python_version(),
            cpus=os.cpu_count(),
        )
        if not args.skip_streaming:
            # A model that takes its time, streaming off and on, in the same run.
            result["streaming"] = {
                "model_seconds_per_reply": WRITE_PIECES * WRITE_PAUSE_SECONDS,
                **{
                    mode: _streaming_figures(asyncio.run(bench(args.chats, args.messages, mode)))
                    for mode in STREAM_MODES
                },
            }
        print(json.dumps(result), flush=True)


def _streaming_figures(run: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "lost",
        "duplicated",
        "out_of_order",
        "msgs_per_s",
        "api_calls_per_reply",
        "first_text_ms_p50",
    )
    return {k: run[k] for k in keep} | {"latency_ms_p50": run["added_latency_ms_p50"]}


if __name__ == "__main__":
    main()
