"""The terminal chat: lines in, replies out, through the same gateway path.

At a terminal (stdin and stdout both ttys) lines are read with line editing and history
(``terminal_input.EditedLines``, prompt_toolkit, the history file under the parley home
when the gateway passes one); otherwise plain lines are read on a worker thread, which
works the same for a pipe and a file. Either way the event loop never blocks. End of
input (Ctrl-D, or Ctrl-C on an empty line) calls ``on_close`` so ``parley chat`` can
answer what is queued and exit.

Replies stream: drafts are printed as they grow and the reply finishes them, never
printed twice (``terminal_screen.ReplyScreen``). While parley works (from the typing
indicator to the reply) the prompt says so.
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
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

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
    ReplyDraft,
    WebhookRoute,
)
from parley.channels.config import TerminalConfig
from parley.channels.terminal_screen import REPLY_PREFIX, ReplyScreen

if TYPE_CHECKING:
    from prompt_toolkit.formatted_text import StyleAndTextTuples
    from prompt_toolkit.input import Input
    from prompt_toolkit.output import Output

    from parley.channels.terminal_input import EditedLines

__all__ = ["REPLY_PREFIX", "TerminalChannel"]

WORKING_TEXT = "parley is working…"
_STATUS_STYLE = "fg:ansibrightblack"

logger = logging.getLogger("parley.channels.terminal")


class TerminalChannel:
    name = "terminal"
    capabilities = ChannelCapabilities(
        max_message_chars=None, markdown=False, typing_indicator=True, live_drafts=True
    )

    def __init__(
        self,
        config: TerminalConfig,
        *,
        stdin: TextIO | None = None,
        stdout: TextIO | None = None,
        banner: str | None = None,
        on_close: Callable[[], None] | None = None,
        history_path: Path | None = None,
        line_editing: bool | None = None,
        terminal_input: Input | None = None,
        terminal_output: Output | None = None,
    ) -> None:
        """``history_path``: where typed lines are kept across runs (None: this run only).
        ``line_editing``: None decides by whether stdin and stdout are terminals;
        ``terminal_input``/``terminal_output`` stand in for them (tests)."""
        self.config = config
        self._stdin = stdin or sys.stdin
        self._stdout = stdout or sys.stdout
        self.banner = banner
        self.on_close = on_close
        if line_editing is None:
            line_editing = _isatty(self._stdin) and _isatty(self._stdout)
        self._editor: EditedLines | None = None
        if line_editing:
            from parley.channels.terminal_input import EditedLines

            self._editor = EditedLines(
                config.prompt,
                self._status,
                history_path=history_path,
                input=terminal_input,
                output=terminal_output,
            )
        self._plain = PlainLines(self._stdin)
        self._interactive = line_editing or _isatty(self._stdin)
        self._screen = ReplyScreen(hold_partial=self._editor is not None)
        self._working = False
        self._busy_with: str | None = None  # what a draft says the agent is doing
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
        if self._editor is not None:
            await asyncio.to_thread(self._editor.close)  # the last history lines

    def policy(self, message: InboundMessage) -> ChatPolicy:
        return OPEN_POLICY

    def webhook_routes(self) -> list[WebhookRoute]:
        return []

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        text = self._screen.reply(message.text, message.idempotency_key)
        self._busy_with = None
        if not self._screen.drafting:
            self._working = False
        await self._out(text)
        self._prompt()
        return DeliveryResult((f"terminal-out-{next(self._sent)}",), 1, datetime.now(UTC))

    async def draft(self, draft: ReplyDraft) -> None:
        text = self._screen.draft(draft)
        self._busy_with = draft.status  # a tool or a compaction: said in the status line
        if draft.reset == "withdrawn":
            self._working = False  # a silent reply: nothing more is coming
        await self._out(text)

    async def typing(
        self, chat_id: str, thread_id: str | None = None, account: str = "default"
    ) -> None:
        if not self._working:
            self._working = True
            self._refresh()

    # -- output ------------------------------------------------------------------------

    def _status(self) -> StyleAndTextTuples:
        """What the prompt shows above its input line."""
        live = self._screen.live
        if live:
            return [("", f"{live}\n")]
        if self._busy_with:
            return [(_STATUS_STYLE, f"{self._busy_with}…\n")]
        if self._working:
            return [(_STATUS_STYLE, f"{WORKING_TEXT}\n")]
        return []

    async def _out(self, text: str) -> None:
        if self._editor is None:
            if text:
                self._write(text)
            return
        if text:
            await self._editor.write(text, self._stdout)
        self._refresh()

    def _refresh(self) -> None:
        if self._editor is not None:
            self._editor.refresh()

    def _prompt(self) -> None:
        # With line editing the prompt is always there; plain input at a terminal gets
        # one after each reply.
        if self._editor is None and self._interactive:
            self._write(self.config.prompt)

    def _write(self, text: str) -> None:
        with self._lock:
            self._stdout.write(text)
            self._stdout.flush()

    # -- input -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        counter = itertools.count(1)
        reader = self._editor or self._plain
        while True:
            text = await reader.read()
            if text is None:
                if self.on_close is not None:
                    self.on_close()
                return
            if not text.strip():
                self._prompt()
                continue
            if len(text) > self.config.max_input_chars:
                await self._out(
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
                await self._out("(the message was not saved; try again)\n")
                self._prompt()
            except Exception:
                # The reader must outlive any one message: if it died, end of input
                # would never be seen and `parley chat` would wait forever.
                logger.exception("terminal: handling %s failed", inbound.message_id)
                await self._out("(the message could not be handled; try again)\n")
                self._prompt()


class PlainLines:
    """Lines from a file-like ``stdin``, read with a blocking ``readline`` on a worker
    thread; ``None`` at end of input."""

    def __init__(self, stdin: TextIO) -> None:
        self._stdin = stdin

    async def read(self) -> str | None:
        loop = asyncio.get_running_loop()
        # A daemon thread per read: a pending readline must not keep the process alive.
        future: asyncio.Future[str] = loop.create_future()

        def read() -> None:
            try:
                line = self._stdin.readline()
            except (OSError, ValueError):
                line = ""
            if not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_resolve, future, line)

        threading.Thread(target=read, name="terminal-stdin", daemon=True).start()
        line = await future
        return line.rstrip("\r\n") if line else None


def _resolve(future: asyncio.Future[str], line: str) -> None:
    if not future.done():
        future.set_result(line)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False
