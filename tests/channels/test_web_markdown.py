"""The web chat's Markdown tree: what a model writes, formatted, and nothing of it able to
become markup, script or a link that is not http(s)."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from parley.channels.web_markdown import TAGS, markdown_tree


def walk(nodes: list[Any]) -> list[dict[str, Any]]:
    """Every element of a tree, depth first."""
    found: list[dict[str, Any]] = []
    for node in nodes:
        if isinstance(node, dict):
            found.append(node)
            found.extend(walk(node["c"]))
    return found


def text_of(nodes: list[Any]) -> str:
    return "".join(n if isinstance(n, str) else text_of(n["c"]) for n in nodes)


def assert_safe(tree: list[Any]) -> None:
    for node in walk(tree):
        assert node["t"] in TAGS, node
        assert set(node) <= {"t", "c", "href", "lang", "start", "hang"}, node
        if node["t"] == "aligned":  # lines of text, each with its indent in characters
            assert all(isinstance(line, str) for line in node["c"])
            assert all(isinstance(h, int) and 0 <= h <= 30 for h in node["hang"])
        if "href" in node:
            assert node["t"] == "a" and node["href"].lower().startswith(("http://", "https://"))
        if "lang" in node:
            assert node["t"] == "pre" and re.fullmatch(r"[\w+#.-]{1,32}", node["lang"])


def test_what_models_write_is_formatted() -> None:
    tree = markdown_tree(
        "# Plan\n**bold**, *it*, ~~gone~~ and `x < y`\nnext line\n\n"
        "- one\n- two\n\n3. three\n4. four\n\n> said\n\n"
        "```python\nprint('<b>')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n---\n"
        "[docs](https://example.com/a?b=c) and <https://auto.example>"
    )
    assert_safe(tree)
    tags = [n["t"] for n in walk(tree)]
    for tag in ("h1", "strong", "em", "s", "code", "br", "ul", "li", "ol", "blockquote"):
        assert tag in tags
    for tag in ("pre", "table", "th", "td", "hr", "a"):
        assert tag in tags
    (ordered,) = (n for n in walk(tree) if n["t"] == "ol")
    assert ordered["start"] == 3
    (pre,) = (n for n in walk(tree) if n["t"] == "pre")
    assert pre == {"t": "pre", "lang": "python", "c": [{"t": "code", "c": ["print('<b>')"]}]}
    links = [n["href"] for n in walk(tree) if n["t"] == "a"]
    assert links == ["https://example.com/a?b=c", "https://auto.example"]
    # A tight list's items hold their text directly (no paragraph in each).
    (bullets,) = (n for n in walk(tree) if n["t"] == "ul")
    assert bullets["c"] == [{"t": "li", "c": ["one"]}, {"t": "li", "c": ["two"]}]


def test_html_and_script_stay_text() -> None:
    source = (
        '<script>alert("x")</script>\n\n<img src=x onerror=alert(1)>\n\n'
        "inline <b onclick=alert(1)>bold</b> and <iframe src=//evil>"
    )
    tree = markdown_tree(source)
    assert_safe(tree)
    assert [n["t"] for n in walk(tree)] == ["p", "p", "p"]  # no element from the HTML
    assert '<script>alert("x")</script>' in text_of(tree)
    assert "<b onclick=alert(1)>bold</b>" in text_of(tree)


def test_only_http_links_are_links() -> None:
    for href in (
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "java\tscript:alert(1)",
        "vbscript:msgbox(1)",
        "data:text/html;base64,PHNjcmlwdD4=",
        "file:///etc/passwd",
        "//evil.example/x",
        "/relative",
    ):
        tree = markdown_tree(f"[click **me**]({href}) ![pic]({href})")
        assert_safe(tree)
        assert not any("href" in n for n in walk(tree)), href
        assert "click" in text_of(tree)  # the words stay


def test_images_are_links_never_loaded() -> None:
    tree = markdown_tree("![a cat](https://img.example/cat.png)")
    assert_safe(tree)
    (link,) = walk(tree)[1:]
    assert link == {"t": "a", "href": "https://img.example/cat.png", "c": ["[image: a cat]"]}


def test_a_draft_half_written_renders() -> None:
    tree = markdown_tree("Here:\n\n```js\nlet a = 1;\nlet b")  # the fence is not closed yet
    assert_safe(tree)
    assert walk(tree)[-2:] == [
        {"t": "pre", "lang": "js", "c": [{"t": "code", "c": ["let a = 1;\nlet b"]}]},
        {"t": "code", "c": ["let a = 1;\nlet b"]},
    ]
    assert_safe(markdown_tree("**bold without an end [link](https://x"))


def test_deep_nesting_stays_shallow() -> None:
    tree = markdown_tree(">" * 5000 + " deep\n\n" + "- " * 3000 + "x")
    assert_safe(tree)
    json.dumps(tree)  # encodable: no recursion limit reached

    def depth(nodes: list[Any]) -> int:
        return max((1 + depth(n["c"]) for n in nodes if isinstance(n, dict)), default=0)

    assert depth(tree) <= 64


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("<>[]()!*_`~#-|:/\\\"' \nahjsvcript=&;")), max_size=120)
)
def test_any_text_gives_a_safe_tree(source: str) -> None:
    assert_safe(markdown_tree(source))


def test_text_aligned_with_spaces_keeps_its_columns_when_it_wraps() -> None:
    """/help on a phone: each wrapped line goes on at its description's column."""
    help_text = (
        "Commands:\n/new [text]   start a new session;\n"
        "              the text becomes its first message\n/reset        same as /new"
    )
    (node,) = markdown_tree(help_text)
    assert node == {
        "t": "aligned",
        "c": help_text.split("\n"),
        "hang": [0, 14, 14, 14],
    }
    # Markdown's own layouts are not taken for it.
    padded_table = "| a    | b    |\n|------|------|\n| 1    | 2    |"
    assert markdown_tree(padded_table)[0]["t"] == "table"
    assert markdown_tree("- one\n    - two\n    - three")[0]["t"] == "ul"
    assert markdown_tree("One   gap only.\n\nFine.")[0]["t"] == "p"
