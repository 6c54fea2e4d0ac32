"""The audience rule (``core.memory.audience``): who may read which scope, which scopes a
search covers, and how an audience is named on disk.

A direct chat sees the agent plus its own person (and ids the identity links make the
same person); a group sees the agent plus itself; scopes of no audience (legacy
``dm:``/``group:``, ``unscoped``, malformed ids) are nobody's; the operator sees all.
"""

from __future__ import annotations

import pytest

from parley.core.memory.audience import (
    AGENT,
    AGENT_SCOPE,
    MAIN_PERSON,
    Audience,
    AudienceError,
    Viewer,
    audience_label,
    may_read,
    parse_folder,
    parse_scope,
    visible_scopes,
    writable,
)

GROUP = Audience.conversation("telegram:-100")
OTHER_GROUP = Audience.conversation("telegram:-200")
LINKS = {"telegram:42": "alice", "discord:7": "alice", "telegram:43": "bob"}


def linked(person_id: str) -> str:
    """The identity links of these tests: two raw ids are Alice, one is Bob."""
    return LINKS.get(person_id, person_id)


ALICE = Viewer(Audience.person("telegram:42"), frozenset({"alice"}), linked)
BOB = Viewer(Audience.person("telegram:43"), frozenset({"bob"}), linked)
IN_GROUP = Viewer(GROUP)
OPERATOR = Viewer.for_operator()

# Scopes that name no audience: older indexes' scopes, and ids the rule does not accept.
NOBODYS = [
    "unscoped",
    "dm:alice",
    "dm:telegram:42",
    "group:telegram:-100",
    "peer:alice",
    "",
    "person:",
    "conversation:",
    "person:Alice",  # ids are lowercase
    "person:alice bob",
    "person:a:b:c:d:e",  # at most four segments
    "person:" + "x" * 65,  # a segment is at most 64 characters
    "person:alice:",
    "person::alice",
    "Person:alice",
    "agent:alice",
    " agent",
]


# -- may_read: a direct chat ------------------------------------------------------------------


def test_a_direct_chat_sees_the_agent_and_its_own_person() -> None:
    assert may_read(ALICE, AGENT_SCOPE)
    assert may_read(ALICE, "person:telegram:42")  # its own raw id
    assert may_read(ALICE, "person:alice")  # its canonical name
    assert not may_read(ALICE, "person:telegram:43")
    assert not may_read(ALICE, "person:bob")
    assert not may_read(ALICE, "person:carol")


def test_a_direct_chat_sees_a_linked_id_through_person_of() -> None:
    # discord:7 is Alice too (the links say so): what she wrote there is hers here.
    assert may_read(ALICE, "person:discord:7")
    assert not may_read(BOB, "person:discord:7")
    # Without the links, the same raw id is a stranger's.
    unlinked = Viewer(Audience.person("telegram:42"), frozenset({"telegram:42"}))
    assert may_read(unlinked, "person:telegram:42")
    assert not may_read(unlinked, "person:discord:7")
    assert not may_read(unlinked, "person:alice")


def test_a_direct_chat_never_sees_a_conversation() -> None:
    for viewer in (ALICE, BOB):
        assert not may_read(viewer, GROUP.scope)
        assert not may_read(viewer, OTHER_GROUP.scope)
    # Not even one whose id looks like the person's own.
    assert not may_read(ALICE, "conversation:telegram:42")


def test_the_main_person_is_one_audience() -> None:
    main = Viewer(Audience.person(MAIN_PERSON), frozenset({MAIN_PERSON}))
    assert may_read(main, f"person:{MAIN_PERSON}") and may_read(main, AGENT_SCOPE)
    assert not may_read(main, "person:telegram:42")
    assert not may_read(ALICE, f"person:{MAIN_PERSON}")


# -- may_read: a group ------------------------------------------------------------------------


