"""The isolation world of issue 19: people, groups, canaries, a seeded scenario
generator, a model that repeats every secret it is shown, and a checker that no canary
reaches a conversation outside its audience.

The audience rule, as this module states it independently of ``core.memory.audience``:

- a direct chat sees its person (every id the identity links join to it) and nothing
  else of anyone's: its canaries are the person's;
- a group (and its threads) sees itself: its canaries are the group's;
- nothing a person or group says is agent-wide, so no canary may ever sit in the
  workspace, where every conversation's file tools read.

A scenario drives the real ``Gateway`` (lanes, transcripts, state on SQLite or
PostgreSQL, the memory index, flushes, every compaction strategy) through a
``RecordingChannel`` per platform and a ``ScriptedProvider`` whose responder is
``EchoModel``: every reply, summary and flush note repeats every canary the request
showed, so a canary that slips into one conversation's context travels on into its
notes, summaries and replies, and any request, tool result, reply or ``/memory`` answer
of another audience that holds it is caught.

``ISOLATION_PRE_AUDIENCE=1`` leaves out what did not exist before audiences (``/remember``,
``/forget``, the ``remember`` tool, erasure, private notes): only for running the suite
against the code before issue 19, to show that it bites.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import inspect
import io
import json
import os
import random
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from PIL import Image

from parley.channels.base import Attachment, ChatPolicy
from parley.core.context.compaction.summarizer import REQUIRED_HEADINGS, SUMMARY_SYSTEM_PROMPT
from parley.core.messages import ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from parley.core.prompt import is_turn_context
from parley.core.providers.base import STOP_END, STOP_TOOL_USE, ProviderRequest, ProviderResponse
from parley.core.tokens import default_counter
from parley.gateway.app import Gateway
from parley.gateway.config import LoadedConfig, load_config
from tests.fakes.recording_channel import RecordingChannel
from tests.fakes.scripted_provider import ScriptedProvider

PRE_AUDIENCE = os.environ.get("ISOLATION_PRE_AUDIENCE") == "1"

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TODAY = f"{START:%Y-%m-%d}.md"
MODEL = "scripted-model"
FLUSH_MARK = "[memory flush]"
RECALL_MARK = "<recalled-memory>"
# Canary tokens: letters that are no hex digit, so no redaction or id normalisation
# (core.memory.redact, core.memory.tasks) takes them for a credential or an id.
TOKEN_ALPHABET = "ghjkmnpqrstvwxyz"
TOKEN_CHARS = 12
CANARY_RE = re.compile(r"CANARY-[A-Z0-9]+-[" + TOKEN_ALPHABET + r"]{" + str(TOKEN_CHARS) + r"}")
FOLDER_SAFE = "._@+~-"  # core.memory.audience: how an audience id becomes a folder name
FILLER = (
    "we went over the plan for the week, the shopping list, the train times and the "
    "weather, and agreed to talk again tomorrow about the details that are still open"
)


# -- who is in the world ------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """One raw id on one platform; ``person`` is who it is (the links join ids)."""

    channel: str
    sender: str
    person: str

    @property
    def scope_id(self) -> str:  # the product's person id: <channel>:<peer>
        return f"{self.channel}:{self.sender}"


ALICE = Identity("test", "alice", "alice")
ALICE2 = Identity("other", "alice2", "alice")  # linked: the same person as ALICE
BOB = Identity("test", "bob", "bob")
CAROL = Identity("test", "carol", "carol")
DAVE = Identity("other", "dave", "dave")
IDENTITIES = (ALICE, ALICE2, BOB, CAROL, DAVE)
IDENTITY_LINKS = '{ alice = ["test:alice", "other:alice2"] }'
CHANNELS = ("test", "other")


@dataclass(frozen=True)
class Conversation:
    name: str
    audience: str  # "person:<name>" or "group:<channel>:<chat>"
    channel: str
    chat_type: str  # direct | group | thread
    chat_id: str
    thread_id: str | None
    members: tuple[Identity, ...]

    @property
    def tag(self) -> str:
        return canary_tag(self.audience)


def _dm(who: Identity) -> Conversation:
    return Conversation(
        f"dm {who.channel}:{who.sender}",
        f"person:{who.person}",
        who.channel,
        "direct",
        who.sender,
        None,
        (who,),
    )


def _group(
    channel: str, chat: str, members: tuple[Identity, ...], thread: str | None = None
) -> Conversation:
    return Conversation(
        f"{'thread' if thread else 'group'} {channel}:{chat}{'/' + thread if thread else ''}",
        f"group:{channel}:{chat}",
        channel,
        "thread" if thread else "group",
        chat,
        thread,
        members,
    )


CONVERSATIONS: tuple[Conversation, ...] = (
    *(_dm(who) for who in IDENTITIES),
    _group("test", "g1", (ALICE, BOB)),
    _group("test", "g1", (ALICE, BOB), thread="t1"),  # a thread: its group's audience
    _group("test", "g2", (BOB, CAROL, ALICE)),
    _group("other", "g3", (ALICE2, DAVE)),
)
AUDIENCES = tuple(dict.fromkeys(c.audience for c in CONVERSATIONS))


def canary_tag(audience: str) -> str:
    return audience.rsplit(":", 1)[-1].upper()


def product_ids(audience: str) -> list[tuple[str, str]]:
    """(kind, id) of the product's audiences (``core.memory.audience``) for one of ours:
    a person's raw ids (one per linked id), a group's conversation id."""
    kind, _, rest = audience.partition(":")
    if kind == "person":
        return [("person", i.scope_id) for i in IDENTITIES if i.person == rest]
    return [("conversation", rest)]


def audience_of_scope(scope: str) -> str | None:
    """Our audience for a scope string of the product (None: agent-wide or unknown)."""
    kind, _, rest = scope.partition(":")
    if kind == "person":
        peer = rest.rsplit(":", 1)[-1]
        for who in IDENTITIES:
            if peer in (who.sender, who.person):
                return f"person:{who.person}"
        return None
    if kind == "conversation":
        return f"group:{rest}"
    # Before audiences: dm:<channel>:direct:<peer> (or dm:direct:<peer>) and
    # group:<channel>:group:<chat>[:thread:<id>], each searched by its own session only.
    parts = rest.split(":")
    if kind == "dm" and len(parts) >= 2 and parts[-2] == "direct":
        return audience_of_scope(f"person:{parts[-1]}")
    if kind == "group" and len(parts) >= 3 and parts[1] == "group":
        return f"group:{parts[0]}:{parts[2]}"
    return None


def transcript_audience(header_line: str) -> str | None:
    """Our audience for a stored transcript: its header's ``memory_scope``, else its key."""
    try:
        header = json.loads(header_line)
    except ValueError:
        return None
    meta = header.get("meta") if isinstance(header, dict) else None
    scope = meta.get("memory_scope") if isinstance(meta, dict) else None
    owner = audience_of_scope(scope) if isinstance(scope, str) else None
    key = header.get("key") if isinstance(header, dict) else None
    if owner is None and isinstance(key, str) and key.count(":") >= 3:
        rest = key.split(":", 2)[2]
        owner = audience_of_scope(("dm:" if ":group:" not in rest else "group:") + rest)
    return owner


