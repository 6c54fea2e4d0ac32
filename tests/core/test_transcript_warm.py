"""A transcript that lets go of its file and takes it up again (``suspend``/``resume``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from parley.core.errors import TranscriptError
from parley.core.messages import Message
from parley.core.transcript import Transcript


def filled(path: Path, turns: int = 3) -> Transcript:
    transcript = Transcript.create(path, "s1", "agent:main:test:direct:ann")
    for i in range(turns):
        transcript.append_message(Message.user(f"question {i}"))
        transcript.append_message(Message.assistant(f"answer {i}"))
    return transcript


def test_a_resumed_transcript_keeps_its_window_and_appends_where_the_file_ends(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s1.jsonl"
    transcript = filled(path)
    window = transcript.live_entries()
    transcript.suspend()
    assert transcript.closed
    with pytest.raises(TranscriptError):
        transcript.append_message(Message.user("while suspended"))
    assert transcript.resume()
    assert transcript.live_entries() is window  # nothing was read again
    transcript.append_message(Message.user("after"))
    transcript.close()
    reopened = Transcript.open(path)
    assert [e.message.text for e in reopened.live_entries()][-2:] == ["answer 2", "after"]
    assert reopened.load_report.clean
    reopened.close()


def test_a_file_another_writer_appended_to_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "s1.jsonl"
    transcript = filled(path)
    transcript.suspend()
    other = Transcript.open(path)
    other.append_message(Message.user("from elsewhere"))
    other.close()
    assert not transcript.resume()
    assert transcript.closed


def test_a_replaced_or_removed_file_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "s1.jsonl"
    transcript = filled(path)
    transcript.suspend()
    data = path.read_bytes()
    path.unlink()
    assert not transcript.resume()  # removed
    path.write_bytes(data)  # the same bytes, another file
    os.utime(path, ns=(0, 0))
    assert not transcript.resume()
    assert transcript.closed


def test_a_closed_transcript_cannot_be_resumed(tmp_path: Path) -> None:
    transcript = filled(tmp_path / "s1.jsonl")
    transcript.suspend()
    transcript.close()
    assert not transcript.resume()
