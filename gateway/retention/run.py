"""One retention run: work out the plan (``plan``), remove what it holds, say what went.

Safe beside a running gateway on the same home (the CLI while the gateway runs, or
replicas on PostgreSQL): only archived data is touched (a session is archived once and
never again active), every step is idempotent (a file already gone, a row already
deleted), state.db is shared in WAL mode, and ``retention.lock`` keeps two runs on one
home from overlapping. On PostgreSQL a run also holds the shared database's run lock
(``storage.postgres.retention_runs``), so one run works at a time across every replica
and home: the others would race it on the same rows and report the same removals. A
replica's daily run (``run_daily``) also skips a day another replica already did. A
transcript's memory chunks are marked to be kept before its file goes, so a memory sync
running meanwhile never drops them.

Per transcript, in this order: its chunks are marked kept (``archived_memory = "keep"``),
the transcript and its checkpoints are deleted, the registry row notes
``retention_removed_at`` (the row stays: listings and the inspector say "removed by
retention"), and its chunks are dropped (``"drop"``). A kill midway leaves a state the
next run finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from parley.core.files import atomic_file
from parley.core.transcript_store import FileTranscriptStore, TranscriptStore
from parley.gateway.config import LoadedConfig
from parley.gateway.errors import RetentionBusy
from parley.gateway.retention.inventory import checkpoints_root
from parley.gateway.retention.plan import Plan, build_plan
from parley.gateway.retention_config import INBOX_DEDUPE_DAYS, RetentionConfig, format_bytes
from parley.gateway.storage.inbox import Inbox, PruneResult
from parley.gateway.storage.sessions import REMOVED_SETTING, SessionRecord, SessionRegistry

if TYPE_CHECKING:
    from parley.gateway.storage.postgres.database import PgDatabase

log = logging.getLogger("parley.gateway.retention")


class RemovedRows(Protocol):
    """What retention asks of memory (``MemoryIndex``): keep or drop the rows of the
    transcripts it removes."""

    async def keep_removed(self, paths: Sequence[str]) -> None: ...

    async def drop_removed(self, paths: Sequence[str]) -> int: ...


class EveryIndex:
    """Several agents' memory indexes as one: each keeps or drops the rows it holds
    (an agent indexes only its own sessions' transcripts)."""

    def __init__(self, indexes: Sequence[RemovedRows]) -> None:
        self.indexes = tuple(indexes)

    async def keep_removed(self, paths: Sequence[str]) -> None:
        for index in self.indexes:
            await index.keep_removed(paths)

    async def drop_removed(self, paths: Sequence[str]) -> int:
        return sum([await index.drop_removed(paths) for index in self.indexes])


def every_index(indexes: Sequence[RemovedRows]) -> RemovedRows | None:
    """None for no index, the index itself for one, else ``EveryIndex``."""
    if len(indexes) <= 1:
        return indexes[0] if indexes else None
    return EveryIndex(indexes)


LAST_RUN_FILE = "retention.json"
LOCK_FILE = "retention.lock"
# Session ids named in a report; the rest are counted.
IDS_LISTED = 10


class RetentionState(Protocol):
    """What a run needs of the state stores (``StateStores`` has it)."""

    registry: SessionRegistry
    inbox: Inbox
    transcripts: TranscriptStore
    # The shared database (its run lock, its record of the last run); None on SQLite.
    pg: PgDatabase | None


@dataclass(slots=True)
class RunReport:
    """What a run removed (or, dry, would remove): counts, bytes and ids, never words."""

    plan: Plan
    dry_run: bool
    settings: RetentionConfig
    memory: str = ""  # what became of the removed transcripts' memory chunks
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        p, s = self.plan, self.settings
        verb = "would remove" if self.dry_run else "removed"
        by_age = sum(1 for t in p.transcripts if t.reason == "age")
        transcript_bytes = sum(t.bytes for t in p.transcripts)
        checkpoints = sum(t.checkpoint_files for t in p.transcripts)
        checkpoint_bytes = sum(t.checkpoint_bytes for t in p.transcripts)
        media_bytes = sum(m.bytes for m in p.media)
        media_cap = sum(1 for m in p.media if m.reason == "cap")
        out = [f"retention{' (dry run)' if self.dry_run else ''}: {s.describe()}", ""]
        out.append(f"{'KIND':<22}{verb.upper():>14}{'BYTES':>14}  WHY")
        out.append(
            f"{'archived transcripts':<22}{len(p.transcripts):>14}"
            f"{format_bytes(transcript_bytes):>14}  "
            f"{by_age} by age, {len(p.transcripts) - by_age} for the disk cap"
        )
        out.append(
            f"{'checkpoints':<22}{checkpoints:>14}{format_bytes(checkpoint_bytes):>14}  "
            "with their transcripts"
        )
        before = f"finished before {p.inbox_before:%Y-%m-%d}" if p.inbox_before else "kept forever"
        if p.inbox_for_cap:
            before += " (the disk cap: down to the dedupe window)"
        out.append(
            f"{'inbox rows':<22}{p.inbox.rows:>14}{format_bytes(p.inbox.bytes):>14}  {before}"
        )
        out.append(
            f"{'media files':<22}{len(p.media):>14}{format_bytes(media_bytes):>14}  "
            f"{len(p.media) - media_cap} by age, {media_cap} for the disk cap"
        )
        if p.transcripts:
            out.append(f"\nmemory chunks of those transcripts: {self.memory or 'untouched'}")
            ids = [t.session_id for t in p.transcripts]
            more = f" and {len(ids) - IDS_LISTED} more" if len(ids) > IDS_LISTED else ""
            out.append(f"sessions: {', '.join(ids[:IDS_LISTED])}{more}")
        if p.cap_bytes is not None:
            after = p.home_bytes - p.freed_bytes
            out.append(
                f"\ndisk: the home holds {format_bytes(p.home_bytes)}"
                + (f", {format_bytes(after)} after this run" if p.freed_bytes else "")
                + f" (cap {format_bytes(p.cap_bytes)})"
            )
            if p.cap_unmet:
                out.append(
                    "warning: archived data alone cannot bring the home under the cap's low-"
                    "water mark: the rest is active sessions, memory and state (see "
                    "`parley doctor`)"
                )
        out += [f"error: {e}" for e in self.errors]
        return out

    def to_record(self) -> dict[str, Any]:
        p = self.plan
        return {
            "finished_at": p.now.isoformat(),
            "transcripts": len(p.transcripts),
            "transcript_bytes": sum(t.bytes for t in p.transcripts),
            "checkpoint_files": sum(t.checkpoint_files for t in p.transcripts),
            "checkpoint_bytes": sum(t.checkpoint_bytes for t in p.transcripts),
            "inbox_rows": p.inbox.rows,
            "inbox_bytes": p.inbox.bytes,
            "media_files": len(p.media),
            "media_bytes": sum(m.bytes for m in p.media),
            "home_bytes": p.home_bytes,
            "cap_unmet": p.cap_unmet,
            "errors": len(self.errors),
        }


def read_last_run(loaded: LoadedConfig) -> dict[str, Any] | None:
    """The record of the last run that removed (blocking); None when there was none."""
    try:
        data = json.loads((loaded.home / LAST_RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_last_run(loaded: LoadedConfig, record: dict[str, Any]) -> None:
    with atomic_file(loaded.home / LAST_RUN_FILE) as out:
        out.write(json.dumps(record, indent=1).encode("utf-8"))


def finished_at(record: dict[str, Any] | None) -> datetime | None:
    """When a run record says its run was (aware; None when it says nothing usable)."""
    value = record.get("finished_at") if record is not None else None
    try:
        at = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


async def latest_run(loaded: LoadedConfig, pg: PgDatabase | None) -> dict[str, Any] | None:
    """The record of the last run that removed: this home's, or on PostgreSQL the shared
    database's when it is newer (another replica's run, or `parley maintenance` run
    elsewhere): a replica that never wins the lock still knows retention runs."""
    home = await asyncio.to_thread(read_last_run, loaded)
    if pg is None:
        return home
    from parley.gateway.storage.postgres.retention_runs import last_run

    shared = await pg.run(last_run)
    never = datetime.min.replace(tzinfo=UTC)
    found = [r for r in (home, shared) if r is not None]
    return max(found, key=lambda r: finished_at(r) or never, default=None)


@contextlib.contextmanager
def _run_lock(loaded: LoadedConfig) -> Iterator[None]:
    """One run per home at a time (the gateway's daily run, `parley maintenance`)."""
    loaded.home.mkdir(parents=True, exist_ok=True)
    fd = os.open(loaded.home / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RetentionBusy(
                "another retention run is under way on this home (the gateway's daily run "
                "or `parley maintenance`); try again when it is done"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.asynccontextmanager
async def run_lock(loaded: LoadedConfig, pg: PgDatabase | None = None) -> AsyncIterator[None]:
    """The home's lock, then with ``pg`` the shared database's; RetentionBusy when either
    is taken. Both: the rows are the database's, but checkpoints and anything else under
    the home are the home's, and a CLI run on one home needs no database to be kept from
    the gateway's."""
    lock = _run_lock(loaded)
    await asyncio.to_thread(lock.__enter__)
    try:
        if pg is None:
            yield
        else:
            # Imported here: psycopg comes with the postgres extra only.
            from parley.gateway.storage.postgres.retention_runs import hold_run_lock

            async with hold_run_lock(pg):
                yield
    finally:
        await asyncio.to_thread(lock.__exit__, None, None, None)


async def all_sessions(registry: SessionRegistry) -> list[SessionRecord]:
    records: list[SessionRecord] = []
    cursor: str | None = None
    while True:
        page = await registry.list(limit=500, cursor=cursor)
        records += page.sessions
        if page.next_cursor is None:
            return records
        cursor = page.next_cursor


def _transcript_sizes(store: TranscriptStore, session_ids: list[str]) -> dict[str, int]:
    if isinstance(store, FileTranscriptStore):
        sizes: dict[str, int] = {}
        for session_id in session_ids:
            with contextlib.suppress(OSError):
                sizes[session_id] = store.path(session_id).stat().st_size
        return sizes
    sized = getattr(store, "sizes", None)
    return sized(session_ids) if sized is not None else {}


def _remove_files(loaded: LoadedConfig, store: TranscriptStore, session_id: str) -> None:
    """The transcript (a file, or its rows) and its checkpoint folder; blocking."""
    if isinstance(store, FileTranscriptStore):
        store.path(session_id).unlink(missing_ok=True)
    else:
        store.delete([session_id])  # type: ignore[attr-defined]
    folder = checkpoints_root(loaded) / session_id
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)


async def plan_run(loaded: LoadedConfig, state: RetentionState, *, now: datetime) -> Plan:
    """What a run now would remove (changes nothing)."""
    settings = loaded.config.retention
    records = await all_sessions(state.registry)
    archived = [r.session_id for r in records if r.status == "archived"]
    sizes = await asyncio.to_thread(_transcript_sizes, state.transcripts, archived)
    inbox_before = now - timedelta(days=settings.inbox_days) if settings.inbox_days else None
    inbox = (
        await state.inbox.prune_finished(inbox_before, dry_run=True)
        if inbox_before is not None
        else PruneResult()
    )
    plan = await asyncio.to_thread(
        build_plan,
        loaded,
        settings,
        store=state.transcripts,
        records=records,
        transcript_sizes=sizes,
        inbox=inbox,
        inbox_before=inbox_before,
        now=now,
    )
    if plan.cap_unmet and (settings.inbox_days == 0 or settings.inbox_days > INBOX_DEDUPE_DAYS):
        # Still over the cap: finished inbox rows go down to the dedupe window too. That
        # frees pages state.db reuses (it stops growing) rather than shrinking the file.
        plan.inbox_before = now - timedelta(days=INBOX_DEDUPE_DAYS)
        plan.inbox = await state.inbox.prune_finished(plan.inbox_before, dry_run=True)
        plan.inbox_for_cap = True
    return plan


async def run_retention(
    loaded: LoadedConfig,
    state: RetentionState,
    *,
    now: datetime,
    dry_run: bool = False,
    memory: RemovedRows | None = None,
    forget_cached: Callable[[str], None] | None = None,
) -> RunReport:
    """Plan, and unless ``dry_run`` remove, under the retention lock (the home's, and on
    PostgreSQL the shared database's; raises RetentionBusy when another run holds one).
    ``memory``: the open memory index, for the removed transcripts' chunks (None: memory
    is off, or not reachable: said so); ``forget_cached``: drops a session's transcript
    from the gateway's caches."""
    async with run_lock(loaded, state.pg):
        return await _run_locked(
            loaded, state, now=now, dry_run=dry_run, memory=memory, forget_cached=forget_cached
        )


async def run_daily(
    loaded: LoadedConfig,
    state: RetentionState,
    *,
    now: datetime,
    unless_ran_since: datetime,
    memory: RemovedRows | None = None,
    forget_cached: Callable[[str], None] | None = None,
) -> RunReport | None:
    """The gateway's scheduled run: ``run_retention``, except that on PostgreSQL it does
    nothing (None) when the shared database records a run at or after
    ``unless_ran_since`` (that day's hour): another replica has done the day's work.
    Checked under the lock, so a replica whose timer fires just after another's run
    ends skips it too, instead of planning it all again. On SQLite it always runs."""
    async with run_lock(loaded, state.pg):
        if state.pg is not None:
            from parley.gateway.storage.postgres.retention_runs import last_run

            last = finished_at(await state.pg.run(last_run))
            if last is not None and last >= unless_ran_since:
                log.info(
                    "retention: skipped, the shared database records a run at %s (another "
                    "replica's, or `parley maintenance`); the next one is tomorrow",
                    f"{last:%Y-%m-%d %H:%M:%S}",
                )
                return None
        return await _run_locked(
            loaded, state, now=now, dry_run=False, memory=memory, forget_cached=forget_cached
        )


async def _run_locked(
    loaded: LoadedConfig,
    state: RetentionState,
    *,
    now: datetime,
    dry_run: bool,
    memory: RemovedRows | None,
    forget_cached: Callable[[str], None] | None,
) -> RunReport:
    """One run, its locks held."""
    settings = loaded.config.retention
    plan = await plan_run(loaded, state, now=now)
    report = RunReport(plan, dry_run, settings)
    report.memory = _memory_outcome(loaded, settings, memory, dry_run)
    if keep_blocked(loaded, memory):
        # Removing the files would lose their chunks at the next sync.
        report.errors.append(
            f"{len(plan.transcripts)} transcript(s) kept: the memory index could not be "
            'opened to keep their chunks ([retention] archived_memory = "keep")'
        )
        plan.transcripts = []
    if dry_run:
        return report
    paths = [t.memory_path for t in plan.transcripts]
    if paths and memory is not None and settings.archived_memory == "keep":
        await memory.keep_removed(paths)
    removed = []
    for item in plan.transcripts:
        try:
            if forget_cached is not None:
                forget_cached(item.session_id)
            await asyncio.to_thread(_remove_files, loaded, state.transcripts, item.session_id)
            record = await state.registry.get(item.session_id)
            if record is not None:
                settings_now = {**record.settings, REMOVED_SETTING: now.isoformat()}
                await state.registry.update_settings(item.session_id, settings_now)
        except Exception as exc:  # one transcript's failure: the others still go
            log.warning("retention: cannot remove session %s: %s", item.session_id, exc)
            report.errors.append(f"session {item.session_id}: {exc}")
        else:
            removed.append(item)
    plan.transcripts = removed  # the report says what went, not what was meant to
    if removed and memory is not None and settings.archived_memory == "drop":
        await memory.drop_removed([t.memory_path for t in removed])
    if plan.inbox_before is not None:
        plan.inbox = await state.inbox.prune_finished(plan.inbox_before)
    for m in plan.media:
        try:
            await asyncio.to_thread(m.path.unlink, missing_ok=True)
        except OSError as exc:
            report.errors.append(f"media {_relative(m.path, loaded.home)}: {exc}")
    this_run = report.to_record()
    await asyncio.to_thread(_write_last_run, loaded, this_run)
    if state.pg is not None:
        # What the other replicas' daily runs read before planning the day again.
        from parley.gateway.storage.postgres.retention_runs import record_run

        await state.pg.run(record_run, this_run)
    return report


def keep_blocked(loaded: LoadedConfig, memory: RemovedRows | None) -> bool:
    """Chunks are to be kept, but there is no index to tell: no transcript may go."""
    return (
        loaded.config.memory.enabled
        and loaded.config.retention.archived_memory == "keep"
        and memory is None
    )


def _memory_outcome(
    loaded: LoadedConfig, settings: RetentionConfig, memory: RemovedRows | None, dry_run: bool
) -> str:
    if not loaded.config.memory.enabled:
        return "memory is off: the index is not touched"
    if memory is None:
        return (
            "the index is not reachable: they go at its next sync"
            if settings.archived_memory == "drop"
            else "the index is not reachable: no transcript is removed"
        )
    would = "would be " if dry_run else ""
    if settings.archived_memory == "keep":
        return f"{would}kept searchable"
    return f"{would}dropped from the index"


def _relative(path: Path, home: Path) -> str:
    try:
        return str(path.relative_to(home))
    except ValueError:
        return str(path)
