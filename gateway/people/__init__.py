"""Everything parley keeps about one person: list it, or erase it (``parley people``).

A person is named as ``parley memory search --person`` names one:

- a canonical name of ``[session] identity_links`` (``alice``): every id linked to it,
  and everything the audience rule files under any of them (``PersonLinks``);
- one raw id, ``<channel>:<id>`` (``telegram:123``): that id only (with ``dm_scope =
  "per-peer"`` also the bare ``123`` that per-peer sessions from before audiences were
  filed under). An id linked to a name is erased alone: what the linked ids share is
  erased through the name;
- ``~main``: the one person of ``dm_scope = "main"``.

What ``erase_person`` removes, on either backend:

- the person's sessions, active and archived: every transcript whose header's audience
  (as ``gateway.audiences.scope_resolver`` reads it; a legacy header's from its key, a
  key made while linked being the linked person's) is one of the person's ids, and the
  registry rows of those sessions (a row whose transcript is gone is judged by its
  key); the transcript files, or their rows on PostgreSQL;
- the compaction checkpoints of those sessions (``<checkpoints>/<session id>/``), and any
  other checkpoint folder whose copies' header is the person's;
- their private notes (``NoteStore.erase`` per audience) and task logs (the files named
  by the digest of one of their scopes, or whose records say so, in every writer's
  folder, and in the workspace's legacy ``.parley/tasks``);
- flush blocks of their sessions still in the agent-wide ``<workspace>/memory`` files
  (a home not yet migrated by ``parley doctor --fix``);
- the inbox rows they sent (any chat, groups included: the row is their message) and
  their DM pairing requests or approvals;
- the pictures they sent in their direct chats (their folders of the media store,
  ``gateway.media.store``);
- the terminal chat's line history (``<home>/terminal_history``, what was typed at the
  terminal) when they are the terminal's person (``[channels.terminal] sender_id``);
- then the memory index is synced, so the chunks of every removed file go, and the
  forgetting tombstones of their chunks (which keep a preview of the text) are deleted;
  SQLite files are vacuumed so deleted rows do not linger in free pages.

What it does not touch: a group's transcripts, notes and task records are the group's.
Erasing a person does not rewrite group history; the output says so. Backups under
``<home>/backups`` and log files may still hold copies: the output names them.

It refuses to run while a gateway uses the home (state.db or memory.db held open by
another connection; on PostgreSQL, a replica's session-lock listener connected): erase
with every gateway stopped. ``dry_run`` lists what would go and changes nothing.

Its modules (only the names imported here are the package's API; the names the modules
share with one another are its internals, for its own modules alone):

- ``who``: naming a person (``resolve_person``) and the rule of whose a scope is
  (``Person.owns``);
- ``inventory``: what the home holds (the state stores opened without the gateway's
  locks, every session with the scope of its header, task logs, checkpoint folders),
  and the refusals while a gateway holds the home or its state is from an earlier
  parley;
- ``erase``: what of it is the person's, its removal, and the ``ErasureReport``;
- ``listing``: ``parley people list`` (``list_people``, ``format_people``).
"""

from parley.gateway.people.erase import ErasureReport, erase_person
from parley.gateway.people.listing import KnownPerson, format_people, list_people
from parley.gateway.people.who import Person, PersonError, resolve_person

__all__ = [
    "ErasureReport",
    "KnownPerson",
    "Person",
    "PersonError",
    "erase_person",
    "format_people",
    "list_people",
    "resolve_person",
]
