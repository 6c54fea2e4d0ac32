"""Telegram's HTML parse mode, checked as strictly as the Bot API checks it.

``visible_text(html)`` returns what the recipient would see (tags removed, entities
decoded) or raises ``EntityParseError`` with a reason and the UTF-8 byte offset, which
the fake turns into ``400 Bad Request: can't parse entities: <reason> at byte offset N``.

The rules (from the Bot API's "HTML style" section):
- only the listed tags, properly nested; ``span`` only with ``class="tg-spoiler"``,
  ``tg-emoji`` only with an ``emoji-id``;
- only the named entities ``&lt; &gt; &amp; &quot;`` and numeric ones. The real
  server passes some other stray ``&`` through; we refuse every one, so a converter
  that forgets to escape ``&`` is caught here rather than by users.
"""

from __future__ import annotations

import re

SUPPORTED_TAGS = frozenset(
    {
        "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler",
        "a", "code", "pre", "blockquote", "tg-emoji",
    }
)  # fmt: skip
NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
_ATTR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_UNQUOTED_VALUE = re.compile(r"[^\s>\"']*")
_ENTITY = re.compile(r"&(#[0-9]{1,8}|#[xX][0-9A-Fa-f]{1,8}|[A-Za-z][A-Za-z0-9]{0,31});")
_MAX_CODE_POINT = 0x10FFFF


class EntityParseError(Exception):
    def __init__(self, reason: str, byte_offset: int) -> None:
        super().__init__(f"{reason} at byte offset {byte_offset}")
        self.reason = reason
        self.byte_offset = byte_offset


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.pos = 0
        self.out: list[str] = []
        self.open: list[tuple[str, int]] = []  # (tag, index of its "<")

    def fail(self, reason: str, index: int) -> EntityParseError:
        # Telegram reports offsets in UTF-8 bytes of the text as sent.
        return EntityParseError(reason, len(self.source[:index].encode("utf-8")))

    def run(self) -> str:
        source = self.source
        while self.pos < len(source):
            char = source[self.pos]
            if char == "<":
                self.tag()
            elif char == "&":
                self.out.append(self.entity(self.pos))
            else:
                # Copy the run of plain text up to the next markup character at once.
                end = len(source)
                for mark in ("<", "&"):
                    found = source.find(mark, self.pos)
                    if found != -1:
                        end = min(end, found)
                self.out.append(source[self.pos : end])
                self.pos = end
        if self.open:
            name, index = self.open[-1]
            raise self.fail(f'Can\'t find end tag corresponding to start tag "{name}"', index)
        return "".join(self.out)

    def entity(self, start: int) -> str:
        match = _ENTITY.match(self.source, start)
        if match is None:
            raise self.fail("Unsupported HTML entity: '&' must be escaped as &amp;", start)
        body = match.group(1)
        self.pos = match.end()
        if not body.startswith("#"):
            if body not in NAMED_ENTITIES:
                raise self.fail(f'Unsupported HTML entity "&{body};"', start)
            return NAMED_ENTITIES[body]
        code = int(body[2:], 16) if body[1] in "xX" else int(body[1:])
        if code == 0 or code > _MAX_CODE_POINT or 0xD800 <= code <= 0xDFFF:
            raise self.fail(f'Invalid code point in HTML entity "&{body};"', start)
        return chr(code)

    def tag(self) -> None:
        source, start = self.source, self.pos
        if source.startswith("</", start):
            self.end_tag(start)
            return
        match = _TAG_NAME.match(source, start + 1)
        if match is None:
            raise self.fail('Unsupported start tag ""', start)
        name = match.group().lower()
        if name not in SUPPORTED_TAGS:
            raise self.fail(f'Unsupported start tag "{name}"', start)
        attrs = self.attributes(name, match.end(), start)
        if name == "span" and attrs.get("class") != "tg-spoiler":
            raise self.fail('Tag "span" must have class "tg-spoiler"', start)
        if name == "tg-emoji" and not attrs.get("emoji-id"):
            raise self.fail('Tag "tg-emoji" must have attribute "emoji-id"', start)
        self.open.append((name, start))

    def attributes(self, name: str, index: int, start: int) -> dict[str, str]:
        source = self.source
        attrs: dict[str, str] = {}
        while True:
            while index < len(source) and source[index].isspace():
                index += 1
            if index >= len(source):
                raise self.fail(f'Unclosed start tag "{name}"', start)
            if source[index] == ">":
                self.pos = index + 1
                return attrs
            match = _ATTR_NAME.match(source, index)
            if match is None:
                raise self.fail(f'Unexpected character in the tag "{name}"', index)
            key, index = match.group().lower(), match.end()
            if index < len(source) and source[index] == "=":
                value, index = self.attribute_value(name, index + 1, start)
            else:
                value = ""  # a bare flag such as <blockquote expandable>
            attrs[key] = value

    def attribute_value(self, name: str, index: int, start: int) -> tuple[str, int]:
        source = self.source
        if index < len(source) and source[index] in "\"'":
            close = source.find(source[index], index + 1)
            if close == -1:
                raise self.fail(f'Unclosed start tag "{name}"', start)
            raw, index = source[index + 1 : close], close + 1
        else:
            match = _UNQUOTED_VALUE.match(source, index)
            assert match is not None  # the pattern matches the empty string
            raw, index = match.group(), match.end()
        # Attribute values follow the same entity rules as text.
        return _Parser(raw).run(), index

    def end_tag(self, start: int) -> None:
        close = self.source.find(">", start)
        if close == -1:
            raise self.fail("Unclosed end tag", start)
        name = self.source[start + 2 : close].strip().lower()
        if not self.open:
            raise self.fail(f'Unexpected end tag "{name}"', start)
        expected = self.open[-1][0]
        if name != expected:
            raise self.fail(
                f'Unmatched end tag, expected "</{expected}>", found "</{name}>"', start
            )
        self.open.pop()
        self.pos = close + 1


def visible_text(html: str) -> str:
    """The text a recipient sees, or ``EntityParseError`` where Telegram would refuse it."""
    return _Parser(html).run()
