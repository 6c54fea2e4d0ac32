"""Voice notes to text through an OpenAI-compatible transcription endpoint.

``POST <url>/audio/transcriptions`` as multipart form data (``file``, ``model``,
``response_format=json``, optional ``language``), answered ``{"text": "..."}``: what
OpenAI, whisper.cpp's server, faster-whisper-server and LocalAI speak. One request per
voice note, bounded by ``timeout_seconds``; a failure is the note's placeholder, never
the message's.
"""

from __future__ import annotations

import logging

import aiohttp

from parley.gateway.errors import MediaRejected
from parley.gateway.media.config import TranscriptionConfig

log = logging.getLogger("parley.gateway.media")

# Longer error bodies are cut in the log.
ERROR_BODY_CHARS = 300


class Transcriber:
    def __init__(self, config: TranscriptionConfig) -> None:
        self.config = config

    @property
    def configured(self) -> bool:
        return bool(self.config.url)

    @property
    def endpoint(self) -> str:
        return f"{(self.config.url or '').rstrip('/')}/audio/transcriptions"

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        """The words of a voice note; raises ``MediaRejected`` saying what went wrong."""
        config = self.config
        form = aiohttp.FormData()
        form.add_field(
            "file", data, filename=file_name or "voice.ogg", content_type=mime_type or None
        )
        form.add_field("model", config.model)
        form.add_field("response_format", "json")
        if config.language:
            form.add_field("language", config.language)
        headers = {}
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        timeout = aiohttp.ClientTimeout(total=config.timeout_seconds)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(self.endpoint, data=form, headers=headers) as response,
            ):
                if response.status != 200:
                    body = (await response.text(errors="replace"))[:ERROR_BODY_CHARS]
                    log.warning("transcription refused: HTTP %d %s", response.status, body)
                    raise MediaRejected(
                        f"the transcription service refused it (HTTP {response.status})"
                    )
                payload = await response.json(content_type=None)
        except MediaRejected:
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("transcription failed: %s: %s", type(exc).__name__, exc)
            raise MediaRejected("the transcription service could not be reached") from exc
        text = payload.get("text") if isinstance(payload, dict) else None
        if not isinstance(text, str):
            raise MediaRejected("the transcription service gave no text")
        return text.strip()
