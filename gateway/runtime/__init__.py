"""The gateway at work: what happens to a message once it is admitted.

- ``context``: ``Runtime``, the parts every stage shares (config, state stores,
  channels, metrics, the model-side parts built at start) and the few rules they all
  apply (the session route, the audience, the window).
- ``inbound``: admission, the durable inbox record, info commands answered at once,
  the hand-off to the session's lane.
- ``dispatch``: one lane run (a batch of messages and tasks), folded into turns.
- ``sessions``: session reset and creation, archive, compaction on demand.
- ``transcripts``: the cache of open transcripts.
- ``turn``: one turn in ``core`` and its bookkeeping.
- ``delivery``: a reply stored, sent, recorded; ``redelivery``: replies a platform
  could not take, and what a restart finds unanswered.
- ``replicas``: the PostgreSQL backend's share of a lane run across processes.
- ``commands``: slash commands, their parsing and their texts.
"""
