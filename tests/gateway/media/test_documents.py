"""Documents to text: the kinds read, the encodings, PDF text layers, and refusals."""

from __future__ import annotations

import sys

import pytest

from parley.gateway.errors import MediaRejected
from parley.gateway.media.documents import NO_PYPDF, document_kind, document_text
from tests.gateway.media_support import text_pdf


@pytest.mark.parametrize(
    ("name", "mime", "kind"),
    [
        ("notes.md", "", "Markdown"),
        ("NOTES.MARKDOWN", "application/octet-stream", "Markdown"),
        ("data.csv", "", "CSV"),
        ("x.json", "", "JSON"),
        ("report.pdf", "", "PDF"),
        ("", "text/plain; charset=utf-8", "text"),
        ("readme", "text/markdown", "Markdown"),
        ("photo.heic", "image/heic", None),
        ("report.docx", "application/vnd.openxmlformats", None),
        ("", "", None),
    ],
)
def test_kinds_by_name_then_media_type(name: str, mime: str, kind: str | None) -> None:
    assert document_kind(name, mime) == kind


def test_text_encodings_and_binary_data() -> None:
    assert document_text("naïve\n".encode(), kind="text", max_pdf_pages=1) == "naïve\n"
    assert document_text(b"\xef\xbb\xbfbom", kind="text", max_pdf_pages=1) == "bom"
    assert document_text("café".encode("cp1252"), kind="CSV", max_pdf_pages=1) == "café"
    with pytest.raises(MediaRejected, match="does not look like JSON text"):
        document_text(b'{"a": "\x00"}', kind="JSON", max_pdf_pages=1)


def test_pdf_pages_are_read_up_to_the_limit() -> None:
    pdf = text_pdf("first page", "second page", "third page")
    text = document_text(pdf, kind="PDF", max_pdf_pages=2)
    assert text.startswith("[page 1]\nfirst page\n\n[page 2]\nsecond page")
    assert text.endswith("[the PDF has 3 pages; only the first 2 were read]")
    assert "third" not in text


def test_pdf_refusals() -> None:
    with pytest.raises(MediaRejected, match="no text layer"):
        document_text(text_pdf(""), kind="PDF", max_pdf_pages=10)
    with pytest.raises(MediaRejected, match="not a PDF that can be read"):
        document_text(b"%PDF-1.4 broken", kind="PDF", max_pdf_pages=10)


def test_without_pypdf_a_clear_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "pypdf" or n.startswith("pypdf.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pypdf", None)
    with pytest.raises(MediaRejected) as caught:
        document_text(text_pdf("x"), kind="PDF", max_pdf_pages=1)
    assert str(caught.value) == NO_PYPDF
    assert document_text(b"plain", kind="text", max_pdf_pages=1) == "plain"  # text still read


@pytest.mark.parametrize("cut", [40, 200, 400, -60, -20])
def test_a_damaged_pdf_is_refused_whatever_breaks(cut: int) -> None:
    damaged = text_pdf("some words here")[:cut]
    with pytest.raises(MediaRejected):
        document_text(damaged, kind="PDF", max_pdf_pages=10)
