"""bench/compaction_strategies.py in quick mode: the strategies on one short synthetic
conversation, automatic recall on the tiny LoCoMo-format file of ``test_locomo`` (no real
LoCoMo data is read), and the one JSON object the script prints."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from parley.core.context.compaction.summarizer import REQUIRED_HEADINGS
from parley.core.tokens import default_counter
from tests.gateway.cli.test_locomo import SCORED, locomo_data

BENCH_PATH = Path(__file__).resolve().parents[2] / "bench" / "compaction_strategies.py"
STRATEGY_KEYS = {"tokens_before", "tokens_after", "facts_planted", "facts_kept", "lost"}


def _load_bench() -> ModuleType:
    # bench/ is a folder of scripts, not a package: load the file as a module.
    spec = importlib.util.spec_from_file_location("bench_compaction_strategies", BENCH_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


@pytest.fixture
def locomo_file(tmp_path: Path) -> Path:
    path = tmp_path / "locomo-tiny.json"
    path.write_text(json.dumps(locomo_data()), encoding="utf-8")
    return path


def test_conversations_are_seeded_and_carry_every_fact_kind() -> None:
    one = bench.generate_conversation("c0", messages=160, facts=10, seed=3)
    two = bench.generate_conversation("c0", messages=160, facts=10, seed=3)
    other = bench.generate_conversation("c0", messages=160, facts=10, seed=4)
    assert one.messages == two.messages and one.facts == two.facts
    assert one.facts != other.facts
    assert len(one.messages) >= 160 and len(one.facts) == 10
    assert {f.kind for f in one.facts} == set(bench.FACT_KINDS)
    text = bench.view_text(one.messages)
    assert all(bench.collapse(f.needle) in text for f in one.facts)
    errors = [b for m in one.messages for b in m.content if getattr(b, "is_error", False)]
    assert errors, "tool errors are planted as error results"


def test_extractive_summary_keeps_important_sentences_within_budget() -> None:
    counter = default_counter()
    prompt = (
        "<conversation>\n[User]: ok thanks\n[User]: We decided to use Redis because it is fast."
        " The weather is mild.\n[Tool result (error)]: Error: upload of UP-12345 failed.\n"
        "</conversation>\n\nSummarise the conversation above."
    )
    text = bench.extractive_summary(prompt, 1000, counter)
    assert [line for line in text.splitlines() if line.startswith("## ")] == list(REQUIRED_HEADINGS)
    assert "We decided to use Redis because it is fast." in text
    assert "upload of UP-12345 failed" in text
    assert "weather" not in text and "ok thanks" not in text
    tight = bench.extractive_summary(prompt, 20, counter)
    assert "upload of UP-12345 failed" in tight  # the error outranks the decision
    assert "Redis" not in tight


async def test_strategies_quick(tmp_path: Path) -> None:
    result = await bench.run_strategies(
        conversations=1,
        messages=160,
        facts=10,
        seed=9,
        window=bench.QUICK_WINDOW,
        work_dir=tmp_path,
    )
    assert set(result) == set(bench.STRATEGIES)
    for name, row in result.items():
        assert set(row) >= STRATEGY_KEYS, name
        assert 0 <= row["facts_kept"] <= row["facts_planted"] == 10
        assert row["facts_kept"] + len(row["lost"]) == row["facts_planted"]
        assert row["strategy_used"] == [name]  # compacted by the strategy asked for
        assert 0 < row["tokens_after"] < row["tokens_before"]
    others = [result[n]["facts_kept"] for n in bench.STRATEGIES if n != "sliding-window"]
    assert result["sliding-window"]["facts_kept"] < min(others)


async def test_auto_recall_on_tiny_locomo(locomo_file: Path, tmp_path: Path) -> None:
    result = await bench.run_auto_recall(locomo_file, embedder="none", work_dir=tmp_path)
    assert result["questions"] == SCORED
    shares = [*result["evidence_injected_share"].values(), result["memory_search_share_1500"]]
    assert set(result["evidence_injected_share"]) == {"auto", "always"}
    assert all(0.0 <= s <= 1.0 for s in shares)
    assert all(0.0 <= s <= 1.0 for s in result["evidence_recall_mean"].values())
    assert 0.0 <= result["auto_triggered_share"] <= 1.0
    # always searches at least whenever auto does, on the same index.
    injected = result["evidence_injected_share"]
    assert injected["always"] >= injected["auto"]
    assert all(0 <= t <= bench.RECALL_BUDGET for t in result["tokens_injected_p50"].values())
    assert result["embedder"]["provider"] == "none"


def test_main_prints_one_json_object(locomo_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--quick", "--data", str(locomo_file)])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    result = json.loads(out[0])
    assert {"strategies", "auto_recall", "machine", "date"} <= set(result)
    assert set(result["strategies"]) == set(bench.STRATEGIES)
    assert result["parameters"]["quick"] is True
    # --quick reads only the first LoCoMo conversation.
    assert result["auto_recall"]["conversations"] == 1
    assert 0 < result["auto_recall"]["questions"] < SCORED


def test_main_reports_a_bad_data_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--quick", "--data", str(bad)])
    assert exc.value.code == 2
