"""/compact, /context, /status and the context guard, end to end through the gateway.

The stack is the real one (state.db, transcripts, lanes, context engine, summariser);
only the provider is scripted. Its ``responder`` routes summariser calls (recognised by
their system prompt) to a fixed summary and answers turns with an echo that reports a
realistic prompt size, so the engine's accounting works on believable numbers.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT
from parley.core.context.config import WINDOW_HARD_MIN_TOKENS
from parley.core.context.history import COMPACTION_SUMMARY_PREFIX
from parley.core.context.report import LAST_CALL_LABEL, NEXT_REQUEST_LABEL, WINDOW_LABEL
from parley.core.errors import ContextOverflowError, OverloadedError
from parley.core.messages import TextBlock, Usage
from parley.core.providers.base import (
    STOP_END,
    ModelFacts,
    ProviderRequest,
    ProviderResponse,
)
from parley.core.tokens import default_counter
from parley.core.transcript import ENTRY_COMPACTION, ENTRY_MESSAGE, Entry
from parley.gateway.app import Gateway
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.storage.sessions import SessionRecord
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider, echo_text

KEY = "agent:main:test:direct:alice"
MODEL = "scripted-model"
WINDOW = 20_000
# A 20k window for the scripted model; no automatic compaction or memory flush, so the
# seeded turns pile up untouched until the test sends /compact itself.
SMALL_WINDOW = {
    "PARLEY_CONTEXT__MODELS": f'{{ "{MODEL}" = {{ context_tokens = {WINDOW} }} }}',
    "PARLEY_CONTEXT__COMPACTION__ENABLED": "false",
    "PARLEY_CONTEXT__FLUSH__ENABLED": "false",
}
SUMMARY = (
    "## Decisions\n- Summary marker: the garden plan was agreed.\n"
    "## Open TODOs\n- none\n"
    "## Constraints/Rules\n- none\n"
    "## Pending user asks\n- none\n"
    "## Exact identifiers\n- ORD-10001 (first order)\n- ORD-10002 (second order)"
)
SEEDED_TURNS = 14
COMPACTED = re.compile(r"^Compacted \(([\d,]+) → ([\d,]+) tokens\)$")


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Model:
    """The scripted provider's responder: fixed summaries, echoed turns, believable usage."""

    def __init__(self, *, cache_read_share: float = 0.0, tokenizer_ratio: float = 1.0) -> None:
        self.cache_read_share = cache_read_share
        # The model's tokens per parley-counted token: a real model's tokenizer and chat
        # template are not parley's, so its reports differ from the estimates.
        self.tokenizer_ratio = tokenizer_ratio
        self.summary_requests: list[ProviderRequest] = []
        self.counter = default_counter()

    def __call__(self, request: ProviderRequest) -> ProviderResponse:
        if request.system == SUMMARY_SYSTEM_PROMPT:
            self.summary_requests.append(request)
            return ProviderResponse((TextBlock(SUMMARY),), STOP_END, Usage(300, 120), MODEL)
        text = echo_text(request)
        estimate = self.counter.request(request.system, request.messages, request.tools)
        prompt = int(estimate * self.tokenizer_ratio)
        cached = int(prompt * self.cache_read_share)
        usage = Usage(prompt - cached, self.counter.text(text), cached)
        return ProviderResponse((TextBlock(text),), STOP_END, usage, MODEL)


def make_config(home: Path, **env: str) -> LoadedConfig:
    base = {
        "PARLEY_HOME": str(home),
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
        "PARLEY_HTTP__PORT": "0",
    }
    return load_config(env={**base, **env})


Stack = tuple[Gateway, RecordingChannel, ScriptedProvider, Model]


