"""Long-term memory: store, chunking, sync, embedders and search (one memory.db per agent)."""