def notes_path(kind: str, ident: str, name: str) -> str:
    """A note's display path (``core.memory.notes``): notes/<kind>/<folder>/<name>."""
    return f"notes/{kind}/{quote(ident, safe=FOLDER_SAFE)}/{name}"


# -- canaries -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Canary:
    """A secret of one audience: ``text`` is secret, ``handles`` are public words that
    name it (what another conversation would search for)."""

    text: str
    owner: str
    handles: tuple[str, str]
    step: int  # the step that first says it

    @property
    def phrase(self) -> str:
        return (
            f"Please keep this safe: {self.text} is the {self.handles[0]} {self.handles[1]} code."
        )

    @property
    def query(self) -> str:
        return f"{canary_tag(self.owner).lower()} {self.handles[0]} {self.handles[1]} code"


def pseudo_word(rng: random.Random) -> str:
    consonants, vowels = "bdfklmnprstvz", "aeiou"
    return "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(3))


# -- the scenario -------------------------------------------------------------------------

ToolCall = tuple[str, dict[str, Any]]


@dataclass
class Step:
    index: int
    kind: str
    conv: Conversation
    speaker: Identity | None
    text: str = ""
    rounds: list[list[ToolCall]] = field(default_factory=list)
    introduces: Canary | None = None
    target: Canary | None = None
    erase: str | None = None  # the person an erasure step erases

    def describe(self) -> str:
        who = f" by {self.speaker.channel}:{self.speaker.sender}" if self.speaker else ""
        return f"step {self.index} ({self.kind} in {self.conv.name}{who})"


@dataclass(frozen=True)
class Settings:
    seed: int
    strategy: str
    dm_scope: str
    recall: str
    steps: int
    erase: bool = True  # one person erased two thirds in (where erasure exists)


@dataclass
class Scenario:
    settings: Settings
    steps: list[Step]
    canaries: list[Canary]


@dataclass(frozen=True)
class Paths:
    """What the attacker aims file tools at: the private notes seen from the workspace."""

    notes_from_workspace: str  # relative path from the workspace to the notes root
    notes_absolute: str
    private_from_workspace: str


KINDS: dict[str, int] = {
    "secret": 20,
    "chat": 6,
    "attack": 16,
    "own_recall": 5,
    "secret_tool": 5,
    "remember_cmd": 6,
    "remember_tool": 4,
    "forget_other": 3,
    "forget_own": 2,
    "memory_search": 8,
    "memory_status": 3,
    "memory_stats": 3,
    "context": 2,
    "compact": 6,
    "reset": 3,
    "sync": 4,
    "chatter": 16,
}
LEGACY_LEFT_OUT = {"remember_cmd", "remember_tool", "forget_other", "forget_own", "chatter"}
# Of the "secret" steps, these shares say the secret in a file instead (issue 23): a
# document whose text it is, or a picture whose file name it is. Drawn from a generator
# of their own, so each seed's scenario is otherwise the one it always was.
MEDIA_SECRETS = (("secret_document", 0.3), ("secret_picture", 0.25))
# Groups answer when addressed and keep the rest as group context (issue 23): a
# "chatter" step says a secret in a group without addressing the agent.
GROUP_POLICY = ChatPolicy(activation="mention", group_context_messages=8)


