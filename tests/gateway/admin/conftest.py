"""A running gateway with its admin server on a free loopback port, a web chat
channel, a scripted provider, and one session that has a tool call, its result and a
compaction in its transcript."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from parley.channels.web import WebChannel
from parley.core.messages import TextBlock, ToolUseBlock, Usage
from parley.core.providers.base import STOP_TOOL_USE, ProviderResponse
from parley.gateway.app import Gateway
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider
from tests.gateway.memory_helpers import memory_config, use_hashing_embedder

FACT = "The spare key is in the blue teapot."


@dataclass
class AdminWorld:
    gateway: Gateway
    provider: ScriptedProvider
    channel: RecordingChannel
    web: WebChannel
    home: Path
    base_url: str
    token: str
    session_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def url(self, path: str) -> str:
        return self.base_url + path


def tool_call(name: str, **arguments: object) -> ProviderResponse:
    block = ToolUseBlock(f"call-{name}", name, dict(arguments))
    return ProviderResponse((TextBlock("Let me look."), block), STOP_TOOL_USE, Usage(20, 8))


async def seed_session(world: AdminWorld, sender: str = "alice") -> str:
    """Two turns (one with a tool call) and a compaction entry; returns the session id."""
    gateway, channel = world.gateway, world.channel
    before = len(channel.sent)
    world.provider.push(tool_call("list_files", path="."))
    await gateway.handle_inbound(channel.inbound("what files do you have?", sender=sender))
    await gateway.handle_inbound(channel.inbound(FACT, sender=sender))
    await channel.wait_sent(before + 2)
    await gateway.wait_idle()
    page = await gateway.registry.list(query=sender, status="active")
    record = page.sessions[0]
    transcript = await gateway.transcript(record)
    first = next(iter(transcript.entries()))
    compaction = transcript.append_compaction(
        "The user asked which files exist; the agent listed them.",
        first_kept_entry_id=first.id,
        tokens_before=1200,
        tokens_after=400,
        trigger="manual",
        details={"ledger": {"identifiers": ["notes.md"]}},
    )
    await gateway.registry.record_entries(record.session_id, transcript.entry_count, compaction.id)
    return record.session_id


@asynccontextmanager
async def admin_world(
    home: Path, seed: Callable[[AdminWorld], Awaitable[str]], *, uploads: bool = False, **env: str
) -> AsyncIterator[AdminWorld]:
    """A started gateway with a recording channel and the web chat (taking files when
    ``uploads``, as ``parley run``'s does), seeded by ``seed``.
    Little is kept verbatim, so a manual compaction has something to fold."""
    loaded = memory_config(
        home,
        PARLEY_CONTEXT__COMPACTION__KEEP_RECENT_TOKENS="200",
        PARLEY_CONTEXT__COMPACTION__KEEP_RECENT_TURNS="1",
        **env,
    )
    channel = RecordingChannel()
    spool = loaded.media_dir / "uploads" if uploads else None
    web = WebChannel(loaded.config.channels.web, upload_dir=spool)
    provider = ScriptedProvider()
    async with Gateway(loaded, channels=[channel, web], provider=provider) as gateway:
        assert gateway.http is not None
        world = AdminWorld(
            gateway=gateway,
            provider=provider,
            channel=channel,
            web=web,
            home=home,
            base_url=gateway.http.url("").rstrip("/"),
            token=gateway.http.token.value,
            session_id="",
        )
        world.session_id = await seed(world)
        yield world


@pytest.fixture
async def admin_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[AdminWorld]:
    use_hashing_embedder(monkeypatch)
    async with admin_world(tmp_path / "home", seed_session) as world:
        yield world


@pytest.fixture
async def client(admin_server: AdminWorld) -> AsyncIterator[aiohttp.ClientSession]:
    """A client that sends the admin token."""
    async with aiohttp.ClientSession(
        base_url=admin_server.base_url, headers=admin_server.headers
    ) as session:
        yield session