def test_a_group_sees_the_agent_and_itself() -> None:
    assert may_read(IN_GROUP, AGENT_SCOPE)
    assert may_read(IN_GROUP, GROUP.scope)
    assert not may_read(IN_GROUP, OTHER_GROUP.scope)
    assert not may_read(IN_GROUP, "conversation:telegram")  # a prefix is not the group


def test_a_group_never_sees_a_person() -> None:
    for scope in ("person:telegram:42", "person:alice", f"person:{MAIN_PERSON}"):
        assert not may_read(IN_GROUP, scope)
    # Even a group viewer that was (wrongly) handed person keys sees no person.
    confused = Viewer(GROUP, frozenset({"alice", "telegram:42"}), linked)
    assert not may_read(confused, "person:alice")
    assert not may_read(confused, "person:telegram:42")
    assert may_read(confused, GROUP.scope)


def test_an_agent_viewer_sees_only_the_agent() -> None:
    viewer = Viewer(AGENT, frozenset({"alice"}))
    assert may_read(viewer, AGENT_SCOPE)
    assert not may_read(viewer, "person:alice")
    assert not may_read(viewer, GROUP.scope)


# -- may_read: scopes of nobody, and the operator ---------------------------------------------


@pytest.mark.parametrize("scope", NOBODYS)
def test_scopes_of_no_audience_are_visible_to_the_operator_only(scope: str) -> None:
    assert parse_scope(scope) is None
    for viewer in (ALICE, BOB, IN_GROUP, Viewer(AGENT)):
        assert not may_read(viewer, scope), (viewer, scope)
    assert may_read(OPERATOR, scope)
    assert audience_label(scope) == f"unattributed ({scope})"


def test_a_legacy_scope_named_after_the_viewer_is_still_nobodys() -> None:
    legacy_alice = Viewer(Audience.person("alice"), frozenset({"alice"}))
    assert not may_read(legacy_alice, "dm:alice")
    assert not may_read(IN_GROUP, "group:telegram:-100")


@pytest.mark.parametrize(
    "scope",
    [AGENT_SCOPE, "person:telegram:42", "person:bob", GROUP.scope, OTHER_GROUP.scope, "unscoped"],
)
def test_the_operator_sees_everything(scope: str) -> None:
    assert OPERATOR.operator and OPERATOR.audience == AGENT
    assert may_read(OPERATOR, scope)


# -- visible_scopes ---------------------------------------------------------------------------

KNOWN = (
    AGENT_SCOPE,
    "person:telegram:42",
    "person:discord:7",
    "person:telegram:43",
    "person:alice",
    GROUP.scope,
    OTHER_GROUP.scope,
    "dm:telegram:42",
    "unscoped",
)


def test_visible_scopes_of_a_direct_chat() -> None:
    assert visible_scopes(ALICE, KNOWN) == (
        AGENT_SCOPE,
        "person:alice",
        "person:discord:7",
        "person:telegram:42",
    )
    assert visible_scopes(BOB, KNOWN) == (AGENT_SCOPE, "person:telegram:43")


def test_visible_scopes_always_hold_the_agent_and_the_own_audience() -> None:
    # Nothing indexed yet: the search still covers where this conversation will write.
    assert visible_scopes(ALICE) == (AGENT_SCOPE, "person:telegram:42")
    assert visible_scopes(IN_GROUP) == (AGENT_SCOPE, GROUP.scope)
    assert visible_scopes(Viewer(AGENT)) == (AGENT_SCOPE,)


def test_visible_scopes_of_a_group_name_no_person() -> None:
    assert visible_scopes(IN_GROUP, KNOWN) == (AGENT_SCOPE, GROUP.scope)


def test_visible_scopes_agree_with_may_read() -> None:
    for viewer in (ALICE, BOB, IN_GROUP, Viewer(AGENT), OPERATOR):
        visible = visible_scopes(viewer, KNOWN)
        assert list(visible) == sorted(set(visible))
        for scope in KNOWN:
            assert (scope in visible) == may_read(viewer, scope), (viewer, scope)
    assert set(visible_scopes(OPERATOR, KNOWN)) == set(KNOWN)