def open_stack(home: Path, *, env: dict[str, str], model: Model | None = None) -> Stack:
    channel = RecordingChannel()
    provider = ScriptedProvider(MODEL)
    responder = model or Model()
    provider.responder = responder
    clock = Clock(datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    gateway = Gateway(make_config(home, **env), channels=[channel], provider=provider, clock=clock)
    return gateway, channel, provider, responder


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Stack]:
    gateway, channel, provider, model = open_stack(tmp_path, env=SMALL_WINDOW)
    async with gateway:
        yield gateway, channel, provider, model


async def say(gateway: Gateway, channel: RecordingChannel, text: str, **kw: Any) -> str:
    before = len(channel.sent)
    await gateway.handle_inbound(channel.inbound(text, **kw))
    await gateway.wait_idle()
    sent = await channel.wait_sent(before + 1)
    return sent[before].text


def filler(turn: int) -> str:
    """A turn of plain prose (~250 tokens) with no identifier-like tokens in it."""
    words = "we talked about the garden the weather and the plan for the spring planting"
    body = " ".join([words] * 16)
    order = f" The order is ORD-1000{turn + 1}." if turn < 2 else ""
    return f"Turn {turn}: {body}.{order}"


async def seed(gateway: Gateway, channel: RecordingChannel, turns: int = SEEDED_TURNS) -> None:
    for turn in range(turns):
        assert (await say(gateway, channel, filler(turn))).startswith(f"echo: Turn {turn}:")


async def active(gateway: Gateway) -> SessionRecord:
    record = await gateway.registry.get_active(KEY)
    assert record is not None
    return record


async def entries(gateway: Gateway) -> list[Entry]:
    transcript = await gateway.transcript(await active(gateway))
    return list(transcript.entries())


def compaction_entries(found: list[Entry]) -> list[Entry]:
    return [e for e in found if e.type == ENTRY_COMPACTION]


def parse_compacted(reply: str) -> tuple[int, int]:
    match = COMPACTED.match(reply)
    assert match is not None, reply
    before, after = (int(g.replace(",", "")) for g in match.groups())
    return before, after


# -- /compact ---------------------------------------------------------------------------


async def test_compact_without_a_session_is_skipped(small: Stack) -> None:
    gateway, channel, provider, _ = small
    reply = await say(gateway, channel, "/compact")
    assert reply.startswith("Skipped: ") and "no conversation" in reply
    assert provider.requests == []
    assert await gateway.registry.get_active(KEY) is None  # /compact creates no session


async def test_compact_with_only_a_failed_turn_is_skipped(small: Stack) -> None:
    gateway, channel, provider, _ = small
    provider.push(OverloadedError("Overloaded", provider="scripted", status=529))
    assert "overloaded" in (await say(gateway, channel, "are you there?")).lower()
    calls = len(provider.requests)
    reply = await say(gateway, channel, "/compact")
    assert reply.startswith("Skipped: ")
    assert len(provider.requests) == calls  # no summariser call for nothing
    assert compaction_entries(await entries(gateway)) == []
    assert (await active(gateway)).compaction_count == 0


async def test_compact_of_a_one_turn_chat_is_skipped(small: Stack) -> None:
    gateway, channel, provider, model = small
    await say(gateway, channel, "hi")
    reply = await say(gateway, channel, "/compact")
    assert reply.startswith("Skipped: "), reply
    assert model.summary_requests == [] and len(provider.requests) == 1


async def test_compact_shows_the_working_indicator_while_it_folds(small: Stack) -> None:
    gateway, channel, _, _ = small
    await seed(gateway, channel)
    before = len(channel.typing_calls)
    reply = await say(gateway, channel, "/compact")
    parse_compacted(reply)
    # A compaction can take minutes on a small model: the person sees work going on.
    assert len(channel.typing_calls) > before


