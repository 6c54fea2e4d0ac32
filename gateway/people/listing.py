"""``parley people list``: every person the home holds something of, and how much."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from parley.core.memory.audience import MAIN_PERSON, parse_scope
from parley.core.memory.notes import NoteStore
from parley.gateway.agents import agent_specs, loaded_for
from parley.gateway.audiences import PersonLinks
from parley.gateway.config import LoadedConfig
from parley.gateway.memory import notes_dir
from parley.gateway.people import inventory
from parley.gateway.people.who import Person, person_id
from parley.gateway.routing import normalise_channel, normalise_peer_id


@dataclass
class KnownPerson:
    person: str  # the canonical person (an identity-links name, or the id itself)
    ids: set[str] = field(default_factory=set)
    sessions: int = 0
    notes: int = 0
    task_logs: int = 0
    pairing: list[str] = field(default_factory=list)
    terminal_history: bool = False  # the terminal chat's typed lines are theirs

    def to_dict(self) -> dict[str, Any]:
        return {
            "person": self.person,
            "ids": sorted(self.ids),
            "sessions": self.sessions,
            "notes": self.notes,
            "task_logs": self.task_logs,
            "pairing": self.pairing,
            "terminal_history": self.terminal_history,
        }


async def list_people(loaded: LoadedConfig) -> list[KnownPerson]:
    """Every person the home holds something of (and every identity-links name), with
    the ids their data is filed under and how much of it there is. Reads only."""
    await asyncio.to_thread(inventory.refuse_outdated, loaded)
    session = loaded.config.session
    links = PersonLinks(session)
    agent = Person("", loaded.config.agent.id, links)
    people: dict[str, KnownPerson] = {}

    def entry(person_id: str) -> KnownPerson:
        canonical = links(person_id)
        return people.setdefault(canonical, KnownPerson(canonical))

    for name, ids in session.identity_links.items():
        entry(normalise_peer_id(name)).ids.update(person_id(link) for link in ids)
    async with inventory.open_state(loaded) as state:
        for info in await inventory.sessions(state):
            audience = parse_scope(info.scope)
            if audience is not None and audience.kind == "person":
                found = entry(audience.id)
                found.ids.add(audience.id)
                found.sessions += 1
        requests = await state.pairing.list() if state.pairing is not None else []
    for request in requests:
        raw = f"{normalise_channel(request.channel)}:{normalise_peer_id(request.sender_id)}"
        found = entry(raw)
        found.ids.add(raw)
        found.pairing.append(f"{request.channel} {request.sender_id} ({request.status})")

    def local() -> None:
        # Every agent's notes and task records (each agent's are its own).
        for own in (loaded_for(loaded, spec) for spec in agent_specs(loaded.config)):
            for note in NoteStore(notes_dir(own)).files():
                if note.audience.kind == "person":
                    found = entry(note.audience.id)
                    found.ids.add(note.audience.id)
                    found.notes += 1
            for task in inventory.task_files(own):
                for scope in {agent.current_scope(s) for s in task.scopes}:
                    audience = parse_scope(scope)
                    if audience is not None and audience.kind == "person":
                        found = entry(audience.id)
                        found.ids.add(audience.id)
                        found.task_logs += 1

        if inventory.terminal_history(loaded).exists():
            typist = (
                MAIN_PERSON if session.dm_scope == "main" else inventory.terminal_person(loaded)
            )
            found = entry(typist)
            found.ids.add(typist)
            found.terminal_history = True

    await asyncio.to_thread(local)
    for known in people.values():
        if known.person in links.names:
            known.ids.discard(known.person)  # a name is no platform id
    return sorted(people.values(), key=lambda p: p.person)


def format_people(people: list[KnownPerson]) -> str:
    if not people:
        return "no people yet"
    rows = [("PERSON", "IDS", "SESSIONS", "NOTES", "TASK LOGS", "PAIRING")]
    for p in people:
        rows.append(
            (
                p.person,
                ", ".join(sorted(p.ids)) or "-",
                str(p.sessions),
                str(p.notes),
                str(p.task_logs),
                "; ".join(p.pairing) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
