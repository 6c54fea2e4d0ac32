"""The terminal channel: one reader for the whole run, whatever a message does; replies
that stream printed once; line editing and history through prompt_toolkit's pipe input."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from parley.channels.base import InboundMessage, InboundNotStored, OutboundMessage, ReplyDraft
from parley.channels.config import TerminalConfig
from parley.channels.terminal import TerminalChannel
from parley.channels.terminal_screen import RETRY_NOTE, ReplyScreen


async def test_a_failing_message_does_not_end_the_reader() -> None:
    """A handler that raises (a bug, storage refusing writes) costs that message only:
    the next lines are read, and end of input is still reported (else `parley chat`
    would wait for it forever)."""
    stdin = io.StringIO("boom\nnot stored\nfine\n")
    stdout = io.StringIO()
    closed = asyncio.Event()
    seen: list[str] = []

    async def handler(message: InboundMessage) -> None:
        seen.append(message.text)
        if message.text == "boom":
            raise RuntimeError("a bug in the gateway")
        if message.text == "not stored":
            raise InboundNotStored("storage is read-only")

    channel = TerminalChannel(TerminalConfig(), stdin=stdin, stdout=stdout, on_close=closed.set)
    await channel.start(handler)
    try:
        await asyncio.wait_for(closed.wait(), timeout=10)
    finally:
        await channel.stop()
    assert seen == ["boom", "not stored", "fine"]
    out = stdout.getvalue()
    assert "(the message could not be handled; try again)" in out
    assert "(the message was not saved; try again)" in out


@pytest.mark.parametrize("lines", ["", "\n\n"])
async def test_end_of_input_is_reported(lines: str) -> None:
    closed = asyncio.Event()

    async def handler(message: InboundMessage) -> None:
        raise AssertionError("blank lines are not messages")

    channel = TerminalChannel(
        TerminalConfig(), stdin=io.StringIO(lines), stdout=io.StringIO(), on_close=closed.set
    )
    await channel.start(handler)
    try:
        await asyncio.wait_for(closed.wait(), timeout=10)
    finally:
        await channel.stop()


# -- replies that stream -----------------------------------------------------------------


def draft(
    text: str, key: str = "k1", reset: str | None = None, status: str | None = None
) -> ReplyDraft:
    return ReplyDraft("terminal", "default", "local", key, text, reset=reset, status=status)  # type: ignore[arg-type]


def final(text: str, key: str | None = "k1") -> OutboundMessage:
    return OutboundMessage("terminal", "default", "local", text, idempotency_key=key)


async def plain_channel() -> tuple[TerminalChannel, io.StringIO]:
    stdout = io.StringIO()
    channel = TerminalChannel(TerminalConfig(), stdin=io.StringIO(""), stdout=stdout)
    return channel, stdout


async def test_a_streamed_reply_is_printed_once() -> None:
    channel, stdout = await plain_channel()
    assert channel.capabilities.live_drafts
    for text in ("Hel", "Hello wor", "Hello world\nSecond", "Hello world\nSecond line\n\n"):
        await channel.draft(draft(text))
    await channel.send(final("Hello world\nSecond line"))
    # The reply goes on from its draft: every word once, the usual layout.
    assert stdout.getvalue() == "parley> Hello world\n        Second line\n\n"
    await channel.draft(draft("Hello world\nSecond line and more"))  # late: ignored
    assert stdout.getvalue().count("Second line") == 1


async def test_a_retry_says_so_and_the_reply_follows() -> None:
    channel, stdout = await plain_channel()
    await channel.draft(draft("The answer"))
    await channel.draft(draft("Sorry,", reset="retry"))
    await channel.send(final("Sorry, it is 42."))
    assert stdout.getvalue() == (
        f"parley> The answer\n        {RETRY_NOTE}\nparley> Sorry, it is 42.\n"
    )


async def test_a_reply_that_is_not_its_draft_is_printed_whole() -> None:
    channel, stdout = await plain_channel()
    await channel.draft(draft("Half a tho"))
    await channel.send(final("The model could not be reached. Try again."))
    assert stdout.getvalue() == (
        "parley> Half a tho\nparley> The model could not be reached. Try again.\n"
    )


async def test_a_command_answered_mid_stream_does_not_double_the_draft() -> None:
    channel, stdout = await plain_channel()
    await channel.draft(draft("Once upon"))
    await channel.send(final("Commands: /help", key="other"))
    await channel.draft(draft("Once upon a time"))
    await channel.send(final("Once upon a time."))
    assert stdout.getvalue() == ("parley> Once upon\nparley> Commands: /help\nparley>  a time.\n")


async def test_a_withdrawn_draft_ends_its_line() -> None:
    channel, stdout = await plain_channel()
    await channel.typing("local")
    await channel.draft(draft("Thinking"))
    await channel.draft(draft("", reset="withdrawn"))
    await channel.send(final("next", key="k2"))
    assert stdout.getvalue() == "parley> Thinking\nparley> next\n"


def test_held_lines_show_whole_lines_only() -> None:
    """With line editing the line being written stays in the prompt until it is whole."""
    screen = ReplyScreen(hold_partial=True)
    assert screen.draft(draft("One two")) == ""
    assert screen.live == "parley> One two"
    assert screen.draft(draft("One two\nThree")) == "parley> One two\n"
    assert screen.live == "        Three"
    # Text written before a tool call is kept as a line; the next call's text follows.
    assert screen.draft(draft("Final", reset="next_call")) == "        Three\n"
    assert screen.live == "parley> Final"
    assert screen.reply("Final answer.", "k1") == "parley> Final answer.\n"
    assert screen.live == "" and not screen.drafting
    assert screen.draft(draft("Final answer. More")) == ""  # its reply is out


def test_held_lines_drop_void_text_on_retry() -> None:
    screen = ReplyScreen(hold_partial=True)
    screen.draft(draft("never printed"))
    assert screen.draft(draft("", reset="retry")) == ""  # only the prompt showed it
    assert screen.live == ""
    assert screen.reply("Fresh.", "k1") == "parley> Fresh.\n"


# -- line editing --------------------------------------------------------------------------


class Typist:
    """A terminal with line editing driven through prompt_toolkit's pipe input."""

    def __init__(self, history: Path | None) -> None:
        self.seen: list[str] = []
        self.closed = asyncio.Event()
        self.stdout = io.StringIO()
        self._pipe = create_pipe_input()
        self.keys = self._pipe.__enter__()
        self.channel = TerminalChannel(
            TerminalConfig(),
            stdout=self.stdout,
            on_close=self.closed.set,
            history_path=history,
            line_editing=True,
            terminal_input=self.keys,
            terminal_output=DummyOutput(),
        )

    async def handler(self, message: InboundMessage) -> None:
        self.seen.append(message.text)

    async def lines(self, count: int) -> list[str]:
        await until(lambda: len(self.seen) >= count)
        return self.seen

    async def close(self) -> None:
        await self.channel.stop()
        self._pipe.__exit__(None, None, None)


