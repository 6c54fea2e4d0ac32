"""Long-term memory in PostgreSQL: ``MemoryStore``'s methods and semantics on shared tables.

Layout (migration 3): ``memory_indexes`` has one row per index, an agent's ``live``
one and, during a full rebuild, its ``shadow``; files, chunks and the embedding cache
hang off that row. Every statement resolves the row by (name, role) first, so a
replica whose peer has just promoted a rebuild reads the new index at its next
statement, and a half-built shadow is never anybody's live index.

- ``backend``: ``PgMemoryBackend``, one agent's live and shadow indexes (the
  ``StoreBackend``): opens them, promotes a rebuild, drops an index.
- ``store``: ``PgMemoryStore``, opening an index, its meta and its vector width; the
  rest of its methods come from one class per job:
  ``files`` (files, chunks, the embedding cache, late vectors), ``search`` (keyword and
  vector hits, chunk rows), ``forgetting`` (state and tombstones), ``status`` (counts,
  scopes, integrity).
- ``base``: what those classes share: the index row, its roles, one transaction per call.
- ``info``: ``PgStoreInfo``, the server's and pgvector's versions.
- ``chunks``: building and inserting chunk rows (the store, and ``parley migrate``).
- ``keyword``: FTS5's query syntax and BM25 ranking, reproduced on tsvectors.
- ``vectors``: pgvector: the index choice, HNSW limits, the text form, exact ranking.
"""
