"""Crash soak: the real gateway process, killed with SIGKILL again and again.

The driver runs the protocol fakes on 127.0.0.1 (the Telegram Bot API and the
Anthropic API the tests use) and starts `parley run` as a child process pointed at
them: polling Telegram, lanes in ``queue`` mode (one reply per message), a small
context window so sessions compact, and long-term memory on (keyword index by default;
``--embedder e5`` adds vectors), so automatic recall puts earlier messages at the head
of each new one. The fake model starts each reply with ``reply-to: c<chat> m<n>``,
the last marker of the user's own words (``bench/reply_tags.py``), and only that tag
counts: a reply is not matched by whatever marker comes first in it.

It pushes ``--messages`` messages over ``--sessions`` private chats, in waves, and
after each wave kills the process with SIGKILL at a random moment (``--kills`` in
all) and starts it again. Kills land wherever the process happens to be: appending
to a transcript, compacting, indexing memory, updating the registry, sending. After
the last restart it waits until every message is answered (or nothing moves for
``--settle`` seconds), stops the process with SIGTERM, and checks:

- answered / lost / answered_twice: replies naming each message, at the fake;
  out_of_order: a reply naming an earlier message of its chat than a reply before it;
  untagged_replies: messages the bot sent that name none (error or "busy" notices);
  of answered_twice, answered_twice_one_turn_resent: one turn in the transcript, its
  reply sent again because a kill landed between Telegram accepting it and the delivery
  being recorded (the Bot API has no idempotency key), and answered_twice_by_two_turns:
  two replies in the transcripts for one message (the product answering twice);
- resends_avoided / delivery_lookups: replies in that window that the restart found
  at Telegram instead of sending again, and the Bot API calls spent looking;
- corrupt_transcripts: a transcript that does not open, or has a corrupt line (a
  torn tail from a kill is repaired on load and is not counted);
- registry_mismatches: a session row whose entry count or last entry id disagrees
  with its transcript;
- index_errors: memory.db failing SQLite's integrity check or FTS5's, or chunks
  missing from the keyword index.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the protocol fakes live in tests/fakes

from bench.reply_tags import (  # noqa: E402
    Tally,
    anthropic_reply,
    anthropic_texts,
    final_texts,
    is_flush,
    names_others,
    replied_to,
    tally,
)
from parley.core.context.compaction.summarizer import REQUIRED_HEADINGS as HEADINGS  # noqa: E402
from parley.core.context.compaction.summarizer import SUMMARY_SYSTEM_PROMPT  # noqa: E402
from parley.core.memory.store import MemoryStore  # noqa: E402
from parley.core.transcript import Transcript  # noqa: E402
from tests.fakes.anthropic_api import FakeAnthropic  # noqa: E402
from tests.fakes.llm_common import Reply  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402

TOKEN = "700002:soak-token"
MODEL = "claude-soak-model"
FILLER = (
    "the quarterly report mentions the harbour crane, the blue teapot and the north gate "
    "while the team discusses budgets, invoices, deadlines and the spare key "
)
CONFIG = f"""
[agent]
max_output_tokens = 256

[providers]
default = "anthropic"

[providers.anthropic]
model = "{MODEL}"

[providers.retry]
max_attempts = 2
base_delay_seconds = 0.05
max_delay_seconds = 0.2

[context.models."{MODEL}"]
context_tokens = 16000

[lanes]
mode = "queue"
queue_cap = 200  # the driver queues up to 40 per chat; "busy" replies are not the point here

[session]
timezone = "UTC"

[session.reset]
mode = "off"

[channels.telegram]
dm_policy = "open"
poll_timeout_seconds = 1

[http]
enabled = false

[logging]
level = "WARNING"
"""


def is_summary(body: dict[str, Any]) -> bool:
    return SUMMARY_SYSTEM_PROMPT in json.dumps(body.get("system", ""))


# With ``--streaming`` on: the model writes each reply in pieces this big, this far
# apart, so the channel shows drafts and kills land in the middle of them.
STREAM_CHUNK_CHARS = 160
STREAM_CHUNK_SECONDS = 0.03


def respond(body: dict[str, Any], *, streaming: bool = False) -> Reply:
    """A turn's reply starts ``reply-to: c<chat> m<n>``, naming the message it answers
    (``bench/reply_tags.py``), then echoes the user's words; a summary request gets a
    short well-formed summary, as a real model would write, so compaction shrinks the
    view."""
    if is_summary(body):
        sections = "\n".join(f"{heading}\n- the user sent numbered notes" for heading in HEADINGS)
        return Reply(text=sections)
    reply = anthropic_reply(body)
    if streaming:
        reply = dataclasses.replace(
            reply, chunk_chars=STREAM_CHUNK_CHARS, chunk_seconds=STREAM_CHUNK_SECONDS
        )
    return reply


def child_env(
    home: Path, token: str, fake: FakeTelegram, llm: FakeAnthropic, **extra: str
) -> dict[str, str]:
    """The environment of a `parley run` child on the two fakes (no proxies: loopback)."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(
        {
            "PARLEY_HOME": str(home),
            "TELEGRAM_BOT_TOKEN": token,
            "TELEGRAM_API_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": llm.api_key,
            "ANTHROPIC_BASE_URL": llm.base_url,
            "HF_HUB_OFFLINE": "1",
            "PTB_TIMEDELTA": "1",
            **extra,
        }
    )
    return env


