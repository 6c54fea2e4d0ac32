"""``AgentTranscripts``: with several agents, each memory index lists only its own
agent's transcripts (``gateway.memory``)."""

from __future__ import annotations

import json
from pathlib import Path

from parley.core.memory.sources import FileTranscriptSource
from parley.gateway.memory import AgentTranscripts, transcript_agent


def _header(key: str, **meta: str) -> str:
    return json.dumps({"type": "session", "id": "x", "key": key, "meta": meta}) + "\n"


def _names(source: AgentTranscripts) -> list[str]:
    return [s.path for s in source.transcripts()]


def test_each_agent_lists_its_own_transcripts_only(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(_header("agent:main:telegram:direct:1") + "{}\n")
    (tmp_path / "b.jsonl").write_text(_header("agent:work:telegram:direct:1"))
    (tmp_path / "c.jsonl").write_text("not a transcript\n")  # names no agent
    (tmp_path / "d.jsonl").write_text('{"type": "session", "key": "agent:wo')  # half written
    (tmp_path / "e.jsonl").write_text("")
    long_meta = _header("agent:work:web:direct:2", note="n" * 10_000)  # past the first peek
    (tmp_path / "f.jsonl").write_text(long_meta)
    files = FileTranscriptSource(tmp_path)
    main = AgentTranscripts(files, "main", default=True)
    work = AgentTranscripts(files, "work", default=False)
    assert _names(main) == ["sessions/a.jsonl", "sessions/c.jsonl"]
    assert _names(work) == ["sessions/b.jsonl", "sessions/f.jsonl"]
    # Once its header is complete, the half-written one is its agent's.
    (tmp_path / "d.jsonl").write_text(_header("agent:work:web:direct:3"))
    assert _names(work) == ["sessions/b.jsonl", "sessions/d.jsonl", "sessions/f.jsonl"]
    assert "sessions/d.jsonl" not in _names(main)


def test_transcript_agent_reads_the_key_then_the_meta() -> None:
    assert transcript_agent(_header("agent:work:main").encode()) == "work"
    assert transcript_agent(_header("odd", agent="home").encode()) == "home"
    assert transcript_agent(b"[]\n") is None
