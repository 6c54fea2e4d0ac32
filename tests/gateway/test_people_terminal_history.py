"""`parley people erase` removes the terminal chat's line history (what its person typed,
kept across runs) when the person erased is the terminal's, and only then."""

from __future__ import annotations

from pathlib import Path

from parley.gateway.config import LoadedConfig
from parley.gateway.people import erase_person, list_people
from parley.gateway.people.inventory import terminal_history
from tests.gateway.memory_helpers import memory_config

CANARY = "periwinkleaxolotl"


def typed(loaded: LoadedConfig) -> Path:
    loaded.home.mkdir(parents=True, exist_ok=True)
    path = terminal_history(loaded)
    path.write_text(f"\n# 2026-03-01 12:00:00.000000\n+my secret is {CANARY}\n", encoding="utf-8")
    return path


def anywhere(root: Path, word: str) -> bool:
    return any(word.encode() in p.read_bytes() for p in root.rglob("*") if p.is_file())


async def test_erasing_the_terminals_person_deletes_its_history(tmp_path: Path) -> None:
    loaded = memory_config(tmp_path)
    path = typed(loaded)
    listed = {p.person: p for p in await list_people(loaded)}
    assert listed["terminal:local"].terminal_history

    preview = await erase_person(loaded, "terminal:local", dry_run=True)
    assert preview.terminal_history == [str(path)] and path.exists()
    assert any(line.startswith("  terminal input  1: ") for line in preview.lines())

    report = await erase_person(loaded, "terminal:local")
    assert report.errors == [] and report.terminal_history == [str(path)]
    assert report.to_dict()["terminal_history"] == [str(path)]
    assert not path.exists()
    assert not anywhere(tmp_path, CANARY)


async def test_a_linked_name_and_main_reach_it_too(tmp_path: Path) -> None:
    linked = memory_config(
        tmp_path / "linked", PARLEY_SESSION__IDENTITY_LINKS='{alice = ["terminal:local"]}'
    )
    path = typed(linked)
    assert (await erase_person(linked, "alice")).terminal_history == [str(path)]
    assert not path.exists()

    main = memory_config(tmp_path / "main", PARLEY_SESSION__DM_SCOPE="main")
    path = typed(main)
    assert (await erase_person(main, "~main")).terminal_history == [str(path)]
    assert not path.exists()


async def test_another_persons_erasure_keeps_it(tmp_path: Path) -> None:
    loaded = memory_config(tmp_path, PARLEY_CHANNELS__TERMINAL__SENDER_ID="Me")
    path = typed(loaded)
    for other in ("terminal:local", "telegram:123", "~main"):
        report = await erase_person(loaded, other)
        assert report.terminal_history == [] and path.exists(), other
    assert (await erase_person(loaded, "terminal:me")).terminal_history == [str(path)]
    assert not path.exists()