class Child:
    """`parley run` in a process group of its own, killed and restarted on demand."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        argv: Sequence[str] = ("-m", "parley.gateway.cli.main", "run"),
    ) -> None:
        self.env = env
        self.log = log
        # What follows the interpreter: `parley run` unless a benchmark runs another bot
        # (load.py's bare baseline) under the same start/stop handling.
        self.argv = tuple(argv)
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"\n--- start {self.starts} ---\n".encode())
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, *self.argv,
                env=self.env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip

    async def kill(self) -> None:
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    async def stop(self) -> int | None:
        process = self.process
        if process is None or process.returncode is not None:
            return None if process is None else process.returncode
        process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(process.wait(), 60)
        except TimeoutError:
            await self.kill()
            return None


def replies(fake: FakeTelegram) -> Tally:
    """Replies naming each (chat, message) in their ``reply-to:`` tag. Only the tag
    counts: the echo after it, recalled earlier messages included, names nothing."""
    return tally(final_texts(fake))


def unfinished(texts: list[str], filler: int) -> int:
    """Messages that name a message but do not end as its reply does: a draft a kill
    left half written (every reply echoes the user's words, which end in filler)."""
    tail = (FILLER * filler).strip()[-24:]
    return sum(1 for text in texts if replied_to(text) and tail and not text.endswith(tail))


def check_transcripts(
    home: Path,
) -> tuple[int, int, int, dict[str, tuple[int, str | None]], Counter[tuple[int, int]]]:
    """(corrupt, torn tails left, compactions, {session id: (entry count, last id)},
    turns: how many assistant replies in the transcripts answer each message)."""
    corrupt = torn = compactions = 0
    found: dict[str, tuple[int, str | None]] = {}
    turns: Counter[tuple[int, int]] = Counter()
    for path in sorted((home / "sessions").glob("*.jsonl")):
        try:
            transcript = Transcript.open(path, read_only=True)
        except Exception:
            corrupt += 1
            continue
        with transcript:
            report = transcript.load_report
            entries = list(transcript.entries())
            if report.corrupt_lines or len(entries) != transcript.entry_count:
                corrupt += 1
            torn += report.torn_tail_action != "none"
            compactions += sum(1 for e in entries if e.type == "compaction")
            for entry in entries:
                message = entry.message if entry.type == "message" else None
                if message is not None and message.role == "assistant":
                    turns.update(replied_to(message.text))
            last = entries[-1].id if entries else None
            found[path.stem] = (transcript.entry_count, last)
    return corrupt, torn, compactions, found, turns


def check_registry(home: Path, transcripts: dict[str, tuple[int, str | None]]) -> int:
    conn = sqlite3.connect(home / "state.db")
    try:
        rows = conn.execute("SELECT session_id, entry_count, last_entry_id FROM sessions")
        mismatches = 0
        for session_id, count, last in rows:
            if transcripts.get(session_id) != (count, last):
                mismatches += 1
        return mismatches
    finally:
        conn.close()


def inbox_counts(home: Path) -> dict[str, int]:
    conn = sqlite3.connect(home / "state.db")
    try:
        return dict(conn.execute("SELECT status, count(*) FROM inbox GROUP BY status").fetchall())
    finally:
        conn.close()


def check_index(home: Path) -> tuple[int, list[str]]:
    """The index's own check (SQLite, both FTS5 tables, chunks missing from them)."""
    errors: list[str] = []
    paths = list((home / "memory").glob("*/memory.db"))
    for path in paths:
        store = MemoryStore.open(path)
        try:
            errors += [f"{path}: {problem}" for problem in store.integrity_check()]
        finally:
            store.close()
    return len(paths), errors


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="parley-soak-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        (home / "parley.toml").write_text(CONFIG, encoding="utf-8")
        async with FakeTelegram(length_unit="utf16") as fake, FakeAnthropic() as llm:
            fake.add_bot(TOKEN, "soak_bot", bot_id=int(TOKEN.split(":")[0]))
            streams = args.streaming != "off"
            llm.responder = functools.partial(respond, streaming=streams)
            env = child_env(
                home,
                TOKEN,
                fake,
                llm,
                PARLEY_MEMORY__EMBEDDER__PROVIDER=args.embedder,
                PARLEY_CHANNELS__TELEGRAM__STREAMING=args.streaming,
            )
            child = Child(env, Path(tmp) / "parley.log")
            chats = [6000 + i for i in range(args.sessions)]
            plan = [(chat, n) for n in range(args.messages // args.sessions) for chat in chats]
            waves = [plan[i :: args.kills] for i in range(args.kills)]
            await child.start()
            for wave in waves:
                for chat, n in sorted(wave, key=lambda cm: cm[1]):
                    fake.push_message(
                        TOKEN, chat_id=chat, text=f"c{chat} m{n} {FILLER * args.filler}"
                    )
                # Let the process get into the wave, then kill it wherever it is.
                await asyncio.sleep(rng.uniform(0.05, args.max_gap))
                await child.kill()
                await child.start()
            wanted = set(plan)
            last_progress, answered = time.monotonic(), 0
            while time.monotonic() - last_progress < args.settle:
                texts = final_texts(fake)
                counts = tally(texts).counts
                now_answered = len(wanted & set(counts))
                # Streaming: a draft names its message before the reply is finished.
                if now_answered == len(wanted) and not unfinished(texts, args.filler):
                    break
                if now_answered != answered:
                    answered, last_progress = now_answered, time.monotonic()
                await asyncio.sleep(0.5)
            exit_code = await child.stop()
            sent = replies(fake)
            half_written = unfinished(final_texts(fake), args.filler)
            edits = fake.call_counts["editMessageText"]
            counts = sent.counts
            pending = len(fake.pending_updates(TOKEN))
            # Turns whose user message also held other messages' markers (recalled at
            # its head): each would have fooled a match by the first marker in a reply.
            recalling = sum(
                names_others(anthropic_texts(body))
                for body in llm.requests_bodies
                if not is_summary(body) and not is_flush(anthropic_texts(body))
            )
        corrupt, torn, compactions, transcripts, turns = check_transcripts(home)
        mismatches = check_registry(home, transcripts)
        indexes, index_errors = check_index(home)
        log_text = (Path(tmp) / "parley.log").read_text(errors="replace")
        if args.keep is not None:  # for reading a run's home and log afterwards
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
            (args.keep / "sent.json").write_text(json.dumps(
                [{"chat": m.chat_id, "id": m.message_id, "text": m.visible_text[:80],
                  "now": fake.message_text(m.chat_id, m.message_id) or ""}
                 for m in fake.sent]
            ))  # fmt: skip
        log_tail = log_text[-3000:]
        probes = sum(1 for call in fake.calls if call.method == "editMessageReplyMarkup")
        inbox = inbox_counts(home)
    answered_set = set(counts) & set(plan)
    result: dict[str, Any] = {
        "messages": len(plan),
        "sessions": args.sessions,
        "kills": args.kills,
        "answered": len(answered_set),
        "lost": len(plan) - len(answered_set),
        "answered_twice": sum(1 for key in plan if counts[key] > 1),
        # Of those: one turn (one reply in the transcript) sent again after a kill that
        # landed between the platform accepting it and the delivery being recorded (no
        # idempotency key on Telegram), or two turns answering one message (a product bug).
        "answered_twice_one_turn_resent": sum(
            1 for key in plan if counts[key] > 1 and turns[key] <= 1
        ),
        "answered_twice_by_two_turns": sum(1 for key in plan if turns[key] > 1),
        # Replies a kill left in doubt that the restart found at Telegram (so did not
        # send again), and the Bot API calls it took to look (gateway.send_recovery).
        "resends_avoided": log_text.count("were delivered before the restart ("),
        "delivery_lookups": probes,
        "resent_in_doubt": log_text.count("sending each reply again"),
        "lookups_refused": log_text.count("cannot tell whether"),
        "out_of_order": sent.out_of_order,
        "untagged_replies": sent.untagged,
        # Streaming: replies a kill left half written (never finished), and the edits.
        "streaming": args.streaming,
        "unfinished_replies": half_written,
        "draft_edits": edits,
        "turns_naming_other_messages": recalling,
        "corrupt_transcripts": corrupt,
        "registry_mismatches": mismatches,
        "index_errors": len(index_errors),
        "torn_tails_left": torn,
        "transcripts": len(transcripts),
        "compactions": compactions,
        "memory_indexes": indexes,
        "final_exit_code": exit_code,
        "seconds": round(time.perf_counter() - started, 1),
        "embedder": args.embedder,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    if index_errors:
        result["index_error_samples"] = index_errors[:3]
    result["busy_replies"] = inbox.get("rejected", 0)
    # Which ones, to find them in the log and the transcripts.
    lost = [f"c{c} m{n}" for c, n in plan if not counts[(c, n)]]
    twice = [f"c{c} m{n}" for c, n in plan if counts[(c, n)] > 1]
    if lost:
        result["lost_messages"] = lost[:20]
    if twice:
        result["answered_twice_messages"] = twice[:20]
    if result["lost"]:
        result["inbox"] = inbox
        result["updates_pending_at_telegram"] = pending
    if result["lost"] or exit_code not in (0, None):
        result["log_tail"] = log_tail
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--max-gap", type=float, default=3.0, help="seconds before a kill")
    parser.add_argument("--settle", type=float, default=60.0, help="give up after no progress")
    parser.add_argument("--filler", type=int, default=12, help="repeats of filler text")
    parser.add_argument("--embedder", default="none", choices=["none", "e5"])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--streaming",
        default="partial",  # the channels' default
        choices=["off", "partial", "block"],
        help="the channel's streaming; on, the model writes each reply in timed pieces",
    )
    parser.add_argument("--keep", type=Path, help="copy the home, log and sends here")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
