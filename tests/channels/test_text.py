"""Tests for channels.text: UTF-16 length, the reply splitter and the Markdown renderers.

The property tests lean on two checkers written here, independent of the code under test:
``telegram_visible_text`` parses HTML as strictly as the Telegram Bot API documents it, and
``assert_cores_are_slices`` proves that splitting only ever drops whitespace and adds fences.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parley.channels.markdown_html import find_fences
from parley.channels.text import (
    MIN_SPLIT_LIMIT,
    markdown_to_telegram_html,
    split_message,
    strip_markdown,
    utf16_len,
)

Measure = Callable[[str], int]
FAMILY = "👨\u200d👩\u200d👧"  # one grapheme cluster, 8 UTF-16 units
FLAGS = "🇫🇷🇩🇪🇯🇵🇧🇷🇨🇦"

# --- a strict Telegram HTML checker -------------------------------------------------------------

_TAG = re.compile(r'<(/?)([a-z-]+)((?: [a-z-]+(?:="[^"<>]*")?)*)>')
_ATTR = re.compile(r' ([a-z-]+)(?:="([^"]*)")?')
_ENTITY = re.compile(r"&(?:lt|gt|amp|quot|#[0-9]{1,7}|#x[0-9a-fA-F]{1,6});")
_TEXT = re.compile(r"[^<>&]+")
_FORMATTING = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "tg-spoiler", "span"}
_SAFE_SCHEMES = ("http://", "https://", "tg://", "mailto:")


def _check_open(name: str, attrs: dict[str, str | None], stack: list[str]) -> None:
    parent = stack[-1] if stack else None
    assert parent != "code", f"<{name}> inside <code>"
    assert "pre" not in stack or (name == "code" and parent == "pre"), f"<{name}> inside <pre>"
    for value in attrs.values():
        if value is not None:
            assert _ENTITY.sub("", value).count("&") == 0, f"raw & in attribute {value!r}"
    if name in _FORMATTING:
        expected = {"class": "tg-spoiler"} if name == "span" else {}
        assert attrs == expected, f"<{name}> with {attrs}"
    elif name == "a":
        assert "a" not in stack, "nested links"
        assert list(attrs) == ["href"], attrs
        assert html.unescape(attrs["href"] or "").lower().startswith(_SAFE_SCHEMES), attrs
    elif name == "code":
        # Telegram: code is never part of another entity (only pre, and quotes hold it).
        assert parent in (None, "pre", "blockquote"), f"<code> inside <{parent}>"
        if attrs:
            assert parent == "pre" and list(attrs) == ["class"], attrs
            assert re.fullmatch(r"language-[\w+#.-]+", attrs["class"] or ""), attrs
    elif name in ("pre", "blockquote"):
        assert not stack, f"<{name}> must be top level, inside {stack}"
        assert not attrs or (name == "blockquote" and attrs == {"expandable": None}), attrs
    else:
        raise AssertionError(f"tag <{name}> is not allowed by Telegram")


def telegram_visible_text(markup: str) -> str:
    """Assert ``markup`` is valid Telegram HTML and return the text a reader sees."""
    stack: list[str] = []
    visible: list[str] = []
    pos = 0
    while pos < len(markup):
        if m := _TEXT.match(markup, pos):
            visible.append(m.group())
        elif m := _ENTITY.match(markup, pos):
            visible.append(html.unescape(m.group()))
        elif m := _TAG.match(markup, pos):
            closing, name, raw_attrs = m.groups()
            if closing:
                assert not raw_attrs and stack and stack[-1] == name, f"bad </{name}> {stack}"
                stack.pop()
            else:
                _check_open(name, _attrs(raw_attrs), stack)
                stack.append(name)
        else:
            raise AssertionError(f"unescaped {markup[pos]!r} at {pos} in {markup!r}")
        pos = m.end()
    assert not stack, f"unclosed {stack} in {markup!r}"
    return "".join(visible)


def _attrs(raw: str) -> dict[str, str | None]:
    return {m.group(1): m.group(2) for m in _ATTR.finditer(raw)}


def test_checker_rejects_what_telegram_rejects() -> None:
    for bad in (
        "<b>x",
        "<b><i>x</b></i>",
        "<code><b>x</b></code>",
        "<b><code>x</code></b>",
        "<h1>x</h1>",
        "a < b",
        "&nbsp;",
        '<a href="javascript:x">y</a>',
        "<b><pre>x</pre></b>",
    ):
        with pytest.raises(AssertionError):
            telegram_visible_text(bad)
    good = '<b>a &amp; <a href="https://x?a=1&amp;b=2">l</a></b><pre><code class="language-py">'
    assert telegram_visible_text(good + "1 &lt; 2</code></pre>") == "a & l1 < 2"


def alnum(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


def is_subsequence(short: str, long: str) -> bool:
    it = iter(long)
    return all(ch in it for ch in short)


# --- strategies ---------------------------------------------------------------------------------

_PIECES = [
    *("**", "__", "*", "_", "~~", "~", "||", "|", "`", "``", "\\", "#", "# ", "## ", "> "),
    *("[", "]", "(", ")", "](", "- ", "* ", "1. ", "<", ">", "&", "&amp;", '"', "'"),
    *(" ", "  ", "\t", "\n", "\n", "\n\n", "\n   ", "word", "snake_case_name", "2 * 3"),
    *("end.", "ok!", " x", "é", "e\u0301", "\u0301", "👍", "👍🏽", FAMILY, "🇫🇷", "\r\n"),
    *("http://x.io/a_b", "https://t.me/(x)", "javascript:alert(1)", "mailto:a@b.c", "tg://x"),
    *("```", "~~~", "\n```\n", "\n```python\n", "\n~~~ js\n", "\n````\n", "```py"),
]
_LONG_WORD = st.text(alphabet="abcxyz", min_size=15, max_size=120)
markdownish = st.lists(st.one_of(st.sampled_from(_PIECES), _LONG_WORD), max_size=120).map("".join)
any_text = st.one_of(markdownish, st.text(max_size=400))
# Line-structured replies, so that code blocks (short, long, unclosed) are common.
_prose_line = st.lists(st.sampled_from(["word", "é", "👍", "end.", "**b**", "x" * 30]), max_size=12)
_code_line = st.lists(st.sampled_from(["x", " ", "    ", "= 1", "# c", "\t", "`", "y" * 40]))
line_based = st.lists(
    st.one_of(
        _prose_line.map(" ".join),
        _code_line.map("".join),
        st.sampled_from(["", "```", "```python", "~~~", "~~~ js", "````", "``` c++"]),
    ),
    max_size=60,
).map("\n".join)
replies = st.one_of(markdownish, line_based)
measures = st.sampled_from([len, utf16_len])


# --- utf16_len ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("", 0),
        ("abc", 3),
        ("é", 1),
        ("e\u0301", 2),
        ("👍", 2),
        ("👍🏽", 4),
        (FAMILY, 8),
        ("\ud83d", 1),
    ],
)
def test_utf16_len_counts_code_units(text: str, units: int) -> None:
    assert utf16_len(text) == units


@given(st.text())
def test_utf16_len_counts_astral_code_points_twice(text: str) -> None:
    # Counted per code point, not by the encoder the implementation itself uses.
    assert utf16_len(text) == sum(2 if ord(ch) > 0xFFFF else 1 for ch in text)


# --- split_message: examples --------------------------------------------------------------------


def test_limit_below_minimum_is_refused() -> None:
    with pytest.raises(ValueError):
        split_message("hello", MIN_SPLIT_LIMIT - 1)
    assert split_message("hello", MIN_SPLIT_LIMIT) == ["hello"]


@pytest.mark.parametrize("text", ["", "   ", "\n\n\t \n"])
def test_blank_text_has_no_parts(text: str) -> None:
    assert split_message(text, 100) == []


def test_text_that_fits_comes_back_unchanged_but_for_trailing_whitespace() -> None:
    text = "  indented *start*\n\n```py\nx = 1\n```\n"
    assert split_message(text + "  \n\n", 100) == [text.rstrip()]


def test_cuts_at_the_last_paragraph_break_that_fits() -> None:
    text = "aaaa aaaa\n\nbbbb\n\ncccc\ndddd eeee ffff gggg hhhh"
    parts = ["aaaa aaaa\n\nbbbb", "cccc", "dddd eeee ffff gggg", "hhhh"]
    assert split_message(text, 20) == parts


def test_prefers_a_line_break_to_a_sentence_end_and_a_sentence_end_to_a_space() -> None:
    assert split_message("one two\nthree. four five six", 22) == ["one two", "three. four five six"]
    assert split_message("one. two three four five", 20) == ["one.", "two three four five"]


def test_hard_cut_when_a_word_is_longer_than_the_limit() -> None:
    assert split_message("x" * 40, 16) == ["x" * 16, "x" * 16, "x" * 8]


def test_a_code_block_that_fits_moves_whole_to_the_next_part() -> None:
    code = "```py\nprint('hello world')\nprint(2)\n```"
    text = f"Some intro text here\n{code}\nafter"
    parts = split_message(text, len(code) + len("\nafter"))
    assert parts == ["Some intro text here", code + "\nafter"]


def test_a_code_block_that_fits_is_not_cut_even_at_a_better_break_inside() -> None:
    code = "```\nfirst = 1\n\nsecond = 2\n```"
    assert split_message(f"intro line\n{code}", len(code)) == ["intro line", code]


def test_a_long_code_block_is_cut_between_lines_and_refenced() -> None:
    lines = [f"    value_{i} = {i}" for i in range(30)]
    text = "Intro.\n\n```python\n" + "\n".join(lines) + "\n```\n\nOutro."
    parts = split_message(text, 80)
    assert all(len(part) <= 80 for part in parts)
    assert parts[0] == "Intro."
    assert parts[-1].endswith("```\n\nOutro.")
    code_parts = parts[1:]
    assert all(part.startswith("```python\n    value_") for part in code_parts)
    assert all(part.endswith("\n```") for part in code_parts[:-1])
    # Indentation survives the cuts, and no line is lost, doubled or reordered.
    body = [line for part in code_parts for line in part.split("\n") if "value_" in line]
    assert body == lines


def test_no_part_is_left_holding_only_a_closing_fence() -> None:
    parts = split_message("```\nword word\n\n```\nword word word", 16)
    assert parts == ["```\nword\n```", "```\nword\n\n```", "word word word"]


@pytest.mark.parametrize(
    ("text", "limit"),
    [("```python\n        \n\n\n\n```python", 29), ("``` c++\n\n    \n``` c++\nword", 24)],
)
def test_a_cut_never_turns_a_code_line_into_a_closing_fence(text: str, limit: int) -> None:
    parts = split_message(text, limit)
    assert len(parts) == 2
    assert all(f.close_start < len(parts[0]) for f in find_fences(parts[0])), parts
    assert len(find_fences(parts[1])) == 1, parts


def test_an_overlong_code_line_is_hard_cut_inside_its_fences() -> None:
    parts = split_message("~~~ js\n" + "x" * 100 + "\n~~~", 30)
    assert all(len(part) <= 30 and part.startswith("~~~ js\nx") for part in parts)
    assert all(part.endswith("\n~~~") for part in parts)
    assert "".join(part[len("~~~ js\n") : -len("\n~~~")] for part in parts) == "x" * 100


def test_an_unclosed_fence_stays_unclosed_only_in_the_last_part() -> None:
    parts = split_message("```\n" + "\n".join(["line"] * 20), 30)
    assert all(part.startswith("```\nline") for part in parts)
    assert all(part.endswith("\n```") for part in parts[:-1])
    assert parts[-1].endswith("line")


def test_utf16_measure_counts_emoji_as_two() -> None:
    assert split_message("👍" * 20, 16, measure=utf16_len) == ["👍" * 8, "👍" * 8, "👍" * 4]
    assert split_message("👍" * 20, 16) == ["👍" * 16, "👍" * 4]


@pytest.mark.parametrize(
    ("cluster", "limit"),
    [("e\u0301", 17), ("👍🏽", 18), (FAMILY, 20), ("🇫🇷", 18), ("1\ufe0f\u20e3", 17)],
)
def test_hard_cuts_fall_between_grapheme_clusters(cluster: str, limit: int) -> None:
    parts = split_message(cluster * 12, limit, measure=utf16_len)
    assert len(parts) > 1
    for part in parts:
        assert utf16_len(part) <= limit
        assert part.replace(cluster, "") == "", part


def test_flags_are_not_cut_in_half() -> None:
    parts = split_message(FLAGS * 3, 17)
    assert all(len(part) % 2 == 0 for part in parts) and "".join(parts) == FLAGS * 3


def test_a_cluster_longer_than_the_limit_is_still_cut_to_size() -> None:
    parts = split_message("a" + "\u0301" * 40, 16)
    assert [len(part) for part in parts] == [16, 16, 9]
    assert "".join(parts) == "a" + "\u0301" * 40


def test_blank_lines_before_a_closing_fence_give_way_to_an_added_one() -> None:
    text = "```\nword\n" + " " * 20 + "\n```\nafter"
    assert split_message(text, 16) == ["```\nword\n```", "after"]


def test_a_mark_after_a_space_travels_with_the_space() -> None:
    parts = split_message("x" * 10 + " \u0301" + "y" * 10, 16)
    assert not any(unicodedata.combining(part[0]) for part in parts)


# --- split_message: properties ------------------------------------------------------------------


_FENCE_LINE = re.compile(r"[ \t]*(`{3,}|~{3,})[ \t]*(?=\n|$)")


def assert_cores_are_slices(parts: list[str], text: str) -> None:
    """Each part is an optional fence line, a slice of ``text``, an optional closing fence;
    the slices come in order, and between them lies only whitespace or, where an added
    closing fence stood in for it, a block's own closing line."""

    def cores(part: str) -> list[str]:
        options = [part]
        first, _, rest = part.partition("\n")
        head, _, last = part.rpartition("\n")
        reopened = rest and re.fullmatch(r"(`{3,}|~{3,})[^\n]*", first)
        if reopened:
            options.append(rest)
        if head and re.fullmatch(r"`{3,}|~{3,}", last):
            options.append(head)
            if reopened and "\n" in rest:
                options.append(rest.rpartition("\n")[0])
        return options

    def next_starts(pos: int) -> list[int]:
        # Where the next slice may begin: anywhere in the whitespace after pos, or in the
        # whitespace after a dropped closing line.
        stop = len(text) - len(text[pos:].lstrip())
        starts = list(range(pos, stop + 1))
        if closer := _FENCE_LINE.match(text, stop):
            after = closer.end()
            starts += range(after, len(text) - len(text[after:].lstrip()) + 1)
        return starts

    @cache
    def fits(index: int, pos: int) -> bool:
        if index == len(parts):
            return any(start == len(text) for start in next_starts(pos))
        for core in cores(parts[index]):
            for start in next_starts(pos):
                if text.startswith(core, start) and fits(index + 1, start + len(core)):
                    return True
        return False

    assert fits(0, 0), parts