# -- audiences, scopes and folders ------------------------------------------------------------


@pytest.mark.parametrize(
    ("audience", "folder"),
    [
        (Audience.person("alice"), "person/alice"),
        (Audience.person("telegram:123"), "person/telegram%3A123"),
        (Audience.person(MAIN_PERSON), "person/~main"),
        (Audience.person("matrix:@bob~x:example.org"), "person/matrix%3A@bob~x%3Aexample%2Eorg"),
        (Audience.person("a.b+c_d-e"), "person/a%2Eb+c_d-e"),
        (Audience.conversation("telegram:-100"), "conversation/telegram%3A-100"),
        (Audience.conversation("discord:g1:c2:t3"), "conversation/discord%3Ag1%3Ac2%3At3"),
    ],
)
def test_folder_and_parse_folder_round_trip(audience: Audience, folder: str) -> None:
    assert audience.folder == folder
    kind, name = folder.split("/")
    assert "/" not in name and ":" not in name
    assert parse_folder(kind, name) == audience
    assert parse_scope(audience.scope) == audience


def test_the_agent_has_no_private_folder() -> None:
    with pytest.raises(AudienceError):
        _ = AGENT.folder
    assert AGENT.scope == AGENT_SCOPE and parse_scope(AGENT_SCOPE) == AGENT


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("agent", "x"),
        ("dm", "alice"),
        ("group", "team"),
        ("persons", "alice"),
        ("person", ""),
        ("person", "Alice"),
        ("person", "alice%2Fbob"),  # decodes to a "/"
        ("person", "a%3Ab%3Ac%3Ad%3Ae"),  # five segments
        ("conversation", "team%20chat"),
    ],
)
def test_parse_folder_refuses_what_is_not_an_audience_folder(kind: str, name: str) -> None:
    assert parse_folder(kind, name) is None


@pytest.mark.parametrize("value", ["", "Alice", "a/b", "a b", "a:b:c:d:e", "x" * 65, "é"])
def test_constructors_refuse_ids_that_name_no_audience(value: str) -> None:
    with pytest.raises(AudienceError):
        Audience.person(value)
    with pytest.raises(AudienceError):
        Audience.conversation(value)


def test_labels() -> None:
    assert AGENT.label == "agent-wide"
    assert Audience.person(MAIN_PERSON).label == "your direct chats"
    assert Audience.person("alice").label == "person alice"
    assert GROUP.label == "conversation telegram:-100"
    assert audience_label("person:alice") == "person alice"


# -- viewers and writing ----------------------------------------------------------------------


def test_viewer_only_reads_one_audience() -> None:
    person = Viewer.only(Audience.person("alice"))
    assert person.person_keys == frozenset({"alice"}) and not person.operator
    assert may_read(person, "person:alice") and not may_read(person, "person:bob")
    group = Viewer.only(GROUP)
    assert group.person_keys == frozenset()
    assert may_read(group, GROUP.scope) and not may_read(group, "person:alice")


def test_writable_is_the_own_audience_never_the_agent() -> None:
    assert writable(ALICE) == Audience.person("telegram:42")
    assert writable(IN_GROUP) == GROUP
    for viewer in (OPERATOR, Viewer(AGENT)):
        with pytest.raises(AudienceError):
            writable(viewer)


def test_only_a_linked_person_or_the_operator_needs_every_known_scope() -> None:
    alice = Audience.person("test:alice")
    assert not Viewer(alice, frozenset({"test:alice"})).needs_known_scopes
    assert Viewer(alice, frozenset({"alice"}), linked=True).needs_known_scopes
    assert not Viewer(Audience.conversation("test:g1"), linked=True).needs_known_scopes
    assert Viewer.for_operator().needs_known_scopes