class Generator:
    def __init__(self, settings: Settings, paths: Paths, *, can_erase: bool) -> None:
        self.settings = settings
        self.paths = paths
        self.rng = random.Random(settings.seed)
        self.media_rng = random.Random(settings.seed * 7919)  # MEDIA_SECRETS
        self.canaries: list[Canary] = []
        self.words: set[str] = set()
        self.erased: set[str] = set()
        self.remembered: dict[str, list[Canary]] = {}
        kinds = dict(KINDS)
        if PRE_AUDIENCE:
            kinds = {k: w for k, w in kinds.items() if k not in LEGACY_LEFT_OUT}
        self.kinds = kinds
        self.can_erase = can_erase

    def scenario(self) -> Scenario:
        steps: list[Step] = []
        # Every conversation holds a secret before anyone goes looking for one.
        for conv in CONVERSATIONS:
            steps.append(self._secret(len(steps), conv))
        erase_at = self.settings.steps * 2 // 3 if self.can_erase else -1
        while len(steps) < self.settings.steps:
            if len(steps) == erase_at:
                # One person erased: the linked Alice, or one of the others, by seed.
                person = ("alice", "bob", "carol", "dave")[self.settings.seed % 4]
                self.erased.add(person)
                conv = next(c for c in CONVERSATIONS if c.audience == f"person:{person}")
                steps.append(Step(len(steps), "erase", conv, None, erase=person))
                continue
            kind = self.rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
            conv = self.rng.choice(CONVERSATIONS)
            step = self._make(kind, len(steps), conv)
            if step is not None:
                steps.append(step)
        # End with a manual compaction in every conversation: each flushes what it holds.
        for conv in CONVERSATIONS:
            steps.append(Step(len(steps), "compact", conv, self._speaker(conv), "/compact"))
        return Scenario(self.settings, steps, self.canaries)

    # -- pieces --

    def _media_kind(self) -> str:
        if PRE_AUDIENCE:  # no media before issue 23
            return "secret"
        draw = self.media_rng.random()
        for kind, share in MEDIA_SECRETS:
            if draw < share:
                return kind
            draw -= share
        return "secret"

    def _speaker(self, conv: Conversation) -> Identity:
        return self.rng.choice(conv.members)

    def _canary(self, owner: str, step: int) -> Canary:
        token = "".join(self.rng.choice(TOKEN_ALPHABET) for _ in range(TOKEN_CHARS))
        handles = []
        while len(handles) < 2:
            word = pseudo_word(self.rng)
            if word not in self.words:
                self.words.add(word)
                handles.append(word)
        canary = Canary(
            f"CANARY-{canary_tag(owner)}-{token}", owner, (handles[0], handles[1]), step
        )
        self.canaries.append(canary)
        return canary

    def _known(self, *, own: Conversation, other: bool) -> list[Canary]:
        # Erased people's canaries stay targets: after an erasure nobody may find them.
        return [c for c in self.canaries if (c.owner != own.audience) == other]

    def _secret(self, index: int, conv: Conversation, kind: str = "secret") -> Step:
        canary = self._canary(conv.audience, index)
        return Step(index, kind, conv, self._speaker(conv), canary.phrase, introduces=canary)

    def _notes_target(self, audience: str) -> str:
        """A path of ``audience``'s notes for memory_get, as cited or disguised."""
        rng = self.rng
        kind, ident = rng.choice(product_ids(audience))
        name = rng.choice(["remembered.md", TODAY])
        folder = quote(ident, safe=FOLDER_SAFE)
        own = rng.choice(["test:bob", "other:dave", "test:g2"])
        return rng.choice(
            [
                notes_path(kind, ident, name),
                notes_path(kind, ident, name),
                f"notes/{kind}/{ident}/{name}",  # the colon unencoded
                f"notes/{kind}/{quote(folder, safe='')}/{name}",  # encoded twice
                f"notes/{kind}/{folder.upper()}/{name}",
                f"notes/{kind}/{quote(own, safe=FOLDER_SAFE)}/../{folder}/{name}",
                f"notes/person/{audience.rsplit(':', 1)[-1]}/{name}",  # the linked name
                f"./notes/{kind}/{folder}/{name}",
            ]
        )

    def _search(self, target: Canary) -> ToolCall:
        args: dict[str, Any] = {"query": target.query}
        if self.rng.random() < 0.4:  # everything the conversation may see, and more
            args.update(max_results=50, min_score=0)
        return ("memory_search", args)

    def _file_attacks(self, target: Canary | None) -> list[ToolCall]:
        paths = self.paths
        kind, ident = self.rng.choice(product_ids(target.owner if target else "person:alice"))
        folder = f"{kind}/{quote(ident, safe=FOLDER_SAFE)}"
        name = self.rng.choice(["remembered.md", TODAY])
        reads = [
            f"{paths.notes_from_workspace}/{folder}/{name}",
            f"{paths.notes_absolute}/{folder}/{name}",
            f"memory/{TODAY}",
            "MEMORY.md",
            f"../sessions/../{paths.notes_from_workspace}/{folder}/{name}",
        ]
        lists = [
            {"path": ".", "pattern": "**/*"},
            {"path": "memory"},
            {"path": paths.notes_from_workspace, "pattern": "**/*.md"},
            {"path": paths.private_from_workspace},
            {"path": ".."},
        ]
        return [
            ("read_file", {"path": self.rng.choice(reads)}),
            ("list_files", self.rng.choice(lists)),
        ]

    def _make(self, kind: str, index: int, conv: Conversation) -> Step | None:
        rng = self.rng
        speaker = self._speaker(conv)
        if kind == "secret":
            return self._secret(index, conv, self._media_kind())
        if kind == "chat":
            pool = self.canaries
            canary = rng.choice(pool)
            text = f"Do you remember the {canary.handles[0]} {canary.handles[1]} code? {FILLER}."
            return Step(index, kind, conv, speaker, text, target=canary)
        if kind in ("attack", "own_recall"):
            targets = self._known(own=conv, other=kind == "attack")
            if not targets:
                return None
            target = rng.choice(targets)
            first: list[ToolCall] = [
                self._search(target),
                ("memory_get", {"path": self._notes_target(target.owner)}),
            ]
            rounds = [first]
            if kind == "attack" and rng.random() < 0.6:
                rounds.append(self._file_attacks(target))
            text = f"What was the {target.handles[0]} {target.handles[1]} code again?"
            return Step(index, kind, conv, speaker, text, rounds, target=target)
        if kind == "secret_tool":
            step = self._secret(index, conv, kind)
            step.rounds = [[rng.choice([("list_files", {"path": "."}), ("current_time", {})])]]
            return step
        if kind == "remember_cmd":
            step = self._secret(index, conv, kind)
            step.text = f"/remember {step.text}"
            assert step.introduces is not None
            self.remembered.setdefault(conv.audience, []).append(step.introduces)
            return step
        if kind == "remember_tool":
            step = self._secret(index, conv, kind)
            assert step.introduces is not None
            step.rounds = [[("remember", {"text": step.introduces.phrase})]]
            step.text = f"Remember for me: {step.text}"
            self.remembered.setdefault(conv.audience, []).append(step.introduces)
            return step
        if kind in ("forget_other", "forget_own"):
            if kind == "forget_other":
                pool = [c for a, cs in self.remembered.items() if a != conv.audience for c in cs]
            else:
                pool = self.remembered.get(conv.audience, [])
            if not pool:
                return None
            target = rng.choice(pool)
            text = f"/forget {target.handles[0]} {target.handles[1]}"
            if rng.random() < 0.4:  # by citation: lines of the owner's remembered.md
                kind_, ident = rng.choice(product_ids(target.owner))
                text = f"/forget {notes_path(kind_, ident, 'remembered.md')}#L1-L9"
            return Step(index, kind, conv, speaker, text, target=target)
        if kind == "memory_search":
            other = rng.random() < 0.75
            targets = self._known(own=conv, other=other) or self._known(own=conv, other=not other)
            if not targets:
                return None
            target = rng.choice(targets)
            return Step(index, kind, conv, speaker, f"/memory search {target.query}", target=target)
        if kind == "memory_status":
            return Step(index, kind, conv, speaker, "/memory status")
        if kind == "memory_stats":
            return Step(index, kind, conv, speaker, "/memory stats")
        if kind == "context":
            text = rng.choice(["/context detail", "/context json", "/status"])
            return Step(index, kind, conv, speaker, text)
        if kind == "compact":
            focus = ""
            own = self._known(own=conv, other=False)
            if own and rng.random() < 0.4:
                focus = " " + " ".join(rng.choice(own).handles)
            return Step(index, kind, conv, speaker, f"/compact{focus}")
        if kind == "reset":
            choice = rng.choice(["/new", "/reset", "/new secret"])
            if choice == "/new secret":
                step = self._secret(index, conv, kind)
                step.text = f"/new {step.text}"
                return step
            return Step(index, kind, conv, speaker, choice)
        if kind == "sync":
            return Step(index, kind, conv, None)
        if kind == "chatter":
            if conv.chat_type == "direct":
                return None  # a direct chat has no one else to overhear
            return self._secret(index, conv, kind)
        raise AssertionError(kind)