@settings(max_examples=300, deadline=None)
@given(replies, st.integers(MIN_SPLIT_LIMIT, 120), measures)
def test_split_parts_fit_and_lose_nothing(text: str, limit: int, measure: Measure) -> None:
    parts = split_message(text, limit, measure=measure)
    assert (parts == []) == (not text.strip())
    for part in parts:
        assert measure(part) <= limit
        assert part.strip() and part == part.rstrip()
    assert_cores_are_slices(parts, text)
    if measure(text.rstrip()) <= limit:
        assert parts == ([text.rstrip()] if text.strip() else [])


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=600), st.integers(MIN_SPLIT_LIMIT, 60), measures)
def test_split_survives_arbitrary_text(text: str, limit: int, measure: Measure) -> None:
    parts = split_message(text, limit, measure=measure)
    assert all(measure(part) <= limit and part.strip() for part in parts)
    assert_cores_are_slices(parts, text)


def _protected(text: str, limit: int, measure: Measure) -> bool:
    """Whether every fence in ``text`` falls under the splitter's promise to keep code blocks
    whole or refenced. Documented exceptions: a fence whose opener and closer take over half a
    part, or whose content is all whitespace and too long, is split like prose; and a cut
    inside a line holding a fence-like run (mid-line or tab-indented ``` or ~~~, or a ```-line
    with a backtick further on) may turn that run into a fence."""
    fences = find_fences(text)
    cost = (measure(text[f.start : f.content_start]) + measure("\n" + f.marker) for f in fences)
    fence_like = re.search(
        r"[^\n ][ \t]*(```|~~~)|[^\n]{4}(```|~~~)|^ {0,3}`{3,}[^`\n]+`", text, re.MULTILINE
    )
    blank_and_long = any(
        not text[f.content_start : f.close_start].strip() and measure(text[f.start : f.end]) > limit
        for f in fences
    )
    return all(c <= limit // 2 for c in cost) and fence_like is None and not blank_and_long


@settings(max_examples=300, deadline=None)
@given(replies, st.integers(MIN_SPLIT_LIMIT, 120), measures)
def test_split_parts_are_self_contained_markdown(text: str, limit: int, measure: Measure) -> None:
    assume(_protected(text, limit, measure))
    parts = split_message(text, limit, measure=measure)
    for part in parts[:-1]:
        assert all(f.close_start < len(part) for f in find_fences(part)), part
    # Unless a cluster may exceed a part, or a mark has no base in the input, no part may
    # start (after a reopened fence) with a combining mark.
    if not re.search(r"[\u0300-\u036f]{6}|(^|\n)[\u0300-\u036f]", text):
        for part in parts[1:]:
            body = part.partition("\n")[2] if re.match(r"```|~~~", part) else part
            assert not body or not unicodedata.combining(body[0]), parts


@settings(max_examples=200, deadline=None)
@given(replies, st.integers(MIN_SPLIT_LIMIT, 200))
def test_rendered_parts_stay_within_the_limit(text: str, limit: int) -> None:
    for part in split_message(text, limit, measure=utf16_len):
        assert utf16_len(telegram_visible_text(markdown_to_telegram_html(part))) <= limit


def test_a_100kb_reply_splits_into_full_parts() -> None:
    paragraph = "A sentence with some words. " * 30
    code = "```python\n" + "\n".join(f"x_{i} = {i}" for i in range(400)) + "\n```"
    text = "\n\n".join([paragraph] * 60 + [code] + [paragraph] * 60)
    assert len(text) > 100_000
    parts = split_message(text, 4096, measure=utf16_len)
    assert all(utf16_len(part) <= 4096 for part in parts)
    assert len(parts) <= 2 * len(text) // 4096 + 2


# --- markdown_to_telegram_html: examples --------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
        ("<script>alert('x')</script>", "&lt;script&gt;alert('x')&lt;/script&gt;"),
        ("**bold** and __bold__", "<b>bold</b> and <b>bold</b>"),
        ("*it* and _it_", "<i>it</i> and <i>it</i>"),
        ("***both***", "<i><b>both</b></i>"),
        ("*a **b** c*", "<i>a <b>b</b> c</i>"),
        ("~~gone~~ ||secret||", "<s>gone</s> <tg-spoiler>secret</tg-spoiler>"),
        ("snake_case_name and __init__.py", "snake_case_name and <b>init</b>.py"),
        ("2 * 3 * 4 = 24", "2 * 3 * 4 = 24"),
        ("~5 min, a | b, a || b", "~5 min, a | b, a || b"),
        ("**unclosed and *lonely", "**unclosed and *lonely"),
        ("*a _b* c_", "<i>a _b</i> c_"),
        ("*a _b* c* d", "<i>a _b</i> c* d"),
        ("**a ~~b** c~~", "<b>a ~~b</b> c~~"),
        ("> \n>", "\n"),
        ("```js``` is inline", "<code>js</code> is inline"),
        (r"\*not italic\*", "*not italic*"),
        ("`a < *b*`", "<code>a &lt; *b*</code>"),
        ("``has ` tick``", "<code>has ` tick</code>"),
        ("**a `c` b**", "<b>a </b><code>c</code><b> b</b>"),
        ("**`c`**", "<code>c</code>"),
        ("# Title", "<b>Title</b>"),
        ("### The `x` **call** ###", "<b>The </b><code>x</code><b> call</b>"),
        ("#hashtag", "#hashtag"),
        (
            "> quoted **line**\n> more\nafter",
            "<blockquote>quoted <b>line</b>\nmore</blockquote>\nafter",
        ),
        ("- one\n* two\n  + nested", "• one\n• two\n  • nested"),
        ("1. first\n2) second", "1. first\n2) second"),
        ("---\n***", "---\n***"),
        ("see https://ex.com/a_b_/c*d_ ok", "see https://ex.com/a_b_/c*d_ ok"),
    ],
)
def test_renders_markdown(source: str, expected: str) -> None:
    assert markdown_to_telegram_html(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            '[docs](https://ex.com/a?b=1&c="2")',
            '<a href="https://ex.com/a?b=1&amp;c=&quot;2&quot;">docs</a>',
        ),
        ("[me](tg://user?id=1)", '<a href="tg://user?id=1">me</a>'),
        ("[mail](mailto:a@b.c)", '<a href="mailto:a@b.c">mail</a>'),
        ("[wiki](https://w.org/A_(b))", '<a href="https://w.org/A_(b)">wiki</a>'),
        ("[**bold** `c`](http://x.io)", '<a href="http://x.io"><b>bold</b> c</a>'),
        ("**[x](http://x.io)**", '<b><a href="http://x.io">x</a></b>'),
        ("[](http://x.io)", '<a href="http://x.io">http://x.io</a>'),
        ("[click](javascript:alert(1))", "click"),
        ("[img](data:text/html;base64,xx)", "img"),
        ("[rel](/path) [x](vbscript:y)", "rel x"),
        ("[not a link] (http://x.io)", "[not a link] (http://x.io)"),
    ],
)
def test_renders_links_only_for_safe_schemes(source: str, expected: str) -> None:
    assert markdown_to_telegram_html(source) == expected


