"""Upgrading a home written by an earlier parley to this one's layout (`parley doctor --fix`).

Not the schema migrations a database runs at open (gateway/storage/sqlite/database.py,
gateway/storage/postgres/schema_migrations.py), nor the copy of a home into PostgreSQL
(gateway/storage/copy_to_postgres.py, `parley migrate`):

- ``state``: state.db, memory.db and transcripts of an earlier parley: survey, the
  hash-checked backup, then the upgrade.
- ``audiences``: private memory written before audiences, out of the agent-wide places.
- ``task_scopes``: task records written before audiences, filed under their audience.
"""
