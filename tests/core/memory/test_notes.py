"""Private notes (``core.memory.notes.NoteStore``): flush notes and remembered notes in
each audience's own folder under a private root, removed by text or citation (never a
heading, never another audience's line), erased per audience, and display paths
resolved back to files only when they name exactly one audience's note."""

from __future__ import annotations

import os
import stat
from datetime import datetime
from pathlib import Path

import pytest

from parley.core.memory.audience import Audience
from parley.core.memory.notes import MAX_NOTE_CHARS, REMEMBERED_FILE, NoteError, NoteStore

ALICE = Audience.person("alice")
BOB = Audience.person("bob")
LINKED = Audience.person("telegram:42")
MAIN = Audience.person("~main")
GROUP = Audience.conversation("telegram:-100")
WHEN = datetime(2026, 11, 26, 9, 5)
LATER = datetime(2026, 11, 26, 17, 45)


@pytest.fixture
def notes(tmp_path: Path) -> NoteStore:
    return NoteStore(tmp_path / "private" / "notes")


def text_of(notes: NoteStore, audience: Audience, name: str) -> str:
    return (notes.folder(audience) / name).read_text(encoding="utf-8")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- append_flush -----------------------------------------------------------------------------


def test_a_flush_lands_in_the_audiences_file_of_the_day(notes: NoteStore) -> None:
    path = notes.append_flush(ALICE, WHEN, "  - likes oolong\n- sister in Lisbon  \n")
    assert path == "notes/person/alice/2026-11-26.md"
    file = notes.root / "person" / "alice" / "2026-11-26.md"
    assert file == notes.folder(ALICE) / "2026-11-26.md"
    assert file.read_text(encoding="utf-8") == (
        "\n## 09:05 — saved before compaction\n\n- likes oolong\n- sister in Lisbon\n"
    )
    # Private: only the gateway's user may read or list them.
    assert mode(file) == 0o600
    assert mode(notes.folder(ALICE)) == 0o700


def test_flushes_of_one_day_append_and_never_name_a_session(notes: NoteStore) -> None:
    notes.append_flush(ALICE, WHEN, "- first")
    notes.append_flush(ALICE, LATER, "- second")
    notes.append_flush(ALICE, datetime(2026, 11, 27, 8, 0), "- next day")
    text = text_of(notes, ALICE, "2026-11-26.md")
    assert text == (
        "\n## 09:05 — saved before compaction\n\n- first\n"
        "\n## 17:45 — saved before compaction\n\n- second\n"
    )
    assert "(" not in text  # the old header named the session key in parentheses
    assert text_of(notes, ALICE, "2026-11-27.md").endswith("- next day\n")


def test_a_flush_of_one_audience_is_not_in_another(notes: NoteStore) -> None:
    notes.append_flush(ALICE, WHEN, "- alice's")
    notes.append_flush(GROUP, WHEN, "- the group's")
    assert text_of(notes, GROUP, "2026-11-26.md").endswith("- the group's\n")
    assert "group" not in text_of(notes, ALICE, "2026-11-26.md")
    assert notes.folder(GROUP) == notes.root / "conversation" / "telegram%3A-100"
    assert not notes.folder(BOB).exists()


def test_a_flush_is_capped(notes: NoteStore) -> None:
    notes.append_flush(ALICE, WHEN, "x" * (MAX_NOTE_CHARS + 500))
    body = text_of(notes, ALICE, "2026-11-26.md").split("\n\n", 1)[1]
    assert body == "x" * MAX_NOTE_CHARS + "\n"


# -- remember ---------------------------------------------------------------------------------


def test_remember_appends_a_bullet_and_cites_its_line(notes: NoteStore) -> None:
    first = notes.remember(ALICE, WHEN, "  The boat is\n called   Kittiwake ")
    second = notes.remember(ALICE, LATER, "Allergic to peanuts")
    assert first == "notes/person/alice/remembered.md#L1"
    assert second == "notes/person/alice/remembered.md#L2"
    assert text_of(notes, ALICE, REMEMBERED_FILE) == (
        "- The boat is called Kittiwake (2026-11-26)\n- Allergic to peanuts (2026-11-26)\n"
    )
    assert mode(notes.folder(ALICE) / REMEMBERED_FILE) == 0o600


