"""Provider faults end to end: the real anthropic and openai SDKs against the protocol
fakes on 127.0.0.1, through the whole gateway, with a recording channel.

For every fault: the user hears a clear, specific message after a bounded number of
requests (counted at the fake); the session is not stuck (the lane is idle, the inbox
item is final, the transcript loads with no assistant turn, whole or half, for the
failed call, and the user's message is kept); and the next message in the same chat
is answered normally, with the failed message still in the model's history. Retry
waits are a few milliseconds via config, and the hung-stream tests use a one-second
timeout: nothing here sleeps in the hope that something happened.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from parley.core.transcript_store import SessionTranscript
from parley.gateway.app import Gateway
from parley.gateway.config import load_config
from tests.fakes import anthropic_api, openai_api
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.llm_common import FakeLLMServer, Hang, RawResponse, Reply, Step, StreamError
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.recording_channel import RecordingChannel

SESSION_KEY = "agent:main:test:direct:alice"
MAX_ATTEMPTS = 3
# Generous for a normal answer on a busy machine; only the hang tests wait it out.
TIMEOUT_SECONDS = 30.0
HANG_TIMEOUT_SECONDS = 1.0
HANG_ATTEMPTS = 2
_TURN_CONTEXT = re.compile(r"<turn-context>.*?</turn-context>", re.S)
SAVED = "Your message is saved in the conversation"


def said(body: dict[str, Any]) -> str:
    """The newest user text the model was sent, without the turn context (either API;
    a user message merged with a summary or a failed turn's text holds more)."""
    content = body["messages"][-1]["content"]
    if not isinstance(content, str):
        content = "\n\n".join(b["text"] for b in content if b.get("type") == "text")
    texts = [t.strip() for t in _TURN_CONTEXT.split(content) if t.strip()]
    return texts[-1].split("\n\n")[-1]


def history_text(body: dict[str, Any]) -> str:
    """Everything the model was sent as messages, as one string."""
    parts: list[str] = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            parts.append(content)
        else:
            parts.extend(b.get("text", "") for b in content)
    return "\n".join(parts)


class World:
    def __init__(self, gateway: Gateway, channel: RecordingChannel, llm: FakeLLMServer) -> None:
        self.gateway, self.channel, self.llm = gateway, channel, llm

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The model requests so far, in order."""
        return [r.body for r in self.llm.requests if r.path.endswith(("/messages", "/completions"))]

    @property
    def calls(self) -> int:
        return len(self.bodies)

    async def say(self, text: str) -> str:
        """Send ``text`` in Alice's chat; return the one reply it got."""
        before = len(self.channel.sent)
        await self.gateway.handle_inbound(self.channel.inbound(text))
        await self.gateway.wait_idle()
        sent = await self.channel.wait_sent(before + 1)
        assert len(sent) == before + 1, [m.text for m in sent[before:]]
        return sent[before].text

    async def transcript(self) -> SessionTranscript:
        record = await self.gateway.registry.get_active(SESSION_KEY)
        assert record is not None
        transcript = self.gateway.state.transcripts.open(record.session_id)
        assert record.entry_count == transcript.entry_count
        assert record.last_entry_id == transcript.last_entry.id
        return transcript

    async def assert_not_stuck(self) -> None:
        """The lane is free, every inbox item is final, the transcript is whole."""
        lanes = self.gateway.lanes
        stats = lanes.stats()
        assert stats.active_runs == 0 and stats.queued == 0
        assert not lanes.busy(SESSION_KEY) and lanes.pending(SESSION_KEY) == 0
        assert await self.gateway.inbox.open_items() == []
        assert set(await self.gateway.inbox.counts()) == {"delivered"}
        transcript = await self.transcript()
        assert transcript.load_report.clean
        for entry in transcript.entries():
            if entry.type == "message" and entry.message.role == "assistant":
                assert entry.message.text.strip() or entry.message.tool_uses, entry

    async def assert_failed_turn(self, text: str, error_kind: str) -> None:
        """The failed turn left the user's message, a turn_error and the delivery, and
        no assistant message at all."""
        transcript = await self.transcript()
        entries = list(transcript.entries())
        start = max(
            i
            for i, e in enumerate(entries)
            if e.type == "message" and e.message.role == "user" and e.message.text.startswith(text)
        )
        # Maintenance a recovery may write on the way (a memory flush, a compaction)
        # is not part of the turn's outcome.
        tail = [
            e
            for e in entries[start:]
            if e.type == "message" or e.payload.get("custom_type") in ("turn_error", "delivery")
        ]
        kinds = [e.message.role if e.type == "message" else e.payload["custom_type"] for e in tail]
        assert kinds == ["user", "turn_error", "delivery"], kinds
        assert tail[1].payload["data"]["kind"] == error_kind
        assert tail[2].payload["data"]["ok"] is True

    async def assert_next_message_works(self, failed_text: str) -> None:
        """The same chat is answered normally, and the model sees the failed message."""
        calls = self.calls
        reply = await self.say("are you back?")
        assert reply == "echo: are you back?"
        assert self.calls == calls + 1
        assert failed_text in history_text(self.bodies[-1])
        await self.assert_not_stuck()


def base_env(home: Path, **extra: str) -> dict[str, str]:
    return {
        "PARLEY_HOME": str(home),
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_MEMORY__ENABLED": "false",
        "PARLEY_HTTP__PORT": "0",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "PARLEY_PROVIDERS__RETRY__BASE_DELAY_SECONDS": "0.001",
        "PARLEY_PROVIDERS__RETRY__MAX_DELAY_SECONDS": "0.002",
        "PARLEY_PROVIDERS__RETRY__TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
        **extra,
    }


def provider_env(llm: FakeLLMServer) -> dict[str, str]:
    if isinstance(llm, FakeAnthropic):
        return {
            "ANTHROPIC_API_KEY": llm.api_key,
            "ANTHROPIC_BASE_URL": llm.base_url,
            "PARLEY_PROVIDERS__ANTHROPIC__MODEL": "claude-test-model",
        }
    return {
        "PARLEY_PROVIDERS__DEFAULT": "openai",
        "OPENAI_API_KEY": llm.api_key,
        "OPENAI_BASE_URL": llm.base_url,
        "PARLEY_PROVIDERS__OPENAI__MODEL": "gpt-test-model",
    }


@asynccontextmanager
async def world(tmp_path: Path, api: str = "anthropic", **extra: str) -> AsyncIterator[World]:
    """A gateway on the real ``api`` SDK against its fake, which echoes by default."""
    fake: FakeLLMServer = FakeAnthropic() if api == "anthropic" else FakeOpenAI()
    async with fake as llm:
        llm.responder = lambda body: Reply(text=f"echo: {said(body)}")
        channel = RecordingChannel()
        loaded = load_config(env={**base_env(tmp_path, **extra), **provider_env(llm)})
        async with Gateway(loaded, channels=[channel]) as gateway:
            yield World(gateway, channel, llm)


def fakes(api: str) -> ModuleType:
    return anthropic_api if api == "anthropic" else openai_api


BOTH = pytest.mark.parametrize("api", ["anthropic", "openai"])


# -- faults that persist past the retry budget ---------------------------------------------


@BOTH
@pytest.mark.parametrize(
    ("fault", "kind", "expected"),
    [
        pytest.param(
            lambda m: m.rate_limited(retry_after=0.01),
            "RateLimitError",
            f"The model provider is rate-limiting me after {MAX_ATTEMPTS} attempts. {SAVED}; "
            "try again shortly.",
            id="429-short-retry-after",
        ),
        pytest.param(
            lambda m: m.rate_limited(),
            "RateLimitError",
            f"The model provider is rate-limiting me after {MAX_ATTEMPTS} attempts. {SAVED}; "
            "try again shortly.",
            id="429-no-retry-after",
        ),
        pytest.param(
            lambda m: m.overloaded(),
            "OverloadedError",
            f"The model provider is overloaded right now after {MAX_ATTEMPTS} attempts. "
            f"{SAVED}; try again in a minute.",
            id="overloaded",  # Anthropic 529 overloaded_error, OpenAI 503
        ),
        pytest.param(
            lambda m: m.server_error(),
            "ServerError",
            f"The model provider had an internal error (HTTP 500) after {MAX_ATTEMPTS} "
            f"attempts. {SAVED}; try again in a minute.",
            id="500",
        ),
        pytest.param(
            lambda m: StreamError("api_error", "Internal server error", partial_text="Half of"),
            "ServerError",
            f"The model provider broke off its answer with an error after {MAX_ATTEMPTS} "
            f"attempts. {SAVED}; try again.",
            id="error-mid-stream",
        ),
        pytest.param(
            lambda m: StreamError("overloaded_error", "Overloaded", partial_text="Half of"),
            "OverloadedError",
            f"The model provider is overloaded right now after {MAX_ATTEMPTS} attempts. "
            f"{SAVED}; try again in a minute.",
            id="overloaded-mid-stream",
        ),
    ],
)
async def test_retryable_fault_is_retried_then_reported(
    tmp_path: Path, api: str, fault: Callable[[ModuleType], Step], kind: str, expected: str
) -> None:
    async with world(tmp_path, api) as w:
        w.llm.enqueue(*[fault(fakes(api)) for _ in range(MAX_ATTEMPTS)])
        assert await w.say("what is the plan?") == expected
        assert w.calls == MAX_ATTEMPTS
        assert not w.llm.script  # every scripted fault was met, none left over
        await w.assert_failed_turn("what is the plan?", kind)
        transcript = await w.transcript()
        # Text streamed before a failure is void: neither recorded nor sent.
        assert all("Half of" not in e.to_json() for e in transcript.entries())
        await w.assert_not_stuck()
        await w.assert_next_message_works("what is the plan?")


@BOTH
async def test_retry_after_over_the_cap_is_told_at_once(tmp_path: Path, api: str) -> None:
    async with world(tmp_path, api, PARLEY_PROVIDERS__RETRY__MAX_RETRY_AFTER_SECONDS="5") as w:
        w.llm.enqueue(fakes(api).rate_limited(retry_after=120))
        assert await w.say("quick question") == (
            "The model provider is rate-limiting me and asked to wait about 2 minutes. "
            f"{SAVED}; send it again after that."
        )
        assert w.calls == 1  # not waited out, not retried: the user hears now
        await w.assert_failed_turn("quick question", "RateLimitError")
        await w.assert_next_message_works("quick question")


@BOTH
@pytest.mark.parametrize(
    "hang", [Hang(), Hang(partial_text="I think")], ids=["before-headers", "mid-stream"]
)
async def test_hung_stream_times_out_and_is_reported(tmp_path: Path, api: str, hang: Hang) -> None:
    async with world(
        tmp_path,
        api,
        PARLEY_PROVIDERS__RETRY__TIMEOUT_SECONDS=str(HANG_TIMEOUT_SECONDS),
        PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS=str(HANG_ATTEMPTS),
    ) as w:
        w.llm.enqueue(*[hang] * HANG_ATTEMPTS)
        assert await w.say("are you there?") == (
            f"The model provider did not answer in time after {HANG_ATTEMPTS} attempts. "
            f"{SAVED}; try again."
        )
        assert w.calls == HANG_ATTEMPTS and w.llm.hangs_started == HANG_ATTEMPTS
        await w.assert_failed_turn("are you there?", "ProviderTimeoutError")
        transcript = await w.transcript()
        assert all("I think" not in e.to_json() for e in transcript.entries())
        await w.assert_next_message_works("are you there?")


@BOTH
async def test_connection_refused_is_retried_then_reported(tmp_path: Path, api: str) -> None:
    async with world(tmp_path, api) as w:
        await w.llm.stop()  # nothing listens on the port now: connection refused
        assert await w.say("hello?") == (
            f"I could not reach the model provider after {MAX_ATTEMPTS} attempts. "
            f"{SAVED}; try again later."
        )
        assert w.calls == 0
        await w.assert_failed_turn("hello?", "ProviderConnectionError")
        await w.assert_not_stuck()
        await w.llm.start()  # the service is back, on the same port
        await w.assert_next_message_works("hello?")


MALFORMED = {
    "anthropic": [
        RawResponse(b"<html><body>502 Bad Gateway</body></html>"),
        RawResponse(b"event: message_start\ndata: {not json\n\n"),
        RawResponse(b'{"unexpected": true}', content_type="application/json"),
    ],
    "openai": [
        RawResponse(b"<html><body>502 Bad Gateway</body></html>"),
        RawResponse(b"data: {not json\n\n"),
        RawResponse(b'{"unexpected": true}', content_type="application/json"),
    ],
}


@BOTH
@pytest.mark.parametrize("case", [0, 1, 2], ids=["html", "bad-json-event", "json-not-stream"])
async def test_malformed_response_is_reported_plainly(tmp_path: Path, api: str, case: int) -> None:
    async with world(tmp_path, api) as w:
        w.llm.enqueue(MALFORMED[api][case])
        reply = await w.say("tell me")
        assert reply == (
            f"The model provider sent an answer I could not read. {SAVED}; try again. "
            "If it keeps happening, the operator should check the provider's base URL."
        )
        assert w.calls == 1  # not retried: see MalformedResponseError.retryable
        await w.assert_failed_turn("tell me", "MalformedResponseError")
        await w.assert_next_message_works("tell me")


def overflow(api: str) -> Step:
    if api == "anthropic":
        return anthropic_api.prompt_too_long(250_000, 200_000)
    return openai_api.context_length_exceeded(250_000, 200_000)


@BOTH
async def test_context_overflow_on_every_attempt_is_bounded_and_reported(
    tmp_path: Path, api: str
) -> None:
    async with world(tmp_path, api) as w:
        await w.say("a first message, answered normally")
        echo, before = w.llm.responder, w.calls
        # The provider refuses every request as too long, the summariser's included.
        w.llm.responder = lambda body: overflow(api)
        reply = await w.say("and a second one")
        assert reply == (
            "This conversation no longer fits the model's context window (250,000 / 200,000 "
            f"tokens), even after compacting. {SAVED}. Send /compact to summarise it harder, "
            "or /new to start a fresh session (the current one is archived, not deleted)."
        )
        # Each overflow is recovered and retried at most compaction.max_attempts times:
        # one memory flush, then per recovery a summary (its chunk split in two once on
        # overflow) and a trim. Bounded, and nothing retries an overflow as such.
        recoveries = w.gateway.config.context.compaction.max_attempts
        turn_calls = [b for b in w.bodies[before:] if "and a second one" in said(b)]
        assert len(turn_calls) == recoveries + 1
        assert w.calls - before <= (recoveries + 1) + 1 + 2 * recoveries
        await w.assert_failed_turn("and a second one", "ContextOverflowError")
        await w.assert_not_stuck()
        w.llm.responder = echo
        await w.assert_next_message_works("and a second one")


@BOTH
async def test_message_too_big_for_the_window_is_reported_and_left_out_after(
    tmp_path: Path, api: str
) -> None:
    """A real window overflow: the newest message alone does not fit."""
    async with world(tmp_path, api, PARLEY_AGENT__MAX_OUTPUT_TOKENS="256") as w:
        w.llm.context_window = 3000
        await w.say("a small first message")
        before = w.calls
        huge = "paste " * 4000  # about 6,000 tokens
        reply = await w.say(huge)
        assert reply.startswith("This message does not fit the model's context window (")
        assert "shorter parts" in reply and SAVED in reply and "/new" not in reply
        recoveries = w.gateway.config.context.compaction.max_attempts
        assert w.calls - before <= (recoveries + 1) + 1 + 2 * recoveries
        await w.assert_failed_turn(huge.strip()[:50], "ContextBudgetError")
        await w.assert_not_stuck()
        # The next message is answered; the paste that never fit is left out of the view.
        assert await w.say("a small follow-up") == "echo: a small follow-up"
        assert "paste paste" not in history_text(w.bodies[-1])
        await w.assert_not_stuck()


# -- transient faults that clear within the budget ----------------------------------------


@BOTH
async def test_transient_faults_within_the_budget_are_invisible(tmp_path: Path, api: str) -> None:
    async with world(tmp_path, api, PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS="4") as w:
        m = fakes(api)
        w.llm.enqueue(
            m.rate_limited(retry_after=0.01),
            m.overloaded(),
            StreamError("api_error", "Internal server error", partial_text="Half of"),
        )
        assert await w.say("hi there") == "echo: hi there"
        assert w.calls == 4
        transcript = await w.transcript()
        kinds = [
            e.message.role if e.type == "message" else e.payload.get("custom_type")
            for e in transcript.entries()
        ]
        assert kinds == ["user", "assistant", "delivery"]
        assert all("Half of" not in e.to_json() for e in transcript.entries())
        await w.assert_not_stuck()
        assert await w.say("and again") == "echo: and again"
        assert w.calls == 5


async def test_transient_connection_refused_then_back(tmp_path: Path) -> None:
    """The service comes back between one message and the next: no lasting damage."""
    async with world(tmp_path, PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS="1") as w:
        await w.llm.stop()
        assert (
            await w.say("one") == f"I could not reach the model provider. {SAVED}; try again later."
        )
        await w.llm.start()
        w.llm.enqueue(anthropic_api.overloaded())
        assert "overloaded" in await w.say("two")
        await w.assert_next_message_works("two")
