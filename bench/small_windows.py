"""Small windows: the context engine on 4k, 8k and 32k llama.cpp-like servers (issue #21).

The seeded conversation of ``bench/context_cost.py`` (tool calls with results from a few
bytes to 1 MB, pauses around the cache TTL, identifiers planted in the first turns)
plus one more plant, "my car is on level 3, spot 42", is replayed through the real
runner and context engine against ``tests/core/context/window_fake.WindowFake``: a
deterministic server that counts the prompt with its own tokenizer (15% more tokens
than the engine's), refuses a prompt over its window (``n_prompt_tokens`` / ``n_ctx``)
and stops a reply that fills the window (``STOP_OVERFLOW``). The window is stated in
the config (``context_tokens``), the agent's ``max_output_tokens`` is 4,096 (more than a
4k window can give a reply), and the model writes answers of 150-450 words.

Per window it reports:

- ``overflow_errors``: turns the user lost (the turn raised a context error);
- ``negative_budgets``: budgets computed at or below zero (every trim budget, every
  view's threshold and limit, instrumented);
- ``compactions`` (entries written) and ``trims`` (turns whose view was cut by code);
- ``identifiers_planted`` / ``identifiers_kept``: found in the last request, where the
  model would see them (the kept turns, the summary or the ledger);
- ``server_refusals``, ``stopped_replies``: what the server refused or cut off (each
  recovered, or counted above);
- ``no_summaries``: the same replay with a model that cannot summarise (compaction by
  code, no memory flush);
- ``heavy_tokenizer``: a server tokenizer counting 70% more than the engine's, beyond
  its 1.2 margin, on a session restored with a window's worth of history written by an
  earlier process (nothing to calibrate on yet): refused prompts and cut-off replies,
  recovered while calibration learns the ratio.

``baseline`` replays the same conversation against the commit before the budget
(``--baseline-ref``, default the parent of the commit that added
``core/context/budget.py``), extracted with ``git archive`` into a temporary folder
and imported instead of this checkout; its 16,000-token floor is lowered to let it run.

Prints one JSON object.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The baseline: another commit's parley (see main), with this checkout's bench and fakes.
_ENGINE_ROOT = os.environ.get("PARLEY_BENCH_ENGINE_ROOT")
if _ENGINE_ROOT:
    sys.meta_path[:] = [
        f for f in sys.meta_path if "editable" not in str(getattr(f, "__module__", ""))
    ]
    sys.path.insert(0, _ENGINE_ROOT)
sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

from bench.context_cost import (  # noqa: E402
    FETCH_RE,
    PLANTED,
    WORDS,
    Turn,
    VirtualClock,
    bench_runner,
    make_conversation,
    registry,
)
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT  # noqa: E402
from parley.core.context.config import ContextConfig  # noqa: E402
from parley.core.context.engine import ContextEngine  # noqa: E402
from parley.core.context.flush import FLUSH_PROMPT, FlushTarget  # noqa: E402
from parley.core.errors import ContextError, ContextOverflowError  # noqa: E402
from parley.core.memory.audience import Audience  # noqa: E402
from parley.core.memory.notes import NoteStore  # noqa: E402
from parley.core.messages import Message, ToolUseBlock  # noqa: E402
from parley.core.prompt import render_turn_context  # noqa: E402
from parley.core.providers.base import ProviderRequest  # noqa: E402
from parley.core.providers.provider_config import RetryConfig  # noqa: E402
from parley.core.runner import TurnRequest  # noqa: E402
from parley.core.transcript import ENTRY_COMPACTION, Transcript  # noqa: E402
from tests.core.context.window_fake import TOKENIZER_RATIO, Answer, WindowFake  # noqa: E402

MODEL = "smol-bench"
MAX_OUTPUT = 4_096
WINDOWS = (4_096, 8_192, 32_768)
PARKING = "Remember: my car is on level 3, spot 42."
KEPT = (*PLANTED, "level 3, spot 42")
HEAVY_RATIO = 1.7
SCRATCH = Path(tempfile.gettempdir()) / "parley-bench-small-windows"
_NEGATIVE = re.compile(r"(?<![\w-])-\d")


def conversation(turns: int, seed: int) -> list[Turn]:
    """``context_cost``'s conversation with the parking spot planted after its plants."""
    turns_ = make_conversation(turns, seed)
    at = len(PLANTED)
    if at < len(turns_):
        turns_[at] = Turn(f"{PARKING} {turns_[at].text}", turns_[at].pause_seconds)
    return turns_


