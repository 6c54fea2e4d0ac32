"""Retention: what parley removes from disk, when, and in what order ("tidy disks").

- ``gateway/retention_config.py`` (beside it): the ``[retention]`` section and its size strings.
- ``inventory``: what lies under the home, per kind, with its bytes (doctor, the cap).
- ``plan``: what one run would remove (archived transcripts and their checkpoints,
  finished inbox rows, media), by age and then by the disk cap, oldest archived first.
- ``run``: removing what a plan holds, under the home's lock (and on PostgreSQL the shared
  database's: one run at a time across replicas), and the record of the last run.
- ``service``: the daily run inside the gateway (an explicit lifecycle).
- ``usage``: what `parley doctor` says of the disk and of the last run.

Only archived data goes: an active session's transcript, an open inbox item, the
memory database and state.db itself are never removed. Output is counts, bytes and
session ids only, never a message's words.
"""
