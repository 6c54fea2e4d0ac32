"""Shared fakes for the compaction tests: a summariser provider, a planted conversation.

The provider is ``tests.fakes.scripted_provider.ScriptedProvider`` with a responder
that answers summary calls (recognised by their system prompt) by a test's function.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from parley.core.context.compaction.compactor import Compactor
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT, Summarizer
from parley.core.context.config import CompactionConfig
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from parley.core.providers.base import STOP_END, ProviderRequest, ProviderResponse
from parley.core.providers.provider_config import RetryConfig
from parley.core.tokens import default_counter
from parley.core.transcript import Transcript
from tests.fakes.scripted_provider import ScriptedProvider

MODEL = "scripted-model"
ORDER = "ORD-88123"
HOST = "db.internal:5432"
KEY_PATH = "/srv/keys/api.pem"
DECISION = "We decided to use PostgreSQL 16 for the migration."
TODO = f"TODO: rotate the key at {KEY_PATH} before Friday."
TOOL_ERROR = f"connection refused by {HOST}"
CHATTER = "ok thanks"
FILLER = "The weather report and other chatter that nobody needs to keep verbatim. " * 8

Responder = Callable[[ProviderRequest], ProviderResponse]


def reply(text: str) -> ProviderResponse:
    return ProviderResponse((TextBlock(text),), STOP_END, Usage(10, 5), MODEL)


def summary_reply(text: str = "## Decisions\n- summarised") -> Responder:
    return lambda _request: reply(text)


class SummaryProvider(ScriptedProvider):
    """Answers summary calls with ``summary`` and records their models."""

    def __init__(self, summary: Responder) -> None:
        super().__init__(MODEL)
        self.summary = summary
        self.summary_models: list[str] = []
        self.responder = self._route

    def _route(self, request: ProviderRequest) -> ProviderResponse | None:
        if request.system != SUMMARY_SYSTEM_PROMPT:
            return None
        self.summary_models.append(request.model)
        return self.summary(request)


def make_compactor(provider: SummaryProvider, *, attempts: int = 1, **config: object) -> Compactor:
    counter = default_counter()
    retry = RetryConfig(max_attempts=attempts, base_delay_seconds=0, max_delay_seconds=0)
    settings = CompactionConfig.model_validate(config)

    def summarizer(model: str | None) -> Summarizer:
        return Summarizer(provider, model=model, counter=counter, retry=retry)

    return Compactor(
        summarizer=summarizer(settings.model),
        fallback_summarizer=summarizer(settings.fallback_model)
        if settings.fallback_model
        else None,
        count=counter.entry,
        count_message=counter.message,
        count_text=counter.text,
        config=settings,
    )


def planted(transcript: Transcript, *, fillers: int = 20) -> None:
    """Four turns with what must survive, then ``fillers`` turns of chatter."""
    call = ToolUseBlock("call-1", "shell", {"cmd": f"deploy {ORDER}"})
    transcript.append_message(Message.user(f"Please deploy {ORDER} to staging."))
    transcript.append_message(Message("assistant", (call,)))
    transcript.append_message(
        Message("tool_result", (ToolResultBlock("call-1", TOOL_ERROR, is_error=True),))
    )
    transcript.append_message(Message.assistant("The deploy failed: the database refused."))
    transcript.append_message(Message.user(CHATTER))
    transcript.append_message(Message.assistant("You're welcome."))
    transcript.append_message(Message.user(DECISION))
    transcript.append_message(Message.assistant("Noted, PostgreSQL 16 it is."))
    transcript.append_message(Message.user(TODO))
    transcript.append_message(Message.assistant("Will do."))
    for n in range(fillers):
        transcript.append_message(Message.user(f"tell me more, part {n}. {FILLER}"))
        transcript.append_message(Message.assistant(f"Part {n}: {FILLER}"))


def new_transcript(tmp_path: Path) -> Transcript:
    return Transcript.create(tmp_path / "s.jsonl", "sid", "agent:main:x")
