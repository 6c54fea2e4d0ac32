"""The LoCoMo benchmark module on a tiny synthetic conversation file written here in
LoCoMo's format (two samples, a spare session date, malformed evidence, an int answer, a
category-5 item): parsing, transcripts, scoring under a budget, and a whole run through
``run_locomo`` and ``parley bench locomo``. No real LoCoMo data is read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from parley.core.memory.chunking import transcript_turns
from parley.core.memory.embedders import EmbedderSettings
from parley.core.memory.memory_config import MemorySettings
from parley.core.prompt import is_turn_context
from parley.core.tokens import default_counter
from parley.core.transcript import Transcript
from parley.gateway.cli.locomo import (
    BUDGETS,
    LocomoError,
    found_dia_ids,
    load_locomo,
    recall_within,
    run_locomo,
    write_transcripts,
)
from parley.gateway.cli.main import main
from tests.gateway.memory_helpers import restored_logging

S1_SESSION_1 = [
    ("Marisol", "D1:1", "I adopted a tortoise named Gribble last weekend."),
    ("Teodor", "D1:2", "Gribble is a wonderful name! Where did you find him?"),
    ("Marisol", "D1:3", "At the reptile rescue on Harbour Street, next to the bakery."),
    ("Teodor", "D1:4", "I have been learning to bake sourdough bread on Sundays."),
]
S1_SESSION_2 = [
    ("Marisol", "D2:1", "Gribble ate three strawberries this morning."),
    ("Teodor", "D2:2", "My sourdough starter is called Doughbert and it bubbles happily."),
    ("Marisol", "D2:3", "I signed up for a pottery class that starts in July."),
]
S2_SESSION_1 = [
    ("Oluwaseun", "D1:1", "I restored a vintage zeppelin model called Skyhopper."),
    ("Brigid", "D1:2", "Skyhopper sounds majestic, what colour is the envelope?"),
    ("Oluwaseun", "D1:3", "It is silver, and I keep it in the attic next to my telescope."),
]
S2_SESSION_3 = [
    ("Brigid", "D3:1", "I planted crimson tulips along the garden fence."),
    ("Oluwaseun", "D3:2", "The telescope showed Saturn and its rings last night."),
]
SAMPLE_2_WORDS = ("zeppelin", "Skyhopper", "telescope", "tulips", "Saturn", "attic")


def turns(rows: list[tuple[str, str, str]]) -> list[dict[str, str]]:
    return [{"speaker": s, "dia_id": d, "text": t} for s, d, t in rows]


def locomo_data() -> list[dict[str, Any]]:
    return [
        {
            "sample_id": "s1",
            "conversation": {
                "speaker_a": "Marisol",
                "speaker_b": "Teodor",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": turns(S1_SESSION_1),
                "session_2_date_time": "10:15 am on 12 June, 2023",
                "session_2": turns(S1_SESSION_2),
                "session_3_date_time": "9:00 am on 1 July, 2023",  # spare: no session_3
            },
            "qa": [
                {"question": "What is the name of Marisol's tortoise?", "answer": "Gribble",
                 "evidence": ["D1:1"], "category": 1},
                {"question": "When did Marisol adopt the tortoise Gribble?",
                 "answer": "the weekend before 8 May 2023", "evidence": ["D1:1; D2:1"],
                 "category": 2},
                {"question": "How many strawberries did Gribble eat?", "answer": 3,
                 "evidence": ["D:2:1"], "category": 3},
                {"question": "What is Teodor's sourdough starter called?",
                 "answer": "Doughbert", "evidence": ["D2:2"], "category": 4},
                {"question": "What did Marisol name her zeppelin?",
                 "adversarial_answer": "Skyhopper", "evidence": ["D1:1"], "category": 5},
                {"question": "What is Marisol's favourite colour?", "answer": "unknown",
                 "evidence": [], "category": 4},
            ],
            "event_summary": {"events_session_1": {"Marisol": ["adopts Gribble"]}},
        },
        {
            "sample_id": "s2",
            "conversation": {
                "speaker_a": "Oluwaseun",
                "speaker_b": "Brigid",
                "session_1_date_time": "3:30 pm on 2 February, 2024",
                "session_1": turns(S2_SESSION_1),
                "session_2_date_time": "4:00 pm on 9 February, 2024",  # spare, mid-way
                "session_3_date_time": "11:05 am on 20 March, 2024",
                "session_3": turns(S2_SESSION_3),
            },
            "qa": [
                {"question": "What did Oluwaseun call the zeppelin model?",
                 "answer": "Skyhopper", "evidence": ["D1:1"], "category": 1},
                {"question": "Where does Oluwaseun keep the zeppelin model?",
                 "answer": "in the attic", "evidence": ["D1:3"], "category": 3},
                {"question": "What did Brigid plant along the fence?",
                 "answer": "crimson tulips", "evidence": ["D3:1"], "category": 2},
            ],
        },
    ]  # fmt: skip


QUESTIONS = {"s1": 6, "s2": 3}
SCORED = 7  # every question of categories 1-4 with evidence in the conversation
TURN_TEXTS = {
    "s1": {d: t for _, d, t in S1_SESSION_1 + S1_SESSION_2},
    "s2": {d: t for _, d, t in S2_SESSION_1 + S2_SESSION_3},
}


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_locomo.json"
    path.write_text(json.dumps(locomo_data()), encoding="utf-8")
    return path


@pytest.fixture
def keep_logging() -> Iterator[None]:
    with restored_logging():
        yield


def collapse(text: str) -> str:
    return " ".join(text.split())


# -- load_locomo ---------------------------------------------------------------------------


def test_load_reads_sessions_turns_and_questions(data_file: Path) -> None:
    s1, s2 = load_locomo(data_file)
    assert (s1.sample_id, s1.speaker_a, s1.speaker_b) == ("s1", "Marisol", "Teodor")
    assert [t.dia_id for t in s1.turns] == ["D1:1", "D1:2", "D1:3", "D1:4", "D2:1", "D2:2", "D2:3"]
    assert [t.session for t in s1.turns] == [1, 1, 1, 1, 2, 2, 2]
    assert s1.turns[0].when == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert s1.turns[4].when == datetime(2023, 6, 12, 10, 15, tzinfo=UTC)
    assert s1.turns[1].speaker == "Teodor" and s1.turns[1].text == S1_SESSION_1[1][2]
    # A spare date key in the middle: session 3 is still read, under its own number.
    assert [(t.dia_id, t.session) for t in s2.turns] == [
        ("D1:1", 1), ("D1:2", 1), ("D1:3", 1), ("D3:1", 3), ("D3:2", 3),
    ]  # fmt: skip
    assert s2.turns[3].when == datetime(2024, 3, 20, 11, 5, tzinfo=UTC)
    assert [q.index for q in s1.questions] == list(range(6))
    assert [q.category for q in s1.questions] == [1, 2, 3, 4, 5, 4]
    assert s1.questions[0].question == "What is the name of Marisol's tortoise?"


def test_load_tolerates_malformed_evidence(data_file: Path) -> None:
    s1, s2 = load_locomo(data_file)
    evidence = [q.evidence for q in s1.questions]
    assert evidence == [
        frozenset({"D1:1"}),
        frozenset({"D1:1", "D2:1"}),  # 'D1:1; D2:1'
        frozenset({"D2:1"}),  # 'D:2:1'
        frozenset({"D2:2"}),
        frozenset({"D1:1"}),
        frozenset(),
    ]
    assert [q.evidence for q in s2.questions] == [
        frozenset({"D1:1"}), frozenset({"D1:3"}), frozenset({"D3:1"}),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "content",
    [
        "not json at all",
        json.dumps({"sample_id": "s1"}),  # not a list
        json.dumps([{"sample_id": "s1", "qa": []}]),  # no conversation
        json.dumps([{"sample_id": "s1", "conversation": {"speaker_a": "A"}, "qa": []}]),
        json.dumps(
            [{"sample_id": "s1", "qa": [],
              "conversation": {"speaker_a": "A", "speaker_b": "B",
                               "session_1": turns(S1_SESSION_1),
                               "session_1_date_time": "yesterday-ish"}}]
        ),
        json.dumps(
            [{"sample_id": "s1", "qa": [],
              "conversation": {"speaker_a": "A", "speaker_b": "B",
                               "session_1": [{"speaker": "A", "text": "no dia_id"}],
                               "session_1_date_time": "1:56 pm on 8 May, 2023"}}]
        ),
        json.dumps(
            [{"sample_id": "s1", "conversation": {"speaker_a": "A", "speaker_b": "B"},
              "qa": [{"question": "q?", "evidence": [], "category": "five"}]}]
        ),
        json.dumps([{"sample_id": "s1", "conversation": {"speaker_a": "A", "speaker_b": "B"}}]),
    ],
)  # fmt: skip
def test_load_refuses_a_bad_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LocomoError):
        load_locomo(path)


def test_load_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(LocomoError, match="cannot read"):
        load_locomo(tmp_path / "nowhere.json")


def test_load_refuses_a_sample_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(["not a sample"]), encoding="utf-8")
    with pytest.raises(LocomoError):
        load_locomo(path)


# -- write_transcripts ---------------------------------------------------------------------


def test_write_transcripts_writes_real_transcripts(data_file: Path, tmp_path: Path) -> None:
    s1, _ = load_locomo(data_file)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    assert write_transcripts(s1, sessions, "locomo:s1") == 7
    assert sorted(p.name for p in sessions.iterdir()) == ["s1-s01.jsonl", "s1-s02.jsonl"]
    with Transcript.open(sessions / "s1-s01.jsonl", read_only=True) as transcript:
        header = transcript.header
        entries = list(transcript.entries())
    assert header.key == "agent:locomo:bench:direct:s1"
    assert header.meta["agent_name"] == "Teodor"
    assert header.meta["memory_scope"] == "locomo:s1"
    assert [e.message.role for e in entries] == ["user", "assistant", "user", "assistant"]
    first = entries[0].message
    assert first.content[0].text == S1_SESSION_1[0][2]
    assert is_turn_context(first.content[1])
    assert "from: Marisol [s1]" in first.content[1].text
    assert entries[1].message.text == S1_SESSION_1[1][2]
    # Entry times are the session's date, in order within the session.
    assert [e.ts for e in entries] == [
        "2023-05-08T13:56:00.000Z", "2023-05-08T13:56:01.000Z",
        "2023-05-08T13:56:02.000Z", "2023-05-08T13:56:03.000Z",
    ]  # fmt: skip
    # The index reads them as the conversation between the two named speakers.
    raw = (sessions / "s1-s02.jsonl").read_text(encoding="utf-8").splitlines()
    read = transcript_turns(enumerate(raw, start=1))
    assert [(t.speaker, t.text) for t in read] == [(s, t) for s, _, t in S1_SESSION_2]
    assert read[0].ts == "2023-06-12T10:15:00.000Z"


# -- scoring -------------------------------------------------------------------------------


def test_found_dia_ids_needs_the_whole_turn_text() -> None:
    known = {
        "D1:1": "I adopted a tortoise named Gribble last weekend.",
        "D1:2": "Gribble is a wonderful name!",
        "D1:3": "",
    }
    snippet = (
        "[2023-05-08 13:56] Marisol: I adopted a   tortoise\nnamed Gribble last weekend.\n"
        "Teodor: Gribble is a wonderful"
    )
    assert found_dia_ids(snippet, known) == ["D1:1"]
    assert found_dia_ids("nothing here", known) == []


COUNTER = default_counter()
A = "Marisol: I adopted a tortoise named Gribble last weekend."
B = "Teodor: My sourdough starter is called Doughbert."
C = "Marisol: Gribble ate three strawberries this morning."
TURNS = {"D1:1": A, "D2:2": B, "D2:1": C}
FILLER = " And then we talked about the weather for a long while, on and on." * 4


def tokens(text: str) -> int:
    return COUNTER.text(text)


def test_recall_reads_results_in_rank_order_until_the_budget() -> None:
    results = [(A, ["D1:1"]), (B + FILLER, ["D2:2"]), (C, ["D2:1"])]
    first = tokens(A)
    whole_b = tokens(B)
    # Preconditions about the tokenizer the cases below rely on.
    assert COUNTER.prefix(B + FILLER, whole_b) == B
    assert B not in COUNTER.prefix(B + FILLER, whole_b - 1)
    budgets = (first - 1, first, first + whole_b - 1, first + whole_b, 10_000)
    # Evidence in the first result: in once the budget covers it whole.
    assert recall_within(results, {"D1:1"}, TURNS, budgets) == [0.0, 1.0, 1.0, 1.0, 1.0]
    # Evidence at the start of a result cut at the budget: in when the cut leaves it whole.
    assert recall_within(results, {"D2:2"}, TURNS, budgets) == [0.0, 0.0, 0.0, 1.0, 1.0]
    # Evidence beyond the cut: the reading stops there, though the result is short.
    assert recall_within(results, {"D2:1"}, TURNS, budgets) == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert recall_within(results, {"D1:1", "D2:2"}, TURNS, budgets) == [
        0.0, 0.5, 0.5, 1.0, 1.0,
    ]  # fmt: skip


def test_recall_stops_at_the_first_result_that_does_not_fit() -> None:
    big = A + FILLER
    results = [(big, ["D1:1"]), (C, ["D2:1"])]
    budget = tokens(big) - 1
    assert tokens(C) < budget
    assert recall_within(results, {"D2:1"}, TURNS, (budget,)) == [0.0]
    # The cut result still counts for what it shows whole.
    assert recall_within(results, {"D1:1"}, TURNS, (budget,)) == [1.0]


def test_recall_is_none_without_known_evidence_and_zero_without_results() -> None:
    assert recall_within([(A, ["D1:1"])], set(), TURNS) is None
    assert recall_within([(A, ["D1:1"])], {"D9:9"}, TURNS) is None
    assert recall_within([], {"D1:1", "D9:9"}, TURNS) == [0.0] * len(BUDGETS)
    assert recall_within([(A, ["D1:1"])], {"D1:1", "D9:9"}, TURNS, (1000,)) == [1.0]


# -- run_locomo end to end -----------------------------------------------------------------


def read_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def check_results_file(path: Path, samples: dict[str, int]) -> list[dict[str, Any]]:
    lines = read_results(path)
    assert [(x["sample_id"], x["qa_index"]) for x in lines] == [
        (sample, i) for sample, count in samples.items() for i in range(count)
    ]
    for line in lines:
        assert set(line) == {"sample_id", "qa_index", "results"}
        own = TURN_TEXTS[line["sample_id"]]
        for result in line["results"]:
            assert set(result) == {"text", "dia_ids"}
            whole = [d for d, t in own.items() if collapse(t) in collapse(result["text"])]
            assert result["dia_ids"] == whole
    return lines


def check_summary(summary: dict[str, Any]) -> None:
    budget_keys = {str(b) for b in BUDGETS}
    assert BUDGETS == (250, 500, 1000, 2000)
    for table in (summary["recall"], summary["baseline_bm25_turns"]):
        assert table["n"] == SCORED
        assert set(table["all"]) == budget_keys
        values = [table["all"][str(b)] for b in BUDGETS]
        assert all(0.0 <= v <= 1.0 for v in values) and values == sorted(values)
        assert set(table["by_category"]) == {"1", "2", "3", "4"}
        assert {c: v["n"] for c, v in table["by_category"].items()} == {
            "1": 2, "2": 2, "3": 2, "4": 1,
        }  # fmt: skip
        for row in table["by_category"].values():
            assert set(row) == {"n"} | budget_keys
    assert 0 <= summary["search_ms_p50"] <= summary["search_ms_p95"]
    assert summary["index_seconds"] >= 0
    assert summary["chunks"] > 0 and summary["messages_indexed"] == 12
    assert summary["questions_scored"] == SCORED
    assert set(summary["embedder"]) == {"provider", "model", "dimensions", "fallback"}
    assert summary["sync_errors"] == []


async def test_run_locomo_end_to_end(data_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "RESULTS.jsonl"
    settings = MemorySettings(embedder=EmbedderSettings(provider="e5"))
    work = tmp_path / "work"
    work.mkdir()
    summary = await run_locomo(data_file, out, settings=settings, work_dir=work)
    assert list(work.iterdir()) == []  # the scratch home is gone
    lines = check_results_file(out, QUESTIONS)
    check_summary(summary)
    assert summary["bench"] == "locomo" and summary["conversations"] == 2
    assert summary["embedder"]["provider"] == "e5" and summary["embedder"]["dimensions"] == 384
    assert summary["results_file"] == str(out)
    # Easy questions: the evidence is found within the largest budget.
    assert summary["recall"]["by_category"]["1"]["2000"] == 1.0
    name = lines[0]  # "What is the name of Marisol's tortoise?"
    assert any("D1:1" in r["dia_ids"] for r in name["results"])
    # Each conversation is its own scope: sample 1 never sees sample 2's turns, not even
    # for a question made of sample 2's words.
    for line in lines:
        if line["sample_id"] != "s1":
            continue
        for result in line["results"]:
            assert not any(word in result["text"] for word in SAMPLE_2_WORDS), result
    zeppelin = lines[4]  # s1's category-5 question
    assert zeppelin["qa_index"] == 4 and all(
        "Skyhopper" not in r["text"] for r in zeppelin["results"]
    )
    s2_zeppelin = next(x for x in lines if x["sample_id"] == "s2" and x["qa_index"] == 0)
    assert any("Skyhopper" in r["text"] for r in s2_zeppelin["results"])


def test_bench_locomo_command(
    data_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    keep_logging: None,
) -> None:
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path / "home"))
    out = tmp_path / "RESULTS.jsonl"
    argv = ["bench", "locomo", "--data", str(data_file), "--out", str(out), "--embedder", "none"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert stdout.count("\n") == 1
    summary = json.loads(stdout)
    check_summary(summary)
    assert summary["embedder"]["provider"] == "none"
    assert summary["embedder"]["fallback"]
    check_results_file(out, QUESTIONS)
    # Keyword-only still finds a named thing.
    assert summary["recall"]["by_category"]["1"]["2000"] == 1.0

    assert main([*argv, "--conversations", "1"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["conversations"] == 1 and one["messages_indexed"] == 7
    check_results_file(out, {"s1": 6})


def test_bench_locomo_reports_a_bad_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    keep_logging: None,
) -> None:
    monkeypatch.setenv("PARLEY_HOME", str(tmp_path / "home"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}", encoding="utf-8")
    out = tmp_path / "RESULTS.jsonl"
    code = main(["bench", "locomo", "--data", str(bad), "--out", str(out), "--embedder", "none"])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert re.match(r"parley: expected a list of samples", captured.err)
    assert not out.exists()