async def test_compact_folds_a_long_chat_and_the_next_turn_starts_with_the_summary(
    small: Stack,
) -> None:
    gateway, channel, provider, model = small
    await seed(gateway, channel)
    before = await active(gateway)
    turn_calls = len(provider.requests)

    reply = await say(gateway, channel, "/compact keep the order numbers")

    tokens_before, tokens_after = parse_compacted(reply)
    assert tokens_before > tokens_after > 0
    after = await active(gateway)
    assert after.compaction_count == before.compaction_count + 1
    assert after.context_tokens == tokens_after
    assert after.turn_count == before.turn_count  # a command is not a turn
    # Only summariser calls were made, each carrying the focus as untrusted data.
    summary_calls = provider.requests[turn_calls:]
    assert summary_calls and all(r.system == SUMMARY_SYSTEM_PROMPT for r in summary_calls)
    assert len(model.summary_requests) == len(summary_calls)
    for request in summary_calls:
        prompt = request.messages[-1].text
        assert "<untrusted-focus>\nkeep the order numbers\n</untrusted-focus>" in prompt
    assert "Turn 0:" in summary_calls[0].messages[-1].text  # the oldest turn is folded
    # The transcript gained one manual compaction entry recording the focus.
    [entry] = compaction_entries(await entries(gateway))
    assert entry.payload["trigger"] == "manual"
    assert entry.payload["tokens_before"] == tokens_before
    assert entry.payload["tokens_after"] == tokens_after
    assert entry.payload["details"]["focus"] == "keep the order numbers"
    assert "ORD-10001" in entry.payload["summary"]

    # The next turn's request opens with the summary, then the kept recent turns.
    assert await say(gateway, channel, "what next?") == "echo: what next?"
    request = provider.requests[-1]
    first = request.messages[0].text
    assert first.startswith(COMPACTION_SUMMARY_PREFIX)
    assert "Summary marker" in first and "ORD-10002" in first
    sent = "\n".join(m.text for m in request.messages)
    assert "Turn 0:" not in sent  # folded away
    assert f"Turn {SEEDED_TURNS - 1}:" in sent  # the newest turn is kept verbatim
    assert len(request.messages) < 2 * SEEDED_TURNS


async def test_second_compact_with_nothing_new_is_skipped(small: Stack) -> None:
    gateway, channel, provider, _ = small
    await seed(gateway, channel)
    parse_compacted(await say(gateway, channel, "/compact"))
    calls = len(provider.requests)
    reply = await say(gateway, channel, "/compact")
    assert reply.startswith("Skipped: ")
    assert len(provider.requests) == calls
    assert len(compaction_entries(await entries(gateway))) == 1
    assert (await active(gateway)).compaction_count == 1


async def test_compact_waits_for_the_turn_queued_before_it(small: Stack) -> None:
    gateway, channel, provider, _ = small
    await seed(gateway, channel)
    gate = asyncio.Event()
    provider.gate = gate  # hold the next turn at the provider
    sent_before = len(channel.sent)
    await gateway.handle_inbound(channel.inbound("the last word", message_id="last"))
    await gateway.handle_inbound(channel.inbound("/compact", message_id="compact"))
    assert len(channel.sent) == sent_before  # neither is answered while the turn is held
    gate.set()
    await gateway.wait_idle()
    replies = [m.text for m in (await channel.wait_sent(sent_before + 2))[sent_before:]]
    assert replies[0] == "echo: the last word"
    parse_compacted(replies[1])
    # The compaction saw the turn: its entry comes after that turn's reply.
    found = await entries(gateway)
    [compaction] = compaction_entries(found)
    reply_index = next(
        i
        for i, e in enumerate(found)
        if e.type == ENTRY_MESSAGE and e.message.text == "echo: the last word"
    )
    assert found.index(compaction) > reply_index
    # The turn's model call came before every summariser call.
    systems = [r.system == SUMMARY_SYSTEM_PROMPT for r in provider.requests]
    last_turn = max(i for i, is_summary in enumerate(systems) if not is_summary)
    assert systems.index(True) > last_turn


# -- /context ---------------------------------------------------------------------------


