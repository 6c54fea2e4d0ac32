"""The state in one SQLite file, state.db (the default backend)."""
