"""Kept sources through a rebuild: what retention removed on purpose stays searchable.

Retention (``[retention] archived_memory = "keep"``) marks a transcript's source kept
(``MemoryIndex.keep_removed``: a state key, ``file_sync.kept_key``) before it deletes the
file, and a sync then leaves its rows alone. A rebuild reads only the sources that are
still there, so ``carry_kept`` copies each kept source from the live index into the
shadow after the shadow's sync: its kept mark, then its file row and chunks as stored
(text, lines, timestamps, entry ids; scope and source are the file row's, never
changed, so a chunk stays visible to exactly whom it was). A source the shadow's sync
indexed (its file is back, or was not yet deleted) keeps what the sync wrote; a mark
whose rows were dropped (``drop_removed``, ``parley people erase``) brings nothing back.

Vectors: carried as stored when the rebuild embeds with what the live index did
(embedder, model, key, width: a ``--force`` rebuild, a chunking change); otherwise the
chunks are written pending and the shadow's vector pass embeds their text with the new
model, as it does every other chunk of the shadow. The source is gone, so its chunks
cannot be cut again: a kept source keeps the chunking it was indexed with when the
chunk settings change.

Idempotent, so a killed rebuild resumes: the shadow's mark keeps its sync from deleting
a carried source, a source already in the shadow is not carried again, and each file is
written in one transaction (replacing whatever the shadow had of it).
"""

from __future__ import annotations

from dataclasses import replace

from parley.core.memory.index.file_sync import KEPT_PREFIX
from parley.core.memory.index.workers import StoreThreads
from parley.core.memory.rows import IndexMeta
from parley.core.memory.store_protocol import MemoryStoreProtocol


def same_vectors(live: IndexMeta | None, wanted: IndexMeta) -> bool:
    """Were the live index's vectors made by the model the rebuild embeds with?"""
    if live is None or wanted.embedder == "none":
        return False
    embedding = (wanted.embedder, wanted.model, wanted.provider_key, wanted.dimensions)
    return (live.embedder, live.model, live.provider_key, live.dimensions) == embedding


async def carry_kept(
    live: MemoryStoreProtocol,
    shadow: MemoryStoreProtocol,
    wanted: IndexMeta,
    threads: StoreThreads,
) -> int:
    """Carry every kept source of ``live`` that ``shadow`` lacks into it (after the
    shadow's sync, before its vector pass); how many were carried."""
    w = threads.w
    marks = await w(live.states, KEPT_PREFIX)
    if not marks:
        return 0
    live_files = await w(live.files)
    in_shadow = await w(shadow.files)
    wants_vectors = wanted.embedder != "none"
    # The live vectors are only worth carrying when the shadow can hold them and the
    # live connection can read them (an SQLite without sqlite-vec cannot).
    carry_vectors = (
        same_vectors(await w(live.meta), wanted)
        and shadow.info.vector_available
        and await w(lambda: live.vector_dims) is not None
    )
    carried = 0
    for key, value in sorted(marks.items()):
        path = key[len(KEPT_PREFIX) :]
        # The mark first: should the rebuild be killed before the rows are in, the
        # resumed one carries them; after, its sync leaves them be.
        await w(shadow.set_state, key, value)
        row = live_files.get(path)
        if row is None or path in in_shadow:
            continue  # dropped since it was marked, or indexed by the shadow's own sync
        chunks = await w(live.stored_chunks, path, vectors=carry_vectors)
        dims = {len(c.vector) for c in chunks if c.vector is not None}
        for width in dims:  # one at most: the live index holds one width
            await w(shadow.ensure_vectors, width)
        # Pending (re-embedded by the shadow's vector pass) where no vector came along.
        file = replace(row, chunks=len(chunks), vectors_pending=wants_vectors and bool(chunks))
        await w(shadow.carry_file, file, chunks)
        carried += 1
    return carried
