from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from parley.core.agent_config import AgentConfig
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT
from parley.core.context.config import ContextConfig
from parley.core.context.engine import ContextEngine
from parley.core.errors import (
    CAUSE_MESSAGE,
    CompactionError,
    ContextOverflowError,
    OverloadedError,
    ProviderError,
    RateLimitError,
    ServerError,
)
from parley.core.messages import Message, TextBlock, ToolUseBlock, Usage
from parley.core.prompt import SystemPromptBuilder
from parley.core.providers.base import (
    STOP_END,
    STOP_OVERFLOW,
    STOP_TOOL_USE,
    ProviderRequest,
    ProviderResponse,
)
from parley.core.providers.provider_config import RetryConfig
from parley.core.runner import DISCARDED_REPLY_TYPE, TOOL_LIMIT_NOTE, Runner, TurnRequest
from parley.core.tools.builtin import default_registry
from parley.core.transcript import ENTRY_COMPACTION, Entry, Transcript
from tests.fakes.scripted_provider import ScriptedProvider


def make_runner(tmp_path: Path, provider: ScriptedProvider, **agent: int) -> Runner:
    tools = default_registry(10_000)
    return Runner(
        provider=provider,
        tools=tools,
        prompt=SystemPromptBuilder(tmp_path, agent_name="T", tools=tools.specs()),
        agent=AgentConfig(**agent),
        retry=RetryConfig(max_attempts=1),
        workspace=tmp_path,
    )


@pytest.fixture
def transcript(tmp_path: Path) -> Transcript:
    return Transcript.create(tmp_path / "s.jsonl", "sid", "agent:main:x")


def tool_call(n: int) -> ProviderResponse:
    return ProviderResponse(
        (ToolUseBlock(f"t{n}", "current_time", {}),), STOP_TOOL_USE, Usage(1, 1)
    )


async def test_turn_records_usage_and_context(tmp_path: Path, transcript: Transcript) -> None:
    provider = ScriptedProvider()
    provider.push(ProviderResponse((TextBlock("hi!"),), STOP_END, Usage(100, 7, 900, 50)))
    result = await make_runner(tmp_path, provider).run_turn(
        transcript, TurnRequest("k", "hello", context_text="<turn-context>now</turn-context>")
    )
    assert result.reply == "hi!"
    assert result.usage == Usage(100, 7, 900, 50)
    assert result.context_tokens == 100 + 900 + 50 + 7
    entries = list(transcript.entries())
    assert [e.message.role for e in entries] == ["user", "assistant"]
    assert entries[1].usage == Usage(100, 7, 900, 50)


async def test_tool_loop_is_bounded(tmp_path: Path, transcript: Transcript) -> None:
    provider = ScriptedProvider()
    provider.push(*(tool_call(i) for i in range(10)))
    runner = make_runner(tmp_path, provider, max_tool_iterations=2)
    result = await runner.run_turn(transcript, TurnRequest("k", "loop forever"))
    # Two rounds of tools ran, the third call's tools were refused, one last call followed.
    assert result.model_calls == 4
    results = [e.message for e in transcript.entries() if e.message.role == "tool_result"]
    assert len(results) == 3
    assert results[-1].content[0].content == TOOL_LIMIT_NOTE
    assert results[0].content[0].is_error is False