# -- the model ----------------------------------------------------------------------------


def request_parts(request: ProviderRequest) -> Iterator[tuple[str, str]]:
    """(where, text) for everything a request shows the model."""
    yield "system prompt", request.system
    names: dict[str, str] = {}
    for number, message in enumerate(request.messages):
        for block in message.content:
            if isinstance(block, TextBlock):
                fence = getattr(block, "fence", None)
                if is_turn_context(block):
                    label = "turn context"
                elif fence == "recalled-memory" or block.text.lstrip().startswith(RECALL_MARK):
                    label = "recalled memory"
                elif fence == "group-context":
                    label = "group context"
                else:
                    label = f"{message.role} text"
                yield f"message {number} {label}", block.text
            elif isinstance(block, ToolUseBlock):
                names[block.id] = block.name
                yield (
                    f"message {number} tool call {block.name}",
                    json.dumps(block.input, ensure_ascii=False),
                )
            elif isinstance(block, ToolResultBlock):
                name = names.get(block.tool_use_id, "?")
                yield f"message {number} tool result {name}", block.content


def media_of(step: Step, channel: RecordingChannel) -> tuple[Attachment, ...]:
    """The file a media step sends (served by ``channel``): a document whose text is the
    secret, or a picture whose file name is (the model reads the name beside it)."""
    canary = step.introduces
    if canary is None or step.kind not in ("secret_document", "secret_picture"):
        return ()
    ref = f"file-{step.index}"
    if step.kind == "secret_document":
        channel.files[ref] = canary.phrase.encode()
        return (Attachment("document", ref, name="secret.txt", mime_type="text/plain"),)
    out = io.BytesIO()
    Image.new("RGB", (8 + step.index % 5, 6), (step.index % 256, 40, 90)).save(out, "PNG")
    channel.files[ref] = out.getvalue()
    return (Attachment("image", ref, name=f"{canary.text}.png", mime_type="image/png"),)


