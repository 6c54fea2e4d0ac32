"""``parley bench locomo``: memory retrieval under a context budget, on LoCoMo.

For each conversation, in its own audience: a LoCoMo conversation is one person's direct
chat with the agent (``speaker_a`` is the person, ``person:locomo:<sample_id>``), so
each question is searched with the scopes that person's direct chat may read
(``core.memory.audience``: theirs plus the agent's, never another conversation's).
Every LoCoMo session is written as a parley
transcript through the real transcript store (``speaker_a`` as the user, with the
gateway's turn-context block naming them; ``speaker_b`` as the assistant, named in the
header; entry times from the session date), the transcripts are indexed through the
real sync path, and each question goes to ``MemoryIndex.search`` (what ``memory_search``
calls) with its defaults.

Recall of evidence turns within a budget: results are read in rank order until the
budget (cl100k tokens of snippet text) is spent, the last one cut at the budget; an
evidence turn counts when its whole text is inside what was read. The baseline, scored
the same way in the same run: FTS5 BM25 over single turns (``speaker: text``,
``porter unicode61``, the question's tokens OR-ed).

``backend="postgres"`` runs the same bench on the PostgreSQL memory store: at
``database_url`` (or ``PARLEY_DATABASE_URL``), else on an embedded server started in a
temporary directory (``pgserver``, the ``dev`` extra), whose pgvector cannot compute
distances on these machines: vectors are then ranked exactly by the client.

Writes RESULTS.jsonl (one line per question, all categories) and prints one JSON object.

A bench, not the running gateway: it lives with its command (gateway/cli/bench.py, which
imports it only when ``parley bench locomo`` runs), and it imports nothing from the dev
extra until it starts the embedded server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import sqlite3
import statistics
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from parley.core.memory.audience import Audience, Viewer
from parley.core.memory.embedders import EmbedderSettings, build_embedder
from parley.core.memory.index import MemoryIndex
from parley.core.memory.memory_config import MemorySettings
from parley.core.memory.query import quote_fts
from parley.core.memory.store_protocol import StoreBackend
from parley.core.messages import Message, TextBlock
from parley.core.prompt import render_turn_context, turn_context_block
from parley.core.tokens import default_counter
from parley.core.transcript_store import FileTranscriptStore, TranscriptStore
from parley.gateway.routing import normalise_peer_id

Backend = Literal["sqlite", "postgres"]
BUDGETS = (250, 500, 1000, 2000)
SCORED_CATEGORIES = (1, 2, 3, 4)
_EVIDENCE = re.compile(r"D\d+:\d+")
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")
_DATE_FORMAT = "%I:%M %p on %d %B, %Y"


class LocomoError(ValueError):
    """The bench cannot run: the data file is not in LoCoMo's format, or the embedded
    PostgreSQL it would start is not installed."""


@dataclass(frozen=True, slots=True)
class LocomoTurn:
    dia_id: str
    speaker: str
    text: str
    session: int
    when: datetime


@dataclass(frozen=True, slots=True)
class LocomoQuestion:
    index: int
    question: str
    category: int
    evidence: frozenset[str]


@dataclass(slots=True)
class Conversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    turns: list[LocomoTurn] = field(default_factory=list)
    questions: list[LocomoQuestion] = field(default_factory=list)


def _collapse(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def load_locomo(path: Path) -> list[Conversation]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LocomoError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, list):
        raise LocomoError("expected a list of samples")
    out: list[Conversation] = []
    for sample in raw:
        if not isinstance(sample, dict):
            raise LocomoError(f"a sample is a {type(sample).__name__}, not an object")
        try:
            conv = sample["conversation"]
            item = Conversation(str(sample["sample_id"]), conv["speaker_a"], conv["speaker_b"])
            number = 1
            # Iterate over the sessions themselves: some samples have spare date keys.
            while f"session_{number}" in conv or f"session_{number}_date_time" in conv:
                turns = conv.get(f"session_{number}")
                if turns:
                    when = datetime.strptime(conv[f"session_{number}_date_time"], _DATE_FORMAT)
                    for turn in turns:
                        item.turns.append(
                            LocomoTurn(
                                turn["dia_id"], turn["speaker"], turn["text"], number,
                                when.replace(tzinfo=UTC),
                            )
                        )  # fmt: skip
                number += 1
            for index, qa in enumerate(sample["qa"]):
                evidence: set[str] = set()
                for ref in qa.get("evidence") or []:
                    # Tolerate 'D8:6; D9:17' and 'D:11:26'.
                    evidence.update(_EVIDENCE.findall(str(ref).replace("D:", "D")))
                item.questions.append(
                    LocomoQuestion(index, str(qa["question"]), int(qa["category"]),
                                   frozenset(evidence))
                )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise LocomoError(f"sample {sample.get('sample_id', '?')}: {exc}") from exc
        out.append(item)
    return out


def write_transcripts(conv: Conversation, sessions: Path | TranscriptStore, scope: str) -> int:
    """One transcript per LoCoMo session (in a directory of files, or any transcript
    store); returns the number of messages written."""
    store = FileTranscriptStore(sessions) if isinstance(sessions, Path) else sessions
    written = 0
    by_session: dict[int, list[LocomoTurn]] = {}
    for turn in conv.turns:
        by_session.setdefault(turn.session, []).append(turn)
    for number, turns in by_session.items():
        session_id = f"{conv.sample_id}-s{number:02d}"
        meta = {"agent": "locomo", "agent_name": conv.speaker_b, "memory_scope": scope}
        key = f"agent:locomo:bench:direct:{conv.sample_id}"
        with store.create(session_id, key, meta) as t:
            for offset, turn in enumerate(turns):
                when = turn.when + timedelta(seconds=offset)  # keep the order within a session
                if turn.speaker == conv.speaker_a:
                    context = render_turn_context(
                        now=when, channel="locomo", chat_type="direct",
                        sender_name=conv.speaker_a, sender_id=conv.sample_id,
                    )  # fmt: skip
                    message = Message("user", (TextBlock(turn.text), turn_context_block(context)))
                else:
                    message = Message.assistant(turn.text)
                t.append_message(message, ts=when)
                written += 1
    return written


# -- scoring ---------------------------------------------------------------------------


def found_dia_ids(snippet: str, turns: dict[str, str]) -> list[str]:
    """Every dia_id whose (whitespace-collapsed) turn text is whole inside ``snippet``."""
    flat = _collapse(snippet)
    return [dia for dia, text in turns.items() if text and text in flat]


def recall_within(
    results: Sequence[tuple[str, Sequence[str]]],
    evidence: Iterable[str],
    turns: dict[str, str],
    budgets: Sequence[int] = BUDGETS,
) -> list[float] | None:
    """Per budget: the share of evidence turns whose text is read within the budget."""
    wanted = {e for e in evidence if e in turns}
    if not wanted:
        return None
    counter = default_counter()
    sizes = [counter.text(text) for text, _ in results]
    out: list[float] = []
    for budget in budgets:
        spent = 0
        found: set[str] = set()
        for (text, dias), size in zip(results, sizes, strict=True):
            if spent + size <= budget:
                found.update(dias)
                spent += size
                continue
            remaining = budget - spent
            if remaining > 0:
                part = counter.prefix(text, remaining)
                found.update(d for d in dias if turns[d] in _collapse(part))
            break
        out.append(len(found & wanted) / len(wanted))
    return out


@dataclass(slots=True)
class RecallTable:
    per_category: dict[int, list[list[float]]] = field(default_factory=dict)

    def add(self, category: int, recall: list[float] | None) -> None:
        if recall is not None and category in SCORED_CATEGORIES:
            self.per_category.setdefault(category, []).append(recall)

    def summary(self) -> dict[str, Any]:
        def mean(rows: list[list[float]]) -> dict[str, float]:
            return {
                str(b): round(statistics.fmean(r[i] for r in rows), 4) if rows else 0.0
                for i, b in enumerate(BUDGETS)
            }

        every = [r for rows in self.per_category.values() for r in rows]
        return {
            "n": len(every),
            "all": mean(every),
            "by_category": {
                str(c): {
                    "n": len(self.per_category.get(c, [])),
                    **mean(self.per_category.get(c, [])),
                }
                for c in SCORED_CATEGORIES
            },
        }


class Bm25Baseline:
    """FTS5 BM25 over single turns, the question's tokens OR-ed (stdlib sqlite3)."""

    def __init__(self, conv: Conversation) -> None:
        self._db = sqlite3.connect(":memory:")
        self._db.execute(
            "CREATE VIRTUAL TABLE t USING fts5(text, dia UNINDEXED, tokenize='porter unicode61')"
        )
        self._db.executemany(
            "INSERT INTO t VALUES (?, ?)",
            [(f"{t.speaker}: {t.text}", t.dia_id) for t in conv.turns],
        )

    def search(self, question: str, limit: int = 200) -> list[tuple[str, list[str]]]:
        words = _WORD.findall(question.lower())
        if not words:
            return []
        match = " OR ".join(quote_fts(w) for w in dict.fromkeys(words))
        rows = self._db.execute(
            "SELECT text, dia FROM t WHERE t MATCH ? ORDER BY bm25(t) LIMIT ?", (match, limit)
        ).fetchall()
        return [(text, [dia]) for text, dia in rows]

    def close(self) -> None:
        self._db.close()


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _start_pgserver(data_dir: Path) -> Any:
    """An embedded PostgreSQL (blocking: call in a thread)."""
    # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver does not use it.
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir.parent))
    # pgserver comes with the dev extra only: imported here, never with this module.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import pgserver
        except ImportError as exc:
            raise LocomoError(
                "--backend postgres without PARLEY_DATABASE_URL needs an embedded PostgreSQL: "
                "install the dev extra (pip install -e '.[dev]'), or set PARLEY_DATABASE_URL"
            ) from exc

    return pgserver.get_server(str(data_dir), cleanup_mode="stop")


