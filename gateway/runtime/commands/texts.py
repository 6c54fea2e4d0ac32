"""What slash commands answer with: the help text, usage lines, ``/status``, and what
``/memory status`` and ``/memory search`` print (``parley memory`` prints the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from parley.core.context.compaction.stats import CompactionStats
from parley.core.memory.audience import audience_label
from parley.core.memory.index import MemoryStatus, SearchResult
from parley.gateway.storage.sessions import SessionRecord

SNIPPET_PREVIEW_CHARS = 300

HELP_TEXT = """Commands:
/new [text]   start a new session (the old one is archived, not deleted);
              the text becomes its first message
/reset        same as /new
/compact [focus]
              summarise the older part of this session now (the summary keeps
              decisions, open asks and exact identifiers); focus: what to keep above all
/context [list|detail|json]
              what the model is sent, part by part, in characters and tokens
/status       this session: key and id, model, the context window and where
              its size came from, the next request's estimate and the last
              call's reported size, compactions, tools, cache-read share
/memory status
              the long-term memory index: embedder, files and chunks, dirty files
/memory search <query>
              what memory_search finds for this conversation
/memory stats
              this conversation's task records: outcomes, most frequent errors
/remember <text>
              keep a note in your own memory (in a group: the group's memory)
/forget <text or citation>
              remove your notes that contain the text (or the cited lines)
/help         this list"""

MEMORY_USAGE = "Usage: /memory status | /memory search <query> | /memory stats"
REMEMBER_USAGE = "Usage: /remember <text to keep>"
FORGET_USAGE = "Usage: /forget <text the note contains, or its citation notes/…#Lx>"


def format_status(
    record: SessionRecord | None,
    *,
    key: str,
    model: str,
    figures: Sequence[str],
    now: datetime,
    compactions: CompactionStats | None = None,
    tools: str | None = None,
    profile: str | None = None,
    agent: str | None = None,
) -> str:
    """``/status``. ``figures``: the context figures exactly as ``/context`` and the
    inspector print them (``core.context.report.figure_lines``). ``agent``: who answers
    (its name and id)."""
    who = [f"Agent: {agent}"] if agent is not None else []
    about_model = []
    if tools is not None:
        about_model.append(f"Tools: {tools}")
    if profile is not None:
        about_model.append(f"Profile: {profile}")
    if record is None:
        return "\n".join(
            [
                f"Session: {key}",
                *who,
                "No conversation yet: the next message starts one.",
                f"Model: {model}",
                *figures,
                *about_model,
            ]
        )
    usage = record.usage
    prompt_tokens = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    cache_share = (
        f"{usage.cache_read_tokens / prompt_tokens:.0%} of prompt tokens read from cache"
        if prompt_tokens
        else "no prompt tokens yet"
    )
    lines = [
        f"Session: {record.key}",
        *who,
        f"Id: {record.session_id} (started {_ago(record.created_at, now)})",
        f"Model: {record.model or model}",
        *figures,
        f"Turns: {record.turn_count} · compactions: {record.compaction_count}",
        *about_model,
        f"Cache: {cache_share}",
        f"Usage so far: {usage.input_tokens:,} in, {usage.output_tokens:,} out, "
        f"{usage.cache_read_tokens:,} cache read, {usage.cache_write_tokens:,} cache write "
        f"over {record.turn_count} turn(s)",
        f"Last update: {_ago(record.updated_at, now)}",
    ]
    if compactions is not None and compactions.count:
        lines.insert(4 + len(who) + len(figures), _compaction_line(compactions))
    if record.delivery_error:
        lines.append(f"Last delivery error: {record.delivery_error}")
    return "\n".join(lines)


def _compaction_line(stats: CompactionStats) -> str:
    """ "Compactions: 3 (summary 2, sliding-window 1; threshold 2, messages 1), last
    52,100 → 9,800 tokens"."""
    strategies = ", ".join(f"{k} {v}" for k, v in sorted(stats.by_strategy.items()))
    triggers = ", ".join(f"{k} {v}" for k, v in sorted(stats.by_trigger.items()))
    line = f"Compactions: {stats.count} ({strategies}; {triggers})"
    if stats.last_tokens_before is not None and stats.last_tokens_after is not None:
        line += f", last {stats.last_tokens_before:,} → {stats.last_tokens_after:,} tokens"
    return line


def _ago(then: datetime, now: datetime) -> str:
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m ago"
    return f"{seconds // 86400}d ago ({then:%Y-%m-%d %H:%M} UTC)"


def format_memory_status(status: MemoryStatus) -> str:
    counts = status.counts
    requested = status.requested_provider
    provider = status.provider if status.provider != "none" else "none (keyword-only)"
    lines = [
        f"Provider: {provider} (requested: {requested})",
        f"Model: {status.model or '-'}"
        + (f" · {status.dimensions} dims" if status.dimensions else ""),
        f"Indexed: {counts.files} files · {counts.chunks} chunks"
        + (f" · {counts.vectors} vectors" if status.vector_available else ""),
    ]
    for source in counts.by_source:
        lines.append(f"  {source.source}: {source.files} files · {source.chunks} chunks")
    dirty = status.dirty_files
    preview = ", ".join(dirty[:5]) + (f" (+{len(dirty) - 5} more)" if len(dirty) > 5 else "")
    lines.append(f"Dirty: {'yes — ' + preview if dirty else 'no'}")
    if status.reindexing:
        lines.append("Reindexing: yes (keyword search until it finishes)")
    elif status.reindex_pending:
        lines.append("Rebuild pending: the embedder, driver or chunking changed (next sync)")
    vector = (
        "ready" if status.vector_available else f"off — {status.vector_error or 'keyword-only'}"
    )
    lines.append(f"Vector: {vector}")
    lines.append(f"FTS: {'ready' if status.fts_available else 'unavailable'}")
    lines.append(
        f"Embedding cache: {counts.cache_entries} entries (max {status.cache_max_entries})"
    )
    if counts.pending_vector_files:
        lines.append(f"Awaiting vectors: {counts.pending_vector_files} files")
    if status.forgetting_enabled or counts.forgotten:
        last = status.forgetting_last_run or "never"
        lines.append(f"Forgotten: {counts.forgotten} chunks (last run: {last})")
    embedder = status.embedder or {}
    if embedder:
        lines.append(
            f"Embedder failures: {embedder.get('failures', 0)}/{embedder.get('failure_limit', 0)}"
            + (f" · last error: {embedder['last_error']}" if embedder.get("last_error") else "")
        )
    if status.fallback:
        lines.append(f"Fallback: {status.fallback}")
    driver = status.driver
    if driver.get("postgres"):
        engine = f"PostgreSQL {driver['postgres']}"
    else:
        engine = f"SQLite {driver['sqlite']}"
    lines.append(f"Store: {status.db_path} ({driver['driver']}, {engine})")
    lines.append(f"Workspace: {status.workspace}")
    return "\n".join(lines)


def format_search(query: str, result: SearchResult, *, audiences: bool = False) -> str:
    """What ``/memory search`` and ``parley memory search`` print; ``audiences``: label
    each hit with whose it is (the operator's view of every audience)."""
    if not result.hits:
        head = f'No memory matches "{query}".'
    else:
        timing = f"{result.mode}, {result.search_ms:.0f} ms"
        head = f'{len(result.hits)} result(s) for "{query}" ({timing}):'
    lines = [head]
    for number, hit in enumerate(result.hits, start=1):
        snippet = hit.snippet.replace("\n", " ⏎ ")
        if len(snippet) > SNIPPET_PREVIEW_CHARS:
            snippet = snippet[: SNIPPET_PREVIEW_CHARS - 1] + "…"
        whose = f" · {audience_label(hit.scope)}" if audiences else ""
        lines.append(
            f"{number}. {hit.citation} · {hit.score:.2f} · {hit.source}{whose}\n   {snippet}"
        )
    if result.fallback:
        lines.append(f"(keyword-only: {result.fallback})")
    return "\n".join(lines)