async def test_context_list_detail_json_and_usage_never_call_the_model(
    small: Stack, tmp_path: Path
) -> None:
    gateway, channel, provider, _ = small
    await say(gateway, channel, "hello there")
    (tmp_path / "workspace" / "TOOLS.md").unlink()
    calls = len(provider.requests)

    listing = await say(gateway, channel, "/context")
    assert "Workspace files:" in listing
    assert re.search(r"MISSING\s+\| TOOLS\.md", listing)
    assert re.search(r"OK\s+\| AGENTS\.md", listing)
    assert "current_time" in listing and "History: 2 messages" in listing
    assert f" / {WINDOW:,} tokens (" in listing
    assert await say(gateway, channel, "/context list") == listing

    detail = await say(gateway, channel, "/context detail")
    assert re.search(r"^  user: 1 messages", detail, re.M)
    assert re.search(r"^  assistant: 1 messages", detail, re.M)
    assert re.search(r"^  read_file: [\d,]+ chars", detail, re.M)

    raw = await say(gateway, channel, "/context json")
    report = json.loads(raw)
    assert report["window"] == WINDOW
    assert isinstance(report["total_tokens"], int) and 0 < report["total_tokens"] < WINDOW
    statuses = {f["name"]: f["status"] for f in report["files"]}
    assert statuses["TOOLS.md"] == "MISSING" and statuses["AGENTS.md"] == "OK"
    tools = report["tools"]
    assert tools["count"] == len(tools["items"]) >= 3
    assert {"current_time", "read_file"} <= {t["name"] for t in tools["items"]}
    assert report["history"]["messages"] == 2
    parts = report["system_prompt"]["tokens"] + tools["tokens"] + report["history"]["tokens"]
    assert report["total_tokens"] >= parts - 5  # the parts add up to (about) the total

    assert await say(gateway, channel, "/context bogus") == "Usage: /context [list|detail|json]"
    assert len(provider.requests) == calls  # none of them reached the model
    assert (await active(gateway)).turn_count == 1


async def test_context_without_a_session_shows_an_empty_history(small: Stack) -> None:
    gateway, channel, provider, _ = small
    report = json.loads(await say(gateway, channel, "/context json"))
    assert report["history"]["messages"] == 0
    assert report["window"] == WINDOW
    assert provider.requests == []
    assert await gateway.registry.get_active(KEY) is None


async def test_context_detail_shows_the_summary_after_a_compaction(small: Stack) -> None:
    gateway, channel, _, _ = small
    await seed(gateway, channel)
    parse_compacted(await say(gateway, channel, "/compact"))
    detail = await say(gateway, channel, "/context detail")
    assert re.search(r"^  compaction summary: ~[\d,]+ tok", detail, re.M)
    report = json.loads(await say(gateway, channel, "/context json"))
    assert report["history"]["summary_tokens"] > 0


# -- /status ----------------------------------------------------------------------------


async def test_status_shows_compactions_and_the_cache_read_share(tmp_path: Path) -> None:
    gateway, channel, provider, _ = open_stack(
        tmp_path, env=SMALL_WINDOW, model=Model(cache_read_share=0.75)
    )
    async with gateway:
        await seed(gateway, channel)
        status = await say(gateway, channel, "/status")
        assert f"Turns: {SEEDED_TURNS} · compactions: 0" in status
        parse_compacted(await say(gateway, channel, "/compact"))
        calls = len(provider.requests)
        status = await say(gateway, channel, "/status")
        assert len(provider.requests) == calls
        record = await active(gateway)
        assert "compactions: 1" in status
        # By strategy and trigger, from the transcript, with the last one's tokens.
        line = next(x for x in status.splitlines() if x.startswith("Compactions: "))
        assert line.startswith("Compactions: 1 (summary 1; manual 1), last ")
        assert line.endswith(" tokens") and "→" in line
        scrape = gateway.metrics.render()[0].decode()
        assert f'parley_session_compactions_by_trigger{{session="{record.session_id}"' in scrape
        assert 'parley_compactions_total{strategy="summary",trigger="manual"} 1.0' in scrape
        usage = record.usage
        assert usage.cache_read_tokens > 0
        share = usage.cache_read_tokens / (
            usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        )
        assert 0.5 < share < 0.75  # turns read 75% from cache; summaries read none
        assert f"Cache: {share:.0%} of prompt tokens read from cache" in status
        # The registry holds the compactor's estimate now; no model reported it.
        assert f"{LAST_CALL_LABEL}: none since the latest compaction" in status