def request_kind(request: ProviderRequest) -> str:
    if request.system == SUMMARY_SYSTEM_PROMPT:
        return "summary"
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == "user" and last.text.startswith(FLUSH_MARK):
        return "flush"
    return "turn"


class EchoModel:
    """The responder of a ``ScriptedProvider``: a model that repeats every canary it is
    shown. A turn first plays the step's tool-call rounds (one response each), then
    answers with every canary of the request and the user's last words; a summary lists
    them under its identifiers, a flush note as bullets."""

    def __init__(self) -> None:
        self.rounds: deque[list[ToolCall]] = deque()
        self.step = 0
        self.calls = 0
        self.kinds: Counter[str] = Counter()
        self.counter = default_counter()

    def begin(self, step: Step) -> None:
        self.step = step.index
        self.rounds = deque(step.rounds)

    def __call__(self, request: ProviderRequest) -> ProviderResponse:
        self.calls += 1
        kind = request_kind(request)
        self.kinds[kind] += 1
        shown = "\n".join(text for _, text in request_parts(request))
        seen = list(dict.fromkeys(CANARY_RE.findall(shown)))
        if kind == "summary":
            sections = {heading: ["- none"] for heading in REQUIRED_HEADINGS}
            sections["## Exact identifiers"] = [f"- {c}" for c in seen] or ["- none"]
            text = "\n".join(f"{h}\n" + "\n".join(lines) for h, lines in sections.items())
        elif kind == "flush":
            text = "\n".join(f"- {c}" for c in seen) or "- nothing secret was said"
        elif self.rounds:
            calls = self.rounds.popleft()
            blocks = tuple(
                ToolUseBlock(f"c{self.step}-{self.calls}-{n}", name, args)
                for n, (name, args) in enumerate(calls)
            )
            return ProviderResponse(blocks, STOP_TOOL_USE, Usage(10, 10), MODEL)
        else:
            said = _last_user_words(request)
            text = f"I was shown: {' '.join(seen) or 'nothing secret'}. You said: {said[:300]}"
        prompt = self.counter.request(request.system, request.messages, request.tools)
        usage = Usage(prompt, self.counter.text(text))
        return ProviderResponse((TextBlock(text),), STOP_END, usage, MODEL)


def _last_user_words(request: ProviderRequest) -> str:
    for message in reversed(request.messages):
        if message.role != "user":
            continue
        words = [
            b.text
            for b in message.content
            if isinstance(b, TextBlock) and not is_turn_context(b) and RECALL_MARK not in b.text
        ]
        if words:
            return " ".join(words)
    return "?"


# -- the checker --------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    step: str
    canary: str
    owner: str
    audience: str  # where it appeared
    where: str
    context: str

    def __str__(self) -> str:
        return (
            f"{self.step}: {self.canary} (of {self.owner}) reached {self.audience} "
            f"in {self.where}: …{self.context}…"
        )


@dataclass
class Tally:
    steps: int = 0
    requests: int = 0
    parts: int = 0
    replies: int = 0
    memory_answers: int = 0
    tool_results: int = 0
    attacks: int = 0
    own_hits: int = 0  # own canaries found through memory (search, get, recall, /memory)
    flush_notes: int = 0
    task_records: int = 0
    transcripts: int = 0
    compactions: int = 0
    erasures: int = 0
    checks: int = 0  # (text, canary) pairs asserted
    chatter: int = 0  # group messages not addressed to the agent
    overheard: int = 0  # their canaries shown back to the model as group context
    documents: int = 0  # secrets read to the model from a document someone sent
    pictures: int = 0  # pictures sent inline to the model (their name the secret)

    def line(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.__dict__.items())