async def test_the_turn_says_which_tools_run_while_they_run(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = ScriptedProvider()
    provider.push(tool_call(1), ProviderResponse((TextBlock("noon"),), STOP_END, Usage(1, 1)))
    heard: list[tuple[str | None, int]] = []

    def on_status(text: str | None) -> None:  # with how many tool results were written
        heard.append((text, sum(e.message.role == "tool_result" for e in transcript.entries())))

    result = await make_runner(tmp_path, provider).run_turn(
        transcript, TurnRequest("k", "time?"), on_status=on_status
    )
    assert result.reply == "noon"
    assert heard == [("running current_time", 0), (None, 0)]


async def test_provider_error_is_recorded_and_raised(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = ScriptedProvider()
    provider.push(RateLimitError("slow down", provider="scripted", status=429))
    with pytest.raises(RateLimitError):
        await make_runner(tmp_path, provider).run_turn(transcript, TurnRequest("k", "hi"))
    kinds = [e.type for e in transcript.entries()]
    assert kinds == ["message", "custom"]
    assert list(transcript.entries())[1].payload["data"]["kind"] == "RateLimitError"


async def test_resume_does_not_repeat_the_user_message(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = ScriptedProvider()
    runner = make_runner(tmp_path, provider)
    await runner.run_turn(transcript, TurnRequest("k", "first"))
    await runner.run_turn(transcript, TurnRequest("k", "ignored", resume=True))
    users = [e for e in transcript.entries() if e.message.role == "user"]
    assert len(users) == 1


def stopped(text: str, prompt: int, written: int) -> ProviderResponse:
    """A reply cut off because prompt plus output reached the window (llama.cpp)."""
    blocks = (TextBlock(text),) if text else ()
    return ProviderResponse(blocks, STOP_OVERFLOW, Usage(prompt, written))


def summarising(provider: ScriptedProvider) -> ScriptedProvider:
    """Summary calls get a short summary (as a real model asked for one would write)."""

    def answer(request: ProviderRequest) -> ProviderResponse | None:
        if request.system == SUMMARY_SYSTEM_PROMPT:
            return ProviderResponse((TextBlock("## Decisions\n- none"),), STOP_END, Usage(9, 9))
        return None

    provider.responder = answer
    return provider


def seed(transcript: Transcript, turns: int) -> None:
    for n in range(turns):
        transcript.append_message(Message.user(f"question {n}: " + "words " * 150))
        transcript.append_message(Message.assistant(f"answer {n}: " + "more " * 150))


async def test_a_reply_the_window_cut_off_is_compacted_and_retried(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 8)
    provider = summarising(ScriptedProvider())
    provider.push(stopped("half an answ", 2_000, 48))
    retries: list[tuple[int, ProviderError, float]] = []
    runner = make_runner(tmp_path, provider)
    result = await runner.run_turn(
        transcript,
        TurnRequest("k", "the newest question"),
        on_retry=lambda attempt, exc, delay: retries.append((attempt, exc, delay)),
    )
    # The retry's reply is the answer, and the UI was told to drop the streamed text.
    assert result.reply == "echo: the newest question"
    assert result.model_calls == 2  # the summary call is the engine's, not the turn's
    assert len(retries) == 1
    attempt, error, delay = retries[0]
    assert (attempt, delay) == (1, 0.0)
    assert isinstance(error, ContextOverflowError) and error.prompt_only is True
    assert (error.observed_tokens, error.limit) == (2_000, 2_048)
    # Recovery compacted the history; the retry did not resend the cut-off reply.
    entries = list(transcript.entries())
    compaction = [e for e in entries if e.type == ENTRY_COMPACTION]
    assert [c.payload["trigger"] for c in compaction] == ["overflow"]
    main = [r for r in provider.requests if r.system != SUMMARY_SYSTEM_PROMPT]
    assert "half an answ" not in json.dumps([m.to_dict() for m in main[1].messages])
    assert len(main[1].messages) < len(main[0].messages)
    # Where the reply stopped (2,000 read + 48 written) is no refusal: the session's
    # window is not shrunk to it, and the retry asks for the same reply size.
    assert main[1].max_tokens == main[0].max_tokens
    assert runner.engine.session_window("k", runner.provider.model) > 2_048
    # The transcript keeps the cut-off reply as a record, never as an assistant message.
    assistants = [e.message.text for e in entries if e.type == "message"]
    assert "half an answ" not in assistants
    discarded = [e for e in entries if e.payload.get("custom_type") == DISCARDED_REPLY_TYPE]
    assert [d.payload["data"]["text"] for d in discarded] == ["half an answ"]
    # The cut-off call is counted in the turn's usage.
    assert result.usage.input_tokens == 2_000 + 10 + result.events.usage.input_tokens


async def test_a_cut_off_reply_is_kept_when_recovery_cannot_make_room(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = ScriptedProvider()
    provider.push(stopped("partial", 300, 40))
    retries: list[int] = []
    runner = make_runner(tmp_path, provider)
    result = await runner.run_turn(
        transcript,
        TurnRequest("k", "a"),
        on_retry=lambda attempt, exc, delay: retries.append(attempt),
    )
    # One message, nothing to fold, nothing to trim: the same request would stop the
    # same way, so what was said is the answer and no retry is announced.
    assert result.reply == "partial"
    assert len(provider.requests) == 1 and retries == []
    assert [e.message.text for e in transcript.entries() if e.type == "message"][-1] == "partial"


async def test_a_cut_off_reply_with_nothing_said_is_an_overflow_of_the_message(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = ScriptedProvider()
    provider.push(stopped("", 300, 0))
    with pytest.raises(ContextOverflowError) as caught:
        await make_runner(tmp_path, provider).run_turn(transcript, TurnRequest("k", "b"))
    # Only the newest message was sent: /compact or /new cannot help, and the error says so.
    assert caught.value.cause == CAUSE_MESSAGE
    errors = [e for e in transcript.entries() if e.payload.get("custom_type") == "turn_error"]
    assert [e.payload["data"]["kind"] for e in errors] == ["ContextOverflowError"]


async def test_a_stop_on_every_retry_is_bounded_and_keeps_the_last_reply(
    tmp_path: Path, transcript: Transcript
) -> None:
    seed(transcript, 12)
    provider = ScriptedProvider()
    main: list[ProviderRequest] = []

    def answer(request: ProviderRequest) -> ProviderResponse:
        if request.system == SUMMARY_SYSTEM_PROMPT:
            return ProviderResponse((TextBlock("## Decisions\n- none"),), STOP_END, Usage(9, 9))
        main.append(request)
        return stopped(f"cut {len(main)}", 1_900, 100)

    provider.responder = answer
    runner = make_runner(tmp_path, provider)
    result = await runner.run_turn(transcript, TurnRequest("k", "go"))
    # Each stop is recovered and retried at most compaction.max_attempts times; the
    # last cut-off reply is kept as the answer, the ones before recorded as discarded.
    attempts = runner.engine.config.compaction.max_attempts
    assert 2 <= len(main) <= attempts + 1
    assert result.reply == f"cut {len(main)}"
    assert result.stop_reason == STOP_OVERFLOW
    discarded = [
        e for e in transcript.entries() if e.payload.get("custom_type") == DISCARDED_REPLY_TYPE
    ]
    assert len(discarded) == len(main) - 1


def failing_retry(error: Exception) -> tuple[ScriptedProvider, list[ProviderRequest]]:
    """The first main call stops because the window filled; every later one raises."""
    provider = ScriptedProvider()
    main: list[ProviderRequest] = []

    def answer(request: ProviderRequest) -> ProviderResponse:
        if request.system == SUMMARY_SYSTEM_PROMPT:
            return ProviderResponse((TextBlock("## Decisions\n- none"),), STOP_END, Usage(9, 9))
        main.append(request)
        if len(main) == 1:
            return stopped("a usable half answer", 2_000, 48)
        raise error

    provider.responder = answer
    return provider, main


@pytest.mark.parametrize(
    "error",
    [
        ServerError("boom", provider="scripted", status=500),
        OverloadedError("busy", provider="scripted", status=529),
        ContextOverflowError("too long", provider="scripted", status=400),
    ],
    ids=["server", "overloaded", "overflow"],
)
async def test_a_cut_off_reply_is_kept_when_its_retry_fails(
    tmp_path: Path, transcript: Transcript, error: ProviderError
) -> None:
    seed(transcript, 8)
    provider, main = failing_retry(error)
    runner = make_runner(tmp_path, provider)
    result = await runner.run_turn(transcript, TurnRequest("k", "the newest question"))
    # The retry failed: the cut-off reply, already streamed, is the answer.
    assert len(main) >= 2
    assert result.reply == "a usable half answer"
    assert result.stop_reason == STOP_OVERFLOW
    entries = list(transcript.entries())
    assert [e.message.text for e in entries if e.type == "message"][-1] == "a usable half answer"
    # Nothing was discarded and the turn did not fail.
    customs = [e.payload.get("custom_type") for e in entries if e.type == "custom"]
    assert DISCARDED_REPLY_TYPE not in customs and "turn_error" not in customs


async def test_a_cut_off_reply_is_kept_when_recovery_fails(
    tmp_path: Path, transcript: Transcript, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(transcript, 8)
    provider, main = failing_retry(ServerError("never reached", provider="scripted"))
    runner = make_runner(tmp_path, provider)

    async def broken(*args: object, **kwargs: object) -> None:
        raise CompactionError("no room")

    monkeypatch.setattr(runner.engine, "recover_overflow", broken)
    result = await runner.run_turn(transcript, TurnRequest("k", "the newest question"))
    assert len(main) == 1
    assert result.reply == "a usable half answer"
    customs = [e.payload.get("custom_type") for e in transcript.entries() if e.type == "custom"]
    assert DISCARDED_REPLY_TYPE not in customs and "turn_error" not in customs


async def test_requests_ask_for_at_most_a_quarter_of_a_small_window(
    tmp_path: Path, transcript: Transcript
) -> None:
    provider = ScriptedProvider("smol")
    config = ContextConfig.model_validate({"models": {"smol": {"context_tokens": 2_048}}})
    tools = default_registry(10_000)
    runner = Runner(
        provider=provider,
        tools=tools,
        prompt=SystemPromptBuilder(tmp_path, agent_name="T", tools=tools.specs()),
        agent=AgentConfig(max_output_tokens=4_096),
        retry=RetryConfig(max_attempts=1),
        workspace=tmp_path,
        engine=ContextEngine(
            config=config, provider=provider, retry=RetryConfig(max_attempts=1), max_output=4_096
        ),
    )
    await runner.run_turn(transcript, TurnRequest("k", "hi"))
    # 4,096 would not even fit the window: a server counting max_tokens would refuse.
    assert provider.requests[0].max_tokens == 512


async def test_a_reply_is_counted_once_across_its_turn_and_the_next(
    tmp_path: Path, transcript: Transcript, monkeypatch: pytest.MonkeyPatch
) -> None:
    """record_call counts the stored reply, the very object the next turn's view holds:
    its tokens are not counted a second time there."""
    reply = "a reply long enough to be unmistakable " * 3
    encoded: list[str] = []
    runner = make_runner(tmp_path, ScriptedProvider())
    counter = runner.engine.counter
    real = counter._encode_len

    def spy(text: str) -> int:
        encoded.append(text)
        return real(text)

    monkeypatch.setattr(counter, "_encode_len", spy)
    provider = runner.provider
    assert isinstance(provider, ScriptedProvider)
    provider.push(ProviderResponse((TextBlock(reply),), STOP_END, Usage(10, 5)))
    provider.push(ProviderResponse((TextBlock("second"),), STOP_END, Usage(10, 5)))

    await runner.run_turn(transcript, TurnRequest("k", "first question"))
    await runner.run_turn(transcript, TurnRequest("k", "second question"))

    assert encoded.count(reply) == 1


async def test_a_window_read_again_takes_its_counts_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each message's count is stored in its entry: a session whose window is read again
    from its file (it had left memory) counts only its new words."""
    path = tmp_path / "s.jsonl"
    reply = "the first answer, long enough to be unmistakable " * 3
    runner = make_runner(tmp_path, ScriptedProvider())
    provider = runner.provider
    assert isinstance(provider, ScriptedProvider)
    provider.push(ProviderResponse((TextBlock(reply),), STOP_END, Usage(10, 5)))
    provider.push(ProviderResponse((TextBlock("second"),), STOP_END, Usage(10, 5)))
    with Transcript.create(path, "sid", "agent:main:x") as first:
        await runner.run_turn(first, TurnRequest("k", "the first question, also unmistakable"))
        stored = [e.payload["tokens"] for e in first.live_entries()]
    counter = runner.engine.counter
    assert stored == [
        {counter.encoder_name: counter.message(e.message)} for e in first.live_entries()
    ]

    encoded: list[str] = []
    real = counter._encode_len

    def spy(text: str) -> int:
        encoded.append(text)
        return real(text)

    monkeypatch.setattr(counter, "_encode_len", spy)
    with Transcript.open(path) as again:
        await runner.run_turn(again, TurnRequest("k", "second question"))

    assert reply not in encoded
    assert "the first question, also unmistakable" not in encoded
    assert "second question" in encoded  # what is new is counted


async def test_stored_counts_are_looked_at_once_per_entry_and_new_ones_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn looks for stored counts among the entries it has not looked at: an
    entry another writer appended (with its count) is taken, the rest not walked again."""
    runner = make_runner(tmp_path, ScriptedProvider())
    provider = runner.provider
    assert isinstance(provider, ScriptedProvider)
    for text in ("one", "two", "three"):
        provider.push(ProviderResponse((TextBlock(text),), STOP_END, Usage(10, 5)))
    counter = runner.engine.counter
    looked_at: list[list[str]] = []
    real = counter.know_stored

    def spy(entries: Iterable[Entry]) -> None:
        listed = list(entries)
        looked_at.append([e.id for e in listed])
        real(listed)

    monkeypatch.setattr(counter, "know_stored", spy)
    with Transcript.create(tmp_path / "s.jsonl", "sid", "agent:main:x") as t:
        await runner.run_turn(t, TurnRequest("k", "first"))
        elsewhere = t.append_message(
            Message.assistant("written by another replica"),
            tokens={counter.encoder_name: 777},
        )
        await runner.run_turn(t, TurnRequest("k", "second"))
        await runner.run_turn(t, TurnRequest("k", "third"))
        ids = [e.id for e in t.live_entries()]

    assert counter.message(elsewhere.message) == 777  # the stored count, not a recount
    every_look = [entry_id for look in looked_at for entry_id in look]
    assert len(every_look) == len(set(every_look))  # no entry looked at twice
    assert set(every_look) <= set(ids)
    assert elsewhere.id in looked_at[1]


async def test_a_stored_count_in_another_encoder_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.jsonl"
    with Transcript.create(path, "sid", "agent:main:x") as t:
        t.append_message(Message.user("counted elsewhere"), tokens={"other-encoder": 1})
    runner = make_runner(tmp_path, ScriptedProvider())
    counter = runner.engine.counter
    with Transcript.open(path) as t:
        counter.know_stored(t.live_entries())
        [entry] = t.live_entries()
        assert counter.message(entry.message) > 1  # counted, not the stored 1


async def test_the_system_prompt_is_read_from_the_files_once_while_its_check_is_fresh(
    tmp_path: Path,
) -> None:
    runner = make_runner(tmp_path, ScriptedProvider([]))
    builds: list[str] = []
    build = runner.prompt.build

    def counted_build() -> object:
        builds.append("build")
        return build()

    runner.prompt.build = counted_build  # type: ignore[method-assign]
    first = await runner.view_request("agent:main:x")
    second = await runner.view_request("agent:main:x")
    assert builds == ["build"]  # the second request answered from the fresh check
    assert second.system == first.system

    runner.prompt.recheck_seconds = 0.0  # every request checks the files again
    (tmp_path / "SOUL.md").write_text("# SOUL.md\nnew personality\n", encoding="utf-8")
    third = await runner.view_request("agent:main:x")
    assert builds == ["build", "build"] and "new personality" in third.system
