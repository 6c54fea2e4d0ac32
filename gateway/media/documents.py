"""A document's text: plain text, Markdown, CSV, JSON, and PDF with a text layer (pypdf,
the ``media`` extra). Anything else is refused with a reason a person reads.

The kind is decided from the file name's extension and the declared media type, and
the bytes must agree: a "text" file with NUL bytes, or a PDF that is not one, is
refused. Blocking and CPU-bound: callers run it on a worker thread.
"""

from __future__ import annotations

import io
import logging
from pathlib import PurePath

from parley.gateway.errors import MediaRejected

log = logging.getLogger("parley.gateway.media")

TEXT_KINDS = {
    ".txt": "text",
    ".text": "text",
    ".log": "text",
    ".md": "Markdown",
    ".markdown": "Markdown",
    ".csv": "CSV",
    ".tsv": "CSV",
    ".json": "JSON",
    ".jsonl": "JSON",
    ".pdf": "PDF",
}
MIME_KINDS = {
    "text/plain": "text",
    "text/markdown": "Markdown",
    "text/x-markdown": "Markdown",
    "text/csv": "CSV",
    "text/tab-separated-values": "CSV",
    "application/json": "JSON",
    "application/pdf": "PDF",
}
SUPPORTED = "plain text, Markdown, CSV, JSON or a PDF with a text layer"
NO_PYPDF = (
    "PDFs need the media extra (pypdf), which is not installed here; "
    'run `make run`, or pip install "parley[media]"'
)


def document_kind(name: str, mime_type: str) -> str | None:
    """ "text", "Markdown", "CSV", "JSON" or "PDF"; None for a kind not read."""
    by_name = TEXT_KINDS.get(PurePath(name).suffix.lower()) if name else None
    if by_name is not None:
        return by_name
    mime = mime_type.split(";")[0].strip().lower()
    return MIME_KINDS.get(mime)


def document_text(data: bytes, *, kind: str, max_pdf_pages: int) -> str:
    """The text of a document of ``kind``; raises ``MediaRejected``."""
    if kind == "PDF":
        return _pdf_text(data, max_pdf_pages)
    if b"\x00" in data:
        raise MediaRejected(f"it does not look like {kind} text (it holds binary data)")
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return data.decode("latin-1")  # every byte is a character: never fails


def _pdf_text(data: bytes, max_pages: int) -> str:
    try:
        from pypdf import PdfReader
    except ImportError:
        raise MediaRejected(NO_PYPDF) from None
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise MediaRejected("the PDF is protected by a password")
        pages = reader.pages
        total = len(pages)
        parts = []
        for number in range(min(total, max_pages)):
            text = (pages[number].extract_text() or "").strip()
            if text:
                parts.append(f"[page {number + 1}]\n{text}")
    except MediaRejected:
        raise
    except Exception as exc:  # untrusted bytes: any parser failure is the file's
        log.info("PDF unreadable: %s: %s", type(exc).__name__, exc)
        raise MediaRejected("it is not a PDF that can be read (corrupt or damaged)") from exc
    if not parts:
        raise MediaRejected("the PDF has no text layer (a scan?); send the text instead")
    if total > max_pages:
        parts.append(f"[the PDF has {total} pages; only the first {max_pages} were read]")
    return "\n\n".join(parts)
