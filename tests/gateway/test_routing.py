"""Session keys: the shape for each scope, identity links, groups, threads, and that any
input whatsoever yields a valid, parseable, deterministic key."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from parley.gateway.routing import (
    SessionRoute,
    normalise_agent_id,
    normalise_peer_id,
    parse_session_key,
    reset_type_for,
    resolve_session_key,
)
from parley.gateway.session_config import SessionConfig

# Written out here rather than imported, so the test does not trust the module's regex.
STRICT_KEY = re.compile(r"agent:[a-z0-9][a-z0-9_-]{0,63}(:[a-z0-9_.@+~-]{1,64}){1,7}")
SCOPES = ["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]


def route(
    config: SessionConfig | None = None,
    *,
    agent_id: str = "main",
    channel: str = "telegram",
    account: str = "default",
    chat_type: str = "direct",
    chat_id: str = "42",
    sender_id: str = "42",
    thread_id: str | None = None,
) -> SessionRoute:
    return resolve_session_key(
        agent_id=agent_id,
        channel=channel,
        account=account,
        chat_type=chat_type,  # type: ignore[arg-type]
        chat_id=chat_id,
        sender_id=sender_id,
        thread_id=thread_id,
        config=config or SessionConfig(),
    )


# --- direct messages -------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        ("main", "agent:main:main"),
        ("per-peer", "agent:main:direct:42"),
        ("per-channel-peer", "agent:main:telegram:direct:42"),
        ("per-account-channel-peer", "agent:main:telegram:work:direct:42"),
    ],
)
def test_direct_key_per_scope(scope: str, expected: str) -> None:
    result = route(SessionConfig(dm_scope=scope), account="Work")
    assert result == SessionRoute(key=expected, parent_key=None, chat_type="direct", peer="42")


def test_default_scope_keeps_people_and_channels_apart() -> None:
    assert SessionConfig().dm_scope == "per-channel-peer"
    alice = route(sender_id="1", chat_id="1").key
    bob = route(sender_id="2", chat_id="2").key
    alice_on_discord = route(channel="discord", sender_id="1", chat_id="1").key
    assert len({alice, bob, alice_on_discord}) == 3


def test_main_scope_shares_one_session_and_uses_main_key() -> None:
    config = SessionConfig(dm_scope="main", main_key="lobby")
    keys = {route(config, channel=c, sender_id=s).key for c in ("tg", "dc") for s in ("1", "2")}
    assert keys == {"agent:main:lobby"}


def test_account_only_matters_for_per_account_scope() -> None:
    per_channel = SessionConfig(dm_scope="per-channel-peer")
    per_account = SessionConfig(dm_scope="per-account-channel-peer")
    assert route(per_channel, account="a").key == route(per_channel, account="b").key
    assert route(per_account, account="a").key != route(per_account, account="b").key


def test_sender_is_the_peer_and_chat_id_the_fallback() -> None:
    assert route(sender_id="7", chat_id="dm-channel-99").peer == "7"
    assert route(sender_id="", chat_id="99").key == "agent:main:telegram:direct:99"


@pytest.mark.parametrize("scope", SCOPES)
def test_empty_peer_falls_back_to_main_key(scope: str) -> None:
    assert route(SessionConfig(dm_scope=scope), sender_id="", chat_id="").key == "agent:main:main"


# --- identity links ----------------------------------------------------------------


LINKS = SessionConfig(
    dm_scope="per-peer",
    identity_links={"Alice": ["Telegram:111", "discord:222"], "bob": ["333"]},
)


def test_linked_ids_share_the_canonical_session() -> None:
    telegram = route(LINKS, channel="telegram", sender_id="111")
    discord = route(LINKS, channel="discord", sender_id="222")
    assert telegram.key == discord.key == "agent:main:direct:alice"
    assert telegram.peer == "alice"


def test_link_with_channel_prefix_only_matches_that_channel() -> None:
    assert route(LINKS, channel="discord", sender_id="111").key == "agent:main:direct:111"


def test_bare_link_matches_on_any_channel_and_ignores_case() -> None:
    assert route(LINKS, channel="web", sender_id="333").peer == "bob"
    config = SessionConfig(identity_links={"carol": ["web:CaRoL-Id"]})
    assert route(config, channel="WEB", sender_id="carol-ID").key == "agent:main:web:direct:carol"


@pytest.mark.parametrize("scope", ["per-peer", "per-channel-peer"])
def test_a_stranger_whose_id_reads_as_a_linked_name_gets_a_session_of_their_own(
    scope: str,
) -> None:
    config = SessionConfig(dm_scope=scope, identity_links={"alice": ["telegram:111"]})
    linked = route(config, channel="telegram", sender_id="111")
    stranger = route(config, channel="telegram", sender_id="Alice")
    assert linked.peer == "alice"
    assert stranger.key != linked.key
    assert stranger.peer.startswith("alice~") and len(stranger.peer) == len("alice~") + 16
    # Without the link nobody is "alice" but the stranger: the id is kept as it is.
    assert route(SessionConfig(dm_scope=scope), sender_id="Alice").peer == "alice"


def test_links_are_ignored_in_main_scope() -> None:
    config = SessionConfig(dm_scope="main", identity_links={"alice": ["111"]})
    result = route(config, sender_id="111")
    assert (result.key, result.peer) == ("agent:main:main", "111")


def test_first_canonical_in_config_order_wins() -> None:
    # The bare id and the channel-qualified id sit under different names.
    ordered = SessionConfig(identity_links={"zed": ["telegram:5"], "amy": ["5"]})
    reversed_ = SessionConfig(identity_links={"amy": ["5"], "zed": ["telegram:5"]})
    assert route(ordered, sender_id="5").peer == "zed"
    assert route(reversed_, sender_id="5").peer == "amy"


def test_identity_link_config_is_validated() -> None:
    with pytest.raises(ValidationError, match="linked to both"):
        SessionConfig(identity_links={"a": ["telegram:1"], "b": ["TELEGRAM:1"]})
    with pytest.raises(ValidationError, match="must match"):
        SessionConfig(identity_links={"al:ice": ["1"]})
    with pytest.raises(ValidationError, match="empty id"):
        SessionConfig(identity_links={"alice": ["  "]})


@pytest.mark.parametrize("bad", ["thread", "group", "direct", "Main", "a:b", ""])
def test_main_key_must_be_a_plain_unreserved_name(bad: str) -> None:
    with pytest.raises(ValidationError):
        SessionConfig(main_key=bad)


def test_session_config_is_strict_and_frozen() -> None:
    with pytest.raises(ValidationError):
        SessionConfig(dm_scope="per-user")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        SessionConfig(dmScope="main")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        SessionConfig().dm_scope = "main"  # type: ignore[misc]


# --- groups and threads ------------------------------------------------------------


@pytest.mark.parametrize("scope", SCOPES)
def test_group_is_one_session_per_group_whatever_the_scope(scope: str) -> None:
    config = SessionConfig(dm_scope=scope)
    first = route(config, chat_type="group", chat_id="-100123", sender_id="1")
    second = route(config, chat_type="group", chat_id="-100123", sender_id="2")
    assert first == second
    assert first == SessionRoute(
        key="agent:main:telegram:group:-100123", parent_key=None, chat_type="group", peer="-100123"
    )
    assert route(config, chat_type="group", chat_id="-100124").key != first.key


def test_group_thread_has_the_group_as_parent() -> None:
    result = route(chat_type="thread", chat_id="G1", thread_id="77")
    assert result == SessionRoute(
        key="agent:main:telegram:group:g1:thread:77",
        parent_key="agent:main:telegram:group:g1",
        chat_type="thread",
        peer="g1",
    )
    # A group message carrying a topic id is the same thread.
    assert route(chat_type="group", chat_id="G1", thread_id="77") == result


def test_thread_without_thread_id_is_its_group() -> None:
    result = route(chat_type="thread", chat_id="g1", thread_id=None)
    assert (result.key, result.chat_type) == ("agent:main:telegram:group:g1", "group")
    assert route(chat_type="thread", chat_id="g1", thread_id="").key == result.key


def test_direct_thread_hangs_off_the_dm_key() -> None:
    result = route(SessionConfig(dm_scope="main"), thread_id="9")
    assert (result.key, result.parent_key) == ("agent:main:main:thread:9", "agent:main:main")
    per_peer = route(thread_id="9")
    assert per_peer.parent_key == "agent:main:telegram:direct:42"


def test_unknown_chat_type_is_refused() -> None:
    with pytest.raises(ValueError, match="chat type"):
        route(chat_type="channel")


# --- normalisation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Main", "main"),
        ("My Agent!", "my-agent"),
        ("--ops--", "ops"),
        ("_x", "x"),
        ("", "main"),
        ("!!!", "main"),
        ("a" * 80, "a" * 64),
        ("b" * 63 + "!c", "b" * 63),
    ],
)
def test_agent_id_normalisation(raw: str, expected: str) -> None:
    assert normalise_agent_id(raw) == expected


def test_empty_account_and_channel_get_defaults() -> None:
    config = SessionConfig(dm_scope="per-account-channel-peer")
    assert route(config, channel="", account="").key == "agent:main:unknown:default:direct:42"


@pytest.mark.parametrize("raw", ["-1001234567890", "user.name@example.org", "+4915112345", "a_b"])
def test_plain_ids_are_kept_verbatim(raw: str) -> None:
    assert normalise_peer_id(raw) == raw


def test_empty_group_id_is_unknown() -> None:
    assert route(chat_type="group", chat_id="").key == "agent:main:telegram:group:unknown"


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("a:b", "a-b"),
        ("a b", "a-b"),
        ("x" * 64 + "1", "x" * 64 + "2"),
        ("😀", "😁"),
        ("\u212a", "k"),  # Kelvin sign lowercases to ASCII "k"
        ("ünsal", "nsal"),
    ],
)
def test_lossy_ids_never_collide_with_other_ids(left: str, right: str) -> None:
    assert normalise_peer_id(left) != normalise_peer_id(right)
    assert route(sender_id=left).key != route(sender_id=right).key


def test_ids_differing_only_in_ascii_case_share_a_session() -> None:
    assert route(sender_id="UABC").key == route(sender_id="uabc").key


# --- parsing -----------------------------------------------------------------------


def test_parse_round_trip() -> None:
    parsed = parse_session_key("agent:ops:telegram:group:-5:thread:12")
    assert parsed is not None
    assert (parsed.agent_id, parsed.rest) == ("ops", "telegram:group:-5:thread:12")
    assert (parsed.is_thread, parsed.parent_key, parsed.thread_id) == (
        True,
        "agent:ops:telegram:group:-5",
        "12",
    )
    plain = parse_session_key("agent:ops:main")
    assert plain is not None
    assert (plain.is_thread, plain.parent_key, plain.thread_id) == (False, None, None)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "agent",
        "agent:main",
        "agent:main:",
        "agent:main::x",
        "Agent:main:x",
        "agent:Main:x",
        "agent:-main:x",
        "agent:main:x\n",
        "agent:main:x y",
        "agent:main:" + "a" * 65,
        "session:main:x",
        "agent:main:x/../y",
    ],
)
def test_parse_rejects_what_routing_cannot_produce(bad: str) -> None:
    assert parse_session_key(bad) is None


def test_names_equal_to_structural_words_do_not_read_as_threads() -> None:
    group = route(channel="thread", chat_type="group", chat_id="thread")
    assert group.key == "agent:main:thread:group:thread"
    assert reset_type_for(group.key) == "group"
    assert parse_session_key(group.key).is_thread is False  # type: ignore[union-attr]
    agent = route(SessionConfig(dm_scope="main"), agent_id="thread")
    assert reset_type_for(agent.key) == "direct"
    dm = route(channel="group", sender_id="thread")
    assert (dm.key, reset_type_for(dm.key)) == ("agent:main:group:direct:thread", "direct")


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("agent:main:main", "direct"),
        ("agent:main:direct:1", "direct"),
        ("agent:main:tg:direct:1", "direct"),
        ("agent:main:tg:acc:direct:1", "direct"),
        ("agent:main:tg:group:1", "group"),
        ("agent:main:discord:channel:1", "group"),
        ("agent:main:tg:group:1:thread:2", "thread"),
        ("agent:main:main:thread:2", "thread"),
    ],
)
def test_reset_type_for_keys(key: str, expected: str) -> None:
    assert reset_type_for(key) == expected


def test_reset_type_for_route_and_bad_key() -> None:
    assert reset_type_for(route(chat_type="group", chat_id="1", thread_id="2")) == "thread"
    with pytest.raises(ValueError, match="not a session key"):
        reset_type_for("telegram:group:1")


# --- properties --------------------------------------------------------------------

any_char = st.characters(exclude_categories=())  # surrogates and controls included
nasty_chars = st.sampled_from(list(":~-_.@+ \t\n\x00/\\AZaz09İ\u212aß😀\ud800"))
ids = st.one_of(
    st.text(any_char, max_size=80),
    st.text(nasty_chars, max_size=200),
    st.builds(
        lambda text, times: text * times,
        st.text(nasty_chars, min_size=1, max_size=8),
        st.integers(1, 5_000),
    ),
)
configs = st.builds(
    SessionConfig,
    dm_scope=st.sampled_from(SCOPES),
    identity_links=st.sampled_from([{}, {"alice": ["1", "telegram:2", ":", "😀"]}]),
)


@settings(max_examples=300, deadline=None)
@given(
    config=configs,
    agent_id=ids,
    channel=ids,
    account=ids,
    chat_type=st.sampled_from(["direct", "group", "thread"]),
    chat_id=ids,
    sender_id=ids,
    thread_id=st.one_of(st.none(), ids),
)
def test_any_input_yields_a_valid_parseable_deterministic_key(
    config: SessionConfig,
    agent_id: str,
    channel: str,
    account: str,
    chat_type: str,
    chat_id: str,
    sender_id: str,
    thread_id: str | None,
) -> None:
    kwargs = dict(
        config=config,
        agent_id=agent_id,
        channel=channel,
        account=account,
        chat_type=chat_type,
        chat_id=chat_id,
        sender_id=sender_id,
        thread_id=thread_id,
    )
    result = route(**kwargs)  # type: ignore[arg-type]
    key = result.key
    assert STRICT_KEY.fullmatch(key), key
    assert key == key.lower() and key.isascii()
    segments = key.split(":")
    assert all(1 <= len(segment) <= 64 for segment in segments)
    assert route(**kwargs) == result  # type: ignore[arg-type]

    parsed = parse_session_key(key)
    assert parsed is not None
    assert parsed.agent_id == segments[1] == normalise_agent_id(agent_id)
    assert parsed.is_thread == (result.chat_type == "thread") == bool(thread_id)
    assert parsed.parent_key == result.parent_key
    assert reset_type_for(key) == result.chat_type
    if result.parent_key is not None:
        assert STRICT_KEY.fullmatch(result.parent_key)
        assert key.startswith(result.parent_key + ":thread:")


@settings(max_examples=300, deadline=None)
@given(
    left=ids.filter(bool), right=ids.filter(bool), chat_type=st.sampled_from(["direct", "group"])
)
def test_different_people_and_groups_never_share_a_session(
    left: str, right: str, chat_type: str
) -> None:
    # Ids equal up to case are the same person (platform ids are case-insensitive).
    if left.lower() == right.lower():
        return
    field = "sender_id" if chat_type == "direct" else "chat_id"
    first = route(chat_type=chat_type, **{field: left})  # type: ignore[arg-type]
    second = route(chat_type=chat_type, **{field: right})  # type: ignore[arg-type]
    assert first.key != second.key
    assert normalise_peer_id(left) != normalise_peer_id(right)
