"""What `parley doctor` says of the disk: the bytes per kind under the home (and, on
PostgreSQL, the size of the tables that hold transcripts and the inbox), the retention
settings, the last run (on PostgreSQL the newer of this home's and the shared database's:
another replica may have run it), and whether the home is over its cap. Reads only: the
registry's session statuses come from a read-only state.db connection or one query."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from parley.gateway.config import LoadedConfig
from parley.gateway.retention.inventory import KINDS, disk_use
from parley.gateway.retention.run import latest_run
from parley.gateway.retention_config import format_bytes

if TYPE_CHECKING:
    from parley.gateway.storage.postgres.database import PgDatabase

Severity = Literal["ok", "warning", "error"]
# PostgreSQL tables reported by size (when they exist).
PG_TABLES = ("transcripts", "transcript_lines", "inbox", "sent_messages", "sessions")


@dataclass(frozen=True, slots=True)
class DiskFinding:
    check: str
    severity: Severity
    detail: str


def _sqlite_statuses(loaded: LoadedConfig) -> dict[str, str]:
    path = loaded.state_db
    if not path.exists():
        return {}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute("SELECT session_id, status FROM sessions").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return {}
    return {str(sid): str(status) for sid, status in rows}


def _pg_statuses(conn: Any) -> dict[str, str]:
    rows = conn.execute("SELECT session_id, status FROM sessions").fetchall()
    return {r["session_id"]: r["status"] for r in rows}


def _pg_sizes(conn: Any) -> dict[str, int]:
    rows = conn.execute(
        "SELECT relname, pg_total_relation_size(c.oid) AS size FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind = 'r' AND relname = ANY(%s)",
        (list(PG_TABLES),),
    ).fetchall()
    return {r["relname"]: int(r["size"]) for r in rows}


async def disk_findings(loaded: LoadedConfig, pg: PgDatabase | None = None) -> list[DiskFinding]:
    """The ``disk`` and ``retention`` findings (``pg``: the open shared database)."""
    pg_sizes: dict[str, int] = {}
    if pg is not None:
        statuses = await pg.run(_pg_statuses)
        pg_sizes = await pg.run(_pg_sizes)
    else:
        statuses = await asyncio.to_thread(_sqlite_statuses, loaded)
    active = {s for s, status in statuses.items() if status == "active"}
    archived = {s for s, status in statuses.items() if status == "archived"}
    use = await asyncio.to_thread(disk_use, loaded, active, archived)
    parts = [
        f"{kind} {format_bytes(use.kinds[kind].bytes)}"
        + (f" ({_files(use.kinds[kind].files)})" if kind.endswith(("transcripts", "media")) else "")
        for kind in KINDS
        if use.kinds[kind].bytes or kind in ("active transcripts", "archived transcripts")
    ]
    detail = f"{format_bytes(use.total)} under {loaded.home}: " + "; ".join(parts)
    if pg_sizes:
        detail += "; in PostgreSQL: " + ", ".join(
            f"{name} {format_bytes(size)}" for name, size in sorted(pg_sizes.items())
        )
    findings = [DiskFinding("disk", "ok", detail)]
    settings = loaded.config.retention
    last = await latest_run(loaded, pg)
    text = settings.describe()
    severity: Severity = "ok"
    if last is None:
        text += "; last run: never"
    else:
        text += f"; last run: {_when(last.get('finished_at'))}, removed " + (
            f"{last.get('transcripts', 0)} transcript(s), {last.get('inbox_rows', 0)} inbox "
            f"row(s), {last.get('media_files', 0)} media file(s)"
        )
        if last.get("errors"):
            severity = "warning"
            text += f" ({last['errors']} error(s): see the gateway's log)"
    cap = settings.cap_bytes
    if cap is not None and use.total * 100 > cap * settings.high_water_percent:
        severity = "warning"
        text += (
            f"; the home ({format_bytes(use.total)}) is over the cap's high-water mark: "
            "`parley maintenance` removes the oldest archived data"
        )
    if last is not None and last.get("cap_unmet"):
        severity = "warning"
        text += (
            "; the last run could not meet the cap with archived data alone (active "
            "sessions, memory and state remain): raise disk_cap or free space"
        )
    findings.append(DiskFinding("retention", severity, text))
    return findings


def _files(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"


def _when(value: object) -> str:
    if not isinstance(value, str):
        return "?"
    try:
        return f"{datetime.fromisoformat(value):%Y-%m-%d %H:%M} UTC"
    except ValueError:
        return "?"