# -- one set of figures on every surface ---------------------------------------------------


async def inspector_context(gateway: Gateway, session_id: str) -> dict[str, Any]:
    """What the inspector page reads: the admin API's context endpoint, over HTTP."""
    assert gateway.http is not None
    url = gateway.http.url(f"/api/sessions/{session_id}/context")
    headers = {"Authorization": f"Bearer {gateway.http.token.value}"}
    async with aiohttp.ClientSession() as client, client.get(url, headers=headers) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


def figure_lines(text: str) -> list[str]:
    labels = (WINDOW_LABEL, NEXT_REQUEST_LABEL, LAST_CALL_LABEL)
    return [line for line in text.splitlines() if line.startswith(labels)]


async def test_status_context_and_the_inspector_show_the_same_figures(tmp_path: Path) -> None:
    gateway, channel, provider, _ = open_stack(
        tmp_path, env=SMALL_WINDOW, model=Model(tokenizer_ratio=1.2)
    )
    async with gateway:
        await seed(gateway, channel, turns=3)
        record = await active(gateway)
        calls = len(provider.requests)

        status = await say(gateway, channel, "/status")
        listing = await say(gateway, channel, "/context")
        report = json.loads(await say(gateway, channel, "/context json"))
        inspector = await inspector_context(gateway, record.session_id)

        figures = inspector["figures"]
        assert len(figures["lines"]) == 3
        # The same lines, word for word, on all three surfaces, and the same numbers.
        assert figure_lines(status) == figure_lines(listing) == figures["lines"]
        assert report["figures"] == figures
        assert figures["next_request_tokens"] == inspector["total_tokens"] == report["total_tokens"]
        assert figures["window_tokens"] == inspector["window_tokens"] == WINDOW
        window, estimate, called = figures["lines"]
        assert (
            window
            == f'{WINDOW_LABEL}: {WINDOW:,} tokens, from your config (context.models."{MODEL}")'
        )
        assert estimate.startswith(
            f"{NEXT_REQUEST_LABEL}: ~{report['total_tokens']:,} / {WINDOW:,} tokens ("
        )
        # The last call, as the model reported it: read (cache included) plus written.
        last = provider.requests[-1]
        sent = int(default_counter().request(last.system, last.messages, last.tools) * 1.2)
        reply = default_counter().text(f"echo: {filler(2)}")
        assert figures["last_call"] == {
            "prompt_tokens": sent,
            "output_tokens": reply,
            "tokens": sent + reply,
        }
        assert (
            called
            == f"{LAST_CALL_LABEL}: {sent + reply:,} tokens ({sent:,} read + {reply:,} written)"
        )
        assert record.context_tokens == sent + reply
        # Why two labelled figures: they differ (before, /status and the inspector's facts
        # printed the one, /context and the inspector's bar the other, each as "Context").
        assert figures["last_call"]["tokens"] > figures["next_request_tokens"] * 1.1
        assert len(provider.requests) == calls  # none of it reached the model


