"""Admin API latency over real HTTP on loopback, against the same work done in-process.

A gateway with 5,000 sessions in state.db and one session whose transcript holds
20,100 entries. Each endpoint is asked ``--requests`` times with aiohttp; the
baseline is the same registry query or transcript read called directly in the same
process, in the same run (what HTTP, auth, validation and JSON add is the ratio).

Prints one JSON object: per endpoint p50/p95 in ms, and the baseline's;
``last_page_vs_first``, the transcript's last page over its first (p50, over HTTP):
a late page must not cost a scan of the file (issue 22), and
``transcript_last_page_cold_ms``, the one request that built the line index it pages
from (the first page past what the open transcript had indexed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is a folder of scripts: imported as bench.…

from bench.turn_overhead import (  # noqa: E402
    LONG_PREFIX,
    InstantProvider,
    SignalChannel,
    percentile,
    write_transcript,
)
from parley.core.transcript_store import SessionTranscript  # noqa: E402
from parley.gateway.admin.service import encode_cursor  # noqa: E402
from parley.gateway.app import Gateway  # noqa: E402
from parley.gateway.config import load_config  # noqa: E402
from parley.gateway.storage.sessions import SessionOrigin  # noqa: E402

SESSIONS = 5_000
PAGE = 50
TRANSCRIPT_PAGE = 100


async def _time(call: Callable[[], Awaitable[Any]], count: int) -> dict[str, float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p95_ms": round(percentile(samples, 0.95), 3),
    }


async def _seed(gateway: Gateway, sessions_dir: Path) -> str:
    for i in range(SESSIONS):
        peer = f"person-{i:05d}"
        origin = SessionOrigin(
            f"agent:main:bench:direct:{peer}", "main", "bench", "default", "direct", peer,
            display_name=f"Person {i}",
        )  # fmt: skip
        record = await gateway.registry.create(origin)
    key = record.key
    path = sessions_dir / f"{record.session_id}.jsonl"
    await asyncio.to_thread(write_transcript, path, record.session_id, key, LONG_PREFIX * 2)
    return record.session_id


async def run(requests: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as home:
        env = {
            "PARLEY_HOME": home,
            "PARLEY_SESSION__TIMEZONE": "UTC",
            "PARLEY_MEMORY__ENABLED": "false",
            "PARLEY_HTTP__PORT": "0",
        }
        loaded = load_config(env=env)
        gateway = Gateway(loaded, channels=[SignalChannel()], provider=InstantProvider())
        await gateway.start()
        assert gateway.http is not None
        long_id = await _seed(gateway, loaded.sessions_dir)
        record = await gateway.registry.get(long_id)
        assert record is not None
        transcript = await gateway.transcript(record)
        total = transcript.entry_count
        last_page = str(total - TRANSCRIPT_PAGE)
        headers = {"Authorization": f"Bearer {gateway.http.token.value}"}
        results: dict[str, object] = {}
        async with aiohttp.ClientSession(base_url=gateway.http.url(""), headers=headers) as http:

            def get(path: str, **params: str) -> Callable[[], Awaitable[Any]]:
                async def call() -> Any:
                    async with http.get(path, params=params) as response:
                        assert response.status == 200, await response.text()
                        return await response.read()

                return call

            page = await gateway.registry.list(limit=PAGE)
            for _ in range(39):  # a cursor 40 pages down
                page = await gateway.registry.list(limit=PAGE, cursor=page.next_cursor)
            cursor_raw = page.next_cursor or ""
            cases: dict[str, tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = {
                "sessions_first_page": (
                    get("/api/sessions", limit=str(PAGE)),
                    lambda: gateway.registry.list(limit=PAGE),
                ),
                "sessions_page_40": (
                    get("/api/sessions", limit=str(PAGE), cursor=encode_cursor(cursor_raw)),
                    lambda: gateway.registry.list(limit=PAGE, cursor=cursor_raw),
                ),
                "sessions_text_query": (
                    get("/api/sessions", q="person 4321"),
                    lambda: gateway.registry.list(query="person 4321", limit=PAGE),
                ),
                "session_detail": (
                    get(f"/api/sessions/{long_id}"),
                    lambda: gateway.registry.get(long_id),
                ),
                "transcript_first_page": (
                    get(f"/api/sessions/{long_id}/transcript", limit=str(TRANSCRIPT_PAGE)),
                    lambda: asyncio.to_thread(_read, transcript, 0),
                ),
                "transcript_last_page": (
                    get(
                        f"/api/sessions/{long_id}/transcript",
                        limit=str(TRANSCRIPT_PAGE),
                        cursor=last_page,
                    ),
                    lambda: asyncio.to_thread(_read, transcript, int(last_page)),
                ),
                "context": (
                    get(f"/api/sessions/{long_id}/context"),
                    lambda: gateway.context_report(record, transcript, "direct"),
                ),
            }
            cold: dict[str, float] = {}
            for name, (api_call, baseline_call) in cases.items():
                started = time.perf_counter()
                await api_call()  # warm caches on both sides
                cold[name] = round((time.perf_counter() - started) * 1000, 3)
                await baseline_call()
                api = await _time(api_call, requests)
                base = await _time(baseline_call, requests)
                results[name] = {
                    **api,
                    "baseline_p50_ms": base["p50_ms"],
                    "baseline_p95_ms": base["p95_ms"],
                    "ratio_p50": round(api["p50_ms"] / max(base["p50_ms"], 1e-3), 2),
                }
            first, last = results["transcript_first_page"], results["transcript_last_page"]
            assert isinstance(first, dict) and isinstance(last, dict)
            results["last_page_vs_first"] = round(last["p50_ms"] / first["p50_ms"], 2)
            results["transcript_last_page_cold_ms"] = cold["transcript_last_page"]
        await gateway.stop()
    return {
        "sessions": SESSIONS,
        "transcript_entries": total,
        "requests": requests,
        **results,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def _read(transcript: SessionTranscript, offset: int) -> list[Any]:
    return [e.to_dict() for _, e in transcript.numbered_entries(offset, TRANSCRIPT_PAGE)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.requests))))


if __name__ == "__main__":
    main()
