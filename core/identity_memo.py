"""Values worked out from an object, kept exactly as long as the object lives.

The context view hands the same ``Message`` objects from turn to turn (a transcript
parses each entry once), so what is derived from a message (its token count, its
encoded wire form) need only be computed the first time it is sent. Keyed by
identity, not by value: a message's value hash would walk all its text, and its
tool inputs are dicts, which do not hash at all. A weak reference drops the value
when the object goes, so a memo holds exactly what some live window still holds,
however many sessions there are: a fixed bound made a busy gateway (1,000 chats)
recompute every history on every turn once the histories outgrew it.

A plain dict, not a locked LRU: it is read once per object per call on the hot path,
and single dict operations are atomic.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")  # any object that takes weak references (a slots class needs __weakref__)
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    def __init__(self) -> None:
        self._values: dict[int, tuple[weakref.ref[K], V]] = {}

    def get(self, key: K) -> V | None:
        held = self._values.get(id(key))
        # The id of a freed object can be reused before its callback ran: the
        # reference must still point at this very object.
        if held is not None and held[0]() is key:
            return held[1]
        return None

    def put(self, key: K, value: V) -> None:
        ident = id(key)
        self._values[ident] = (weakref.ref(key, self._forget(ident)), value)

    def __len__(self) -> int:
        return len(self._values)

    def clear(self) -> None:
        self._values.clear()

    def _forget(self, ident: int) -> Callable[[weakref.ref[K]], None]:
        """The callback dropping a value when its object goes. Run while the object is
        being freed, before its id can be reused; it checks the entry is still its own
        all the same (a newer object with the same id may have replaced it)."""
        values = self._values

        def forget(ref: weakref.ref[K]) -> None:
            held = values.get(ident)
            if held is not None and held[0] is ref:
                with contextlib.suppress(KeyError):
                    del values[ident]

        return forget
