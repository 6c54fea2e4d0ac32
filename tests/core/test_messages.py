"""Message: values derived from a message are kept on it, never shared between two."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref

from parley.core.messages import DerivedKey, Message


class Encoded:
    """A derived value that can be watched going away."""


def test_equal_messages_do_not_share_derived_values() -> None:
    key: DerivedKey[str] = DerivedKey("test")
    one, twin = Message.user("same"), Message.user("same")
    one.keep_derived(key, "one's")

    assert one == twin and hash(one) == hash(twin)
    assert one.derived(key) == "one's"
    assert twin.derived(key) is None
    # Not part of the message's value: equality, hashing and repr ignore it.
    assert repr(one) == repr(twin)


def test_each_key_is_its_own_even_with_the_same_name() -> None:
    first: DerivedKey[int] = DerivedKey("count")
    second: DerivedKey[int] = DerivedKey("count")
    message = Message.user("hello")
    message.keep_derived(first, 1)

    assert message.derived(first) == 1
    assert message.derived(second) is None
    message.keep_derived(second, 2)
    assert (message.derived(first), message.derived(second)) == (1, 2)


def test_a_changed_copy_starts_with_nothing() -> None:
    key: DerivedKey[int] = DerivedKey("count")
    message = Message.user("hello")
    message.keep_derived(key, 5)

    changed = dataclasses.replace(message, role="assistant")

    assert changed.derived(key) is None
    assert message.derived(key) == 5


def test_a_derived_value_goes_with_its_message() -> None:
    key: DerivedKey[Encoded] = DerivedKey("encoded")
    message = Message.user("hello")
    value = Encoded()
    message.keep_derived(key, value)
    watched = weakref.ref(value)
    del value
    assert watched() is not None  # the message holds it

    del message
    gc.collect()

    assert watched() is None


def test_values_kept_from_several_threads_each_read_back_their_own() -> None:
    keys = [DerivedKey[int](f"k{i}") for i in range(8)]
    messages = [Message.user(f"m{i}") for i in range(200)]

    def keep(index: int) -> None:
        for position, message in enumerate(messages):
            if message.derived(keys[index]) is None:
                message.keep_derived(keys[index], position * 10 + index)

    workers = [threading.Thread(target=keep, args=(i,)) for i in range(len(keys))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    # A lost race may drop a value (it is worked out again), never give another's.
    for position, message in enumerate(messages):
        for index, key in enumerate(keys):
            assert message.derived(key) in (None, position * 10 + index)