async def test_after_a_compaction_no_surface_calls_an_estimate_reported(small: Stack) -> None:
    gateway, channel, _, _ = small
    await seed(gateway, channel)
    parse_compacted(await say(gateway, channel, "/compact"))
    record = await active(gateway)
    status = await say(gateway, channel, "/status")
    inspector = await inspector_context(gateway, record.session_id)
    none = f"{LAST_CALL_LABEL}: none since the latest compaction"
    assert inspector["figures"]["last_call"] is None
    assert figure_lines(status) == inspector["figures"]["lines"]
    assert none in status and none in await say(gateway, channel, "/context")
    # The next turn reports again, on every surface.
    await say(gateway, channel, "and now?")
    status = await say(gateway, channel, "/status")
    inspector = await inspector_context(gateway, record.session_id)
    assert inspector["figures"]["last_call"]["tokens"] == (await active(gateway)).context_tokens
    assert figure_lines(status) == inspector["figures"]["lines"]


class LlamaServer(ScriptedProvider):
    """A llama.cpp server that published its window and said its template has no tools."""

    supports_tools = False
    context_window = 24_576

    def __init__(self) -> None:
        super().__init__("qwen2.5-3b-instruct")  # the table says 32,768: the server wins
        self.facts = ModelFacts(
            24_576, "llama.cpp /props", supports_tools=False, server="llama.cpp"
        )


async def test_status_says_where_the_window_came_from_and_whether_tools_are_offered(
    tmp_path: Path,
) -> None:
    channel, provider = RecordingChannel(), LlamaServer()
    gateway = Gateway(make_config(tmp_path), channels=[channel], provider=provider)
    async with gateway:
        status = await say(gateway, channel, "/status")  # before any conversation too
        assert f"{WINDOW_LABEL}: 24,576 tokens, from the llama.cpp server (/props)" in status
        assert "Tools: withheld: the llama.cpp server says the model cannot use them" in status
        await say(gateway, channel, "hello")
        status = await say(gateway, channel, "/status")
        assert f"{WINDOW_LABEL}: 24,576 tokens, from the llama.cpp server (/props)" in status
        assert "Tools: withheld" in status and provider.requests[-1].tools == ()
        assert "Profile: standard" in status  # 24,576 tokens: not a small window


async def test_status_says_the_window_is_an_assumed_default(tmp_path: Path) -> None:
    channel, provider = RecordingChannel(), ScriptedProvider("no-such-model")
    gateway = Gateway(make_config(tmp_path), channels=[channel], provider=provider)
    async with gateway:
        status = await say(gateway, channel, "/status")
    tools = len(gateway.rt.runner.tools.specs())
    default = gateway.config.context.default_window
    assert (
        f"{WINDOW_LABEL}: {default:,} tokens, assumed default: set "
        'context.models."no-such-model".context_tokens to the model\'s real window'
    ) in status
    assert f"Tools: offered ({tools})" in status


# -- the guard --------------------------------------------------------------------------


async def test_a_message_larger_than_the_window_is_refused_with_numbers(tmp_path: Path) -> None:
    # Default compaction (on): the next message must still be answered.
    env = {"PARLEY_CONTEXT__MODELS": SMALL_WINDOW["PARLEY_CONTEXT__MODELS"]}
    env["PARLEY_CONTEXT__FLUSH__ENABLED"] = "false"
    gateway, channel, provider, _ = open_stack(tmp_path, env=env)
    async with gateway:
        assert await say(gateway, channel, "hello") == "echo: hello"
        calls = len(provider.requests)
        reply = await say(gateway, channel, "word " * 30_000)
        assert len(provider.requests) == calls  # never sent
        match = re.search(r"\(([\d,]+) / ([\d,]+) tokens\)", reply)
        assert match is not None, reply
        used, limit = (int(g.replace(",", "")) for g in match.groups())
        assert used > limit and limit < WINDOW
        # The newest message alone does not fit: compacting or a new session cannot help,
        # so the reply advises shorter parts and not them.
        assert "saved" in reply and "shorter parts" in reply
        assert "/compact" not in reply and "/new" not in reply
        assert await say(gateway, channel, "still there?") == "echo: still there?"
        sent = provider.requests[-1]
        assert default_counter().request(sent.system, sent.messages, sent.tools) < WINDOW


