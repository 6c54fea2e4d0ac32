"""Pictures in the conversation, end to end: a photo someone shared in a group before
the bot was addressed, and the photo a message replies to, reach the model of the turn
that asks about them (the real python-telegram-bot and discord.py against their fakes,
the real anthropic and openai SDKs against theirs), and only in the chat they belong
to."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.channels.discord_support import BOB as DISCORD_BOB
from tests.channels.discord_support import GENERAL, LIMIT, ME, RANDOM
from tests.channels.discord_support import TOKEN as DISCORD_TOKEN
from tests.channels.telegram_helpers import TOKEN, USERNAME
from tests.gateway.media_support import (
    BOB,
    all_text,
    chat_bodies,
    decoded_size,
    discord_world,
    images_of,
    picture,
    telegram_world,
)

GROUP = -1001000000001
OTHER_GROUP = -1001000000002


async def test_a_photo_shared_in_a_group_reaches_the_turn_that_mentions_the_bot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with telegram_world(tmp_path / "home", monkeypatch) as w:
        photo = w.fake.photo(TOKEN, picture(900, 600), 900, 600)
        shared = w.fake.push_message(
            TOKEN, chat_id=GROUP, chat_type="supergroup", sender_id=BOB,
            sender_first_name="Bob", extra=photo,
        )  # fmt: skip
        await w.fake.wait_polled(TOKEN, shared["update_id"] + 1)
        await w.gateway.wait_idle()
        assert chat_bodies(w.llm) == [] and w.fake.downloads == []  # kept, not answered
        # Asked about in another group first: the photo is its own group's alone.
        await w.send(chat_id=OTHER_GROUP, chat_type="supergroup",
                     text=f"@{USERNAME} what did Bob send?")  # fmt: skip
        [elsewhere] = chat_bodies(w.llm)
        assert images_of(elsewhere) == [] and w.fake.downloads == []
        await w.send(chat_id=GROUP, chat_type="supergroup",
                     text=f"@{USERNAME} what is on Bob's photo?")  # fmt: skip
        asked = chat_bodies(w.llm)[-1]
        [(media_type, data)] = images_of(asked)
        assert (media_type, decoded_size(data)) == ("image/jpeg", ("JPEG", (900, 600)))
        assert "[sent earlier in this chat by Bob:]" in all_text(asked)
        assert "Bob [5002]: [photo]" in all_text(asked)  # its line in the group context
        # Taken with that turn: the next mention fetches nothing again.
        await w.send(chat_id=GROUP, chat_type="supergroup", text=f"@{USERNAME} thanks")
        assert len(w.fake.downloads) == 1


async def test_a_reply_to_a_photo_brings_that_photo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Earlier files off: only the reply can bring the picture.
    env = {"PARLEY_MEDIA__EARLIER_FILES": "0"}
    async with telegram_world(tmp_path / "home", monkeypatch, **env) as w:
        photo = w.fake.photo(TOKEN, picture(640, 480), 640, 480)
        shared = w.fake.push_message(TOKEN, chat_id=GROUP, chat_type="supergroup",
                                     sender_id=BOB, sender_first_name="Bob", caption="my dog",
                                     extra=photo)  # fmt: skip
        await w.send(chat_id=GROUP, chat_type="supergroup",
                     text=f"@{USERNAME} nice, isn't it?")  # fmt: skip
        assert images_of(chat_bodies(w.llm)[-1]) == []  # the group context's file: not taken
        await w.send(chat_id=GROUP, chat_type="supergroup", text=f"@{USERNAME} what breed?",
                     reply_to=shared["message"])  # fmt: skip
        asked = chat_bodies(w.llm)[-1]
        [(_, data)] = images_of(asked)
        assert decoded_size(data) == ("JPEG", (640, 480))
        text = all_text(asked)
        assert "[in the message replied to:]" in text
        assert "[in reply to Bob: [photo] my dog]" in text


async def test_discord_reply_brings_the_files_of_its_own_channel_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"PARLEY_PROVIDERS__OPENAI__VISION": "true", "PARLEY_MEDIA__EARLIER_FILES": "0"}
    async with discord_world(tmp_path / "home", monkeypatch, **env) as w:

        def png(name: str, width: int, height: int) -> dict[str, object]:
            data = picture(width, height, fmt="PNG", mode="RGBA")
            return {"filename": name, "content_type": "image/png", "width": width,
                    "height": height, "data": data}  # fmt: skip

        elsewhere = await w.fake.push_message(
            DISCORD_TOKEN, channel_id=RANDOM, content="CANARY-RANDOM", author=DISCORD_BOB,
            attachments=[png("random.png", 120, 80)],
        )  # fmt: skip
        here = await w.fake.push_message(
            DISCORD_TOKEN, channel_id=GENERAL, content="look", author=DISCORD_BOB,
            attachments=[png("general.png", 300, 200)],
        )  # fmt: skip
        # A reference to another channel's message (as a forward or crosspost carries)
        # brings neither its files nor its words into this channel's conversation.
        await w.fake.push_message(
            DISCORD_TOKEN, channel_id=GENERAL, content=f"<@{ME['id']}> and that?",
            author=DISCORD_BOB, mentions=[ME], referenced_message=elsewhere,
        )  # fmt: skip
        await w.fake.wait_until(lambda: len(w.replies()) >= 1, LIMIT)
        await w.gateway.wait_idle()
        first = chat_bodies(w.llm)[-1]
        assert images_of(first) == [] and w.fake.cdn_fetches == []
        assert "CANARY-RANDOM" not in all_text(first)
        await w.fake.push_message(
            DISCORD_TOKEN, channel_id=GENERAL, content=f"<@{ME['id']}> what is it?",
            author=DISCORD_BOB, mentions=[ME], referenced_message=here,
        )  # fmt: skip
        await w.fake.wait_until(lambda: len(w.replies()) >= 2, LIMIT)
        await w.gateway.wait_idle()
        asked = chat_bodies(w.llm)[-1]
        [(media_type, data)] = images_of(asked)
        assert (media_type, decoded_size(data)) == ("image/png", ("PNG", (300, 200)))
        assert "[in the message replied to:]" in all_text(asked)
        assert len(w.fake.cdn_fetches) == 1
