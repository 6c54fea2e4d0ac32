from __future__ import annotations

from pathlib import Path

import pytest

from parley.core.agent_config import AgentConfig
from parley.core.errors import ContextOverflowError, RateLimitError
from parley.core.messages import TextBlock, ToolUseBlock, Usage
from parley.core.prompt import SystemPromptBuilder
from parley.core.providers.base import STOP_END, STOP_OVERFLOW, STOP_TOOL_USE, ProviderResponse
from parley.core.providers.provider_config import RetryConfig
from parley.core.runner import TOOL_LIMIT_NOTE, Runner, TurnRequest
from parley.core.tools.builtin import default_registry
from parley.core.transcript import Transcript
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


async def test_overflow_stop_keeps_text_or_raises(tmp_path: Path, transcript: Transcript) -> None:
    provider = ScriptedProvider()
    provider.push(ProviderResponse((TextBlock("partial"),), STOP_OVERFLOW, Usage(1, 1)))
    runner = make_runner(tmp_path, provider)
    assert (await runner.run_turn(transcript, TurnRequest("k", "a"))).reply == "partial"
    provider.push(ProviderResponse((), STOP_OVERFLOW, Usage(1, 0)))
    with pytest.raises(ContextOverflowError):
        await runner.run_turn(transcript, TurnRequest("k", "b"))