def test_remember_cites_an_encoded_folder(notes: NoteStore) -> None:
    assert notes.remember(LINKED, WHEN, "x") == "notes/person/telegram%3A42/remembered.md#L1"
    assert notes.remember(MAIN, WHEN, "y") == "notes/person/~main/remembered.md#L1"
    assert notes.remember(GROUP, WHEN, "z") == (
        "notes/conversation/telegram%3A-100/remembered.md#L1"
    )


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_remember_refuses_nothing(notes: NoteStore, text: str) -> None:
    with pytest.raises(NoteError):
        notes.remember(ALICE, WHEN, text)
    assert not notes.root.exists()


def test_writes_refuse_a_symlinked_file_or_folder(notes: NoteStore, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.md"
    elsewhere.write_text("untouched\n", encoding="utf-8")
    notes.folder(ALICE).mkdir(parents=True)
    (notes.folder(ALICE) / REMEMBERED_FILE).symlink_to(elsewhere)
    with pytest.raises(NoteError, match="symlink"):
        notes.remember(ALICE, WHEN, "leak me")
    outside = tmp_path / "outside"
    outside.mkdir()
    (notes.root / "person" / "bob").symlink_to(outside, target_is_directory=True)
    with pytest.raises(NoteError, match="symlink"):
        notes.append_flush(BOB, WHEN, "- leak me")
    assert elsewhere.read_text(encoding="utf-8") == "untouched\n"
    assert list(outside.iterdir()) == []


# -- forget -----------------------------------------------------------------------------------


def seeded(notes: NoteStore) -> None:
    notes.append_flush(ALICE, WHEN, "- Alice likes oolong\n- the locker code is 4417")
    notes.remember(ALICE, WHEN, "Oolong at 90 degrees")
    notes.remember(ALICE, WHEN, "Sister Priya lives in Lisbon")
    notes.remember(BOB, WHEN, "Bob likes oolong too")
    notes.append_flush(GROUP, WHEN, "- the team drinks oolong")


def test_forget_by_text_removes_matching_lines_of_the_audience_only(notes: NoteStore) -> None:
    seeded(notes)
    removed = notes.forget(ALICE, "OOLONG")
    assert [(f.path, f.lines) for f in removed] == [
        ("notes/person/alice/2026-11-26.md", ("- Alice likes oolong",)),
        ("notes/person/alice/remembered.md", ("- Oolong at 90 degrees (2026-11-26)",)),
    ]
    assert text_of(notes, ALICE, "2026-11-26.md") == (
        "\n## 09:05 — saved before compaction\n\n- the locker code is 4417\n"
    )
    assert text_of(notes, ALICE, REMEMBERED_FILE) == (
        "- Sister Priya lives in Lisbon (2026-11-26)\n"
    )
    # Bob's and the group's lines with the same word are theirs, and stay.
    assert "oolong" in text_of(notes, BOB, REMEMBERED_FILE)
    assert "oolong" in text_of(notes, GROUP, "2026-11-26.md")
    assert notes.forget(ALICE, "oolong") == []


def test_forget_never_removes_a_heading(notes: NoteStore) -> None:
    seeded(notes)
    before = text_of(notes, ALICE, "2026-11-26.md")
    assert notes.forget(ALICE, "saved before compaction") == []
    assert notes.forget(ALICE, "09:05") == []
    assert notes.forget(ALICE, "notes/person/alice/2026-11-26.md#L2") == []  # the heading
    assert text_of(notes, ALICE, "2026-11-26.md") == before


def test_forget_by_citation_removes_the_cited_lines(notes: NoteStore) -> None:
    seeded(notes)
    removed = notes.forget(ALICE, "notes/person/alice/2026-11-26.md#L1-L5")
    # Lines 1 and 3 are blank and line 2 the heading: only the two notes go.
    assert [(f.path, f.lines) for f in removed] == [
        (
            "notes/person/alice/2026-11-26.md",
            ("- Alice likes oolong", "- the locker code is 4417"),
        )
    ]
    removed = notes.forget(ALICE, "notes/person/alice/remembered.md#L2")
    assert [f.lines for f in removed] == [("- Sister Priya lives in Lisbon (2026-11-26)",)]
    assert text_of(notes, ALICE, REMEMBERED_FILE) == "- Oolong at 90 degrees (2026-11-26)\n"


def test_forget_by_citation_of_another_audiences_file_removes_nothing(notes: NoteStore) -> None:
    seeded(notes)
    bob_before = text_of(notes, BOB, REMEMBERED_FILE)
    group_before = text_of(notes, GROUP, "2026-11-26.md")
    assert notes.forget(ALICE, "notes/person/bob/remembered.md#L1") == []
    assert notes.forget(ALICE, "notes/conversation/telegram%3A-100/2026-11-26.md#L4") == []
    assert notes.forget(GROUP, "notes/person/alice/remembered.md#L1") == []
    assert text_of(notes, BOB, REMEMBERED_FILE) == bob_before
    assert text_of(notes, GROUP, "2026-11-26.md") == group_before
    assert "Oolong at 90" in text_of(notes, ALICE, REMEMBERED_FILE)


def test_forget_needs_a_needle(notes: NoteStore) -> None:
    seeded(notes)
    with pytest.raises(NoteError):
        notes.forget(ALICE, "   ")


def test_forget_leaves_no_temporary_file(notes: NoteStore) -> None:
    seeded(notes)
    notes.forget(ALICE, "Priya")
    assert sorted(p.name for p in notes.folder(ALICE).iterdir()) == [
        "2026-11-26.md",
        REMEMBERED_FILE,
    ]
    assert mode(notes.folder(ALICE) / REMEMBERED_FILE) == 0o600


# -- erase ------------------------------------------------------------------------------------


def test_erase_deletes_every_note_of_the_audience_and_nothing_else(notes: NoteStore) -> None:
    seeded(notes)
    (notes.folder(ALICE) / "stray.txt").write_text("left behind\n", encoding="utf-8")
    removed = notes.erase(ALICE)
    assert removed == ["notes/person/alice/2026-11-26.md", "notes/person/alice/remembered.md"]
    assert not notes.folder(ALICE).exists()
    assert [n.path for n in notes.files()] == [
        "notes/conversation/telegram%3A-100/2026-11-26.md",
        "notes/person/bob/remembered.md",
    ]
    assert notes.erase(ALICE) == []  # nothing left: nothing to do


def test_erase_does_not_follow_a_symlinked_folder(notes: NoteStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.md").write_text("keep\n", encoding="utf-8")
    (notes.root / "person").mkdir(parents=True)
    (notes.root / "person" / "bob").symlink_to(outside, target_is_directory=True)
    assert notes.erase(BOB) == []
    assert (outside / "keep.md").read_text(encoding="utf-8") == "keep\n"


# -- files ------------------------------------------------------------------------------------


def test_files_lists_the_notes_of_every_audience_and_nothing_else(
    notes: NoteStore, tmp_path: Path
) -> None:
    seeded(notes)
    notes.remember(LINKED, WHEN, "linked")
    outside = tmp_path / "outside.md"
    outside.write_text("outside\n", encoding="utf-8")
    (notes.folder(BOB) / "link.md").symlink_to(outside)
    (notes.folder(BOB) / "notes.txt").write_text("not markdown\n", encoding="utf-8")
    for foreign in ("agent/x", "dm/alice", "person/Alice"):
        (notes.root / foreign).mkdir(parents=True)
        (notes.root / foreign / "a.md").write_text("foreign\n", encoding="utf-8")
    (notes.root / "stray.md").write_text("at the root\n", encoding="utf-8")

    found = notes.files()
    assert [(n.path, n.audience) for n in found] == [
        ("notes/conversation/telegram%3A-100/2026-11-26.md", GROUP),
        ("notes/person/alice/2026-11-26.md", ALICE),
        ("notes/person/alice/remembered.md", ALICE),
        ("notes/person/bob/remembered.md", BOB),
        ("notes/person/telegram%3A42/remembered.md", LINKED),
    ]
    assert all(n.abs_path == notes.root / n.path.removeprefix("notes/") for n in found)
    assert NoteStore(tmp_path / "none").files() == []


@pytest.mark.parametrize("name", ["telegram:42", "telegram%3a42"])
def test_files_lists_only_what_resolve_accepts(notes: NoteStore, name: str) -> None:
    (notes.root / "person" / name).mkdir(parents=True)
    (notes.root / "person" / name / "a.md").write_text("- hand made\n", encoding="utf-8")
    assert all(notes.resolve(n.path) is not None for n in notes.files())


# -- resolve ----------------------------------------------------------------------------------


def test_resolve_names_one_audiences_file(notes: NoteStore) -> None:
    note = notes.resolve("notes/person/telegram%3A42/2026-11-26.md")
    assert note is not None
    assert note.audience == LINKED
    assert note.abs_path == notes.folder(LINKED) / "2026-11-26.md"
    assert note.path == "notes/person/telegram%3A42/2026-11-26.md"
    assert not note.abs_path.exists()  # it need not exist yet
    group = notes.resolve("notes/conversation/telegram%3A-100/remembered.md")
    assert group is not None and group.audience == GROUP
    main = notes.resolve("notes/person/~main/remembered.md")
    assert main is not None and main.audience == MAIN


@pytest.mark.parametrize(
    "path",
    [
        "notes/../x.md",
        "notes/person/../../x.md",
        "notes/person/alice/../bob/x.md",
        "notes/person/alice/../../x.md",
        "notes/person/alice",
        "notes/person/alice/",
        "notes/person/alice/x",
        "notes/person/alice/x.txt",
        "notes/person/alice/.hidden.md",
        "notes/person/alice/.remembered.md.tmp",
        "notes/person/alice/a\\b.md",
        "notes/person/alice/a\x00.md",
        "notes/person/alice/sub/x.md",
        "/notes/person/alice/x.md",
        "memory/person/alice/x.md",
        "Notes/person/alice/x.md",
        "notes/agent/x/y.md",
        "notes/dm/alice/x.md",
        "notes/group/team/x.md",
        "notes/persons/alice/x.md",
        "notes/person/Alice/x.md",
        "notes/person//x.md",
        # Folder names that decode to an audience but are not its folder's name.
        "notes/person/telegram:42/x.md",
        "notes/person/telegram%3a42/x.md",
        "notes/person/%61lice/x.md",
        "notes/person/%7Emain/x.md",
        "notes/person/alice%2Fbob/x.md",
    ],
)
def test_resolve_refuses_what_is_not_exactly_a_note_path(notes: NoteStore, path: str) -> None:
    assert notes.resolve(path) is None


@pytest.mark.parametrize("path", ["notes/person/../x.md", "notes/conversation/./x.md"])
def test_resolve_refuses_dot_folders(notes: NoteStore, path: str) -> None:
    assert notes.resolve(path) is None


def test_resolve_refuses_symlinks(notes: NoteStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("secret\n", encoding="utf-8")
    notes.remember(ALICE, WHEN, "real")
    (notes.folder(ALICE) / "link.md").symlink_to(outside / "secret.md")
    (notes.root / "person" / "bob").symlink_to(outside, target_is_directory=True)
    assert notes.resolve("notes/person/alice/link.md") is None
    assert notes.resolve("notes/person/bob/secret.md") is None
    assert notes.resolve("notes/person/alice/remembered.md") is not None


def test_a_resolved_path_round_trips_through_display(notes: NoteStore) -> None:
    for audience in (ALICE, LINKED, MAIN, GROUP, Audience.conversation("discord:g:c:t")):
        path = notes.display(audience, "2026-11-26.md")
        note = notes.resolve(path)
        assert note is not None and note.audience == audience, path
        assert note.abs_path == notes.folder(audience) / "2026-11-26.md"
        assert os.path.commonpath([note.abs_path, notes.root]) == str(notes.root)
