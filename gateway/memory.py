"""Long-term memory in the gateway: where memory.db lives, audiences, task records.

Audiences (``gateway.audiences``, the rule in ``core.memory.audience``): a direct chat's
transcripts, notes and task records belong to its person, a group's to that group, and
only what the operator writes (MEMORY.md, memory/*.md, extra paths) to the agent. Every
search asks ``MemoryIndex.visible_scopes`` for the conversation's viewer.

Where it lives follows ``[storage] backend``: memory.db and the transcript files with
SQLite; with PostgreSQL the index's rows sit in the shared database (one index per
agent id) and its ``sessions`` source reads the transcripts from their table. Notes and
task records live under the private directory (``[memory] private_dir``, beside
memory.db by default), never in the workspace.

Task records: after a turn that used tools, ``record_turn_task`` writes one (in the
conversation's audience) through the index, which indexes it like the rest.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from parley.core.memory.embedders import build_embedder
from parley.core.memory.index import AsyncResource, MemoryIndex
from parley.core.memory.sources import (
    FileTranscriptSource,
    Marker,
    SourceFile,
    StoreTranscriptSource,
    read_header,
)
from parley.core.memory.tasks import task_record_from_turn
from parley.core.transcript import Entry
from parley.gateway.audiences import PersonLinks, scope_resolver
from parley.gateway.config import LoadedConfig

log = logging.getLogger("parley.gateway.memory")

# A memory index that opens its own PostgreSQL pool (the CLI, doctor) needs few
# connections: one writer, one reader and the transcript reads of a sync.
OWN_POOL_SIZE = 4

if TYPE_CHECKING:
    from parley.core.memory.sources import TranscriptSource
    from parley.core.memory.store_protocol import StoreBackend
    from parley.gateway.storage.postgres.database import PgDatabase


def memory_db_path(loaded: LoadedConfig) -> Path:
    memory = loaded.config.memory
    if memory.db_path is not None:
        return memory.db_path.expanduser()
    return loaded.home / "memory" / loaded.config.agent.id / "memory.db"


def private_dir(loaded: LoadedConfig) -> Path:
    """Where notes and task records live: ``[memory] private_dir``, else beside memory.db."""
    configured = loaded.config.memory.private_dir
    if configured is not None:
        return configured.expanduser()
    return memory_db_path(loaded).parent


def private_roots(loaded: LoadedConfig) -> tuple[Path, ...]:
    """What the file tools must never reach, should the workspace contain it (an
    operator may set the workspace to the home): transcripts, checkpoints, memory.db,
    notes and task records, state, logs, backups and the admin token."""
    home = loaded.home
    return (
        loaded.sessions_dir,
        loaded.checkpoints_dir,
        memory_db_path(loaded).parent,
        private_dir(loaded),
        loaded.state_db,
        home / "memory",
        home / "logs",
        home / "backups",
        loaded.admin_token_file,
    )


def notes_dir(loaded: LoadedConfig) -> Path:
    return private_dir(loaded) / "notes"


def tasks_dir(loaded: LoadedConfig) -> Path:
    return private_dir(loaded) / "tasks"


def build_memory_index(loaded: LoadedConfig, *, db: PgDatabase | None = None) -> MemoryIndex:
    """The agent's memory index on the configured backend.

    With PostgreSQL it uses ``db`` (the gateway's ``state.pg``: open it before the
    index and close it after); without one the index opens and closes a small pool
    of its own.
    """
    settings = loaded.config.memory
    backend: StoreBackend | None = None
    transcripts: TranscriptSource | None = None
    resource: AsyncResource | None = None
    storage = loaded.config.storage
    if storage.backend == "postgres":
        from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend
        from parley.gateway.storage.postgres.transcripts import PgTranscriptStore

        if db is None:
            db = _own_pool(loaded)
            resource = db
        backend = PgMemoryBackend(db, loaded.config.agent.id, vector_index=storage.vector_index)
        transcripts = StoreTranscriptSource(PgTranscriptStore(db))
    if loaded.config.agents:
        # Several agents share the transcripts: this one's index reads its own only.
        default = loaded.config.default_agent().id
        transcripts = AgentTranscripts(
            transcripts or FileTranscriptSource(loaded.sessions_dir),
            loaded.config.agent.id,
            default=default == loaded.config.agent.id,
        )
    writer: str | None = None
    if storage.backend == "postgres":
        # Replicas share the index, so they must share the task logs it reads (the
        # private directory on a shared volume), each replica appending to its own folder.
        writer = replica_writer(loaded.config.http.port)
        if settings.private_dir is None:
            log.warning(
                "[memory] private_dir is not set: notes and task records stay in %s; with "
                "several replicas set it to a volume they all share (docs/deploy.md)",
                private_dir(loaded),
            )
    return MemoryIndex(
        settings,
        db_path=memory_db_path(loaded),
        workspace=loaded.workspace,
        sessions_dir=loaded.sessions_dir,
        embedder=build_embedder(settings.embedder),
        scope_for=scope_resolver(PersonLinks(loaded.config.session).names),
        backend=backend,
        transcripts=transcripts,
        resource=resource,
        tasks_dir=tasks_dir(loaded),
        tasks_writer=writer,
        notes_dir=notes_dir(loaded),
    )


# Where task records lived on PostgreSQL before audiences: inside the workspace, where
# the file tools could read them. ``parley doctor --fix`` moves them out.
LEGACY_SHARED_TASKS_DIR = Path(".parley") / "tasks"


def replica_writer(port: int) -> str:
    """A name for this replica's task-log folder, stable across its restarts: the host
    and the HTTP port (replicas on one host listen on different ports)."""
    host = re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).strip(".-")[:60] or "host"
    return f"{host}-{port}"


async def record_turn_task(
    index: MemoryIndex,
    *,
    user_text: str,
    entries: Sequence[Entry],
    started_at: datetime,
    finished_at: datetime,
    scope: str,
) -> bool:
    """Write the task record of a turn that used tools (True when one was written).
    Never raises: the person has their answer, and a record is bookkeeping."""
    try:
        record = await asyncio.to_thread(
            task_record_from_turn, user_text, entries, started_at, finished_at, scope=scope
        )
        if record is None:
            return False
        await index.record_task(record)
        return True
    except Exception:
        log.exception("writing the task record failed")
        return False


class AgentTranscripts:
    """A ``TranscriptSource`` that lists only one agent's transcripts: those whose
    header's key is ``agent:<id>:...`` (the default agent also takes a file whose first
    line names no agent, which only a hand-made file could be). A header never changes,
    so each transcript's agent is read once; a transcript whose first line is not
    complete yet is nobody's until the next sync."""

    def __init__(self, inner: TranscriptSource, agent_id: str, *, default: bool) -> None:
        self.inner = inner
        self.agent_id = agent_id
        self.default = default
        self._owners: dict[str, str] = {}  # path -> agent id ("": none named)

    def transcripts(self) -> list[SourceFile]:
        return [s for s in self.inner.transcripts() if self._owns(s)]

    def _owns(self, source: SourceFile) -> bool:
        owner = self._owners.get(source.path)
        if owner is None:
            try:
                head = self._first_line(source)
            except Exception:  # gone or unreadable: not listed now, asked again next sync
                return False
            if head is None:  # its first line is not written in full yet: next sync
                return False
            owner = transcript_agent(head) or ""  # "": it names no agent
            self._owners[source.path] = owner
        return owner == self.agent_id or (owner == "" and self.default)

    def _first_line(self, source: SourceFile) -> bytes | None:
        data = b""
        for limit in (HEADER_PEEK_BYTES, HEADER_READ_BYTES + 1):
            data = self.inner.read(source, limit)
            end = data.find(b"\n")
            if end >= 0:
                return data[:end]
            if len(data) < limit:
                return None
        return data  # longer than any header: not one of ours

    def marker(self, source: SourceFile) -> Marker | None:
        return self.inner.marker(source)

    def read(self, source: SourceFile, limit: int) -> bytes:
        return self.inner.read(source, limit)

    def read_range(self, source: SourceFile, start: int, limit: int) -> bytes:
        return self.inner.read_range(source, start, limit)

    def __repr__(self) -> str:
        return f"<AgentTranscripts {self.agent_id} of {self.inner!r}>"


HEADER_PEEK_BYTES = 4096  # a header is far shorter; a longer one is read again in full
HEADER_READ_BYTES = 64 * 1024


def transcript_agent(data: bytes) -> str | None:
    """The agent id a transcript's first line names (its key's ``agent:<id>:``, else
    its ``agent`` meta), None when it names none."""
    end = data.find(b"\n")
    header = read_header(data if end < 0 else data[:end])
    if header is None:
        return None
    key = header.get("key")
    if isinstance(key, str) and key.startswith("agent:") and key.count(":") >= 2:
        return key.split(":", 2)[1]
    meta = header.get("meta")
    agent = meta.get("agent") if isinstance(meta, dict) else None
    return agent if isinstance(agent, str) else None


def _own_pool(loaded: LoadedConfig) -> PgDatabase:
    from parley.gateway.storage.postgres.database import PgDatabase

    storage = loaded.config.storage
    assert storage.url is not None  # the config refuses postgres without one
    return PgDatabase(storage.url.get_secret_value(), pool_size=OWN_POOL_SIZE)
