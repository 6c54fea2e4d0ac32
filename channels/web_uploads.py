"""Files sent in the web chat: carried in the message frame, kept in an upload spool.

A message frame may carry ``"files": [{"name", "type", "data"}]`` (``data``: base64, at
most ``max_upload_bytes`` decoded, ``max_files`` of them). The adapter writes each
file to the spool before it hands the message over, so the inbox records only a
reference (the upload's name in the spool) and the gateway fetches the bytes when the
turn runs (``WebChannel.fetch_attachment``), after a restart too.

A client's uploads live in its own folder (a digest of its id), and a fetch looks only
in the folder of the message's client: no message can name another client's file.
Folders are 0700, files 0600. The spool sits in the media store's tree
(``$PARLEY_HOME/media/uploads``): deleting a file there is always safe (the turn then
says the file is no longer available).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parley.channels.base import Attachment, AttachmentKind, AttachmentUnavailable, ChannelError

_UPLOAD_RE = re.compile(r"[0-9a-f]{32}")
_MIME_RE = re.compile(r"[a-z0-9.+-]{1,64}/[a-z0-9.+-]{1,128}")
MAX_NAME_CHARS = 200


class UploadRefused(ChannelError):
    """A frame's files cannot be taken; the text says why (sent to the browser)."""


@dataclass(frozen=True, slots=True)
class Upload:
    name: str
    mime_type: str
    data: bytes

    @property
    def kind(self) -> AttachmentKind:
        if self.mime_type.startswith("image/"):
            return "image"
        if self.mime_type.startswith("audio/"):
            return "voice"
        return "document"


def read_files(raw: Any, *, max_bytes: int, max_files: int) -> list[Upload]:
    """The files of a message frame; raises ``UploadRefused``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise UploadRefused("files must be a list")
    if len(raw) > max_files:
        raise UploadRefused(f"at most {max_files} files per message")
    uploads = []
    for item in raw:
        if not isinstance(item, dict):
            raise UploadRefused("each file must be an object with name, type and data")
        name, mime, data = item.get("name"), item.get("type") or "", item.get("data")
        if not isinstance(name, str) or not name.strip() or not isinstance(data, str):
            raise UploadRefused("each file needs a name and its data (base64)")
        if not isinstance(mime, str):
            raise UploadRefused("a file's type must be a string")
        mime = mime.strip().lower()
        if mime and not _MIME_RE.fullmatch(mime):
            raise UploadRefused(f"not a media type: {mime[:40]!r}")
        if len(data) > (max_bytes + 2) // 3 * 4 + 4:
            raise UploadRefused(f"{name[:80]} is larger than the limit of {max_bytes:,} bytes")
        try:
            content = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise UploadRefused(f"{name[:80]}: data is not base64") from None
        if len(content) > max_bytes:
            raise UploadRefused(f"{name[:80]} is larger than the limit of {max_bytes:,} bytes")
        clean = name.replace("/", "_").replace("\\", "_").strip()[:MAX_NAME_CHARS]
        uploads.append(Upload(clean, mime, content))
    return uploads


class UploadSpool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _folder(self, client_id: str) -> Path:
        return self.directory / hashlib.sha256(client_id.encode()).hexdigest()[:32]

    async def keep(self, client_id: str, upload: Upload) -> Attachment:
        """Write ``upload`` to the client's folder; its attachment (ref: the upload id)."""
        upload_id = uuid.uuid4().hex
        path = self._folder(client_id) / upload_id
        await asyncio.to_thread(_write_private, path, upload.data)
        return Attachment(
            upload.kind,
            upload_id,
            name=upload.name,
            mime_type=upload.mime_type,
            size=len(upload.data),
        )

    async def read(self, client_id: str, upload_id: str, max_bytes: int) -> bytes:
        if not _UPLOAD_RE.fullmatch(upload_id):
            raise AttachmentUnavailable("not an upload of this web chat")
        path = self._folder(client_id) / upload_id
        try:
            size = await asyncio.to_thread(lambda: path.stat().st_size)
            if size > max_bytes:
                raise AttachmentUnavailable(f"{size} bytes", too_large=True)
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise AttachmentUnavailable("the upload is no longer kept") from None
        except OSError as exc:
            raise AttachmentUnavailable(f"the upload cannot be read: {exc}") from exc


def _write_private(path: Path, data: bytes) -> None:
    for folder in (path.parent.parent, path.parent):
        if not folder.is_dir():
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(folder, 0o700)
    temp = path.with_name(f".{path.name}.incoming")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
