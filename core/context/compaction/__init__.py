"""Compaction: folding the old part of a session into a summary plus a ledger.

``compactor`` plans the cut and writes the ``compaction`` entry; ``strategies/`` make
the summary text; ``summarizer`` is the model half, ``ledger`` the code half;
``triggers`` fire compactions beyond the token threshold, ``gate`` says which sessions
are compacting now, and ``stats`` derives the figures from the transcript.
"""
