"""Memory indexing that keeps up with a conversation (issue 22).

Three figures, each against its baseline in the same run:

- ``append_cost_ratio``: the cost of syncing one appended turn into a transcript of
  10,000 entries over one of 100 (keyword-only index, so only chunking and writing
  count; median of ``--appends`` rounds, alternating). The sync resumes where the last
  one stopped; the baseline is chunking the whole file, which every sync did before.
- ``vector_vs_raw``: parley's vector indexing throughput (the vector pass over a fresh
  index's pending chunks: reading them, the cache, embedding, writing) over the raw
  embedder's (``embed_passages`` over the same chunk texts, in the embedder's own
  batches), default e5 embedder. The baseline is one chunk per call, as a sync after
  each turn used to embed.
- ``keyword_findable_ms``: from a turn's append (and ``notify_transcript``, as the
  gateway calls it) to the fact being found by a keyword search without catching up
  (automatic recall's way), default sync settings; ``vector_findable_ms``: until its
  vector is in too.

Prints one JSON object. Run alone: ``HF_HUB_OFFLINE=1 .venv/bin/python bench/index_speed.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from parley.core.memory.embedders import EmbedderSettings, ResilientEmbedder, build_embedder
from parley.core.memory.index import MemoryIndex, SyncReport
from parley.core.memory.memory_config import MemorySettings, SyncSettings
from parley.core.memory.sources import SourceFile
from parley.core.messages import Message
from parley.core.transcript import Transcript

START = datetime(2026, 1, 1, tzinfo=UTC)
QUIET = SyncSettings(on_start=False, watch=False)
WORDS = [
    "tea",
    "garden",
    "Oslo",
    "meeting",
    "budget",
    "kiwi",
    "violin",
    "ferry",
    "lantern",
    "orchard",
    "harbour",
]


def write_transcript(sessions: Path, sid: str, entries: int) -> Path:
    sessions.mkdir(parents=True, exist_ok=True)
    path = sessions / f"{sid}.jsonl"
    meta = {"memory_scope": "person:bench", "agent_name": "Nora"}
    with Transcript.create(path, sid, f"key:{sid}", meta) as transcript:
        for i in range(entries):
            append(transcript, i)
    return path


def append(transcript: Transcript, i: int, text: str | None = None) -> None:
    words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(8 + i % 9))
    body = text or f"Message {i}: {words}."
    message = Message.user(body) if i % 2 == 0 else Message.assistant(body)
    transcript.append_message(message, ts=START + timedelta(minutes=i))


def index_for(
    home: Path, settings: MemorySettings, embedder: ResilientEmbedder | None
) -> MemoryIndex:
    return MemoryIndex(
        settings,
        db_path=home / "memory.db",
        workspace=home / "workspace",
        sessions_dir=home / "sessions",
        embedder=embedder,
    )


async def append_cost(root: Path, rounds: int) -> dict[str, Any]:
    sizes = (100, 10_000)
    indexes: dict[int, MemoryIndex] = {}
    paths: dict[int, Path] = {}
    settings = MemorySettings(sync=QUIET, sources=("sessions",))
    for n in sizes:
        home = root / f"append-{n}"
        paths[n] = write_transcript(home / "sessions", f"s{n}", n)
        indexes[n] = index_for(home, settings, None)
        await indexes[n].open()
        await indexes[n].sync()
    times: dict[int, list[float]] = {n: [] for n in sizes}
    whole: dict[int, list[float]] = {n: [] for n in sizes}
    resumed = 0
    try:
        for r in range(rounds):
            for n in sizes:
                with Transcript.open(paths[n]) as transcript:
                    append(transcript, n + r)
                started = time.perf_counter()
                report = await indexes[n].sync()
                times[n].append(time.perf_counter() - started)
                resumed += report.files_resumed
                # The baseline: chunking the whole file, as every sync did before.
                files = indexes[n]._sync._files
                source = SourceFile(f"sessions/{paths[n].name}", paths[n], "sessions", None)
                started = time.perf_counter()
                data = await asyncio.to_thread(paths[n].read_bytes)
                await asyncio.to_thread(files.chunk_file, source, data)
                whole[n].append(time.perf_counter() - started)
    finally:
        for index in indexes.values():
            await index.close()
    med = {n: statistics.median(times[n]) * 1000 for n in sizes}
    base = {n: statistics.median(whole[n]) * 1000 for n in sizes}
    return {
        "append_cost_ratio": round(med[10_000] / med[100], 3),
        "append_sync_ms_100": round(med[100], 2),
        "append_sync_ms_10000": round(med[10_000], 2),
        "appends_resumed": f"{resumed}/{rounds * len(sizes)}",
        "baseline_whole_chunk_ms_100": round(base[100], 2),
        "baseline_whole_chunk_ms_10000": round(base[10_000], 2),
        "baseline_append_cost_ratio": round(base[10_000] / base[100], 1),
    }


async def vector_speed(root: Path, entries: int, embedder: ResilientEmbedder) -> dict[str, Any]:
    home = root / "vectors"
    write_transcript(home / "sessions", "v", entries)
    settings = MemorySettings(sync=QUIET, sources=("sessions",))
    index = index_for(home, settings, embedder)
    primary = embedder.primary
    batch = max(1, primary.max_batch)
    await primary.embed_passages(["warm up the model", "and its caches"])
    await index.open()
    try:
        await index._sync.sync(reason="bench", wait_vectors=False, scheduled_forgetting=False)
        await index._vectors.cancel()  # the background pass: timed below instead
        store = index._store()
        texts = [t for _, _, t in await index._w(store.chunk_texts, "sessions/v.jsonl")]
        raw_s: list[float] = []
        for _ in range(2):  # raw before and after parley's pass: same machine noise
            started = time.perf_counter()
            for i in range(0, len(texts), batch):
                await primary.embed_passages(texts[i : i + batch])
            raw_s.append(time.perf_counter() - started)
            if len(raw_s) == 1:
                report = SyncReport(reason="bench")
                started = time.perf_counter()
                await index._vectors.drain(report)
                parley_s = time.perf_counter() - started
        single = texts[: min(len(texts), 2 * batch)]
        started = time.perf_counter()
        for text in single:
            await primary.embed_passages([text])
        single_s = time.perf_counter() - started
        counts = (await index.status()).counts
    finally:
        await index.close()
    raw_rate = len(texts) / statistics.mean(raw_s)
    parley_rate = report.embedded / parley_s
    return {
        "vector_vs_raw": round(parley_rate / raw_rate, 3),
        "vector_chunks": len(texts),
        "vector_embedded": report.embedded,
        "vector_left_pending": counts.pending_vector_files,
        "vector_chunks_per_s": round(parley_rate, 2),
        "raw_chunks_per_s": round(raw_rate, 2),
        "raw_seconds": [round(s, 2) for s in raw_s],
        "baseline_one_chunk_per_call_per_s": round(len(single) / single_s, 2),
        "embedder": f"{primary.provider}/{primary.model}",
        "batch": batch,
    }


async def findable(
    root: Path, entries: int, rounds: int, embedder: ResilientEmbedder
) -> dict[str, Any]:
    home = root / "findable"
    path = write_transcript(home / "sessions", "f", entries)
    settings = MemorySettings(sync=SyncSettings(on_start=False, watch=False), sources=("sessions",))
    index = index_for(home, settings, embedder)
    await index.open()
    keyword_ms: list[float] = []
    vector_ms: list[float] = []
    try:
        await index.sync()
        for r in range(rounds):
            fact = f"zebracode{r}x{os.getpid()}"
            started = time.perf_counter()
            with Transcript.open(path) as transcript:
                append(transcript, entries + r, f"My locker code is {fact}.")
            index.notify_transcript()
            while True:
                result = await index.search(fact, scopes=["person:bench"], catch_up=False)
                if any(fact in h.snippet for h in result.hits):
                    break
                await asyncio.sleep(0.005)
            keyword_ms.append((time.perf_counter() - started) * 1000)
            while True:
                status = await index.status()
                sync_task, vec_task = index._sync.task, index._vectors.task
                busy = any(t is not None and not t.done() for t in (sync_task, vec_task))
                if not busy and status.counts.pending_vector_files == 0:
                    break
                await asyncio.sleep(0.005)
            vector_ms.append((time.perf_counter() - started) * 1000)
    finally:
        await index.close()
    return {
        "keyword_findable_ms": round(statistics.median(keyword_ms), 1),
        "keyword_findable_ms_max": round(max(keyword_ms), 1),
        "vector_findable_ms": round(statistics.median(vector_ms), 1),
        "transcript_debounce_seconds": settings.sync.transcript_debounce_seconds,
        "baseline_transcript_debounce_seconds": 5.0,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--appends", type=int, default=15)
    parser.add_argument("--vector-entries", type=int, default=1000)
    parser.add_argument("--findable-rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out: dict[str, Any] = {"bench": "index_speed"}
    with tempfile.TemporaryDirectory(prefix="parley-index-speed-") as tmp:
        root = Path(tmp)
        out.update(await append_cost(root, args.appends))
        embedder = build_embedder(EmbedderSettings())
        try:
            out.update(
                await vector_speed(root, args.vector_entries, build_embedder(EmbedderSettings()))
            )
            out.update(await findable(root, 300, args.findable_rounds, embedder))
        finally:
            await embedder.close()
    out["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
