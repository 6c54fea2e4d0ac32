"""Reading the terminal chat's lines with line editing and history, when a person types at
a terminal (prompt_toolkit; imported only then: it costs ~0.1 s).

``EditedLines`` runs prompt_toolkit's prompt on the event loop (its input is read with the
loop's reader callbacks, never a blocking call). Output goes above the prompt through
``run_in_terminal``, and the prompt's message shows, above the input line, the reply line
being written or that parley is working: printing a half line next to a live prompt
would tear both. History is a file (owner-only) read on a thread and appended on one;
on start, a file over ``HISTORY_ENTRIES`` entries is first rewritten to its newest ones
(on the writing thread, before it is read), so it never grows for ever. It holds what the
terminal's person typed: ``parley people erase`` deletes it with the rest of theirs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.application import run_in_terminal
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import FileHistory, History, InMemoryHistory, ThreadedHistory
from prompt_toolkit.input import Input
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.output import Output

logger = logging.getLogger("parley.channels.terminal")

# Entries kept in the history file: enough to find last week's lines, bounded so the file
# (parsed whole on every start) does not grow for years.
HISTORY_ENTRIES = 1000


class HistoryFile(FileHistory):
    """prompt_toolkit's history file, owner-only, written on a thread of its own (in
    order), trimmed there to its newest ``HISTORY_ENTRIES`` entries before it is read."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.path = path
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terminal-history")
        self._trimmed = self._writer.submit(self._trim)

    def _trim(self) -> None:
        """Rewrite the file to its newest ``HISTORY_ENTRIES`` entries when it holds more
        (atomically, owner-only): a reader sees the old file or the new, never half."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning("terminal: cannot read the history %s: %s", self.path, exc)
            return
        entries = _entries(data)
        if len(entries) <= HISTORY_ENTRIES:
            return
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(b"".join(entries[-HISTORY_ENTRIES:]))
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path)
        except OSError as exc:
            logger.warning("terminal: cannot trim the history %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                temp.unlink()

    def load_history_strings(self) -> Iterable[str]:
        # On ThreadedHistory's thread: wait for the trim, then read the smaller file.
        self._trimmed.result()
        try:
            newest_first = super().load_history_strings()
            return [line for line, _ in zip(newest_first, range(HISTORY_ENTRIES), strict=False)]
        except OSError as exc:  # no history is no reason to refuse the chat
            logger.warning("terminal: cannot read the history %s: %s", self.path, exc)
            return []

    def store_string(self, string: str) -> None:
        self._writer.submit(self._store, string)

    def _store(self, string: str) -> None:
        try:
            # Owner-only, even if it was made wider: it holds what the person typed.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            super().store_string(string)
        except OSError as exc:
            logger.warning("terminal: cannot write the history %s: %s", self.path, exc)

    def close(self) -> None:
        """Finish the writes queued (a few lines at most)."""
        self._writer.shutdown(wait=True)


def _entries(data: bytes) -> list[bytes]:
    """A history file's entries, oldest first, each with the lines before it (its
    timestamp comment): FileHistory's format, where ``+`` lines make one entry and any
    other line ends it."""
    entries: list[bytes] = []
    before: list[bytes] = []
    entry: list[bytes] = []
    for line in io.BytesIO(data):  # lines as FileHistory reads them: split at \n only
        if line.startswith(b"+"):
            entry.append(line)
            continue
        if entry:
            entries.append(b"".join(before + entry))
            before, entry = [], []
        before.append(line)
    if entry:
        entries.append(b"".join(before + entry))
    return entries


class EditedLines:
    """Lines typed at a terminal, with line editing and history.

    ``status`` gives what the prompt shows above its input line (the reply line being
    written, or that parley is working); call ``refresh`` when it changes. Ctrl-C clears
    a line being typed and, on an empty line, ends input like Ctrl-D."""

    def __init__(
        self,
        prompt: str,
        status: Callable[[], StyleAndTextTuples],
        *,
        history_path: Path | None = None,
        input: Input | None = None,
        output: Output | None = None,
    ) -> None:
        self._prompt = prompt
        self._status = status
        self._file = HistoryFile(history_path) if history_path is not None else None
        history: History = ThreadedHistory(self._file) if self._file else InMemoryHistory()
        bindings = KeyBindings()

        @bindings.add("c-c")
        def _interrupt(event: KeyPressEvent) -> None:
            buffer = event.app.current_buffer
            if buffer.text:
                buffer.reset()
            else:
                event.app.exit(exception=EOFError())

        self._session: PromptSession[str] = PromptSession(
            history=history,
            key_bindings=bindings,
            input=input,
            output=output,
            # Typed-ahead keys (while a reply streams) belong to the next line.
            erase_when_done=False,
        )

    async def read(self) -> str | None:
        try:
            return await self._session.prompt_async(self._message)
        except EOFError:
            return None

    def _message(self) -> StyleAndTextTuples:
        return [*self._status(), ("", self._prompt)]

    async def write(self, text: str, stdout: TextIO) -> None:
        """Print above the prompt (or straight out when no prompt is showing)."""

        def write() -> None:
            stdout.write(text)
            stdout.flush()

        await run_in_terminal(write, in_executor=False)

    def refresh(self) -> None:
        app: Any = self._session.app
        if app.is_running:
            app.invalidate()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
