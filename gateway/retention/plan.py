"""What one retention run would remove, worked out without removing anything.

By age first: archived sessions' transcripts (and their checkpoints) archived more
than ``archived_transcripts_days`` ago, media older than ``media_days``, and finished
inbox rows past ``inbox_days`` (counted by the inbox itself). Then the disk cap: when
the home holds more than ``high_water_percent`` of ``disk_cap`` after that, the oldest
of what is left of the archived transcripts and the media goes, oldest first, until it
is under ``low_water_percent``; if that is not enough, the plan says the cap is unmet
(and ``run.plan_run`` then takes finished inbox rows down to the dedupe window). An
active session, an open inbox item, state.db and the memory database are never in a
plan: only what is archived.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from parley.core.memory.sources import transcript_path
from parley.core.transcript_store import FileTranscriptStore, TranscriptStore
from parley.gateway.config import LoadedConfig
from parley.gateway.retention.inventory import (
    checkpoints_root,
    disk_use,
    folder_bytes,
    media_dir,
    walk_files,
)
from parley.gateway.retention_config import RetentionConfig
from parley.gateway.storage.inbox import PruneResult
from parley.gateway.storage.sessions import SessionRecord, removed_at


@dataclass(frozen=True, slots=True)
class TranscriptItem:
    session_id: str
    archived_at: datetime
    bytes: int  # of the transcript (its file, or its rows on PostgreSQL)
    checkpoint_files: int
    checkpoint_bytes: int
    reason: str  # "age" or "cap"
    on_disk: bool = True  # False: the transcript is in PostgreSQL, not under the home

    @property
    def disk_bytes(self) -> int:
        """What removing it frees under the home."""
        return (self.bytes if self.on_disk else 0) + self.checkpoint_bytes

    @property
    def memory_path(self) -> str:
        return transcript_path(self.session_id)


@dataclass(frozen=True, slots=True)
class MediaItem:
    path: Path
    mtime: datetime
    bytes: int
    reason: str


@dataclass(slots=True)
class Plan:
    now: datetime
    transcripts: list[TranscriptItem] = field(default_factory=list)
    media: list[MediaItem] = field(default_factory=list)
    inbox: PruneResult = field(default_factory=PruneResult)
    inbox_before: datetime | None = None
    inbox_for_cap: bool = False  # the cap took the inbox down to the dedupe window
    home_bytes: int = 0  # under the home before the run
    cap_bytes: int | None = None
    cap_unmet: bool = False

    @property
    def freed_bytes(self) -> int:
        """Bytes under the home the run frees (the inbox's go back to state.db's pages)."""
        return sum(t.disk_bytes for t in self.transcripts) + sum(m.bytes for m in self.media)


@dataclass(frozen=True, slots=True)
class _Candidate:
    record: SessionRecord
    at: datetime


def archived_candidates(
    records: Sequence[SessionRecord],
) -> list[_Candidate]:
    """Archived sessions whose transcript retention has not removed, oldest first."""
    found = [
        _Candidate(r, r.archived_at or r.updated_at)
        for r in records
        if r.status == "archived" and removed_at(r) is None
    ]
    return sorted(found, key=lambda c: (c.at, c.record.session_id))


def build_plan(
    loaded: LoadedConfig,
    settings: RetentionConfig,
    *,
    store: TranscriptStore,
    records: Sequence[SessionRecord],
    transcript_sizes: dict[str, int],
    inbox: PruneResult,
    inbox_before: datetime | None,
    now: datetime,
) -> Plan:
    """The plan (blocking: it walks the home). ``records`` are every session of the
    registry; ``transcript_sizes`` the archived transcripts' bytes (a file's size, or
    the rows' on PostgreSQL); ``inbox`` what the inbox would prune."""
    plan = Plan(now, inbox=inbox, inbox_before=inbox_before, cap_bytes=settings.cap_bytes)
    on_disk = isinstance(store, FileTranscriptStore)
    candidates = archived_candidates(records)
    checkpoints = checkpoints_root(loaded)

    def item(c: _Candidate, reason: str) -> TranscriptItem:
        files, size = folder_bytes(checkpoints / c.record.session_id)
        return TranscriptItem(
            c.record.session_id,
            c.at,
            transcript_sizes.get(c.record.session_id, 0),
            files,
            size,
            reason,
            on_disk,
        )

    left: list[_Candidate] = []
    cutoff = (
        now - timedelta(days=settings.archived_transcripts_days)
        if settings.archived_transcripts_days
        else None
    )
    for c in candidates:
        if cutoff is not None and c.at < cutoff:
            plan.transcripts.append(item(c, "age"))
        else:
            left.append(c)
    media = _media(loaded)
    media_cutoff = now - timedelta(days=settings.media_days) if settings.media_days else None
    media_left: list[MediaItem] = []
    for m in media:
        if media_cutoff is not None and m.mtime < media_cutoff:
            plan.media.append(m)
        else:
            media_left.append(m)
    cap = settings.cap_bytes
    if cap is None:
        return plan
    active = {r.session_id for r in records if r.status == "active"}
    archived = {r.session_id for r in records if r.status == "archived"}
    plan.home_bytes = disk_use(loaded, active, archived).total
    used = plan.home_bytes - plan.freed_bytes
    if used * 100 <= cap * settings.high_water_percent:
        return plan
    target = cap * settings.low_water_percent // 100
    # The oldest archived data first, whichever kind it is.
    queue: list[tuple[datetime, int, _Candidate | MediaItem]] = [(c.at, 0, c) for c in left] + [
        (m.mtime, 1, m) for m in media_left
    ]
    queue.sort(key=lambda t: (t[0], t[1]))
    for _, _, thing in queue:
        if used <= target:
            break
        if isinstance(thing, MediaItem):
            chosen = MediaItem(thing.path, thing.mtime, thing.bytes, "cap")
            plan.media.append(chosen)
            used -= chosen.bytes
        else:
            t = item(thing, "cap")
            if t.disk_bytes == 0:
                continue  # frees nothing under the home (PostgreSQL, no checkpoints)
            plan.transcripts.append(t)
            used -= t.disk_bytes
    plan.cap_unmet = used > target
    return plan


def _media(loaded: LoadedConfig) -> list[MediaItem]:
    """Every media file (the media store's contract: one file per item under
    ``$PARLEY_HOME/media``, any sub-folders, its age its mtime)."""
    found = [
        MediaItem(path, datetime.fromtimestamp(stat.st_mtime, UTC), stat.st_size, "age")
        for path, stat in walk_files(media_dir(loaded))
    ]
    return sorted(found, key=lambda m: (m.mtime, os.fspath(m.path)))