class SmallModel:
    """The fake server's answers: a summariser that skims (keeps only the end of what it
    was shown, so the ledger must keep the rest), short notes, tool calls on request,
    answers of 150-450 words."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: ProviderRequest) -> str | Answer:
        last = request.messages[-1]
        said = last.text
        if request.system == SUMMARY_SYSTEM_PROMPT:
            tail = said[-1_500:].replace("\n", " ")
            return (
                "## Decisions\n- keep going as discussed\n## Open TODOs\n- none\n"
                f"## Constraints/Rules\n- none\n## Pending user asks\n- {tail[:600]}\n"
                "## Exact identifiers\n- see the ledger"
            )
        if said.startswith(FLUSH_PROMPT[:14]):
            return "- the user keeps asking about datasets and budgets"
        if last.role == "tool_result":
            return "I looked at the result: " + " ".join(said.split())[:200]
        match = FETCH_RE.search(said)
        if match and last.role == "user":
            self.calls += 1
            args: dict[str, Any] = {"dataset": int(match.group(1)), "size": int(match.group(2))}
            if match.group(3):
                args["failing"] = True
            call = ToolUseBlock(f"call_{self.calls}", "fetch_data", args)
            return Answer("Fetching it now.", (call,))
        rng = random.Random(len(said) * 7919 + len(request.messages))
        answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 450)))
        return "Sure. " + " ".join(said.split()[:40]) + "\n\n" + answer


class Instruments:
    """Every budget the engine computes, and the turns it lost."""

    def __init__(self, engine: ContextEngine) -> None:
        self.budgets: list[int] = []
        self.lost: list[str] = []
        fit, prepare = engine._fit, engine.prepare

        def fit_spy(state: Any, request: Any, messages: Sequence[Message], budget: int) -> Any:
            self.budgets.append(budget)
            return fit(state, request, messages, budget)

        async def prepare_spy(*args: Any, **kwargs: Any) -> Any:
            view = await prepare(*args, **kwargs)
            self.budgets.append(view.threshold)
            figures = getattr(view, "budget", None)  # the baseline has none
            if figures is not None:
                self.budgets.extend((figures.limit, figures.output, figures.threshold))
            return view

        # Spies on this engine's methods, which may be another commit's (the baseline):
        # mypy refuses any assignment to a method, whatever its type.
        engine._fit = fit_spy  # type: ignore[method-assign]
        engine.prepare = prepare_spy  # type: ignore[method-assign]

    @property
    def negative(self) -> int:
        shown = sum(1 for text in self.lost if _NEGATIVE.search(text))
        return sum(1 for b in self.budgets if b <= 0) + shown


async def replay(
    window: int,
    turns: Sequence[Turn],
    home: Path,
    *,
    summaries: bool,
    baseline: bool,
    ratio: float = TOKENIZER_RATIO,
    restored: bool = False,
) -> dict[str, Any]:
    clock = VirtualClock()
    model = SmallModel()
    provider = WindowFake(window, model, model=MODEL, summaries=summaries, tokenizer_ratio=ratio)
    workspace = home / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    tools = registry()
    context: dict[str, Any] = {"models": {MODEL: {"context_tokens": window}}}
    if baseline:
        context["min_window_tokens"] = 0  # its 16,000 floor refuses 4k and 8k outright
    retry = RetryConfig(max_attempts=1, base_delay_seconds=0, max_delay_seconds=0)
    engine = ContextEngine(
        config=ContextConfig.model_validate(context),
        provider=provider,
        retry=retry,
        max_output=MAX_OUTPUT,
        flush_target=FlushTarget(NoteStore(home / "notes"), lambda _: Audience.person("ada")),
        now=clock.now,
    )
    spy = Instruments(engine)
    runner = bench_runner(provider, engine, tools, workspace, retry, clock, MAX_OUTPUT)
    transcript = Transcript.create(home / "bench.jsonl", "bench", "agent:main:bench")
    if restored:
        restore(transcript, window)
    trimmed = 0
    started = time.perf_counter()
    try:
        for turn in turns:
            context_text = render_turn_context(
                now=clock.now(), channel="bench", chat_type="direct", sender_name="Ada",
                sender_id="ada",
            )  # fmt: skip
            try:
                result = await runner.run_turn(
                    transcript,
                    TurnRequest("agent:main:bench", turn.text, context_text=context_text),
                )
            except (ContextError, ContextOverflowError) as exc:
                spy.lost.append(getattr(exc, "message", str(exc)))
            else:
                trimmed += result.events.trims > 0
            clock.seconds += turn.pause_seconds
        entries = list(transcript.entries())
    finally:
        transcript.close()
    main = [r for r in provider.requests if r.system != SUMMARY_SYSTEM_PROMPT]
    seen = json.dumps([m.to_dict() for m in main[-1].messages], ensure_ascii=False) if main else ""
    flushes = [e for e in entries if e.custom_type == "memory_flush"]
    return {
        "overflow_errors": len(spy.lost),
        "negative_budgets": spy.negative,
        "compactions": sum(1 for e in entries if e.type == ENTRY_COMPACTION),
        "trims": trimmed,
        "identifiers_planted": len(KEPT),
        "identifiers_kept": sum(1 for kept in KEPT if kept in seen),
        "server_refusals": provider.refused,
        "stopped_replies": provider.stopped,
        "requests": len(provider.requests),
        "max_prompt_tokens": max((provider.prompt_tokens(r) for r in main), default=0),
        "flushes": len(flushes),
        "lost_example": spy.lost[0][:160] if spy.lost else "",
        "seconds": round(time.perf_counter() - started, 1),
    }


def restore(transcript: Transcript, window: int) -> None:
    """History an earlier process wrote (another model, no usage to calibrate on), up to
    about the whole window by the engine's count: the first request is the engine's
    estimate alone, and this server's tokenizer counts more."""
    rng = random.Random(window)
    written = 0
    while written < window:
        said = " ".join(rng.choice(WORDS) for _ in range(60))
        answer = " ".join(rng.choice(WORDS) for _ in range(120))
        transcript.append_message(Message.user(f"{said}?"))
        transcript.append_message(Message.assistant(f"Sure. {answer}"))
        written += 200