def test_renders_fenced_code_verbatim() -> None:
    source = "Run:\n```python\nif a < b and **c**:\n    print(`x`)\n```\ndone"
    assert markdown_to_telegram_html(source) == (
        'Run:\n<pre><code class="language-python">if a &lt; b and **c**:\n'
        "    print(`x`)</code></pre>\ndone"
    )
    assert markdown_to_telegram_html("~~~\n<tag>\n~~~") == "<pre>&lt;tag&gt;</pre>"
    assert markdown_to_telegram_html("```\nopen *forever*\n\n# no") == (
        "<pre>open *forever*\n\n# no</pre>"
    )
    assert markdown_to_telegram_html('```"><script>\nx\n```') == "<pre>x</pre>"
    assert markdown_to_telegram_html("```py\n```\nafter") == "\nafter"


# --- markdown_to_telegram_html: properties ------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(any_text)
def test_html_is_always_valid_and_never_longer(source: str) -> None:
    visible = telegram_visible_text(markdown_to_telegram_html(source))
    assert utf16_len(visible) <= utf16_len(source)
    assert is_subsequence(alnum(visible), alnum(source))


_PLAIN = st.text(
    alphabet=st.characters(blacklist_characters="*_~|[`\\#>-+", blacklist_categories=["Cs"])
)


