"""``memory_search``, ``memory_get`` and ``remember``: the agent's way into its long-term
memory, each bounded by the conversation's audience (``core.memory.audience``).

``memory_search`` searches only the scopes the turn may see (``ToolContext.extra
["memory_scopes"]``, which the gateway asked the audience rule for), so one person's
memories never surface in another's chat. ``memory_get`` reads lines of memory files
(MEMORY.md, memory/**/*.md, configured extra paths) and of the notes the turn's viewer
(``extra["memory_viewer"]``) may read; any other path is refused, another audience's
notes exactly as a path that does not exist. ``remember`` stores a durable note in the
conversation's own audience, never the agent's: where it goes is code's decision.
"""

from __future__ import annotations

import json
from typing import Any

from parley.core.errors import MemoryIndexError, ToolError
from parley.core.memory.audience import AudienceError, Viewer, writable
from parley.core.memory.index import MemoryIndex
from parley.core.memory.notes import NoteError
from parley.core.prompt import MEMORY_GET_TOOL, MEMORY_SEARCH_TOOL
from parley.core.tools.tool_registry import Tool, ToolContext

SCOPES_KEY = "memory_scopes"
VIEWER_KEY = "memory_viewer"
REMEMBER_TOOL = "remember"
MAX_QUERY_CHARS = 2000
MAX_RESULTS_LIMIT = 50
MAX_REMEMBER_CHARS = 2000
# A search may have to wait for a sync of a dirty index first.
SEARCH_TIMEOUT_SECONDS = 120.0


def _scopes(context: ToolContext) -> list[str]:
    scopes = context.extra.get(SCOPES_KEY)
    if not scopes:
        raise ToolError("memory search is not available in this conversation")
    return list(scopes)


def _viewer(context: ToolContext) -> Viewer:
    viewer = context.extra.get(VIEWER_KEY)
    if not isinstance(viewer, Viewer):
        raise ToolError("memory is not available in this conversation")
    return viewer


def render_results(result: Any) -> str:
    """What the model reads: one JSON object (results, then how the search ran)."""
    payload = result.to_dict()
    if not payload["results"]:
        payload["note"] = "no memory matched; say so rather than guess"
    return json.dumps(payload, ensure_ascii=False, indent=1)


def memory_tools(index: MemoryIndex) -> list[Tool]:
    async def memory_search(arguments: dict[str, Any], context: ToolContext) -> str:
        query = str(arguments["query"]).strip()
        if not query:
            raise ToolError("query is empty")
        try:
            result = await index.search(
                query,
                scopes=_scopes(context),
                max_results=arguments.get("max_results"),
                min_score=arguments.get("min_score"),
            )
        except MemoryIndexError as exc:
            raise ToolError(f"memory search is unavailable: {exc}") from exc
        return render_results(result)

    async def memory_get(arguments: dict[str, Any], context: ToolContext) -> str:
        path = str(arguments["path"])
        try:
            text = await index.read(
                path,
                int(arguments.get("from", 1)),
                arguments.get("lines"),
                viewer=_viewer(context),
            )
        except MemoryIndexError as exc:
            raise ToolError(str(exc)) from exc
        return text if text else f"({path} is empty or has no such lines)"

    async def remember(arguments: dict[str, Any], context: ToolContext) -> str:
        text = str(arguments["text"]).strip()
        if not text:
            raise ToolError("text is empty")
        try:
            citation = await index.remember(writable(_viewer(context)), text)
        except (AudienceError, NoteError, OSError) as exc:
            raise ToolError(f"could not remember it: {exc}") from exc
        return f"remembered ({citation})"

    search = Tool(
        name=MEMORY_SEARCH_TOOL,
        description=(
            "Search long-term memory (MEMORY.md, memory/*.md notes, notes kept for this "
            "conversation and past conversations with this person or group) by meaning and "
            "keywords. Returns the best passages with a citation path#Lx-Ly. Use before "
            "answering about past events, decisions, dates, people, preferences or todos."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS},
                "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS_LIMIT},
                "min_score": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        handler=memory_search,
        timeout_seconds=SEARCH_TIMEOUT_SECONDS,
    )
    get = Tool(
        name=MEMORY_GET_TOOL,
        description=(
            "Read lines of a memory file (MEMORY.md, memory/**/*.md, a configured extra "
            "path, or a notes/ path a memory_search result cited), e.g. around a citation. "
            "'from' is 1-based; 'lines' is a count."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "maxLength": 1024},
                "from": {"type": "integer", "minimum": 1},
                "lines": {"type": "integer", "minimum": 1, "maximum": 2000},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        handler=memory_get,
    )
    keep = Tool(
        name=REMEMBER_TOOL,
        description=(
            "Store a durable note in this conversation's own long-term memory (this person's "
            "in a direct chat, this group's in a group; never anyone else's). Use when asked "
            "to remember something, or for a fact, preference or decision worth keeping."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 1, "maxLength": MAX_REMEMBER_CHARS},
            },
            "required": ["text"],
            "additionalProperties": False,
        },
        handler=remember,
    )
    return [search, get, keep]