async def run_all(
    turns: Sequence[Turn],
    windows: Sequence[int],
    *,
    summaries: bool,
    baseline: bool,
    ratio: float = TOKENIZER_RATIO,
    restored: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for window in windows:
        # One fixed folder: the workspace path is in the system prompt, and a random
        # one would tokenise differently from run to run.
        home = SCRATCH / str(window)
        shutil.rmtree(home, ignore_errors=True)
        try:
            out[str(window)] = await replay(
                window,
                turns,
                home,
                summaries=summaries,
                baseline=baseline,
                ratio=ratio,
                restored=restored,
            )
        finally:
            shutil.rmtree(SCRATCH, ignore_errors=True)
    return out


def baseline_ref() -> str:
    """The parent of the commit that added core/context/budget.py."""
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "core/context/budget.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        raise SystemExit("no commit adds core/context/budget.py: pass --baseline-ref")
    return f"{added[-1]}^"


def run_baseline(ref: str, args: argparse.Namespace) -> dict[str, Any]:
    """This script again, in a child process importing ``ref``'s parley."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "parley").mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", ref, "core", "gateway", "channels"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root / "parley")], input=archive, check=True)
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--turns",
                str(args.turns),
                "--seed",
                str(args.seed),
                "--only-baseline",
            ],
            env={**os.environ, "PARLEY_BENCH_ENGINE_ROOT": str(root)},
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, Any] = json.loads(child.stdout)
    return {"ref": ref, **result}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-ref", default="")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--only-baseline", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    turns = conversation(args.turns, args.seed)
    started = time.perf_counter()
    if args.only_baseline:  # the child process of run_baseline
        print(json.dumps({"windows": await run_all(turns, WINDOWS, summaries=True, baseline=True)}))
        return
    result: dict[str, Any] = {
        "windows": await run_all(turns, WINDOWS, summaries=True, baseline=False),
        "no_summaries": await run_all(turns, WINDOWS[:2], summaries=False, baseline=False),
        # A tokenizer that counts more than the engine's margin allows for, on a session
        # restored with a full window: the server refuses prompts and cuts replies off
        # until calibration has learnt the ratio.
        "heavy_tokenizer": {
            "ratio": HEAVY_RATIO,
            **await run_all(
                turns,
                WINDOWS[:2],
                summaries=True,
                baseline=False,
                ratio=HEAVY_RATIO,
                restored=True,
            ),
        },
    }
    if not args.no_baseline:
        result["baseline"] = run_baseline(args.baseline_ref or baseline_ref(), args)
    result.update(
        {
            "turns": args.turns,
            "seed": args.seed,
            "max_output_tokens": MAX_OUTPUT,
            "total_seconds": round(time.perf_counter() - started, 1),
            "machine": (
                f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
            ),
        }
    )
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
