"""The memory index: one agent's long-term memory, kept in sync and searched.

Lifecycle: ``await index.start()`` opens the store (two connections, each on its own
thread: a writer for sync and a reader for search, so a long sync never stalls a
search), starts the start-up sync and the file watcher; ``await index.close()`` stops
them. Every store call runs off the event loop.

Sync is incremental: a file whose (mtime, size) and then content hash are unchanged is
skipped; a changed file's chunks are replaced in one transaction, so a kill at any
moment leaves every file either fully old or fully new and the next sync resumes.
Embeddings come from the cache (by content hash) before the embedder is asked.

When what the rows depend on changes (embedder, model, dimensions, chunking,
tokenizer: ``IndexMeta``), the index is rebuilt into ``memory.db.reindex`` while the old
one keeps answering (keyword-only, since its vectors belong to another model), then
swapped in with one rename. A kill during the rebuild resumes it at the next start.
Sources retention removed but kept (``keep_removed``) are carried over from the old
index, so they stay searchable (``kept``).
Another ``StoreBackend`` (PostgreSQL) keeps its rows elsewhere and swaps its own way;
transcripts come through a ``TranscriptSource`` (files, or a transcript store's rows).

Triggers: start-up, a search on a dirty index (an empty index waits for its first
sync), the watcher on memory files (file events, or polling as the fallback;
debounced), transcript appends (debounced, or at once past a size/count threshold),
compactions and new task records.

Forgetting (``core.memory.forgetting``): after a sync, once ``schedule_hours`` have
passed since the last run (kept in the store), and on demand (``forget``). Evicted
chunks leave tombstones that every later sync, and a rebuild, leaves out.

Where each job lives:

- ``memory_index``: ``MemoryIndex``, the facade: its collaborators, open and close;
- ``state``: what the parts share (``IndexState``) and the ``IndexMeta`` wanted;
- ``workers``: the writer and reader threads and their stores;
- ``discovery``: the source files, their markers and bytes;
- ``file_sync``: syncing files into a store (chunking, embedding), ``SyncReport``;
- ``sync``: one sync at a time, incremental or a rebuild, then forgetting if due;
- ``rebuild``: the shadow index built and swapped in;
- ``kept``: the kept sources (their files removed by retention) carried into the shadow;
- ``forgetting_schedule``: when and how forgetting's plan is applied;
- ``triggers``: transcript, compaction, note and task-record syncs (debounced);
- ``watch``: the watcher on the memory files (inotify through watchfiles, polling as the fallback);
- ``search``: catch up, embed the query, run the hybrid search; ``SearchResult``;
- ``status``: ``MemoryStatus``, the scopes a viewer sees, the integrity check;
- ``access``: ``memory_get``, ``/remember`` and ``/forget``.

This module re-exports what importers of ``core.memory.index`` use.
"""

from parley.core.memory.backend import SHADOW_SUFFIX
from parley.core.memory.index.file_sync import (
    UNSCOPED,
    ProgressCallback,
    SyncReport,
    default_scope_resolver,
)
from parley.core.memory.index.memory_index import AsyncResource, MemoryIndex
from parley.core.memory.index.search import SIMILARITY_FLOORS, SearchResult
from parley.core.memory.index.status import MemoryStatus

__all__ = [
    "SHADOW_SUFFIX",
    "SIMILARITY_FLOORS",
    "UNSCOPED",
    "AsyncResource",
    "MemoryIndex",
    "MemoryStatus",
    "ProgressCallback",
    "SearchResult",
    "SyncReport",
    "default_scope_resolver",
]