@contextlib.asynccontextmanager
async def _store_backend(
    backend: Backend, home: Path, database_url: str | None
) -> AsyncIterator[tuple[StoreBackend | None, str]]:
    """(the MemoryIndex backend, a description); None for memory.db under ``home``."""
    if backend == "sqlite":
        yield None, "sqlite"
        return
    from parley.gateway.storage.postgres.database import PgDatabase
    from parley.gateway.storage.postgres.memory.backend import PgMemoryBackend

    url = database_url or os.environ.get("PARLEY_DATABASE_URL")
    server = None
    if not url:
        # Unix socket paths are limited to ~107 bytes: keep the data directory short.
        short = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="parley-pg-"))
        server = await asyncio.to_thread(_start_pgserver, short / "data")
        url = str(server.get_uri())
    try:
        async with PgDatabase(url) as db:
            # A name of its own: a shared database keeps its other indexes untouched.
            store = PgMemoryBackend(
                db,
                f"locomo-bench-{uuid.uuid4().hex[:12]}",
                vector_index="exact" if server is not None else "hnsw",
            )
            try:
                yield store, "postgres (embedded)" if server is not None else "postgres"
            finally:
                await asyncio.to_thread(store.drop)
    finally:
        if server is not None:
            await asyncio.to_thread(server.cleanup)


