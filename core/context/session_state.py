"""What the context engine keeps per session between provider calls.

Each session has its accountant (the provider's last reported size and the estimate of
what came after), the trim budget an overflow shrank, the window the provider itself
reported when smaller than configured, and the entry a failed compaction stopped at.
The table is bounded: the least recently used sessions are forgotten first, and a
forgotten session starts again from a full estimate, which costs accuracy, not safety.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from parley.core.tokens import ContextAccountant

MAX_SESSION_STATES = 4096


@dataclass(slots=True)
class SessionState:
    model: str
    accountant: ContextAccountant
    # A compaction that failed or was skipped is not retried until the window changes.
    compaction_blocked_at: str | None = None
    budget_scale: float = 1.0  # < 1 after an overflow: trim below the window by this much
    # The window the provider itself reported in an overflow error, when it is smaller
    # than the configured one: from then on the session plans against the real limit.
    window_cap: int | None = None


class SessionStates:
    """Session key → ``SessionState``, least recently used first out.

    ``new_accountant`` makes the accountant for a model; a session whose model changed
    starts a new state, since the old figures describe another tokenizer and window.
    """

    def __init__(self, new_accountant: Callable[[str], ContextAccountant]) -> None:
        self._new_accountant = new_accountant
        self._states: OrderedDict[str, SessionState] = OrderedDict()

    def get(self, key: str, model: str) -> SessionState:
        """The session's state for ``model``, made when missing or the model changed."""
        state = self._states.get(key)
        if state is None or state.model != model:
            state = SessionState(model, self._new_accountant(model))
            self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > MAX_SESSION_STATES:
            self._states.popitem(last=False)
        return state

    def peek(self, key: str) -> SessionState | None:
        """The session's state if it has one, without making it recently used."""
        return self._states.get(key)

    def forget(self, key: str) -> None:
        self._states.pop(key, None)
