"""The index's two worker threads, and the store connection each holds open.

A writer (sync, rebuild, forgetting, status) and a reader (search, the scopes a viewer
may see) each own a connection, so a long sync never stalls a search. Store calls
block, so every one runs on its thread, never on the event loop. The reader lock keeps
a search off the reader's store while a rebuild swaps the live index.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from parley.core.errors import MemoryIndexError
from parley.core.memory.store_protocol import MemoryStoreProtocol, StoreBackend

T = TypeVar("T")


class StoreThreads:
    def __init__(self) -> None:
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="parley-memory-write")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="parley-memory-read")
        self.wstore: MemoryStoreProtocol | None = None
        self.rstore: MemoryStoreProtocol | None = None
        self.reader_lock = asyncio.Lock()

    async def w(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the writer's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, lambda: fn(*args, **kwargs))

    async def r(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the reader's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, lambda: fn(*args, **kwargs))

    def writer_store(self) -> MemoryStoreProtocol:
        if self.wstore is None:
            raise MemoryIndexError("the memory index is not open")
        return self.wstore

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[MemoryStoreProtocol]:
        """The reader's store, held under the reader lock (call it with ``r``)."""
        async with self.reader_lock:
            store = self.rstore
            if store is None:
                raise MemoryIndexError("the memory index is not open")
            yield store

    async def open(self, backend: StoreBackend, *, vector: bool) -> None:
        """Open the live index on both threads."""
        self.wstore = await self.w(backend.open_live, vector=vector)
        self.rstore = await self.r(backend.open_live, vector=vector)

    async def swap_in(self, backend: StoreBackend, *, vector: bool) -> None:
        """Close both stores, promote the backend's shadow, open the new live index."""
        async with self.reader_lock:
            if self.rstore is not None:
                await self.r(self.rstore.close)
            await self.w(self.writer_store().close)
            self.wstore = self.rstore = None
            await self.w(backend.promote_shadow)
            self.wstore = await self.w(backend.open_live, vector=vector)
            self.rstore = await self.r(backend.open_live, vector=vector)

    async def close_stores(self) -> None:
        if self.wstore is not None:
            await self.w(self.wstore.close)
        if self.rstore is not None:
            await self.r(self.rstore.close)
        self.wstore = self.rstore = None

    def shutdown(self) -> None:
        """Stop both threads (after ``close_stores``)."""
        self._writer.shutdown(wait=True)
        self._reader.shutdown(wait=True)
