"""A send whose answer is lost (a timeout under load: Telegram took the message, the
gateway never heard so) is not sent a second time by the quick retries: the gateway
looks for it first, as a restart does after a kill (gateway/runtime/delivery.py,
send_recovery.py). The whole gateway, the real python-telegram-bot adapter and the
fake Bot API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fakes.telegram_api import DROP, ApiError, FakeTelegram
from tests.gateway.test_send_recovery import dm, running, sent_rows, telegram_world, texts


def answer_lost(fake: FakeTelegram, times: int = 1) -> list[int]:
    """The next ``times`` sendMessage calls are carried out, then their connection
    dies before the answer: the client sees a network error. Returns the ids taken."""
    name, handler = fake._methods["sendmessage"]
    taken: list[int] = []

    async def handled_then_dropped(bot: Any, params: dict[str, Any]) -> Any:
        result = await handler(bot, params)
        if len(taken) < times:
            taken.append(int(result["message_id"]))
            raise ApiError(DROP, "connection dropped")
        return result

    fake._methods["sendmessage"] = (name, handled_then_dropped)
    return taken


async def test_a_reply_whose_answer_was_lost_is_not_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("parley.gateway.runtime.delivery.DELIVERY_BACKOFF_SECONDS", (0.0, 0.0))
    async with telegram_world(tmp_path, monkeypatch) as (fake, _, loaded):
        taken = answer_lost(fake)
        async with running(loaded) as gateway:
            dm(fake, "c1 m0 hello")
            await fake.wait_sent(1)
            await gateway.wait_idle()
            assert taken  # the first send went out, and its answer was lost
            assert len(texts(fake)) == 1  # before: the retry sent it a second time
            assert await gateway.inbox.counts() == {"delivered": 1}
            # The found message is recorded as this reply's, as a sent one would be.
            assert [row[0] for row in await sent_rows(loaded)] == [
                f"{fake.sent[0].chat_id}:{taken[0]}"
            ]
            dm(fake, "c1 m1 again")
            await fake.wait_sent(2)
            await gateway.wait_idle()
            assert len(texts(fake)) == 2
