"""Who a person is: a name as typed, normalised (``person_id``, ``resolve_person``), and
the rule that says whose a stored scope is (``Person``). Internal to ``gateway.people``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from parley.core.memory.audience import MAIN_PERSON, Audience, AudienceError, parse_scope
from parley.gateway.audiences import PersonLinks, scope_for_key
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import GatewayError
from parley.gateway.routing import normalise_channel, normalise_peer_id

_RAW_ID = re.compile(r"[a-z0-9_.@+~-]{1,64}")


class PersonError(GatewayError):
    """Not a person, or not now (a gateway holds the home)."""


@dataclass(frozen=True, slots=True)
class Person:
    """One person, and the rule that says whose scope is theirs."""

    id: str  # normalised: "alice", "telegram:123", "~main"
    agent_id: str
    links: PersonLinks
    linked: tuple[str, ...] = ()  # the ids the identity links give a canonical name
    per_peer: bool = False

    @property
    def canonical(self) -> bool:
        return self.id in self.links.names

    def owns(self, scope: str) -> bool:
        """Is ``scope`` (a stored one: legacy ``dm:``/``group:`` scopes are read as the
        audience their key names) one of this person's?"""
        audience = parse_scope(self.current_scope(scope))
        if audience is None or audience.kind != "person":
            return False
        if self.canonical:
            return self.links(audience.id) == self.id
        if audience.id == self.id:
            return True
        # Per-peer sessions from before audiences were filed under the bare peer (one
        # reading as a link name is that person's, never this id's: viewer_for's rule).
        bare = self.id.partition(":")[2]
        return (
            self.per_peer and bool(bare) and bare not in self.links.names and (audience.id == bare)
        )

    def current_scope(self, scope: str) -> str:
        """A scope of an index or task log from before audiences, as today's audience."""
        kind, sep, rest = scope.partition(":")
        if sep and kind in ("dm", "group") and rest:
            return scope_for_key(f"agent:{self.agent_id}:{rest}", self.links.names)
        return scope

    def senders(self, found: Iterable[str] = ()) -> set[tuple[str | None, str]]:
        """(channel or None for any, peer id) of the person, for the inbox and pairing:
        the linked ids (a canonical name), else the id itself, and the ``channel:peer``
        person ids found in their sessions. Never the canonical name as a peer (a key
        made while linked holds the name, which is nobody's platform id)."""
        ids = set(self.linked) if self.canonical else {self.id}
        ids |= {i for i in found if ":" in i}
        out: set[tuple[str | None, str]] = set()
        for person_id in ids:
            if person_id == MAIN_PERSON:
                continue
            channel, sep, peer = person_id.partition(":")
            if not sep:
                if person_id != self.id or not self.canonical:
                    out.add((None, person_id))
            elif not (self.canonical and peer == self.id and person_id not in self.linked):
                out.add((channel, peer))
        return out


def person_id(text: str) -> str:
    """A person as typed, normalised as session keys normalise ids."""
    raw = text.strip()
    if raw.lower().startswith("person:"):
        raw = raw[len("person:") :]
    if not raw:
        raise PersonError("name a person: a linked name or <channel>:<id>")
    if raw.lower() == MAIN_PERSON:
        return MAIN_PERSON
    channel, sep, peer = raw.partition(":")
    if sep:
        if not peer:
            raise PersonError(f"not a person: {text[:80]!r} (expected <channel>:<id>)")
        return f"{normalise_channel(channel)}:{_peer(peer)}"
    return _peer(raw)


def _peer(raw: str) -> str:
    lowered = raw.lower()
    # Already a key segment (an escaped id as a listing shows it): keep it.
    return lowered if raw.isascii() and _RAW_ID.fullmatch(lowered) else normalise_peer_id(raw)


def resolve_person(loaded: LoadedConfig, text: str) -> Person:
    session = loaded.config.session
    links = PersonLinks(session)
    found = person_id(text)
    try:
        Audience.person(found)
    except AudienceError as exc:
        raise PersonError(f"not a person: {exc}") from exc
    linked: tuple[str, ...] = ()
    if found in links.names:
        for name, ids in session.identity_links.items():
            if normalise_peer_id(name) == found:
                linked = tuple(person_id(link) for link in ids)
    return Person(
        found,
        loaded.config.agent.id,
        links,
        linked,
        per_peer=session.dm_scope == "per-peer",
    )
