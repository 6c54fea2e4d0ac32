"""Network faults for provider tests, on 127.0.0.1 only.

- ``ShapingProxy``: a TCP proxy in front of a real server that can stop forwarding the
  answer after some stream events (a stalled stream: the connection stays open, no more
  bytes come) or forward each event after a delay (a slow but steady stream). It also
  keeps every byte the client sent, so a test can read the request the server got.
- ``unanswered_port``: a listening socket whose accept queue is full, so the kernel drops
  new SYNs and a connection attempt hangs: the client's connect timeout must fire.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, Self

EVENT_END = b"\n\n"  # server-sent events end with a blank line
READ_SIZE = 64 * 1024


def _pieces(data: bytes) -> list[bytes]:
    """``data`` cut after each event end, so each piece can be held back or delayed."""
    pieces: list[bytes] = []
    start = 0
    while (end := data.find(EVENT_END, start)) >= 0:
        pieces.append(data[start : end + len(EVENT_END)])
        start = end + len(EVENT_END)
    if start < len(data):
        pieces.append(data[start:])
    return pieces


class ShapingProxy:
    """``async with ShapingProxy(upstream_port, ...) as proxy``: clients use ``proxy.port``.

    ``pause_after_events``: forward that many stream events (pieces carrying ``data:``),
    then nothing more, while holding the connection open. ``delay_per_event``: wait that
    long before forwarding each piece of the answer.
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        pause_after_events: int | None = None,
        delay_per_event: float = 0.0,
    ) -> None:
        self.upstream_port = upstream_port
        self.pause_after_events = pause_after_events
        self.delay_per_event = delay_per_event
        self.port = 0
        self.sent = bytearray()  # what clients sent, all connections together
        self.events_forwarded = 0
        self.paused = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers += [client_w, upstream_w]
        self._spawn(self._requests(client_r, upstream_w))
        self._spawn(self._answers(upstream_r, client_w))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(READ_SIZE):
                self.sent += data
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(READ_SIZE):
                for piece in _pieces(data):
                    if (
                        self.pause_after_events is not None
                        and self.events_forwarded >= self.pause_after_events
                    ):
                        self.paused.set()
                        await asyncio.Event().wait()  # hold the connection, send nothing
                    if self.delay_per_event:
                        await asyncio.sleep(self.delay_per_event)  # the slow server
                    writer.write(piece)
                    await writer.drain()
                    if b"data:" in piece:
                        self.events_forwarded += 1
        writer.close()


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connecting hangs: the listener never accepts, and its
    queue (backlog 0) is filled first, so the kernel drops the next SYNs."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = int(listener.getsockname()[1])
        for _ in range(3):  # Linux queues backlog + 1; a spare or two for other kernels
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