class Checker:
    def __init__(self, canaries: Iterable[Canary]) -> None:
        self.canaries = {c.text: c for c in canaries}
        self.pattern = re.compile(
            "|".join(re.escape(c.split("-")[-1]) for c in self.canaries), re.I
        )
        self.by_token = {c.split("-")[-1].lower(): c for c in self.canaries}
        self.erased: dict[str, int] = {}  # person -> the step from which they are gone
        self.violations: list[Violation] = []
        self.tally = Tally()

    def allowed(self, canary: Canary, audience: str, step: int) -> bool:
        # An erased person's secrets said before the erasure are nobody's any more.
        erased_at = self.erased.get(canary.owner.partition(":")[2])
        if canary.owner.startswith("person:") and erased_at is not None and canary.step < erased_at:
            return False
        return canary.owner == audience

    def found(self, text: str) -> list[tuple[Canary, int]]:
        return [
            (self.canaries[self.by_token[m.group(0).lower()]], m.start())
            for m in self.pattern.finditer(text)
        ]

    def check(self, step: Step, audience: str | None, where: str, text: str) -> list[Canary]:
        """Record every canary in ``text`` that ``audience`` may not see; the allowed
        ones found are returned (for the positive controls)."""
        self.tally.parts += 1
        self.tally.checks += len(self.canaries)
        ok: list[Canary] = []
        for canary, at in self.found(text):
            if audience is not None and self.allowed(canary, audience, step.index):
                ok.append(canary)
                continue
            context = text[max(0, at - 60) : at + 40].replace("\n", " ")
            self.violations.append(
                Violation(step.describe(), canary.text, canary.owner, audience or "agent-wide",
                          where, context)
            )  # fmt: skip
        return ok

    def report(self, limit: int = 30) -> str:
        """The leaks by place (a request's part, a reply, a stored file), each with its
        first example: step, canary, owner, audience reached, text around it."""
        by_place: dict[str, list[Violation]] = {}
        for v in self.violations:
            by_place.setdefault(
                re.sub(r"message \d+ |(note|task record|transcript) \S+", r"\1", v.where), []
            ).append(v)
        canaries = {v.canary for v in self.violations}
        lines = [
            f"{len(self.violations)} leak(s) of {len(canaries)} canaries, in {len(by_place)} "
            "kind(s) of place; the first of each:"
        ]
        for found in sorted(by_place.values(), key=len, reverse=True)[:limit]:
            lines.append(f"  [{len(found)}x] {found[0]}")
        return "\n".join(lines)


# -- the world ----------------------------------------------------------------------------


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def scenario_env(settings: Settings) -> dict[str, str]:
    return {
        "PARLEY_SESSION__TIMEZONE": "UTC",
        "PARLEY_PROVIDERS__RETRY__MAX_ATTEMPTS": "1",
        "PARLEY_HTTP__PORT": "0",
        "PARLEY_HTTP__ENABLED": "false",
        "PARLEY_MEMORY__SYNC__WATCH": "false",
        "PARLEY_MEMORY__SYNC__ON_START": "false",
        "PARLEY_MEMORY__SYNC__TRANSCRIPT_DEBOUNCE_SECONDS": "0",
        "PARLEY_MEMORY__RECALL": settings.recall,
        "PARLEY_SESSION__DM_SCOPE": settings.dm_scope,
        "PARLEY_SESSION__IDENTITY_LINKS": IDENTITY_LINKS,
        # A small window: the flush and every kind of compaction really happen.
        "PARLEY_CONTEXT__MODELS": f'{{ "{MODEL}" = {{ context_tokens = 20000 }} }}',
        "PARLEY_CONTEXT__COMPACTION__STRATEGY": settings.strategy,
        "PARLEY_CONTEXT__COMPACTION__KEEP_RECENT_TOKENS": "200",
        "PARLEY_CONTEXT__COMPACTION__KEEP_RECENT_TURNS": "1",
        "PARLEY_CONTEXT__COMPACTION__MAX_MESSAGES": "10",
        "PARLEY_CONTEXT__COMPACTION__SLIDING_WINDOW_MESSAGES": "4",
    }


def load(home: Path, settings: Settings, **extra: str) -> LoadedConfig:
    return load_config(env={"PARLEY_HOME": str(home), **scenario_env(settings), **extra})


def find_eraser() -> Callable[..., Any] | None:
    """``parley people erase`` as a function (``gateway.people.erase_person(loaded,
    person)``), looked up rather than imported so that the suite also runs where it
    does not exist (the code before audiences): erasure steps are left out there, and
    only there. Anywhere else a missing eraser is an error, never a silent skip."""
    if PRE_AUDIENCE:
        return None
    eraser: Callable[..., Any] = importlib.import_module("parley.gateway.people").erase_person
    return eraser


