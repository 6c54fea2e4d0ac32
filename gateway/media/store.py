"""The media store: the pictures people sent, one file each, under ``$PARLEY_HOME/media/``.

A file lives in its audience's folder (``core.memory.audience.Audience.folder``: the
person of a direct chat, or the group) and is named by the SHA-256 of its bytes::

    media/person/telegram%3A42/3f/3f9c…e1.jpg
    media/conversation/discord%3A77/a0/a0b1…07.png

The transcript refers to it by that path relative to the store (``ImageBlock.ref``),
never by its bytes. Folders are 0700, files 0600, written whole (a temporary file
renamed into place), so a reader never sees half a file. Storing the same picture
twice in one audience is one file (its mtime renewed: a file's age is its mtime).

Deleting any file at any time is safe (retention does): a reference whose file is gone
reads as None and the model is told the picture is no longer kept (``core.media``).

Reads go through the one audience rule: ``MediaStore.loader(viewer)`` answers only refs
whose folder ``core.memory.audience.may_read`` grants the viewer, so a conversation's
request can carry no one else's picture even if its transcript named one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from parley.core.files import write_atomically
from parley.core.memory.audience import Audience, Viewer, may_read, parse_folder
from parley.gateway.file_modes import DIR_MODE, FILE_MODE

log = logging.getLogger("parley.gateway.media")

# <kind>/<folder name>/<2 hex>/<64 hex>.<ext>: the folder name is percent-encoded
# (no "/", and no "." that could make "..": Audience.folder).
_REF = re.compile(
    r"(?P<kind>person|conversation)/(?P<name>[A-Za-z0-9_@+~%-]{1,256})/"
    r"(?P<fan>[0-9a-f]{2})/(?P<digest>[0-9a-f]{64})\.(?P<ext>[a-z0-9]{1,8})"
)


class MediaStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, audience: Audience, data: bytes, extension: str) -> str:
        """Store ``data`` for ``audience``; its ref. Blocking: call it on a thread."""
        digest = hashlib.sha256(data).hexdigest()
        ref = f"{audience.folder}/{digest[:2]}/{digest}.{extension}"
        if _REF.fullmatch(ref) is None:
            raise ValueError(f"not a media ref: {ref!r}")
        path = self.root / ref
        if path.is_file():
            os.utime(path)  # sent again: as young as the newest sending
            return ref
        self._make_dirs(path.parent)
        write_atomically(path, data, FILE_MODE)
        return ref

    def read(self, ref: str, viewer: Viewer) -> bytes | None:
        """The bytes of ``ref`` for ``viewer``; None when the file is gone or the rule
        does not let this viewer see its audience. Blocking."""
        owner = owner_of(ref)
        if owner is None:
            log.warning("media ref refused: not one of the store's (%r)", ref[:120])
            return None
        if not may_read(viewer, owner.scope):
            log.warning("media ref refused: %s may not read %s", viewer.audience.scope, owner.scope)
            return None
        try:
            return (self.root / ref).read_bytes()
        except FileNotFoundError:
            return None  # deleted by retention (or by hand): a placeholder says so
        except OSError as exc:
            log.warning("media file %s unreadable: %s", ref, exc)
            return None

    def audience_folders(self) -> list[tuple[Audience, Path]]:
        """Every audience folder of the store, with its audience (erasing a person).
        Blocking."""
        found = []
        for kind in ("person", "conversation"):
            base = self.root / kind
            if not base.is_dir():
                continue
            for folder in sorted(base.iterdir()):
                audience = parse_folder(kind, folder.name) if folder.is_dir() else None
                if audience is not None:
                    found.append((audience, folder))
        return found

    def loader(self, viewer: Viewer) -> ViewerMedia:
        """What a turn's request may read (``core.media.MediaLoader``)."""
        return ViewerMedia(self, viewer)

    def _make_dirs(self, directory: Path) -> None:
        missing: list[Path] = []
        probe = directory
        while not probe.exists():
            missing.append(probe)
            if probe == self.root or probe.parent == probe:
                break
            probe = probe.parent
        for folder in reversed(missing):
            folder.mkdir(mode=DIR_MODE, exist_ok=True)
            os.chmod(folder, DIR_MODE)  # whatever the umask


class ViewerMedia:
    """A ``MediaLoader`` bound to one reader."""

    def __init__(self, store: MediaStore, viewer: Viewer) -> None:
        self._store = store
        self._viewer = viewer

    def load(self, ref: str) -> bytes | None:
        return self._store.read(ref, self._viewer)


def owner_of(ref: str) -> Audience | None:
    """The audience a ref's file belongs to; None for anything not a store ref."""
    match = _REF.fullmatch(ref)
    if match is None:
        return None
    return parse_folder(match["kind"], match["name"])