async def test_compact_after_an_oversized_message_makes_room(tmp_path: Path) -> None:
    gateway, channel, _, _ = open_stack(tmp_path, env=SMALL_WINDOW)
    async with gateway:
        await say(gateway, channel, "hello")
        await say(gateway, channel, "word " * 30_000)
        reply = await say(gateway, channel, "/compact")
        assert not reply.startswith("Skipped: "), reply
        assert await say(gateway, channel, "still there?") == "echo: still there?"


async def test_a_window_below_the_minimum_is_refused_before_any_call(tmp_path: Path) -> None:
    tiny = WINDOW_HARD_MIN_TOKENS // 2
    env = {"PARLEY_CONTEXT__MODELS": f'{{ "{MODEL}" = {{ context_tokens = {tiny} }} }}'}
    gateway, channel, provider, _ = open_stack(tmp_path, env=env)
    async with gateway:
        reply = await say(gateway, channel, "hello")
        assert "too small" in reply and f"{tiny:,}" in reply
        assert "[context.models]" in reply
        assert provider.requests == []
        # /compact refuses the same way, and the info commands still answer.
        assert "too small" in await say(gateway, channel, "/compact")
        assert f"{WINDOW_LABEL}: {tiny:,} tokens, from your config" in await say(
            gateway, channel, "/status"
        )
        assert provider.requests == []


@pytest.mark.parametrize("summaries", [None, "true"])
async def test_the_small_profile_compacts_without_a_summary_unless_the_model_is_said_to_write_them(
    tmp_path: Path, summaries: str | None
) -> None:
    said = f", summaries = {summaries}" if summaries else ""
    env = {
        **SMALL_WINDOW,
        # 8k: the small profile. A tiny model's summaries are noise that later replies
        # echo, and each one holds a reply back: it folds without one unless told.
        "PARLEY_CONTEXT__MODELS": f'{{ "{MODEL}" = {{ context_tokens = 8192{said} }} }}',
    }
    gateway, channel, _, model = open_stack(tmp_path, env=env)
    async with gateway:
        await seed(gateway, channel, turns=6)
        reply = await say(gateway, channel, "/compact")
        status = await say(gateway, channel, "/status")
    assert reply.startswith("Compacted"), reply
    assert "Profile: small" in status
    if summaries:
        assert model.summary_requests and "selective" not in reply
    else:
        assert model.summary_requests == [] and "selective" in reply


async def test_a_window_a_refusal_taught_is_the_one_status_and_context_show(
    small: Stack,
) -> None:
    gateway, channel, provider, _ = small
    # The provider refuses the first request: its window is 12,000, not the configured
    # 20,000. The session learns it, and every surface shows the one figure.
    provider.push(ContextOverflowError("too long", provider="scripted", status=400, limit=12_000))
    assert await say(gateway, channel, "hello") == "echo: hello"
    report = json.loads(await say(gateway, channel, "/context json"))
    assert report["window"] == 12_000
    status = await say(gateway, channel, "/status")
    assert f"{WINDOW_LABEL}: 12,000 tokens, as the provider's refusal showed" in status
    assert "/ 12,000 tokens" in status
    assert gateway.window_for(await active(gateway)) == 12_000


async def test_status_and_context_read_the_transcript_off_the_event_loop(
    small: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, channel, _, _ = small
    await seed(gateway, channel, 2)
    transcript = await gateway.transcript(await active(gateway))
    readers: list[threading.Thread] = []
    original = type(transcript).live_entries

    def spy(self: Any) -> Any:
        readers.append(threading.current_thread())
        return original(self)

    monkeypatch.setattr(type(transcript), "live_entries", spy)
    for command in ("/status", "/context", "/context json"):
        await say(gateway, channel, command)
    # Read, cut and searched in a worker thread: never on the event loop's thread.
    assert readers and threading.main_thread() not in readers
