"""The inspector and web chat pages: plain files shipped in the package, served as
they are (no CDN, no build step), with headers that keep them to this origin."""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

from parley.gateway.errors import ApiError

STATIC_DIR = Path(__file__).with_name("static")
ASSET_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}\.(js|css|svg)$"
_ASSET = re.compile(ASSET_PATTERN)
_TYPES = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
ASSET_TYPES = tuple(_TYPES.values())
# The pages load only their own files and talk only to this server.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


# Listed once at import: the package's files do not change while it runs, and a
# request then never touches the disk to find out whether a name exists.
_FILES = frozenset(p.name for p in STATIC_DIR.iterdir() if p.is_file())


def _file(name: str, content_type: str) -> web.FileResponse:
    if name not in _FILES:
        raise ApiError(404, "not_found", f"no such page asset: {name}")
    response = web.FileResponse(STATIC_DIR / name, headers=_HEADERS)
    response.content_type = content_type
    return response


async def inspector(request: web.Request) -> web.FileResponse:
    return _file("index.html", "text/html")


async def chat(request: web.Request) -> web.FileResponse:
    return _file("chat.html", "text/html")


async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    match = _ASSET.match(name)
    if match is None:  # also what keeps "..", "/" and NUL out of the path
        raise ApiError(404, "not_found", f"no such page asset: {name}")
    return _file(name, _TYPES[match.group(1)])
