"""The ``[media]`` section: what people may send besides words, and how big.

Sizes are the platform's file sizes in bytes, checked before a download (from what the
platform declares) and again on the bytes: nothing larger is read into memory.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

MIB = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TranscriptionConfig(_Strict):
    """An OpenAI-compatible speech-to-text endpoint (``POST <url>/audio/transcriptions``,
    whisper.cpp's server, faster-whisper-server, OpenAI). Unset ``url``: voice notes
    reach the model as a placeholder saying they were not transcribed."""

    url: str | None = Field(
        None, description="base URL, /v1 included (e.g. http://127.0.0.1:8080/v1)"
    )
    model: str = "whisper-1"
    # From PARLEY_TRANSCRIPTION_API_KEY when the file leaves it unset; a local server
    # usually needs none.
    api_key: SecretStr | None = None
    language: str | None = Field(None, description="ISO-639-1 hint; unset: detected")
    timeout_seconds: float = Field(120.0, gt=0, le=3600)
    max_bytes: int = Field(25 * MIB, ge=1024, le=512 * MIB, description="a voice note's size")


class MediaConfig(_Strict):
    # Off: attachments reach the model as the adapters' short placeholders only.
    enabled: bool = True
    # Photos: downscaled so the longer side is at most this (a vision model's cost grows
    # with the pixels; Anthropic's own limit for one image is 1,568).
    image_max_side: int = Field(1200, ge=64, le=8000)
    max_image_bytes: int = Field(20 * MIB, ge=1024, le=512 * MIB)
    # A picture is decoded only up to this many pixels (a "decompression bomb" beyond).
    max_image_pixels: int = Field(50_000_000, ge=10_000, le=500_000_000)
    # Documents: text, Markdown, CSV, JSON, PDF with a text layer. Their text is cut
    # like a tool result (head and tail kept: core.tools.truncation) to fit the window.
    max_document_bytes: int = Field(10 * MIB, ge=1024, le=512 * MIB)
    max_pdf_pages: int = Field(200, ge=1, le=10_000)
    # A turn that addresses the agent in a group also takes the files of the messages
    # said there before it (the group context): the newest this many. Each costs what
    # it does when sent directly (a picture ~1,300 tokens), so few; 0: none (their
    # lines still say "[photo]").
    earlier_files: int = Field(2, ge=0, le=10)
    transcription: TranscriptionConfig = TranscriptionConfig()
