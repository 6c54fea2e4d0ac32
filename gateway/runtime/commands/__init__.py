"""Slash commands, in one place.

- ``parsing``: which command a message is (``/status``, ``/help``, ``/context``,
  ``/memory``, ``/remember``, ``/forget``, ``/compact``, and the reset triggers
  ``/new`` and ``/reset``).
- ``texts``: what they answer with (help, usage lines, status, memory status and
  search results).
- ``replies``: the answers that need the gateway's state. ``/status``, ``/help``,
  ``/context``, ``/memory``, ``/remember`` and ``/forget`` are answered at once,
  outside the session's lane and without the model; ``/compact`` and the reset
  triggers run in the lane like a turn (``gateway.runtime.dispatch``), since they
  write the transcript. Any other ``/word`` is ordinary text for the model.
"""
