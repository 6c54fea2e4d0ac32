"""Markdown as language models write it, rendered as Telegram HTML or as plain text.

Telegram refuses a whole message when its HTML is malformed, so the renderer is total: for any
input it emits only tags Telegram knows, closes them in the order opened and never nests them
where Telegram forbids it (nothing inside ``code``/``pre``; ``code`` never inside formatting or
a link). Markers that do not pair up stay as literal text.

Every construct only removes visible characters (markers, fences, link targets), never adds
any: adapters split the Markdown at the platform limit *before* rendering, so a rendered part
must never be longer than its source.

Parsing has two levels. Blocks are line based: fenced code, headings, quotes, list items,
thematic breaks and paragraphs. Inside a block, code spans, links and bare URLs are atoms, and
emphasis delimiters are paired with CommonMark's delimiter-run rules (flanking, the "rule of
three"), which is what keeps ``snake_case_name`` and ``2 * 3`` as written.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = ["Fence", "find_fences", "markdown_to_telegram_html", "strip_markdown"]

_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})([^\n]*)$", re.MULTILINE)
# Telegram puts the language into a class attribute; anything odd is dropped, not escaped.
_LANGUAGE = re.compile(r"[\w+#.-]{1,32}")


@dataclass(frozen=True, slots=True)
class Fence:
    """A fenced code block, as offsets into the text it was found in."""

    start: int  # start of the opener line
    content_start: int  # start of the first content line
    content_end: int  # end of the last content line (its newline excluded)
    close_start: int  # start of the closer line; len(text) when never closed
    end: int  # end of the closer line (newline excluded); len(text) when never closed
    opener: str  # the opener line, trimmed: "```python"
    marker: str  # the fence run ("```"); repeating it closes the block
    language: str  # "" when absent or not a plausible language name


@lru_cache(maxsize=64)
def _closer(char: str, length: int) -> re.Pattern[str]:
    return re.compile(rf"^ {{0,3}}{re.escape(char)}{{{length},}}[ \t\r]*$", re.MULTILINE)


def find_fences(text: str) -> list[Fence]:
    """The fenced code blocks of ``text`` in order (CommonMark rules; an unclosed fence runs
    to the end). Shared by the renderers and the splitter so they agree on what is code."""
    fences: list[Fence] = []
    n = len(text)
    pos = 0
    while (m := _FENCE_OPEN.search(text, pos)) is not None:
        marker, info = m.group(1), m.group(2)
        if marker[0] == "`" and "`" in info:
            # A backtick info string cannot hold backticks: "```x```" is inline code.
            pos = m.end()
            continue
        content_start = min(m.end() + 1, n)
        closer = _closer(marker[0], len(marker)).search(text, content_start)
        if closer is None:
            close_start = end = content_end = n
        else:
            close_start, end = closer.start(), closer.end()
            content_end = max(content_start, close_start - 1)
        words = info.split()
        language = words[0] if words and _LANGUAGE.fullmatch(words[0]) else ""
        opener = m.group(0).strip()
        fences.append(
            Fence(m.start(), content_start, content_end, close_start, end, opener, marker, language)
        )
        if closer is None:
            break
        pos = end
    return fences


# --- inline -----------------------------------------------------------------------------------

_ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_SPECIAL = re.compile(r"[\\`\[*_~|]|(?<![\w/])(?:https?|tg)://")
# A bare URL is kept verbatim so its "_" and "*" are not read as emphasis; trailing
# punctuation is left out because it usually belongs to the sentence.
_BARE_URL = re.compile(r"(?:https?|tg)://[^\s<>`\[\]*|~]*[^\s<>`\[\]*_~|.,;:!?'\")]")
_LINK_TARGET = re.compile(
    r"\(([^\s()<>\x00-\x1f]+(?:\([^\s()<>\x00-\x1f]*\)[^\s()<>\x00-\x1f]*)*)"
    r"(?:[ \t]+\"[^\"\n]*\")?\)"
)
_SAFE_URL = re.compile(r"https?://[^\s/?#]|tg://\w|mailto:[^\s@]+@", re.IGNORECASE)
_BRACKETS = re.compile(r"\\.|[\[\]]", re.DOTALL)  # an escaped bracket is not a bracket
_TAGS = {"*": ("i", "b"), "_": ("i", "b"), "~": ("s", "s"), "|": ("tg-spoiler", "tg-spoiler")}


@dataclass(slots=True)
class _Delim:
    """A run of emphasis characters; pairing fills ``closes``/``opens`` and uses up ``left``."""

    char: str
    length: int
    can_open: bool
    can_close: bool
    left: int = 0
    closes: list[str] = field(default_factory=list)  # emitted before the leftover characters
    opens: list[str] = field(default_factory=list)  # emitted after them, outermost first

    def __post_init__(self) -> None:
        self.left = self.length


@dataclass(frozen=True, slots=True)
class _Code:
    text: str


@dataclass(frozen=True, slots=True)
class _Link:
    label: list[_Token]  # empty when the label has no visible text
    url: str
    safe: bool  # a scheme Telegram will open and that cannot run code


_Token = str | _Delim | _Code | _Link


def _is_punctuation(ch: str) -> bool:
    return unicodedata.category(ch)[0] in "PS"


def _run_end(s: str, i: int) -> int:
    j = i + 1
    while j < len(s) and s[j] == s[i]:
        j += 1
    return j


def _delimiter(s: str, i: int, end: int) -> _Delim | None:
    char = s[i]
    if char in "~|" and end - i != 2:
        return None  # "~5 min", "a | b" and "|||" are text, not strike or spoiler
    before = s[i - 1] if i else " "
    after = s[end] if end < len(s) else " "
    left = not after.isspace() and (
        not _is_punctuation(after) or before.isspace() or _is_punctuation(before)
    )
    right = not before.isspace() and (
        not _is_punctuation(before) or after.isspace() or _is_punctuation(after)
    )
    if char == "_":  # intra-word underscores (snake_case_name) neither open nor close
        can_open = left and (not right or _is_punctuation(before))
        can_close = right and (not left or _is_punctuation(after))
    else:
        can_open, can_close = left, right
    if not (can_open or can_close):
        return None
    return _Delim(char, end - i, can_open, can_close)


def _bracket_pairs(s: str) -> dict[int, int]:
    """Each "[" mapped to its matching "]", found in one pass so that a text full of
    unmatched brackets still tokenizes in linear time."""
    pairs: dict[int, int] = {}
    opened: list[int] = []
    for m in _BRACKETS.finditer(s):
        if m.group() == "[":
            opened.append(m.start())
        elif m.group() == "]" and opened:
            pairs[opened.pop()] = m.start()
    return pairs


def _link(s: str, i: int, close: int) -> tuple[_Link, int] | None:
    target = _LINK_TARGET.match(s, close + 1)
    if target is None:
        return None
    label, url = s[i + 1 : close], target.group(1)
    tokens = _tokenize(label, links=False) if label.strip() else []
    return _Link(tokens, url, _SAFE_URL.match(url) is not None), target.end()


def _tokenize(s: str, *, links: bool = True) -> list[_Token]:
    tokens: list[_Token] = []
    text: list[str] = []
    no_closer: set[int] = set()  # backtick run lengths known to have no closer further on
    brackets = _bracket_pairs(s) if links and "[" in s else {}

    def flush() -> None:
        if joined := "".join(text):
            tokens.append(joined)
        text.clear()

    pos = 0
    while (m := _SPECIAL.search(s, pos)) is not None:
        i = m.start()
        text.append(s[pos:i])
        c = s[i]
        pos = i + 1
        if c == "\\":
            if pos < len(s) and s[pos] in _ASCII_PUNCTUATION:  # an escaped marker is literal
                pos += 1
            text.append(s[pos - 1])
        elif c == "`":
            pos = _run_end(s, i)
            code = None if pos - i in no_closer else _code_span(s, i, pos)
            if code is None:
                no_closer.add(pos - i)
                text.append(s[i:pos])
            else:
                flush()
                tokens.append(_Code(code[0]))
                pos = code[1]
        elif c == "[":
            link = _link(s, i, brackets[i]) if i in brackets else None
            if link is None:
                text.append(c)
            else:
                flush()
                tokens.append(link[0])
                pos = link[1]
        elif c in "*_~|":
            pos = _run_end(s, i)
            delim = _delimiter(s, i, pos)
            if delim is None:
                text.append(s[i:pos])
            else:
                flush()
                tokens.append(delim)
        else:
            url = _BARE_URL.match(s, i)
            pos = url.end() if url else m.end()
            text.append(s[i:pos])
    text.append(s[pos:])
    flush()
    _pair(tokens)
    return tokens


def _code_span(s: str, i: int, run_end: int) -> tuple[str, int] | None:
    length = run_end - i
    j = run_end
    while (j := s.find("`" * length, j)) != -1:
        end = _run_end(s, j)
        if end - j == length:
            content = s[run_end:j].replace("\n", " ")
            if len(content) > 1 and content[0] == content[-1] == " " and content.strip():
                content = content[1:-1]  # CommonMark: one padding space each side
            return content, end
        j = end
    return None


def _pair(tokens: list[_Token]) -> None:
    """CommonMark's "process emphasis": pair closers with the nearest compatible opener.
    Whatever lies between a pair can no longer pair across it, which is what guarantees
    that tags nest properly."""
    stack: list[_Delim] = []
    # Per closer kind, stack entries below this index are known not to match it.
    bottoms: dict[tuple[str, bool, int], int] = {}
    for tok in tokens:
        if not isinstance(tok, _Delim):
            continue
        key = (tok.char, tok.can_open, tok.length % 3)
        while tok.can_close and tok.left:
            idx = _opener_for(tok, stack, bottoms.get(key, 0))
            if idx < 0:
                bottoms[key] = len(stack)
                break
            opener = stack[idx]
            used = 2 if tok.left >= 2 and opener.left >= 2 else 1
            tag = _TAGS[tok.char][used - 1]
            opener.opens.insert(0, tag)  # later pairs with the same opener enclose earlier ones
            tok.closes.append(tag)
            opener.left -= used
            tok.left -= used
            del stack[idx + 1 :]
            if not opener.left:
                stack.pop()
            for k, bottom in bottoms.items():
                bottoms[k] = min(bottom, len(stack))
        if tok.can_open and tok.left:
            stack.append(tok)


def _opener_for(closer: _Delim, stack: list[_Delim], bottom: int) -> int:
    for idx in range(len(stack) - 1, min(bottom, len(stack)) - 1, -1):
        opener = stack[idx]
        if opener.char != closer.char:
            continue
        total = opener.length + closer.length
        if (
            closer.char in "*_"
            and (opener.can_close or closer.can_open)
            and total % 3 == 0
            and (opener.length % 3 or closer.length % 3)
        ):
            continue  # the rule of three: "*foo**bar*" is one emphasis, not two
        return idx
    return -1


class _HtmlWriter:
    """Writes inline tokens as Telegram HTML.

    Formatting tags are opened lazily, just before the first text they wrap, so no empty
    elements appear; around inline code every open tag is closed and later reopened, since
    Telegram forbids code inside other entities. A tag already open further out (bold inside
    a bold heading) is tracked but never written twice.
    """

    def __init__(self, *, in_link: bool = False, outer: frozenset[str] = frozenset()) -> None:
        self.out: list[str] = []
        self.stack: list[tuple[str, bool]] = []  # (tag, redundant)
        self.shown = 0  # how many stack entries (from the bottom) are currently written
        self.in_link = in_link
        self.outer = outer

    def open(self, tag: str) -> None:
        redundant = tag in self.outer or any(t == tag for t, _ in self.stack)
        self.stack.append((tag, redundant))

    def close(self, tag: str) -> None:
        if not self.stack or self.stack[-1][0] != tag:
            return  # pairing guarantees nesting; never emit a stray closing tag regardless
        _, redundant = self.stack.pop()
        if len(self.stack) < self.shown:
            self.shown -= 1
            if not redundant:
                self.out.append(f"</{tag}>")

    def show(self) -> None:
        for tag, redundant in self.stack[self.shown :]:
            if not redundant:
                self.out.append(f"<{tag}>")
        self.shown = len(self.stack)

    def hide(self) -> None:
        for tag, redundant in reversed(self.stack[: self.shown]):
            if not redundant:
                self.out.append(f"</{tag}>")
        self.shown = 0

    def text(self, s: str) -> None:
        if s:
            self.show()
            self.out.append(html.escape(s, quote=False))

    def write(self, tokens: list[_Token]) -> None:
        for tok in tokens:
            if isinstance(tok, str):
                self.text(tok)
            elif isinstance(tok, _Delim):
                for tag in tok.closes:
                    self.close(tag)
                self.text(tok.char * tok.left)
                for tag in tok.opens:
                    self.open(tag)
            elif isinstance(tok, _Code):
                if self.in_link or not tok.text.strip():
                    self.text(tok.text)
                else:
                    self.hide()
                    self.out.append(f"<code>{html.escape(tok.text, quote=False)}</code>")
            elif not tok.safe:
                self.write(tok.label)  # just the label: the target is never shown or linked
            else:
                label = _HtmlWriter(in_link=True, outer=self.outer | {t for t, _ in self.stack})
                label.write(tok.label or [tok.url])
                self.show()
                href = html.escape(tok.url, quote=True)
                self.out.append(f'<a href="{href}">{label.finish()}</a>')

    def finish(self) -> str:
        self.hide()
        return "".join(self.out)


def _plain(tokens: list[_Token]) -> str:
    out: list[str] = []
    for tok in tokens:
        if isinstance(tok, str):
            out.append(tok)
        elif isinstance(tok, _Delim):
            out.append(tok.char * tok.left)
        elif isinstance(tok, _Code):
            out.append(tok.text)
        elif tok.label:
            out.append(f"{_plain(tok.label)} ({tok.url})")
        else:
            out.append(tok.url)
    return "".join(out)


def _inline(s: str, as_html: bool, *, bold: bool = False) -> str:
    tokens = _tokenize(s)
    if not as_html:
        return _plain(tokens)
    writer = _HtmlWriter()
    if bold:
        writer.open("b")
    writer.write(tokens)
    return writer.finish()


# --- blocks -----------------------------------------------------------------------------------

_QUOTE = re.compile(r"(?:[ \t]{0,3}>[ \t]?)+")
_HEADING = re.compile(r"[ \t]{0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t\r]*")
_RULE = re.compile(r"[ \t]{0,3}([-*_])(?:[ \t]*\1){2,}[ \t\r]*")
_BULLET = re.compile(r"([ \t]*)[-*+]([ \t]+)(?=\S)")
_NUMBERED = re.compile(r"[ \t]*\d{1,9}[.)][ \t]+")


def _kind(line: str) -> str:
    if _QUOTE.match(line):
        return "quote"
    if (heading := _HEADING.fullmatch(line)) and heading.group(1).strip():
        return "heading"
    if _RULE.fullmatch(line):
        return "rule"
    if _BULLET.match(line):
        return "bullet"
    if _NUMBERED.match(line):
        return "numbered"
    return "text" if line.strip() else "blank"


def _render_lines(chunk: str, as_html: bool) -> str:
    """Render prose (no fences). Each group of lines renders to the same number of lines."""
    lines = chunk.split("\n")
    # Classified once: a run of quote or text lines would otherwise classify its first
    # line and the one that ends it twice.
    kinds = [_kind(line) for line in lines]
    out: list[str] = []
    i = 0
    while i < len(lines):
        line, kind = lines[i], kinds[i]
        j = i + 1
        if kind == "quote":
            while j < len(lines) and kinds[j] == "quote":
                j += 1
            body = _inline("\n".join(_QUOTE.sub("", q, count=1) for q in lines[i:j]), as_html)
            if not as_html:
                body = "\n".join(f"> {q}" for q in body.split("\n"))
            elif body.strip():
                body = f"<blockquote>{body}</blockquote>"
            out.append(body)
        elif kind == "heading":
            heading = _HEADING.fullmatch(line)
            assert heading is not None
            out.append(_inline(heading.group(1), as_html, bold=True))
        elif kind == "bullet":
            bullet = _BULLET.match(line)
            assert bullet is not None
            rest = _inline(line[bullet.end() :], as_html)
            out.append(f"{bullet.group(1)}•{bullet.group(2)}{rest}")
        elif kind == "numbered":
            out.append(_inline(line, as_html))
        elif kind in ("rule", "blank"):
            out.append(_escape(line, as_html))
        else:
            # A paragraph is one inline scope, so emphasis may span its lines.
            while j < len(lines) and kinds[j] == "text":
                j += 1
            out.append(_inline("\n".join(lines[i:j]), as_html))
        i = j
    return "\n".join(out)


def _escape(s: str, as_html: bool) -> str:
    return html.escape(s, quote=False) if as_html else s


def _render(text: str, as_html: bool) -> str:
    out: list[str] = []
    pos = 0
    for fence in find_fences(text):
        out.append(_render_lines(text[pos : fence.start], as_html))
        code = text[fence.content_start : fence.content_end]
        if not as_html:
            out.append(code)
        elif code.strip():  # an empty <pre> is an empty entity, which Telegram may refuse
            escaped = html.escape(code, quote=False)
            if fence.language:
                lang = html.escape(fence.language, quote=True)
                out.append(f'<pre><code class="language-{lang}">{escaped}</code></pre>')
            else:
                out.append(f"<pre>{escaped}</pre>")
        pos = fence.end
    out.append(_render_lines(text[pos:], as_html))
    return "".join(out)


def markdown_to_telegram_html(text: str) -> str:
    """Render Markdown as Telegram Bot API HTML (``parse_mode="HTML"``).

    Always well-formed, and the visible text is never longer (in UTF-16 units) than ``text``.
    May be empty or whitespace-only when ``text`` has nothing visible (an empty code block).
    """
    return _render(text, as_html=True)


def strip_markdown(text: str) -> str:
    """A plain-text reading of ``text``: markers dropped, code kept without its fences, links
    as "label (url)", bullets as "•". Every word of the input is kept, except the language
    name on a code fence."""
    return _render(text, as_html=False)
