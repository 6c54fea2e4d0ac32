"""The terminal chat: stdin lines in, replies out, through the same gateway path.

Input is read on a worker thread (a blocking readline works the same for a tty, a
pipe and a file, and never blocks the event loop). End of input calls ``on_close``
so ``parley chat`` can answer what is queued and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

from parley.channels.base import (
    OPEN_POLICY,
    ChannelCapabilities,
    ChannelStartError,
    ChatPolicy,
    DeliveryResult,
    InboundHandler,
    InboundMessage,
    InboundNotStored,
    OutboundMessage,
    WebhookRoute,
)
from parley.channels.config import TerminalConfig

REPLY_PREFIX = "parley> "

logger = logging.getLogger("parley.channels.terminal")


class TerminalChannel:
    name = "terminal"
    capabilities = ChannelCapabilities(max_message_chars=None, markdown=False)

    def __init__(
        self,
        config: TerminalConfig,
        *,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        banner: str | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self._stdin = stdin or sys.stdin
        self._stdout = stdout or sys.stdout
        self.banner = banner
        self.on_close = on_close
        self._interactive = bool(getattr(self._stdin, "isatty", lambda: False)())
        self._task: asyncio.Task[None] | None = None
        self._handler: InboundHandler | None = None
        self._lock = threading.Lock()
        self._sent = itertools.count(1)
        # Message ids must be unique across runs: the inbox dedupes on them.
        self._run_id = uuid.uuid4().hex[:12]

    async def start(self, handler: InboundHandler) -> None:
        if self._task is not None:
            raise ChannelStartError("the terminal channel is already running")
        self._handler = handler
        if self.banner:
            self._write(f"{self.banner}\n")
        self._write("Type a message and press Enter. /help lists commands; Ctrl-D quits.\n")
        self._prompt()
        self._task = asyncio.create_task(self._read_loop(), name="terminal-reader")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def policy(self, message: InboundMessage) -> ChatPolicy:
        return OPEN_POLICY

    def webhook_routes(self) -> list[WebhookRoute]:
        return []

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        body = message.text.replace("\n", "\n" + " " * len(REPLY_PREFIX))
        self._write(f"{REPLY_PREFIX}{body}\n")
        self._prompt()
        return DeliveryResult((f"terminal-out-{next(self._sent)}",), 1, datetime.now(UTC))

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        return None

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        counter = itertools.count(1)
        while True:
            # A daemon thread per read: a pending readline must not keep the process alive.
            future: asyncio.Future[str] = loop.create_future()

            def read(fut: asyncio.Future[str] = future) -> None:
                try:
                    line = self._stdin.readline()
                except (OSError, ValueError):
                    line = ""
                if not loop.is_closed():
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(_resolve, fut, line)

            threading.Thread(target=read, name="terminal-stdin", daemon=True).start()
            line = await future
            if line == "":
                if self.on_close is not None:
                    self.on_close()
                return
            text = line.rstrip("\r\n")
            if not text.strip():
                self._prompt()
                continue
            if len(text) > self.config.max_input_chars:
                self._write(
                    f"(message refused: {len(text):,} characters; the limit is "
                    f"{self.config.max_input_chars:,})\n"
                )
                self._prompt()
                continue
            assert self._handler is not None
            inbound = InboundMessage(
                channel=self.name,
                account="default",
                chat_type="direct",
                chat_id=self.config.sender_id,
                sender_id=self.config.sender_id,
                sender_name=self.config.sender_name,
                text=text,
                message_id=f"{self._run_id}-{next(counter)}",
                timestamp=datetime.now(UTC),
                mentions_bot=True,
            )
            try:
                await self._handler(inbound)
            except InboundNotStored as exc:  # storage refuses writes: the person retries
                logger.warning("terminal: %s not stored: %s", inbound.message_id, exc)
                self._write("(the message was not saved; try again)\n")
                self._prompt()
            except Exception:
                # The reader must outlive any one message: if it died, end of input
                # would never be seen and `parley chat` would wait forever.
                logger.exception("terminal: handling %s failed", inbound.message_id)
                self._write("(the message could not be handled; try again)\n")
                self._prompt()

    def _prompt(self) -> None:
        if self._interactive:
            self._write(self.config.prompt)

    def _write(self, text: str) -> None:
        with self._lock:
            self._stdout.write(text)
            self._stdout.flush()


def _resolve(future: asyncio.Future[str], line: str) -> None:
    if not future.done():
        future.set_result(line)
