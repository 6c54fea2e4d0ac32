"""Who may read a piece of memory: its audience, and the one rule that decides.

Every chunk of long-term memory (a transcript, a note, a task record) is filed under a
*scope* string naming its audience, decided by code when it is written:

- ``agent``: everyone who talks to the agent. Only what the operator writes: MEMORY.md,
  the files under the workspace's ``memory/`` and the configured extra paths.
- ``person:<id>``: one human. ``<id>`` is the raw identity the words came from
  (``telegram:123``), a canonical name from the identity links (``alice``), ``~main``
  when every direct chat is one session (``dm_scope = "main"``), or a bare peer id for
  transcripts of a ``per-peer`` session written before audiences existed.
- ``conversation:<channel>:<chat>``: one group, channel or forum. A thread shares its
  parent's audience: everyone in a thread is a member of the group it hangs off.

Reads go through ``may_read`` (and ``visible_scopes``, built on it), nothing else: a
direct chat sees the agent plus its person, a group sees the agent plus itself, and the
operator sees everything. Which raw ids are one person is the gateway's knowledge (its
identity links), handed in as ``Viewer.person_of``; linking two ids therefore merges
what each wrote, and unlinking gives each back its own, without rewriting anything.

Scopes of older indexes (``dm:…``, ``group:…``, ``unscoped``) belong to no audience and
are visible to the operator only, until a rebuild files them again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote, unquote

AudienceKind = Literal["agent", "person", "conversation"]

AGENT_SCOPE = "agent"
# What ``dm_scope = "main"`` files a direct chat under: one person on many devices.
MAIN_PERSON = "~main"
# Scope ids are key segments joined by ":" (lowercase ASCII, ``_ . @ + ~ -``).
_ID_RE = re.compile(r"[a-z0-9_.@+~-]{1,64}(?::[a-z0-9_.@+~-]{1,64}){0,3}")
# A folder name for an audience: the id with anything but these percent-encoded. "." is
# encoded too, so no id (not even "." or "..") names a folder that leaves its kind's.
_FOLDER_SAFE = "_@+~-"


class AudienceError(ValueError):
    """A scope string that names no audience."""


@dataclass(frozen=True, slots=True)
class Audience:
    kind: AudienceKind
    id: str = ""

    @property
    def scope(self) -> str:
        return AGENT_SCOPE if self.kind == "agent" else f"{self.kind}:{self.id}"

    @property
    def label(self) -> str:
        """How people and operators are told about it."""
        if self.kind == "agent":
            return "agent-wide"
        if self.kind == "person":
            return "your direct chats" if self.id == MAIN_PERSON else f"person {self.id}"
        return f"conversation {self.id}"

    @property
    def folder(self) -> str:
        """Where its files live under a private root: ``person/telegram%3A123``."""
        if self.kind == "agent":
            raise AudienceError("agent-wide memory lives in the workspace, not a private root")
        # quote never encodes ".", so it is done by hand (unquote decodes it back).
        return f"{self.kind}/{quote(self.id, safe=_FOLDER_SAFE).replace('.', '%2E')}"

    @classmethod
    def person(cls, person_id: str) -> Audience:
        return cls._checked("person", person_id)

    @classmethod
    def conversation(cls, conversation_id: str) -> Audience:
        return cls._checked("conversation", conversation_id)

    @classmethod
    def _checked(cls, kind: AudienceKind, value: str) -> Audience:
        if not _ID_RE.fullmatch(value):
            raise AudienceError(f"not a {kind} id: {value[:80]!r}")
        return cls(kind, value)


AGENT = Audience("agent")


def parse_scope(scope: str) -> Audience | None:
    """The audience a scope names (None: a legacy or unknown scope, nobody's)."""
    if scope == AGENT_SCOPE:
        return AGENT
    kind, _, value = scope.partition(":")
    if kind not in ("person", "conversation") or not _ID_RE.fullmatch(value):
        return None
    return Audience(kind, value)  # type: ignore[arg-type]  # kind checked above


def parse_folder(kind: str, name: str) -> Audience | None:
    """The audience of a private folder ``<kind>/<name>`` (None: not one of ours)."""
    if kind not in ("person", "conversation"):
        return None
    return parse_scope(f"{kind}:{unquote(name)}")


def audience_label(scope: str) -> str:
    """A scope as operators read it ("unattributed" for scopes of no audience)."""
    audience = parse_scope(scope)
    return audience.label if audience is not None else f"unattributed ({scope})"


def _same(person_id: str) -> str:
    return person_id


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is reading.

    ``audience`` is where the conversation's own words go. ``person_keys`` are the
    canonical persons a direct chat speaks for (usually one); ``person_of`` maps any
    person id to its canonical person (the identity links). ``operator`` sees all.
    """

    audience: Audience
    person_keys: frozenset[str] = frozenset()
    person_of: Callable[[str], str] = field(default=_same, compare=False)
    operator: bool = False
    # True when scopes other than its own may be this viewer's person (identity links,
    # legacy per-peer ids): only then must a search look at every scope the index holds.
    linked: bool = False

    @classmethod
    def for_operator(cls) -> Viewer:
        return cls(AGENT, operator=True)

    @classmethod
    def only(cls, audience: Audience) -> Viewer:
        """A viewer of one audience plus the agent (the CLI's --person/--conversation)."""
        keys = frozenset({audience.id}) if audience.kind == "person" else frozenset()
        return cls(audience, keys)

    @property
    def needs_known_scopes(self) -> bool:
        """Does ``visible_scopes`` need every scope the index holds for this viewer?"""
        return self.operator or (self.audience.kind == "person" and self.linked)


def may_read(viewer: Viewer, scope: str) -> bool:
    """The rule. Every read of memory, notes, task records and transcripts asks it."""
    if viewer.operator:
        return True
    audience = parse_scope(scope)
    if audience is None:
        return False
    if audience.kind == "agent":
        return True
    own = viewer.audience
    if audience.kind == "conversation":
        return own.kind == "conversation" and audience.id == own.id
    # A person's memory: only in that person's direct chats, never in a group.
    return own.kind == "person" and viewer.person_of(audience.id) in viewer.person_keys


def visible_scopes(viewer: Viewer, known: Iterable[str] = ()) -> tuple[str, ...]:
    """The scopes a search for ``viewer`` covers: the agent, its own audience, and any
    ``known`` scope the rule admits (another id linked to the same person), sorted."""
    found = {AGENT_SCOPE}
    if viewer.audience.kind != "agent":
        found.add(viewer.audience.scope)
    found.update(scope for scope in known if may_read(viewer, scope))
    return tuple(sorted(found))


def writable(viewer: Viewer) -> Audience:
    """Where a conversation's own notes go: never the agent, whatever asks."""
    if viewer.audience.kind == "agent":
        raise AudienceError("nothing the bot writes on its own is agent-wide")
    return viewer.audience