@given(_PLAIN)
def test_plain_text_is_only_escaped(source: str) -> None:
    assert markdown_to_telegram_html(source) == html.escape(source, quote=False)


def test_angle_brackets_and_ampersands_mid_line_are_only_escaped() -> None:
    source = "if a<b & b>c then x -> y; x<=y && tags like <b> stay text"
    assert markdown_to_telegram_html(source) == html.escape(source, quote=False)


# --- strip_markdown -----------------------------------------------------------------------------


def test_strip_markdown_keeps_the_words_and_drops_the_markers() -> None:
    source = (
        "# Title\n**bold** _it_ ~~s~~ ||sp|| `code` [docs](https://ex.com)\n"
        "* item\n> quote\n```python\nx = 1\n```\nsnake_case 2 * 3"
    )
    assert strip_markdown(source) == (
        "Title\nbold it s sp code docs (https://ex.com)\n• item\n> quote\nx = 1\nsnake_case 2 * 3"
    )
    assert strip_markdown("[x](javascript:y)") == "x (javascript:y)"
    assert strip_markdown("[](http://x.io) and [ ](tg://y)") == "http://x.io and tg://y"


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_strip_markdown_keeps_every_letter_in_order(source: str) -> None:
    # Only a fence's opener line (its language name) may go.
    kept, pos = [], 0
    for fence in find_fences(source):
        kept.append(source[pos : fence.start])
        pos = fence.content_start
    kept.append(source[pos:])
    assert alnum(strip_markdown(source)) == alnum("".join(kept))
