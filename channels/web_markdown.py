"""Markdown for the web chat, as a tree of whitelisted nodes the browser builds with DOM
calls (``createElement``, text nodes): no HTML string is ever parsed, so no text a model
or a person wrote can become markup or script.

Parsing is markdown-it-py (CommonMark, plus GFM tables and strikethrough), with raw HTML
off: ``<script>`` stays text. A node is a string (text) or an object::

    {"t": "p" | "h1".."h6" | "strong" | "em" | "s" | "code" | "pre" | "a" | "ul" | "ol"
          | "li" | "blockquote" | "hr" | "br" | "table" | "thead" | "tbody" | "tr" | "th"
          | "td",
     "c": [children],  "href": "https://...",  "lang": "python",  "start": 3}

``href`` is only ever http(s) (anything else loses its link, keeps its text); images are
not loaded (a remote image would tell its server who reads the chat): they become a link
to the image with its alt text. markdown-it caps nesting (``maxNesting``), so the tree is
shallow whatever the input.

Text laid out in columns with spaces (``/help``, ``/context``: the gateway's own replies,
or a model's table without a fence) is not Markdown: it becomes one ``aligned`` node,
``{"t": "aligned", "c": [lines], "hang": [indents]}``, which the page shows in a
monospace font with each line's wrapped part indented to its text column (``hang``, in
characters), so it stays readable on a narrow screen instead of wrapping to column 0.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["TAGS", "markdown_tree"]

Node = str | dict[str, Any]

TAGS = frozenset(
    {
        *("p", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "s", "code", "pre"),
        *("a", "ul", "ol", "li", "blockquote", "hr", "br", "table", "thead", "tbody"),
        *("tr", "th", "td", "aligned"),
    }
)
_SAFE_HREF = re.compile(r"https?://[^\s]+", re.IGNORECASE)
_LANGUAGE = re.compile(r"[\w+#.-]{1,32}")
# Two or more lines with a gap of 3+ spaces between words, or indented under a line above:
# text aligned by hand.
_COLUMN_GAP = re.compile(r"\S {3,}\S")
_FENCE = re.compile(r"^ {0,3}(```|~~~)", re.MULTILINE)
_MARKDOWN_LAYOUT = re.compile(r"\s*(\||[-*+] |\d{1,9}[.)] )")
_HANG_GAP = re.compile(r"\S( {2,})(?=\S)")
MAX_HANG = 30
_INLINE_TAGS = {"strong_open": "strong", "em_open": "em", "s_open": "s", "link_open": "a"}

# One parser for the process: markdown-it's parse holds no state between calls.
_md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])


def markdown_tree(text: str) -> list[Node]:
    """``text`` as the web chat's node tree (a draft's unclosed fence runs to the end)."""
    if _is_aligned(text):
        lines = text.split("\n")
        return [{"t": "aligned", "c": lines, "hang": [_hang(line) for line in lines]}]
    root: list[Node] = []
    stack: list[list[Node]] = [root]
    for token in _md.parse(text):
        if token.type == "inline":
            stack[-1].extend(_inline(token.children or ()))
        elif token.nesting == 1:
            if token.hidden:  # a tight list's paragraph: its text goes in the item
                stack.append(stack[-1])
                continue
            node = _element(token.tag)
            if token.type == "ordered_list_open":
                start = token.attrGet("start")
                if isinstance(start, int | str) and str(start).isdigit() and int(start) != 1:
                    node["start"] = int(start)
            stack[-1].append(node)
            stack.append(node["c"])
        elif token.nesting == -1:
            if len(stack) > 1:
                stack.pop()
        else:
            stack[-1].extend(_block_leaf(token))
    return root


def _element(tag: str) -> dict[str, Any]:
    # Only tags of the whitelist; anything else markdown-it might add becomes a paragraph.
    return {"t": tag if tag in TAGS else "p", "c": []}


def _block_leaf(token: Token) -> list[Node]:
    if token.type in ("fence", "code_block"):
        code = token.content.removesuffix("\n")
        pre: dict[str, Any] = {"t": "pre", "c": [{"t": "code", "c": [code] if code else []}]}
        language = token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""
        if _LANGUAGE.fullmatch(language):
            pre["lang"] = language
        return [pre]
    if token.type == "hr":
        return [{"t": "hr", "c": []}]
    # html_block cannot occur with html off; any other leaf: its text, as text.
    return [{"t": "p", "c": [token.content]}] if token.content else []


def _inline(tokens: Sequence[Token]) -> list[Node]:
    root: list[Node] = []
    stack: list[list[Node]] = [root]
    for token in tokens:
        kind = token.type
        if kind == "text" or kind == "html_inline":
            _text(stack[-1], token.content)
        elif kind == "code_inline":
            stack[-1].append({"t": "code", "c": [token.content]})
        elif kind in ("softbreak", "hardbreak"):
            stack[-1].append({"t": "br", "c": []})
        elif kind == "image":
            _image(stack[-1], token)
        elif kind == "link_open":
            href = str(token.attrGet("href") or "")
            node: dict[str, Any] = {"t": "a", "c": []}
            if _SAFE_HREF.fullmatch(href):
                node["href"] = href
            else:
                node["t"] = "span"  # not a link the chat will follow: its text only
            stack[-1].append(node)
            stack.append(node["c"])
        elif kind in _INLINE_TAGS:
            node = {"t": _INLINE_TAGS[kind], "c": []}
            stack[-1].append(node)
            stack.append(node["c"])
        elif kind.endswith("_close"):
            if len(stack) > 1:
                stack.pop()
        elif token.content:
            _text(stack[-1], token.content)
    return _unwrap_spans(root)


def _image(into: list[Node], token: Token) -> None:
    alt = token.content or "image"
    src = str(token.attrGet("src") or "")
    if _SAFE_HREF.fullmatch(src):
        into.append({"t": "a", "href": src, "c": [f"[image: {alt}]"]})
    else:
        _text(into, f"[image: {alt}]")


def _text(into: list[Node], text: str) -> None:
    if not text:
        return
    if into and isinstance(into[-1], str):
        into[-1] += text  # adjacent text merges: fewer nodes to build
    else:
        into.append(text)


def _unwrap_spans(nodes: list[Node]) -> list[Node]:
    """A refused link leaves its children in place of the link."""
    out: list[Node] = []
    for node in nodes:
        if isinstance(node, dict):
            children = _unwrap_spans(node["c"])
            if node["t"] == "span":
                for child in children:
                    if isinstance(child, str):
                        _text(out, child)
                    else:
                        out.append(child)
                continue
            node["c"] = children
        if isinstance(node, str):
            _text(out, node)
        else:
            out.append(node)
    return out


def _is_aligned(text: str) -> bool:
    if _FENCE.search(text):
        return False
    lines = text.split("\n")
    # Padded Markdown table rows and list items are Markdown's own layout: not counted.
    plain = [line for line in lines if not _MARKDOWN_LAYOUT.match(line)]
    columns = sum(1 for line in plain if _COLUMN_GAP.search(line.strip()))
    hanging = sum(
        1
        for above, line in itertools.pairwise(lines)
        if line.startswith("    ")
        and line.strip()
        and above.strip()
        and not _MARKDOWN_LAYOUT.match(line)
    )
    return columns >= 2 or (columns >= 1 and hanging >= 1)


def _hang(line: str) -> int:
    """Where a wrapped part of ``line`` goes on: its text column after a gap of spaces,
    or its own indentation."""
    indent = len(line) - len(line.lstrip(" "))
    gap = _HANG_GAP.search(line, indent)
    column = gap.end() if gap is not None else indent
    return min(column, MAX_HANG)
