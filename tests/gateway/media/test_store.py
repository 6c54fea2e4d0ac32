"""The media store: one owner-only file per picture in its audience's folder, read
through the audience rule, and safe to delete at any time."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from parley.core.memory.audience import Audience, Viewer
from parley.gateway.media.store import MediaStore, owner_of

ALICE = Audience.person("telegram:1")
BOB = Audience.person("telegram:2")
GROUP = Audience.conversation("discord:77")


def test_put_is_content_addressed_private_and_idempotent(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media")
    ref = store.put(ALICE, b"picture bytes", "jpg")
    assert ref.startswith("person/telegram%3A1/") and ref.endswith(".jpg")
    path = tmp_path / "media" / ref
    assert path.read_bytes() == b"picture bytes"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (path.parent, path.parent.parent, tmp_path / "media"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert store.put(ALICE, b"picture bytes", "jpg") == ref  # the same file
    assert store.put(BOB, b"picture bytes", "jpg") != ref  # each audience its own copy
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_reads_follow_the_audience_rule(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media")
    mine = store.put(ALICE, b"a", "png")
    theirs = store.put(GROUP, b"g", "png")
    alice = Viewer.only(ALICE)
    assert store.read(mine, alice) == b"a"
    assert store.read(mine, Viewer.only(BOB)) is None
    assert store.read(theirs, alice) is None  # a group's picture is the group's
    assert store.read(theirs, Viewer.only(GROUP)) == b"g"
    assert store.read(mine, Viewer.for_operator()) == b"a"
    assert store.loader(alice).load(mine) == b"a"
    (tmp_path / "media" / mine).unlink()  # retention may delete any file at any time
    assert store.read(mine, alice) is None


@pytest.mark.parametrize(
    "ref",
    [
        "../state.db",
        "person/telegram%3A1/../../../state.db",
        "person/telegram%3A1/ab/" + "ab" * 32 + ".jpg/../x",
        "agent/ab/" + "ab" * 32 + ".jpg",
        "/etc/passwd",
        "person/telegram%3A1/ab/" + "AB" * 32 + ".jpg",
        "person/telegram:1/ab/" + "ab" * 32 + ".jpg",
    ],
)
def test_anything_but_a_store_ref_is_refused(tmp_path: Path, ref: str) -> None:
    (tmp_path / "state.db").write_bytes(b"secret")
    store = MediaStore(tmp_path / "media")
    store.put(ALICE, b"a", "jpg")
    assert owner_of(ref) is None
    assert store.read(ref, Viewer.for_operator()) is None


def test_audience_folders_list_every_owner(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media")
    assert store.audience_folders() == []
    store.put(ALICE, b"a", "jpg")
    store.put(GROUP, b"g", "jpg")
    found = {audience for audience, _ in store.audience_folders()}
    assert found == {ALICE, GROUP}
