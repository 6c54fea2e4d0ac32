"""IdentityMemo: values kept by object identity, for as long as the object lives."""

from __future__ import annotations

import gc

from parley.core.identity_memo import IdentityMemo
from parley.core.messages import Message


def test_equal_objects_do_not_share_a_value() -> None:
    memo: IdentityMemo[Message, str] = IdentityMemo()
    one, twin = Message.user("same"), Message.user("same")
    memo.put(one, "one")

    assert one == twin
    assert memo.get(one) == "one"
    assert memo.get(twin) is None


def test_a_value_goes_with_its_object_and_a_replaced_entry_stays() -> None:
    memo: IdentityMemo[Message, int] = IdentityMemo()
    kept = Message.user("kept")
    gone = Message.user("gone")
    memo.put(kept, 1)
    memo.put(gone, 2)
    memo.put(kept, 3)  # the first reference's callback must not remove the new entry

    del gone
    gc.collect()

    assert len(memo) == 1
    assert memo.get(kept) == 3


def test_an_entry_left_by_an_object_at_a_reused_id_is_not_read() -> None:
    """Until its callback runs, a dead object's entry may sit under an id a new object
    has: the weak reference tells them apart."""
    memo: IdentityMemo[Message, str] = IdentityMemo()
    old = Message.user("old")
    new = Message.user("new")
    stale_ref = memo._values  # the entry written for ``old``, moved under ``new``'s id
    memo.put(old, "old's")
    stale_ref[id(new)] = stale_ref.pop(id(old))

    assert memo.get(new) is None
    memo.put(new, "new's")
    assert memo.get(new) == "new's"
