"""Which audience a conversation writes to and reads, from its route and the links.

The rule itself lives in ``core.memory.audience``; this module knows what it cannot:
session keys, ``dm_scope`` and the identity links.

- A direct chat writes to ``person:<channel>:<peer>``: the raw id the words came from
  (the peer normalised as in session keys). Several accounts of one channel are one
  person (a platform's user id is the same whichever bot it writes to). With
  ``dm_scope = "main"`` every direct chat is one person, ``person:~main``.
- A group, channel or forum writes to ``conversation:<channel>:<chat>``; its threads
  share it (a thread's members are the group's).
- A direct chat reads every person id that the identity links map to the same
  canonical name as its own: linking merges, unlinking gives each id back its own.

Transcripts record their audience in the header (``meta.memory_scope``); transcripts
from before audiences are attributed from their session key (``scope_for_key``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from parley.core.memory.audience import (
    MAIN_PERSON,
    Audience,
    Viewer,
    parse_scope,
)
from parley.gateway.routing import (
    SessionRoute,
    normalise_channel,
    normalise_peer_id,
    parse_session_key,
    reset_type_for,
)
from parley.gateway.session_config import SessionConfig

# Transcripts nobody can be attributed to: indexed, but in no conversation's search.
UNSCOPED = "unscoped"


class PersonLinks:
    """``person_of``: any person id to its canonical person under the identity links."""

    def __init__(self, config: SessionConfig) -> None:
        self._qualified: dict[tuple[str, str], str] = {}
        self._bare: dict[str, str] = {}
        self.names: frozenset[str] = frozenset(normalise_peer_id(n) for n in config.identity_links)
        for canonical, ids in config.identity_links.items():
            name = normalise_peer_id(canonical)
            for link in ids:
                channel, sep, peer = link.partition(":")
                if sep and peer:
                    self._qualified[(normalise_channel(channel), normalise_peer_id(peer))] = name
                self._bare.setdefault(normalise_peer_id(link), name)

    def __bool__(self) -> bool:
        """Are any ids linked at all?"""
        return bool(self.names)

    def __call__(self, person_id: str) -> str:
        if person_id == MAIN_PERSON:
            return person_id
        channel, sep, peer = person_id.partition(":")
        if not sep:  # a canonical name, or a legacy per-peer id of any channel
            return person_id if person_id in self.names else self._bare.get(person_id, person_id)
        # A raw id is the name's only through a link: a stranger whose id reads as a
        # canonical name ("third:alice") is not that person.
        return self._qualified.get((channel, peer)) or self._bare.get(peer) or person_id


def audience_for(
    route: SessionRoute, *, channel: str, sender_id: str, chat_id: str, config: SessionConfig
) -> Audience:
    """Where a message's conversation writes its memory."""
    if route.chat_type != "direct":
        base = route.parent_key or route.key
        return _conversation_from_key(base)
    raw = sender_id or chat_id
    if config.dm_scope == "main" or not raw:
        return Audience.person(MAIN_PERSON)
    return Audience.person(f"{normalise_channel(channel)}:{normalise_peer_id(raw)}")


def viewer_for(audience: Audience, config: SessionConfig, links: PersonLinks) -> Viewer:
    """What a conversation of ``audience`` may read (``core.memory.audience.may_read``)."""
    if audience.kind != "person":
        return Viewer(audience)
    keys = {links(audience.id)}
    bare = audience.id.partition(":")[2]
    if config.dm_scope == "per-peer" and bare and bare not in links.names:
        # Transcripts of per-peer sessions from before audiences name the bare peer (a
        # peer reading as a canonical name is that person's only through a link).
        keys.add(links(bare))
    linked = bool(links) or keys != {audience.id}
    return Viewer(audience, frozenset(keys), links, linked=linked)


def scope_for_key(key: str, names: frozenset[str] = frozenset()) -> str:
    """The audience of a session key's transcripts, for transcripts whose header does
    not record one ("unscoped" when the key is not one of ours). ``names``: the link
    names; a key made while linked holds the name itself, and is that person's."""
    parsed = parse_session_key(key)
    if parsed is None:
        return UNSCOPED
    base = parsed.parent_key or key
    if reset_type_for(base) != "direct":
        return _conversation_from_key(base).scope
    rest = base.split(":", 2)[2].split(":")
    if len(rest) == 1:  # dm_scope "main"
        return Audience.person(MAIN_PERSON).scope
    if len(rest) == 2 or rest[-1] in names:  # per-peer direct:<peer>, or a linked name
        return Audience.person(rest[-1]).scope
    # per-channel-peer <ch>:direct:<peer>, per-account-channel-peer <ch>:<acct>:direct:<peer>
    return Audience.person(f"{rest[0]}:{rest[-1]}").scope


def _conversation_from_key(base: str) -> Audience:
    rest = base.split(":", 2)[2].split(":")  # <channel>:group:<chat>
    return Audience.conversation(f"{rest[0]}:{rest[-1]}")


def scope_resolver(names: frozenset[str] = frozenset()) -> Callable[[Mapping[str, Any]], str]:
    """A transcript's scope: the person or conversation its header records, else the
    one its key names (older headers record ``dm:…``/``group:…`` or nothing; ``names``:
    the link names, as ``scope_for_key`` takes them)."""

    def resolve(header: Mapping[str, Any]) -> str:
        meta = header.get("meta")
        recorded = meta.get("memory_scope") if isinstance(meta, dict) else None
        audience = parse_scope(recorded) if isinstance(recorded, str) else None
        if audience is not None and audience.kind != "agent":
            return audience.scope
        key = header.get("key")
        return scope_for_key(key, names) if isinstance(key, str) else UNSCOPED

    return resolve


def header_audience(
    header: Mapping[str, Any], names: frozenset[str] = frozenset()
) -> Audience | None:
    """The audience a transcript's words belong to (None: nobody's)."""
    return parse_scope(scope_resolver(names)(header))