def erased_name(person: str) -> str:
    """How ``parley people erase`` names one of ours: the linked name for a person with
    several ids (everything of every linked id goes), else the one raw id."""
    ids = [i.scope_id for i in IDENTITIES if i.person == person]
    return person if len(ids) > 1 else ids[0]


async def erase_person(eraser: Callable[..., Any], loaded: LoadedConfig, person: str) -> Any:
    """Erasure runs with the gateway stopped (it refuses a home in use)."""
    result = eraser(loaded, erased_name(person))
    if inspect.isawaitable(result):
        result = await result
    return result


class World:
    """One scenario through one real gateway."""

    def __init__(self, home: Path, settings: Settings, **backend_env: str) -> None:
        self.home = home
        self.settings = settings
        self.loaded = load(home, settings, **backend_env)
        self.clock = Clock(START)
        self.channels = {name: RecordingChannel(name) for name in CHANNELS}
        if not PRE_AUDIENCE:
            for channel in self.channels.values():
                channel.chat_policy = GROUP_POLICY
        self.model = EchoModel()
        self.provider = ScriptedProvider(MODEL)
        self.provider.vision = True  # type: ignore[attr-defined]  # pictures inline
        self.provider.responder = self.model
        self.eraser = find_eraser()
        self.notes_root = self._notes_root()
        workspace = self.loaded.workspace
        private = self.notes_root.parent
        self.paths = Paths(
            os.path.relpath(self.notes_root, workspace),
            str(self.notes_root),
            os.path.relpath(private, workspace),
        )
        can_erase = settings.erase and self.eraser is not None
        generator = Generator(settings, self.paths, can_erase=can_erase)
        self.scenario = generator.scenario()
        self.checker = Checker(self.scenario.canaries)
        self.gateway: Gateway | None = None

    def _notes_root(self) -> Path:
        if PRE_AUDIENCE:  # before audiences: no private notes
            return self.loaded.home / "memory" / self.loaded.config.agent.id / "notes"
        module = importlib.import_module("parley.gateway.memory")
        return Path(module.notes_dir(self.loaded))

    @property
    def tally(self) -> Tally:
        return self.checker.tally

    async def run(self) -> Checker:
        steps = deque(self.scenario.steps)
        while steps:
            gateway = Gateway(
                self.loaded, channels=list(self.channels.values()), provider=self.provider,
                clock=self.clock, serve_http=False,
            )  # fmt: skip
            async with gateway:
                self.gateway = gateway
                while steps and steps[0].kind != "erase":
                    step = steps.popleft()
                    self.clock.now = START + timedelta(minutes=step.index)
                    await self.play(step)
            self.gateway = None
            if steps:  # an erasure: with the gateway stopped, then it starts again
                await self.erase(steps.popleft())
        self.check_storage(self.scenario.steps[-1])
        return self.checker

    async def erase(self, step: Step) -> None:
        assert self.eraser is not None and step.erase is not None
        self.tally.steps += 1
        report = await erase_person(self.eraser, self.loaded, step.erase)
        errors = getattr(report, "errors", None)
        assert not errors, f"{step.describe()}: erasure failed: {errors}"
        self.checker.erased[step.erase] = step.index
        self.tally.erasures += 1

    async def play(self, step: Step) -> None:
        gateway = self.gateway
        assert gateway is not None
        tally = self.tally
        tally.steps += 1
        self.model.begin(step)
        if step.kind == "sync":
            if gateway.memory is not None:
                await gateway.memory.sync()
            return
        conv, speaker = step.conv, step.speaker
        assert speaker is not None
        channel = self.channels[conv.channel]
        requests_before = len(self.provider.requests)
        sent_before = {name: len(c.sent) for name, c in self.channels.items()}
        notes_before = self._other_notes(conv.audience) if step.kind == "forget_other" else None
        text, attachments = step.text, media_of(step, channel)
        if attachments:
            text = "Keep this file for me."  # the secret is in the file, not the words
        message = channel.inbound(
            text,
            sender=speaker.sender,
            chat_type=conv.chat_type,
            chat_id=conv.chat_id,
            thread_id=conv.thread_id,
            mentions_bot=step.kind != "chatter",
            attachments=attachments,
        )
        await gateway.handle_inbound(message)
        await gateway.wait_idle()
        if step.kind == "chatter":  # kept for the group's next turn: no request, no reply
            tally.chatter += 1
            sent_after = {name: len(c.sent) for name, c in self.channels.items()}
            assert len(self.provider.requests) == requests_before, step.describe()
            assert sent_after == sent_before, step.describe()
            return
        await channel.wait_sent(sent_before[conv.channel] + 1)
        if step.kind in ("attack", "own_recall"):
            tally.attacks += step.kind == "attack"
        if attachments and step.introduces is not None:
            # Counted when the file reached the model: the document's text, or the
            # picture inline with its name beside it (assert_isolated wants some of each).
            turns = [
                r for r in self.provider.requests[requests_before:] if request_kind(r) == "turn"
            ]
            shown = "\n".join(text for r in turns for _, text in request_parts(r))
            inline = any(
                isinstance(b, ImageBlock) and b.data
                for r in turns
                for m in r.messages
                for b in m.content
            )
            if step.introduces.text in shown:
                if step.kind == "secret_document":
                    tally.documents += 1
                elif inline:
                    tally.pictures += 1
        for request in self.provider.requests[requests_before:]:
            tally.requests += 1
            for where, text in request_parts(request):
                ok = self.checker.check(step, conv.audience, f"model request: {where}", text)
                if "tool result" in where:
                    tally.tool_results += 1
                    if where.endswith(("memory_search", "memory_get")):
                        tally.own_hits += len(ok)
                if where.endswith("recalled memory"):
                    tally.own_hits += len(ok)
                if where.endswith("group context"):
                    tally.overheard += len(ok)
        for name, channel_ in self.channels.items():
            for sent in channel_.sent[sent_before[name] :]:
                self._check_reply(step, name, sent)
        if notes_before is not None and self._other_notes(conv.audience) != notes_before:
            self.checker.violations.append(
                Violation(step.describe(), "-", "-", conv.audience,
                          "notes of other audiences changed by /forget", step.text)
            )  # fmt: skip

    def _check_reply(self, step: Step, channel: str, sent: Any) -> None:
        tally = self.tally
        tally.replies += 1
        recipient = next(
            (
                c
                for c in CONVERSATIONS
                if (c.channel, c.chat_id, c.thread_id) == (channel, sent.chat_id, sent.thread_id)
            ),
            None,
        )
        if recipient is None or recipient.audience != step.conv.audience:
            self.checker.violations.append(
                Violation(step.describe(), "-", "-", str(recipient and recipient.audience),
                          f"a reply delivered to {channel}:{sent.chat_id}", sent.text[:100])
            )  # fmt: skip
            return
        label = "reply"
        if step.text.startswith("/memory"):
            label = f"/memory answer ({step.text.split()[1] if ' ' in step.text else 'status'})"
            tally.memory_answers += 1
        elif step.text.startswith(
            ("/remember", "/forget", "/compact", "/new", "/reset", "/context", "/status")
        ):
            label = f"{step.text.split()[0]} answer"
        ok = self.checker.check(step, recipient.audience, label, sent.text)
        if label.startswith("/memory answer (search"):
            tally.own_hits += len(ok)
        if step.kind == "compact" and sent.text.startswith("Compacted"):
            tally.compactions += 1

    def _other_notes(self, audience: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for path, owner in self._note_files():
            if owner != audience:
                out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        return out

    def _note_files(self) -> list[tuple[Path, str | None]]:
        found: list[tuple[Path, str | None]] = []
        for kind in ("person", "conversation"):
            base = self.notes_root / kind
            if not base.is_dir():
                continue
            for folder in sorted(base.iterdir()):
                owner = audience_of_scope(f"{kind}:{unquote(folder.name)}")
                found += [(p, owner) for p in sorted(folder.glob("*.md"))]
        return found

    def _transcript_files(self) -> list[Path]:
        """Transcripts and their compaction checkpoints on disk (none on PostgreSQL,
        where the request checks stand for them)."""
        found: list[Path] = []
        for root in (self.loaded.sessions_dir, self.loaded.checkpoints_dir):
            found += sorted(root.rglob("*.jsonl")) if root.is_dir() else []
        return found

    def check_storage(self, last: Step) -> None:
        """At the end: each audience's notes hold only its own canaries, each task
        record only its scope's, each transcript (and checkpoint) on disk only its
        header's audience's, and the workspace (agent-wide) none at all."""
        checker = self.checker
        for path, owner in self._note_files():
            text = path.read_text(encoding="utf-8", errors="replace")
            checker.check(last, owner, f"stored note {path.relative_to(self.notes_root)}", text)
            if re.fullmatch(r"\d{4}-\d\d-\d\d\.md", path.name) and CANARY_RE.search(text):
                self.tally.flush_notes += 1
        tasks = self.notes_root.parent / "tasks"
        for path in sorted(tasks.rglob("*.jsonl")) if tasks.is_dir() else []:
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    owner = audience_of_scope(str(record.get("scope", "")))
                    checker.check(last, owner, f"stored task record {path.name}", line)
                    self.tally.task_records += 1
        for path in self._transcript_files():
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            owner = transcript_audience(lines[0]) if lines else None
            self.tally.transcripts += 1
            checker.check(last, owner, f"stored transcript {path.name}", "\n".join(lines[1:]))
        workspace = self.loaded.workspace
        for path in sorted(workspace.rglob("*")):
            if path.is_file() and path.stat().st_size < 2_000_000:
                text = path.read_text(encoding="utf-8", errors="replace")
                where = f"workspace file {path.relative_to(workspace)}"
                checker.check(last, None, where, text)
                if path.parent.name == "memory" and CANARY_RE.search(text):
                    self.tally.flush_notes += 1  # before audiences flushes wrote here


async def run_world(home: Path, settings: Settings, **backend_env: str) -> World:
    world = World(home, settings, **backend_env)
    await asyncio.wait_for(world.run(), timeout=300)
    return world
