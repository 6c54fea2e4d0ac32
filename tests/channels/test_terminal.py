"""The terminal channel: one reader for the whole run, whatever a message does."""

from __future__ import annotations

import asyncio
import io

import pytest

from parley.channels.base import InboundMessage, InboundNotStored
from parley.channels.config import TerminalConfig
from parley.channels.terminal import TerminalChannel


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
