"""The context engine: the model's view of a session, kept inside the model's window.

``engine`` runs before every provider call (the window guard, pruning, the memory
flush, compaction, the deterministic trim) and keeps each session's figures in
``session_state``; ``requests`` holds what its callers pass and get; ``budget`` derives
every size it plans with from the window (2,048 to 1,000,000 tokens); ``view`` is the
model's view of the transcript, which ``history`` builds from the live window and
``pruning`` shrinks old tool results in; ``trim`` cuts a view that still does not fit;
``window`` resolves the model's window; ``flush`` writes durable notes before a
compaction; ``compaction/`` folds the old part of a session into a summary and a
ledger; ``report`` shows what fills the window; ``config`` is the ``[context]`` config
section.
"""
