"""Session keys: which conversation a message belongs to.

A key is ``agent:<agent>:<rest>``, every segment lowercase ASCII, none longer than
64 characters, ``:`` only between segments. Keys are data, never paths: the gateway
names files by random session ids, so nothing here has to be filesystem-safe.

Shapes of ``<rest>``::

    direct, dm_scope "main"                      <main_key>
    direct, dm_scope "per-peer"                  direct:<peer>
    direct, dm_scope "per-channel-peer"          <channel>:direct:<peer>
    direct, dm_scope "per-account-channel-peer"  <channel>:<account>:direct:<peer>
    group (groups, rooms and channels alike)     <channel>:group:<chat_id>
    thread / forum topic                         <base>:thread:<thread_id>

Contract with the adapters:

- In a DM the peer is ``sender_id`` (the person), falling back to ``chat_id``; when
  both are empty every dm_scope falls back to the main key.
- ``chat_type="thread"`` is a thread or topic inside a group: ``chat_id`` is the group,
  ``thread_id`` the thread. A thread in a DM (Telegram private topics) is
  ``chat_type="direct"`` with a ``thread_id``. A thread message without a thread id is
  keyed as its group. There is no separate "channel" kind: a Discord text channel is a
  group. ``parse_session_key`` still reads a legacy ``:channel:`` kind as a group.

Normalisation:

- Agent, account and channel names: kept when they match ``^[a-z0-9][a-z0-9_-]{0,63}$``
  after lowercasing; otherwise runs of other characters become ``-``, leading ``-``/``_``
  and trailing ``-`` are trimmed, the result is cut to 64 characters, and an empty
  result becomes ``main`` / ``default`` / ``unknown``.
- Peer, chat and thread ids: kept when, after lowercasing, they are 1-64 characters of
  ``a-z 0-9 _ - . @ +`` (Telegram's negative group ids keep their ``-``). Any other id
  is rewritten lossily (invalid runs to ``-``, trimmed, shortened) and then tagged with
  ``~`` and 16 hex digits of a BLAKE2b digest of the lowercased original. ``~`` never
  appears in a kept id, so two different ids (case aside) can never share a session:
  ``a:b`` and ``a-b``, or two long ids with a common 64-character prefix, stay apart.
  An empty id becomes ``unknown``.
- Identity links (not for dm_scope "main"): the candidates are the lowercased peer id
  and ``<channel>:<peer id>``; the first canonical name (in config order) listing one
  of them replaces the peer. Canonical names share the namespace of raw peer ids, so an
  unlinked id equal to a canonical name is always digest-tagged (``alice~<hex>``): a
  stranger called "alice" never shares the linked Alice's session.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from hashlib import blake2b

from parley.channels.base import ChatType
from parley.core.agent_config import DEFAULT_AGENT_ID
from parley.gateway.session_config import DEFAULT_MAIN_KEY, ResetType, SessionConfig

DEFAULT_ACCOUNT_ID = "default"
DEFAULT_CHANNEL_NAME = "unknown"
UNKNOWN_PEER = "unknown"
MAX_SEGMENT_CHARS = 64
ESCAPE_MARK = "~"
DIGEST_HEX_CHARS = 16

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_NAME_INVALID_RUN = re.compile(r"[^a-z0-9_-]+")
_PEER_RE = re.compile(r"[a-z0-9_.@+-]{1,64}")
_PEER_INVALID_RUN = re.compile(r"[^a-z0-9_.@+-]+")
# Everything resolve_session_key can produce, and nothing else.
SESSION_KEY_RE = re.compile(r"agent:[a-z0-9][a-z0-9_-]{0,63}(?::[a-z0-9_.@+~-]{1,64})+")
_GROUP_KINDS = frozenset({"group", "channel"})


@dataclass(frozen=True, slots=True)
class SessionRoute:
    """Where a message goes: its session key, and the parent key when it is in a thread."""

    key: str
    parent_key: str | None
    chat_type: ResetType
    peer: str  # the normalised DM peer (after identity links) or group id


@dataclass(frozen=True, slots=True)
class ParsedKey:
    agent_id: str
    rest: str
    is_thread: bool
    parent_key: str | None
    thread_id: str | None


def _normalise_name(value: str, fallback: str) -> str:
    lowered = value.lower()
    if _NAME_RE.fullmatch(lowered):
        return lowered
    cleaned = _NAME_INVALID_RUN.sub("-", lowered).lstrip("-_")
    return cleaned[:MAX_SEGMENT_CHARS].rstrip("-") or fallback


def normalise_agent_id(value: str) -> str:
    return _normalise_name(value, DEFAULT_AGENT_ID)


def normalise_account_id(value: str) -> str:
    return _normalise_name(value, DEFAULT_ACCOUNT_ID)


def normalise_channel(value: str) -> str:
    return _normalise_name(value, DEFAULT_CHANNEL_NAME)


def normalise_peer_id(value: str, *, tagged: bool = False) -> str:
    """A peer, chat or thread id as a key segment; distinct ids give distinct segments.
    ``tagged``: always the digest-tagged form, even for an id that could be kept."""
    if not value:
        return UNKNOWN_PEER
    lowered = value.lower()
    # isascii on the original: "\u212a" (Kelvin sign) lowercases to an ASCII "k".
    if not tagged and value.isascii() and _PEER_RE.fullmatch(lowered):
        return lowered
    digest = blake2b(
        lowered.encode("utf-8", "surrogatepass"), digest_size=DIGEST_HEX_CHARS // 2
    ).hexdigest()
    room = MAX_SEGMENT_CHARS - len(ESCAPE_MARK) - DIGEST_HEX_CHARS
    readable = _PEER_INVALID_RUN.sub("-", lowered).strip("-")[:room].rstrip("-")
    return f"{readable}{ESCAPE_MARK}{digest}"


def _linked_peer(config: SessionConfig, channel: str, peer: str) -> str | None:
    lowered = peer.lower()
    candidates = (lowered, f"{channel}:{lowered}")
    for canonical, ids in config.identity_links.items():
        # The config validator stores ids lowercased and stripped.
        if any(candidate in ids for candidate in candidates):
            return canonical.lower()
    return None


def _canonical_names(config: SessionConfig) -> frozenset[str]:
    return frozenset(normalise_peer_id(name) for name in config.identity_links)


def _direct_base(
    prefix: str,
    *,
    channel: str,
    account: str,
    peer_raw: str,
    config: SessionConfig,
) -> tuple[str, str]:
    main = f"{prefix}:{_normalise_name(config.main_key, DEFAULT_MAIN_KEY)}"
    if config.dm_scope == "main" or not peer_raw:
        return main, normalise_peer_id(peer_raw)
    linked = _linked_peer(config, channel, peer_raw)
    if linked is not None:
        peer = normalise_peer_id(linked)
    else:
        # An unlinked id that reads as a canonical name ("alice" on a channel where
        # nobody linked it) must not land in that person's session: it is tagged.
        peer = normalise_peer_id(peer_raw)
        if peer in _canonical_names(config):
            peer = normalise_peer_id(peer_raw, tagged=True)
    if config.dm_scope == "per-peer":
        return f"{prefix}:direct:{peer}", peer
    if config.dm_scope == "per-channel-peer":
        return f"{prefix}:{channel}:direct:{peer}", peer
    return f"{prefix}:{channel}:{normalise_account_id(account)}:direct:{peer}", peer


def resolve_session_key(
    *,
    agent_id: str,
    channel: str,
    account: str,
    chat_type: ChatType,
    chat_id: str,
    sender_id: str,
    thread_id: str | None = None,
    config: SessionConfig,
) -> SessionRoute:
    """The session a message belongs to. Deterministic; any input gives a valid key."""
    prefix = f"agent:{normalise_agent_id(agent_id)}"
    chan = normalise_channel(channel)
    if chat_type == "direct":
        base, peer = _direct_base(
            prefix, channel=chan, account=account, peer_raw=sender_id or chat_id, config=config
        )
        base_type: ResetType = "direct"
    elif chat_type in ("group", "thread"):
        peer = normalise_peer_id(chat_id)
        base = f"{prefix}:{chan}:group:{peer}"
        base_type = "group"
    else:
        raise ValueError(f"unknown chat type {chat_type!r}")
    if thread_id:
        key = f"{base}:thread:{normalise_peer_id(thread_id)}"
        return SessionRoute(key=key, parent_key=base, chat_type="thread", peer=peer)
    return SessionRoute(key=base, parent_key=None, chat_type=base_type, peer=peer)


def parse_session_key(key: str) -> ParsedKey | None:
    """Split a key made by ``resolve_session_key``; None for anything that is not one."""
    if not SESSION_KEY_RE.fullmatch(key):
        return None
    _, agent_id, *rest = key.split(":")
    # A thread suffix needs a base of at least one segment before ":thread:<id>"; checking
    # the position (not searching for ":thread:") keeps a channel or agent named
    # "thread" from reading as one.
    is_thread = len(rest) >= 3 and rest[-2] == "thread"
    return ParsedKey(
        agent_id=agent_id,
        rest=":".join(rest),
        is_thread=is_thread,
        parent_key=key.rsplit(":", 2)[0] if is_thread else None,
        thread_id=rest[-1] if is_thread else None,
    )


def key_agent_id(key: str) -> str:
    """The agent segment of a session key (``agent:<id>:...``), without the full parse
    (the hot path asks it of every message); "" for what is not a key."""
    if not key.startswith("agent:"):
        return ""
    end = key.find(":", 6)
    return key[6:end] if end > 6 else ""


def reset_type_for(target: SessionRoute | str) -> ResetType:
    """Which ``reset_by_type`` entry applies to a route or a key."""
    if isinstance(target, SessionRoute):
        return target.chat_type
    parsed = parse_session_key(target)
    if parsed is None:
        raise ValueError(f"not a session key: {target[:200]!r}")
    if parsed.is_thread:
        return "thread"
    rest = parsed.rest.split(":")
    return "group" if len(rest) >= 3 and rest[-2] in _GROUP_KINDS else "direct"