async def run_locomo(
    data: Path,
    out: Path,
    *,
    settings: MemorySettings | None = None,
    work_dir: Path | None = None,
    limit_conversations: int | None = None,
    backend: Backend = "sqlite",
    database_url: str | None = None,
) -> dict[str, Any]:
    conversations = load_locomo(data)[:limit_conversations]
    base = settings or MemorySettings()
    memory = base.model_copy(
        update={
            "sources": ("sessions",),
            "sync": base.sync.model_copy(update={"watch": False, "on_start": False}),
        }
    )
    with tempfile.TemporaryDirectory(prefix="parley-locomo-", dir=work_dir) as tmp:
        home = Path(tmp)
        async with _store_backend(backend, home, database_url) as (store, described):
            return await _run(conversations, data, out, memory, home, store, described)


def locomo_person(conv: Conversation) -> Audience:
    """The person whose direct chat a LoCoMo conversation stands for."""
    return Audience.person(f"locomo:{normalise_peer_id(conv.sample_id)}")


async def _run(
    conversations: list[Conversation],
    data: Path,
    out: Path,
    memory: MemorySettings,
    home: Path,
    store: StoreBackend | None,
    described: str,
) -> dict[str, Any]:
    sessions_dir = home / "sessions"
    sessions_dir.mkdir()
    # The bench's transcripts stay files whatever the memory backend: they live only in
    # this run's temporary directory.
    transcripts = FileTranscriptStore(sessions_dir)
    messages = await asyncio.to_thread(
        lambda: sum(
            write_transcripts(c, transcripts, locomo_person(c).scope) for c in conversations
        )
    )
    index = MemoryIndex(
        memory,
        db_path=home / "memory" / "memory.db",
        workspace=home / "workspace",
        sessions_dir=sessions_dir,
        embedder=build_embedder(memory.embedder),
        backend=store,
    )
    await index.open()
    try:
        started = time.perf_counter()
        report = await index.sync(reason="bench")
        index_seconds = time.perf_counter() - started
        status = (await index.status()).to_dict()
        ours, baseline = RecallTable(), RecallTable()
        latencies: list[float] = []
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as sink:
            for conv in conversations:
                turns = {t.dia_id: _collapse(t.text) for t in conv.turns}
                bm25 = Bm25Baseline(conv)
                scopes = await index.visible_scopes(Viewer.only(locomo_person(conv)))
                for q in conv.questions:
                    t0 = time.perf_counter()
                    result = await index.search(q.question, scopes=scopes)
                    latencies.append((time.perf_counter() - t0) * 1000)
                    rows = [(h.snippet, found_dia_ids(h.snippet, turns)) for h in result.hits]
                    line = {
                        "sample_id": conv.sample_id,
                        "qa_index": q.index,
                        "results": [{"text": t, "dia_ids": d} for t, d in rows],
                    }
                    sink.write(json.dumps(line, ensure_ascii=False) + "\n")
                    ours.add(q.category, recall_within(rows, q.evidence, turns))
                    baseline.add(
                        q.category, recall_within(bm25.search(q.question), q.evidence, turns)
                    )
                bm25.close()
    finally:
        await index.close()
    chunks = int(status["chunks"])
    summary_ours, summary_base = ours.summary(), baseline.summary()
    at_1000 = summary_base["all"]["1000"]
    return {
        "bench": "locomo",
        "backend": described,
        "data": str(data),
        "conversations": len(conversations),
        "questions_scored": summary_ours["n"],
        "recall": summary_ours,
        "baseline_bm25_turns": summary_base,
        "ratio_at_1000": round(summary_ours["all"]["1000"] / at_1000, 3) if at_1000 else None,
        "search_ms_p50": round(percentile(latencies, 0.5), 2),
        "search_ms_p95": round(percentile(latencies, 0.95), 2),
        "index_seconds": round(index_seconds, 2),
        "messages_indexed": messages,
        "chunks": chunks,
        "chunks_per_s": round(chunks / index_seconds, 1) if index_seconds else None,
        "embedder": {
            "provider": status["provider"],
            "model": status["model"],
            "dimensions": status["dimensions"],
            "fallback": status["fallback"],
        },
        "sync_errors": report.errors[:5],
        "search_defaults": memory.search.model_dump(),
        "chunking": memory.chunking.model_dump(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "results_file": str(out),
    }


def embedder_settings(provider: str | None, base: EmbedderSettings) -> EmbedderSettings:
    if provider is None:
        return base
    return base.model_copy(update={"provider": provider})
