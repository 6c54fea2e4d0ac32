"""Shared pieces of the gateway memory tests: a config in a tmp PARLEY_HOME without
background memory triggers, the deterministic embedder swapped in for the real one, a
spy on the index's sync requests, and scripted tool calls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder
from parley.core.memory.index import MemoryIndex, SyncReport
from parley.core.messages import Message, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from parley.core.providers.base import STOP_END, STOP_TOOL_USE, ProviderRequest, ProviderResponse
from parley.gateway.app import Gateway
from parley.gateway.config import LoadedConfig, load_config
from parley.gateway.logs import ROOT_LOGGER
from tests.fakes.embedder import HashingEmbedder, resilient
from tests.fakes.recording_channel import RecordingChannel

# No watcher and no start-up sync: the tests decide when the index syncs.
QUIET_MEMORY = {
    "PARLEY_MEMORY__SYNC__WATCH": "false",
    "PARLEY_MEMORY__SYNC__ON_START": "false",
}
E5 = {"PARLEY_MEMORY__EMBEDDER__PROVIDER": "e5"}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def memory_config(home: Path, **env: str) -> LoadedConfig:
    base = {
        "PARLEY_HOME": str(home),
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
        "PARLEY_HTTP__PORT": "0",
        **QUIET_MEMORY,
    }
    return load_config(env={**base, **env})


def use_hashing_embedder(monkeypatch: pytest.MonkeyPatch) -> list[HashingEmbedder]:
    """Every index the gateway (or the CLI) builds gets a fresh ``HashingEmbedder``."""
    made: list[HashingEmbedder] = []

    def build(settings: EmbedderSettings) -> ResilientEmbedder:
        embedder = HashingEmbedder()
        made.append(embedder)
        return resilient(embedder)

    monkeypatch.setattr("parley.gateway.memory.build_embedder", build)
    return made


@dataclass
class SyncSpy:
    """Records every ``request_sync`` an index receives (reason and the task it returned)."""

    calls: list[tuple[str, asyncio.Task[SyncReport]]] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        return [reason for reason, _ in self.calls]

    async def wait_all(self) -> list[SyncReport]:
        return [await task for _, task in self.calls]


def spy_on_sync(index: MemoryIndex, monkeypatch: pytest.MonkeyPatch) -> SyncSpy:
    spy = SyncSpy()
    original = index.request_sync

    def request_sync(reason: str) -> asyncio.Task[SyncReport]:
        task = original(reason)
        spy.calls.append((reason, task))
        return task

    monkeypatch.setattr(index, "request_sync", request_sync)
    return spy


async def say(gateway: Gateway, channel: RecordingChannel, text: str, **kw: Any) -> str:
    before = len(channel.sent)
    await gateway.handle_inbound(channel.inbound(text, **kw))
    await gateway.wait_idle()
    sent = await channel.wait_sent(before + 1)
    return sent[before].text


def tool_call(call_id: str, name: str, **arguments: Any) -> ProviderResponse:
    return ProviderResponse((ToolUseBlock(call_id, name, arguments),), STOP_TOOL_USE, Usage(5, 5))


def final(text: str) -> ProviderResponse:
    return ProviderResponse((TextBlock(text),), STOP_END, Usage(5, 5))


def tool_results(request: ProviderRequest) -> list[ToolResultBlock]:
    """The tool results the model is shown at the end of ``request``."""
    last: Message = request.messages[-1]
    assert last.role == "tool_result", last.role
    return [b for b in last.content if isinstance(b, ToolResultBlock)]


def search_payload(result: ToolResultBlock) -> dict[str, Any]:
    assert not result.is_error, result.content
    payload = json.loads(result.content)
    assert isinstance(payload, dict)
    return payload


@contextlib.contextmanager
def restored_logging() -> Iterator[None]:
    """main() configures the ``parley`` logger tree; put it back for the other tests."""
    logger = logging.getLogger(ROOT_LOGGER)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield
    finally:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            if handler not in saved[0]:
                handler.close()
        for handler in saved[0]:
            logger.addHandler(handler)
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
