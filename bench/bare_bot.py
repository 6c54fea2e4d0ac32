"""Bare bot: the simplest correct Telegram → Anthropic bot, the load benchmark's baseline.

It uses the client libraries parley uses (python-telegram-bot's ``telegram.Bot`` and
the ``anthropic`` SDK) and nothing of parley itself: it long-polls ``getUpdates``,
sends each text message as the only user message of a streamed Messages API call,
collects the streamed text and sends it back to the chat. No prompt, no history, no
persistence, no memory: what is left is what the libraries and the fakes cost.

Like parley it keeps each chat's replies in its messages' order and runs at most
``--max-runs`` provider calls at once (parley's ``[lanes] max_concurrent_runs``).

Configuration is the environment `parley run` gets from ``crash_soak.child_env``
(``TELEGRAM_BOT_TOKEN``, ``TELEGRAM_API_BASE_URL``, ``ANTHROPIC_API_KEY``,
``ANTHROPIC_BASE_URL``) plus ``--model``, ``--max-runs`` and ``--max-tokens``. It runs
until SIGTERM or SIGINT, then lets the replies under way finish and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

import anthropic
from telegram import Bot, Update
from telegram.error import TelegramError
from telegram.request import HTTPXRequest

logger = logging.getLogger("bare_bot")

POLL_TIMEOUT_SECONDS = 1  # parley's load config: poll_timeout_seconds = 1
# The same send pool as parley's Telegram channel: PTB's default (one connection, 1 s
# pool timeout) fails with PoolTimeout when dozens of replies go out at once, and a
# different pool size would make the comparison about pool sizing, not per-message work.
SEND_POOL_SIZE = 16
SEND_POOL_TIMEOUT_SECONDS = 10.0
PROVIDER_TIMEOUT_SECONDS = 120.0  # parley's providers timeout_seconds default
POLL_ERROR_PAUSE_SECONDS = 1.0
STOP_GRACE_SECONDS = 10.0


class BareBot:
    def __init__(self, bot: Bot, llm: anthropic.AsyncAnthropic, args: argparse.Namespace) -> None:
        self.bot = bot
        self.llm = llm
        self.model: str = args.model
        self.max_tokens: int = args.max_tokens
        self.runs = asyncio.Semaphore(args.max_runs)
        # The last reply task of each chat: the next one waits for it, which keeps a
        # chat's replies in order while different chats run side by side.
        self.tails: dict[int, asyncio.Task[None]] = {}
        self.offset: int | None = None  # the next update id not yet taken
        self.stopping = asyncio.Event()

    async def poll(self) -> None:
        while not self.stopping.is_set():
            try:
                updates = await self.bot.get_updates(
                    offset=self.offset, timeout=POLL_TIMEOUT_SECONDS, allowed_updates=["message"]
                )
            except TelegramError as exc:
                logger.warning("getUpdates failed: %s", exc)
                await asyncio.sleep(POLL_ERROR_PAUSE_SECONDS)
                continue
            for update in updates:
                # The next getUpdates acknowledges everything before this offset.
                self.offset = update.update_id + 1
                self.dispatch(update)

    def dispatch(self, update: Update) -> None:
        message = update.message
        if message is None or not message.text:
            return
        chat_id = message.chat.id
        previous = self.tails.get(chat_id)
        task = asyncio.create_task(self.reply(chat_id, message.text, previous))
        self.tails[chat_id] = task
        task.add_done_callback(lambda done: self.forget(chat_id, done))

    def forget(self, chat_id: int, done: asyncio.Task[None]) -> None:
        # Drop the chat's entry once its last reply is out, so idle chats cost nothing.
        if self.tails.get(chat_id) is done:
            del self.tails[chat_id]
        if not done.cancelled() and (exc := done.exception()) is not None:
            logger.error("chat %s: reply failed: %s: %s", chat_id, type(exc).__name__, exc)

    async def reply(self, chat_id: int, text: str, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            # asyncio.wait never raises: the previous reply's failure is logged by its own
            # callback, and this message still gets answered.
            await asyncio.wait([previous])
        async with self.runs:
            answer = await self.ask(text)
        await self.bot.send_message(chat_id, answer)

    async def ask(self, text: str) -> str:
        parts: list[str] = []
        async with self.llm.messages.stream(
            model=self.model,
            max_tokens=self.max_tokens,
            messages=[{"role": "user", "content": text}],
        ) as stream:
            async for delta in stream.text_stream:
                parts.append(delta)
        return "".join(parts) or "(empty reply)"  # Telegram refuses an empty message

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        poller = asyncio.create_task(self.poll())
        await self.stopping.wait()
        # A pending long poll holds nothing we need: cut it rather than wait up to 1 s.
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        pending = list(self.tails.values())
        if pending:
            _, late = await asyncio.wait(pending, timeout=STOP_GRACE_SECONDS)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self.offset is not None:
            # Confirm the last batch, or the server would hand it out again next start.
            with contextlib.suppress(TelegramError):
                await self.bot.get_updates(offset=self.offset, timeout=0, limit=1)


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"bare_bot: {name} is not set")
    return value


async def main_async(args: argparse.Namespace) -> None:
    api = required_env("TELEGRAM_API_BASE_URL").rstrip("/")
    bot = Bot(
        required_env("TELEGRAM_BOT_TOKEN"),
        base_url=f"{api}/bot",
        base_file_url=f"{api}/file/bot",
        request=HTTPXRequest(
            connection_pool_size=SEND_POOL_SIZE, pool_timeout=SEND_POOL_TIMEOUT_SECONDS
        ),
        get_updates_request=HTTPXRequest(connection_pool_size=1),
    )
    llm_options: dict[str, Any] = {
        "api_key": required_env("ANTHROPIC_API_KEY"),
        "base_url": os.environ.get("ANTHROPIC_BASE_URL") or None,
        "timeout": PROVIDER_TIMEOUT_SECONDS,
        # Parley's client options: no SDK retries (a failure shows as a missing reply)
        # and no tracing, so the baseline does not pay for work parley does not do.
        "max_retries": 0,
        "open_telemetry": False,
    }
    async with bot, anthropic.AsyncAnthropic(**llm_options) as llm:
        await BareBot(bot, llm, args).run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-runs", type=int, default=64, help="provider calls at once")
    parser.add_argument("--max-tokens", type=int, default=4096, help="parley's default")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
