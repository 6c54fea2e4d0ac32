"""Properties of what hostile input meets first: routing, inbound normalisation
(Telegram and Discord), message splitting of hostile characters, transcript reading.

Complements tests/gateway/test_routing.py, tests/channels/test_text.py and
tests/core/test_transcript.py (their properties are not repeated here): these draw
from every code point, lone surrogates and controls included, and from garbled bytes.
"""

from __future__ import annotations

import re
from pathlib import Path
from tempfile import TemporaryDirectory
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from telegram import Update, User

from parley.channels.discord_inbound import render_text
from parley.channels.telegram_inbound import normalise_update
from parley.channels.text import MIN_SPLIT_LIMIT, split_message, utf16_len
from parley.core.messages import Message
from parley.core.transcript import Transcript
from parley.gateway.routing import SESSION_KEY_RE, resolve_session_key
from parley.gateway.session_config import SessionConfig

# derandomize: the same examples on every run; each property stays within a few seconds.
FAST = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

any_char = st.characters(exclude_categories=())  # surrogates and controls included
hostile_chars = st.sampled_from(
    list(
        ":~-_.@+ \t\n\r\x00\x1b/\\\u202e\u200b\u200d\ufeff\u0301Az09\u212a\u0130😀\ud800\udfff<>&#"
    )
)
hostile_text = st.one_of(st.text(any_char, max_size=120), st.text(hostile_chars, max_size=120))
ids = st.one_of(st.text(any_char, min_size=1, max_size=40), st.text(hostile_chars, min_size=1))


# -- routing -------------------------------------------------------------------------------


def _identity(chat_type: str, chat_id: str, sender_id: str, thread_id: str | None) -> tuple:
    """What must decide the session under dm_scope "per-channel-peer": ids compare
    case-insensitively, a thread is part of the identity, a DM is its sender."""
    thread = thread_id.lower() if thread_id else None
    if chat_type == "direct":
        return ("direct", sender_id.lower(), thread)
    return ("group", chat_id.lower(), thread)


routes = st.tuples(
    st.sampled_from(["direct", "group", "thread"]),
    ids,
    ids,
    st.one_of(st.none(), ids),
)


@FAST
@given(first=routes, second=routes)
def test_routes_collide_exactly_when_their_identities_match(first: tuple, second: tuple) -> None:
    """Across chat types and threads, not only within one field: a forged id (holding
    ":thread:", ":group:", "~", a key) never lands in another conversation's session."""
    config = SessionConfig(dm_scope="per-channel-peer")
    keys = []
    for chat_type, chat_id, sender_id, thread_id in (first, second):
        route = resolve_session_key(
            agent_id="main", channel="telegram", account="default", chat_type=chat_type,
            chat_id=chat_id, sender_id=sender_id, thread_id=thread_id, config=config,
        )  # fmt: skip
        assert SESSION_KEY_RE.fullmatch(route.key)
        keys.append(route.key)
    same = _identity(*first) == _identity(*second)
    assert (keys[0] == keys[1]) == same, (first, second, keys)


@FAST
@given(peer=ids, forged=st.sampled_from([":thread:1", ":group:1", "~0123456789abcdef", ":"]))
def test_a_suffix_never_forges_a_thread_or_group_key(peer: str, forged: str) -> None:
    config = SessionConfig(dm_scope="per-channel-peer")

    def key(**kw: Any) -> str:
        base = {"agent_id": "main", "channel": "web", "account": "default", "config": config}
        return resolve_session_key(**base, **kw).key

    honest_thread = key(chat_type="direct", chat_id=peer, sender_id=peer, thread_id="1")
    honest_group = key(chat_type="group", chat_id=peer, sender_id=peer)
    forged_key = key(chat_type="direct", chat_id=peer + forged, sender_id=peer + forged)
    assert forged_key not in (honest_thread, honest_group)
    assert forged_key.count(":") == key(chat_type="direct", chat_id="x", sender_id="x").count(":")


# -- Telegram normalisation ----------------------------------------------------------------

BOT = User(id=123, first_name="Parley", is_bot=True, username="parley_bot")


def _update(text: str, entities: list[dict[str, Any]]) -> Update:
    return Update.de_json(
        {
            "update_id": 1,
            "message": {
                "message_id": 5, "date": 1_700_000_000, "chat": {"id": 42, "type": "private"},
                "from": {"id": 42, "is_bot": False, "first_name": "Alice"},
                "text": text, "entities": entities,
            },
        },
        None,
    )  # fmt: skip


entity = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["mention", "bot_command", "text_mention", "bold", "url"]),
        "offset": st.integers(-5, 200),
        "length": st.integers(-5, 200),
    },
    optional={"user": st.just({"id": 123, "is_bot": True, "first_name": "P"})},
)


@FAST
@given(text=hostile_text, entities=st.lists(entity, max_size=4))
def test_telegram_text_with_any_entities_never_raises_or_loses_the_rest(
    text: str, entities: list[dict[str, Any]]
) -> None:
    """Entities that split a surrogate pair, overlap, run past the end or start before
    it (Telegram never sends these, a forged webhook can) still give a message."""
    message = normalise_update(_update(text, entities), account="default", bot=BOT)
    if not text.strip():
        assert message is None
        return
    if message is None:  # every visible character was inside a cut-out mention
        return
    assert isinstance(message.text, str) and message.text == message.text.strip()
    assert message.mentions_bot  # a DM
    # What is left is made of the original's characters (surrogate halves aside).
    original = set(text) | {"\ud800", *(chr(c) for c in range(0xD800, 0xE000))}
    assert set(message.text) <= original | {" "}


