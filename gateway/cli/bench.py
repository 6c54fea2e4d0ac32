"""``parley bench locomo``: memory retrieval under a context budget, on LoCoMo (the bench
itself: gateway/cli/locomo.py, imported when the command runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from parley.gateway.cli.common import EXIT_OK, EXIT_PROBLEM
from parley.gateway.config import LoadedConfig


def add_bench_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    bench = sub.add_parser("bench", parents=[common], help="benchmarks")
    benches = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    locomo = benches.add_parser(
        "locomo", parents=[common], help="memory retrieval under a context budget (LoCoMo)"
    )
    locomo.add_argument("--data", type=Path, required=True, help="a file in LoCoMo's format")
    locomo.add_argument("--out", type=Path, required=True, help="RESULTS.jsonl to write")
    locomo.add_argument(
        "--embedder", choices=["auto", "e5", "local", "openai", "none"], default=None,
        help="override [memory.embedder] provider",
    )  # fmt: skip
    locomo.add_argument("--conversations", type=int, default=None, help="only the first N")
    locomo.add_argument(
        "--backend", choices=["sqlite", "postgres"], default="sqlite",
        help="memory store: memory.db, or PostgreSQL (PARLEY_DATABASE_URL, else embedded)",
    )  # fmt: skip


async def bench_command(loaded: LoadedConfig, args: argparse.Namespace) -> int:
    from parley.gateway.cli.locomo import LocomoError, embedder_settings, run_locomo

    memory = loaded.config.memory
    if args.embedder is not None:
        memory = memory.model_copy(
            update={"embedder": embedder_settings(args.embedder, memory.embedder)}
        )
    try:
        summary = await run_locomo(
            args.data,
            args.out,
            settings=memory,
            limit_conversations=args.conversations,
            backend=args.backend,
        )
    except LocomoError as exc:
        print(f"parley: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    print(json.dumps(summary))
    return EXIT_OK