async def until(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Wait for ``condition``, which prompt_toolkit's own tasks and threads make true
    (they signal nothing a test could await): checked every few ms, up to a deadline."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 - no event exists to wait on
            await asyncio.sleep(0.005)


async def test_line_editing_keeps_history_across_runs(tmp_path: Path) -> None:
    history = tmp_path / "terminal_history"
    first = Typist(history)
    await first.channel.start(first.handler)
    first.keys.send_text("helo\x7flo there\r")  # a typo fixed with backspace
    assert await first.lines(1) == ["hello there"]
    first.keys.send_text("\x04")  # Ctrl-D: end of input
    await asyncio.wait_for(first.closed.wait(), 10)
    await first.close()
    assert history.stat().st_mode & 0o777 == 0o600
    assert "+hello there" in history.read_text()

    second = Typist(history)
    await second.channel.start(second.handler)
    editor = second.channel._editor
    assert editor is not None
    # History loads on a thread while the prompt is up: wait until Up can reach it.
    buffer = editor._session.default_buffer
    await until(lambda: "hello there" in buffer._working_lines)
    second.keys.send_text("\x1b[A\r")  # Up, Enter: the line from the last run again
    assert await second.lines(1) == ["hello there"]
    second.keys.send_text("typed\x03")  # Ctrl-C clears a line being typed ...
    second.keys.send_text("\x03")  # ... and on an empty line ends input
    await asyncio.wait_for(second.closed.wait(), 10)
    assert second.seen == ["hello there"]
    await second.close()


async def test_line_editing_shows_the_line_being_written_and_working() -> None:
    typist = Typist(None)
    channel = typist.channel
    await channel.start(typist.handler)
    try:
        assert channel._status() == []
        await channel.typing("local")
        assert "parley is working" in str(channel._status())
        await channel.draft(draft("First line\nsecond"))
        assert channel._status() == [("", "        second\n")]
        await channel.send(final("First line\nsecond line"))
        assert channel._status() == []  # the reply is out: nothing in progress
        await until(lambda: "second line" in typist.stdout.getvalue())
        assert typist.stdout.getvalue().count("First line") == 1
        assert typist.stdout.getvalue().endswith("parley> First line\n        second line\n")
    finally:
        await typist.close()


async def test_the_status_line_says_which_tool_runs_until_the_reply() -> None:
    channel, _ = await plain_channel()
    await channel.typing("local")
    await channel.draft(draft("", status="running current_time"))
    assert "running current_time…" in str(channel._status())
    await channel.draft(draft("It is noon"))  # the tool is done: back to working
    assert "running" not in str(channel._status())
    await channel.send(final("It is noon."))
    assert channel._status() == []


async def test_a_silent_reply_ends_working() -> None:
    channel, stdout = await plain_channel()
    await channel.typing("local")
    assert "working" in str(channel._status())
    await channel.draft(draft("", reset="withdrawn"))  # nothing was shown, nothing follows
    assert channel._status() == [] and stdout.getvalue() == ""


def test_a_history_file_over_the_cap_is_trimmed_to_its_newest_entries(tmp_path: Path) -> None:
    from prompt_toolkit.history import FileHistory

    from parley.channels.terminal_input import HISTORY_ENTRIES, HistoryFile

    path = tmp_path / "terminal_history"
    total = HISTORY_ENTRIES + 250
    path.write_text(
        "".join(
            f"\n# 2026-03-01 12:00:{n:06d}\n+line {n}\n+second\rhalf {n}\n" for n in range(total)
        )
    )
    path.chmod(0o644)
    history = HistoryFile(path)
    try:
        loaded = list(history.load_history_strings())  # newest first, after the trim
    finally:
        history.close()
    assert len(loaded) == HISTORY_ENTRIES
    assert loaded[0] == f"line {total - 1}\nsecond\rhalf {total - 1}"
    # The file itself now holds only the newest entries, timestamps kept, owner-only.
    on_disk = list(FileHistory(path).load_history_strings())
    assert on_disk == loaded
    text = path.read_text()
    assert "+line 249\n" not in text and "+line 250\n" in text
    assert f"# 2026-03-01 12:00:{total - 1:06d}\n" in text
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["terminal_history"]


def test_a_history_file_under_the_cap_is_left_alone(tmp_path: Path) -> None:
    from parley.channels.terminal_input import HistoryFile

    path = tmp_path / "terminal_history"
    path.write_text("\n# t\n+only\n")
    before = path.stat().st_ino, path.read_text()
    history = HistoryFile(path)
    try:
        assert list(history.load_history_strings()) == ["only"]
    finally:
        history.close()
    assert (path.stat().st_ino, path.read_text()) == before