@FAST
@given(text=hostile_text)
def test_telegram_text_without_entities_is_kept_verbatim_but_stripped(text: str) -> None:
    message = normalise_update(_update(text, []), account="default", bot=BOT)
    if text.strip():
        assert message is not None and message.text == text.strip()
    else:
        assert message is None


@FAST
@given(before=hostile_text, after=hostile_text)
def test_telegram_bot_mention_is_cut_whatever_surrounds_it(before: str, after: str) -> None:
    mention = "@parley_bot"
    text = f"{before} {mention} {after}"
    offset = utf16_len(before) + 1
    message = normalise_update(
        _update(text, [{"type": "mention", "offset": offset, "length": len(mention)}]),
        account="default",
        bot=BOT,
    )
    if message is not None:
        remaining = message.text.replace(before.strip(), "", 1).replace(after.strip(), "", 1)
        assert mention not in remaining


# -- Discord normalisation -----------------------------------------------------------------

ME = SimpleNamespace(id=210000000000000001, name="parley", display_name="parley")


def _discord(content: str) -> Any:
    return SimpleNamespace(
        content=content, guild=None, mentions=[], role_mentions=[], attachments=[], stickers=[]
    )


markup = st.one_of(
    hostile_text,
    st.builds(
        lambda kind, digits, text: f"{text}<{kind}{digits}>{text}",
        st.sampled_from(["@", "@!", "@&", "#", ":e:", "a:e:", "/cmd:"]),
        st.one_of(
            st.text("0123456789", min_size=1, max_size=30),
            st.text("0123456789\u0661\u0662\uff11", min_size=1, max_size=30),  # non-ASCII digits
            st.integers(4300, 6000).map(lambda n: "9" * n),  # past int()'s digit limit
        ),
        st.text(hostile_chars, max_size=10),
    ),
)


@FAST
@given(content=markup)
def test_discord_text_with_any_markup_never_raises(content: str) -> None:
    text = render_text(_discord(content), ME, lambda _id: None)
    assert text == text.strip()
    if "<" not in content and content.strip():
        assert text == content.strip()


@FAST
@given(before=hostile_text, after=hostile_text, bang=st.booleans())
def test_discord_own_mention_is_removed(before: str, after: str, bang: bool) -> None:
    mention = f"<@{'!' if bang else ''}{ME.id}>"
    message = _discord(f"{before} {mention} {after}")
    message.mentions = [ME]
    text = render_text(message, ME, lambda _id: None)
    if (before + after).strip():
        assert mention not in text and "@parley" not in text.replace(before, "").replace(after, "")


# -- splitting hostile text ----------------------------------------------------------------


@FAST
@given(text=st.text(any_char, max_size=400), limit=st.integers(MIN_SPLIT_LIMIT, 80))
def test_split_of_text_with_lone_surrogates_and_controls(text: str, limit: int) -> None:
    """test_text.py draws from st.text() (no surrogates): here lone surrogates, controls
    and separators too, measured the way Telegram measures."""
    parts = split_message(text, limit, measure=utf16_len)
    assert all(1 <= utf16_len(part) <= limit for part in parts)
    # Every non-whitespace character survives, in order (fences may add backticks).
    kept = re.sub(r"\s+", "", "".join(parts))
    wanted = re.sub(r"\s+", "", text)
    iterator = iter(kept)
    assert all(char in iterator for char in wanted)


# -- transcript reading --------------------------------------------------------------------

garbage_line = st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"\\n"))


@settings(FAST, max_examples=60)
@given(
    texts=st.lists(hostile_text, min_size=1, max_size=6),
    garbage=st.lists(st.tuples(st.integers(0, 6), garbage_line), max_size=4),
    tail=st.binary(max_size=120),
    read_only=st.booleans(),
)
def test_garbled_transcripts_open_and_keep_every_valid_entry(
    texts: list[str], garbage: list[tuple[int, bytes]], tail: bytes, read_only: bool
) -> None:
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        with Transcript.create(path, "s", "agent:main:main") as t:
            written = [t.append_message(Message.user(text)) for text in texts]
        lines = path.read_bytes().split(b"\n")[:-1]
        header, body = lines[0], lines[1:]
        for position, line in sorted(garbage, reverse=True):
            body.insert(min(position, len(body)), line)
        path.write_bytes(b"\n".join([header, *body]) + b"\n" + tail)
        before = path.read_bytes()
        with Transcript.open(path, read_only=read_only) as opened:
            ids = [e.id for e in opened.entries()]
            assert [e.id for e in written] == [i for i in ids if i in {e.id for e in written}]
            assert {e.id for e in written} <= {e.id for e in opened.live_entries()}
        if read_only:
            assert path.read_bytes() == before
        else:
            # The torn tail is repaired: the file ends with a newline and opens clean of it.
            assert path.read_bytes().endswith(b"\n")
            with Transcript.open(path) as again:
                assert again.load_report.torn_tail_bytes == 0
