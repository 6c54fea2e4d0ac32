"""The context engine: the model's view of a session, kept inside the model's window.

``engine`` runs before every provider call (the window guard, pruning, the memory
flush, compaction, the deterministic trim); ``history`` builds the view from the
transcript's live window, ``pruning`` shrinks old tool results in it, ``window``
resolves the model's window and the compaction threshold, ``flush`` writes durable
notes before a compaction, ``compaction/`` folds the old part of a session into a
summary and a ledger, ``report`` shows what fills the window, and ``config`` is the
``[context]`` config section.
"""
