"""The PostgreSQL backend (``[storage] backend = "postgres"``): state, transcripts and
memory shared by several gateway replicas.

Statements run on a small pool of worker threads with psycopg 3 (sync), the way
state.db's statements run on its thread, so the layers above see the same async
interfaces whichever backend is configured. Needs the ``postgres`` extra.
"""
